//! `cachefit chat -m FILE`: talk to an instruction-tuned model.
//!
//! Each turn the whole conversation goes through the model's chat template
//! ([`chat::ChatTemplate`], ChatML when the GGUF has none) and is tokenized
//! again, then runs as one job on the engine's scheduler with one slot kept
//! across turns ([`super::generate::Local`]): the scheduler evaluates only
//! the part after the longest prefix already in the slot's KV cache, as
//! llama.cpp does, so a turn costs its new tokens, not the whole history.
//! The reply streams to stdout until an end-of-generation token, a stop
//! string, `-n` tokens, the end of the context or Ctrl-C, and is kept in
//! the history as text. When the next prompt would not leave room for a
//! reply, the oldest exchanges are dropped ([`conversation`]).
//!
//! stdout carries only the replies, one per message, each ending in a
//! newline; prompts, notices and timings go to stderr. So piping messages
//! in (one per line, [`input`] rules) gives a transcript of answers, which
//! is how the tests drive it.
//!
//! On a terminal, lines are read with a line editor ([`editor`]: arrows,
//! Home/End, history kept across chats) and the prompt and notices have
//! colour ([`style`]); piped input is read plainly, by the same rules.
//!
//! Ctrl-C is a flag the loops poll: during a reply it ends the reply (what
//! was written is kept); at an empty prompt, or a second time during one
//! reply, it exits with status 130 as llama.cpp does. (On a line with text
//! the editor clears the line instead.)

mod conversation;
mod editor;
mod input;
mod style;

use super::common::{self, ContextArgs, ModelArgs};
use super::generate::{GenArgs, Local, Printer};
use anyhow::{bail, Context, Result};
use chat::ChatTemplate;
use conversation::{Conversation, Fit};
use engine::prompt::TurnEnd;
use engine::{FinishReason, GenParams};
use input::{Command, Input, InputReader, LineSource};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use style::{ColorChoice, Style};
use tokenize::Vocab;

/// Exit status after Ctrl-C at the prompt (128 + SIGINT, as shells and
/// llama.cpp report it).
pub const EXIT_INTERRUPTED: i32 = 130;

const INPUT_HELP: &str = "\
Input:
  One line is one message. End a line with \\ to continue it on the next, or
  paste several lines between a line starting with \"\"\" and one ending
  with \"\"\" (taken as they are: no commands, no continuations).
Commands:
  /clear      forget the conversation (the --system prompt stays)
  /save FILE  write the conversation as JSON ({\"messages\": [{\"role\", \"content\"}]})
  /load FILE  replace the conversation with one /save wrote
  /exit       leave (also /quit, or end of input: Ctrl-D)
  /help       show this
On a terminal, lines can be edited (arrows, Home/End, Ctrl-A/E/K/U/W) and
Up/Down recall earlier lines, kept in ${XDG_CACHE_HOME:-~/.cache}/cachefit/chat_history
(--no-history: not kept). Ctrl-C stops a reply and keeps what it wrote; on a
line with text it clears the line; at an empty prompt, or a second one
during a reply, it exits with status 130.

When stdin is not a terminal, messages are read from it by the same rules
and stdout gets only the replies, each followed by a newline; everything
else goes to stderr. When the conversation outgrows the context (-c), the
oldest exchanges are dropped and the system prompt is kept.";

#[derive(clap::Args)]
#[command(after_help = INPUT_HELP)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub ctx: ContextArgs,
    /// -n is the most tokens per reply, and the room kept for a reply when
    /// old exchanges are dropped (with -1, a quarter of the context). With
    /// a seed, reply k after the start or a /clear uses seed + k, so a
    /// cleared chat replays exactly.
    #[command(flatten)]
    pub gen: GenArgs,
    // Every reply is constrained the same way.
    #[command(flatten)]
    pub structured: super::structured::StructuredArgs,
    /// System prompt, kept at the top of the conversation (default: the
    /// template's own, if it has one).
    #[arg(long)]
    pub system: Option<String>,
    /// Print each rendered prompt on stderr before its reply.
    #[arg(long)]
    pub verbose_prompt: bool,
    /// A memory file (made if new): every turn, the prompt sees its
    /// history (its start, its end and blocks recalled for the message),
    /// and the turn (message and reply) is appended, so a later chat
    /// remembers. The conversation itself then lives in the memory: each
    /// prompt renders only the system prompt and the new message.
    #[arg(long, value_name = "FILE")]
    pub memory: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub mem: super::memory::MemoryArgs,
    /// Let control tokens typed in messages (`<|im_end|>`) act as control
    /// tokens; by default message text is always text.
    #[arg(long = "special-in-messages")]
    pub special_in_messages: bool,
    /// Print one JSON line per reply (the message, its reply, token counts,
    /// timings, why it stopped) instead of streaming the reply.
    #[arg(long)]
    pub json: bool,
    /// Colour the prompt and notices: auto (when stdout and stderr are
    /// terminals and NO_COLOR is not set), always or never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, value_name = "WHEN")]
    pub color: ColorChoice,
    /// Do not read or write the line history file.
    #[arg(long)]
    pub no_history: bool,
}

fn check_args(args: &Args) -> Result<()> {
    args.gen.check()?;
    if args.gen.n_predict == 0 {
        bail!("-n must be positive, or -1 for no limit");
    }
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    check_args(&args)?;
    let spec = args.structured.spec()?;
    let pools = common::Pools::from_args(&args.model)?;
    let pools_line = pools.describe();
    let opened = common::open_model(&args.model)?;
    let (cfg, vocab) = (&opened.cfg, &opened.vocab);
    let path = args.model.shown();
    let mut opts = common::state_options(&opened, &args.ctx, false)?;
    opts.draft_rows = args.gen.draft_rows(1);
    let n_ctx = opts.n_ctx;
    let token_text = |id: Option<u32>| id.and_then(|id| vocab.token_text(id));
    let template = ChatTemplate::from_gguf(
        opened.file.metadata(),
        token_text(vocab.bos()),
        token_text(vocab.eos()),
    )
    .with_context(|| format!("{path}: reading the chat template"))?;
    // Before binding: binding may release pages the hash would read again.
    let fingerprint = args
        .memory
        .as_ref()
        .map(|_| engine::memory::fingerprint(&opened.file, vocab));
    let threads = pools.decode().n_threads();
    let model = super::generate::bind(&opened, &args.model)?;
    let memory = super::memory::session_for(
        args.memory.as_deref(),
        fingerprint,
        &opened,
        &model,
        threads,
        memory::Mode::Write,
        args.mem.config(),
    )?;
    let draft_opened = super::generate::open_draft(&args.gen, &args.model, &opened)?;
    let draft = super::generate::bind_draft(draft_opened.as_ref(), &args.gen)?;
    let local = Local::new(&opened, &model, draft.as_ref(), &opts, pools)?;
    eprintln!(
        "cachefit: {} ({}, {} layers), ctx {n_ctx}, {} KV cache, batch {}, {}, kernels {}",
        path,
        cfg.arch.name(),
        cfg.n_layers,
        opts.kv_type,
        opts.n_batch,
        pools_line,
        kernels::selected().isa().name()
    );
    if let Some(notice) = template.fallback_notice() {
        eprintln!("cachefit: {notice}");
    }
    let mut params = args.gen.params(n_ctx);
    params.constraint = args.structured.compile(spec, vocab, cfg.vocab_size)?;
    let base_seed = *params
        .sampling
        .seed
        .get_or_insert_with(engine::sample::random_seed);
    if params.sampling.temp > 0.0 && args.gen.seed.is_none() {
        eprintln!("cachefit: sampling with seed {base_seed} (-s {base_seed} repeats this chat)");
    }
    let limit = args.gen.max_tokens();
    let ctrl_c = CtrlC::install()?;
    let mut chat = Chat {
        local,
        vocab,
        turn_end: engine::prompt::turn_end(&template, vocab),
        template,
        conversation: Conversation::new(args.system.clone()),
        params,
        base_seed,
        replies: 0,
        reserve: if args.gen.n_predict > 0 {
            limit
        } else {
            n_ctx / 4
        },
        n_ctx,
        verbose_prompt: args.verbose_prompt,
        special: if args.special_in_messages {
            chat::Special::Parse
        } else {
            chat::Special::Text
        },
        printer: Printer::new(ctrl_c.interrupted.clone(), !args.json),
        json: args.json,
        style: Style::new(args.color),
        memory: memory.map(|s| (args.memory.clone().expect("with a session"), s)),
    };

    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    let style = chat.style;
    if interactive {
        style.note(
            "cachefit: chatting; /help for commands, Ctrl-C stops a reply, /exit or Ctrl-D leaves",
        );
    }
    // The editor needs a terminal it can drive; TERM=dumb (and the others
    // rustyline cannot drive) gets plain lines with prompts on stderr.
    let dumb =
        std::env::var("TERM").is_ok_and(|t| ["dumb", "cons25", "emacs"].contains(&t.as_str()));
    let source: Box<dyn LineSource> = if interactive && !dumb {
        let history = if args.no_history {
            None
        } else {
            editor::history_path()
        };
        Box::new(editor::Editor::new(history, style).context("starting the line editor")?)
    } else {
        Box::new(input::Plain::new(stdin.lock(), interactive))
    };
    let mut reader = InputReader::from_source(source).with_limit(args.ctx.max_prompt_bytes());
    loop {
        ctrl_c.set_busy(false);
        match reader.next().context("reading stdin")? {
            Input::Message(text) => {
                ctrl_c.set_busy(true);
                if !chat.answer(text, &ctrl_c)? {
                    return Ok(()); // stdout is gone
                }
            }
            Input::Eof => {
                if interactive {
                    eprintln!();
                }
                return Ok(());
            }
            Input::Command(Command::Exit) => return Ok(()),
            // The editor leaves the terminal as it found it before this.
            Input::Interrupted => std::process::exit(EXIT_INTERRUPTED),
            Input::Command(Command::Save(None) | Command::Load(None)) => {
                style.warn("cachefit: /save and /load need a file name: /save FILE")
            }
            Input::Command(Command::Save(Some(path))) => match chat.save(&path) {
                Ok(n) => style.note(&format!(
                    "cachefit: saved {n} message{} to {}",
                    if n == 1 { "" } else { "s" },
                    path.display()
                )),
                Err(e) => style.warn(&format!("cachefit: {e:#}")),
            },
            Input::Command(Command::Load(Some(path))) => {
                match chat.load(&path, args.ctx.max_prompt_bytes()) {
                    Ok(n) => style.note(&format!(
                        "cachefit: loaded {n} exchange{} from {}",
                        if n == 1 { "" } else { "s" },
                        path.display()
                    )),
                    Err(e) => style.warn(&format!(
                        "cachefit: {e:#}; the conversation is unchanged"
                    )),
                }
            }
            Input::Command(Command::Clear) => {
                let n = chat.clear();
                style.note(&format!(
                    "cachefit: conversation cleared ({n} exchange{} forgotten)",
                    if n == 1 { "" } else { "s" }
                ));
            }
            Input::Command(Command::Help) => eprintln!("{INPUT_HELP}"),
            Input::Command(Command::Unknown(word)) => style.warn(&format!(
                "cachefit: unknown command /{word} (/help lists them; to send it as a message, put it between \"\"\" lines)"
            )),
        }
    }
}

/// A conversation with the model and how its replies are made.
struct Chat<'a> {
    local: Local<'a>,
    vocab: &'a Vocab,
    template: ChatTemplate,
    /// The ends of a reply the template implies, besides the vocabulary's.
    turn_end: TurnEnd,
    conversation: Conversation,
    /// How every reply generates (its seed is `base_seed + k`).
    params: GenParams,
    /// Reply k (from 0) since the start or the last /clear samples with
    /// `base_seed + k`, so a cleared chat replays the same.
    base_seed: u32,
    replies: u32,
    /// Room kept for a reply when fitting the conversation in the context.
    reserve: usize,
    n_ctx: usize,
    verbose_prompt: bool,
    /// `--special-in-messages`.
    special: chat::Special,
    printer: Printer,
    /// `--json`: a JSON line per reply instead of the streamed text.
    json: bool,
    style: Style,
    /// The memory file and its session, when the chat has one.
    memory: Option<(
        std::path::PathBuf,
        std::sync::Arc<std::sync::Mutex<engine::memory::MemorySession>>,
    )>,
}

impl Chat<'_> {
    /// Forget the conversation but the system prompt; the exchanges there
    /// were. (The cache keeps its tokens: the next prompt reuses the
    /// system prompt's.)
    fn clear(&mut self) -> usize {
        let n = self.conversation.exchanges();
        self.conversation.clear();
        self.replies = 0;
        n
    }

    /// `/save`: write the conversation to `path` atomically (a temporary
    /// file beside it, then renamed); the messages written.
    fn save(&self, path: &std::path::Path) -> Result<usize> {
        if self.memory.is_some() {
            bail!("/save does not work with --memory: the conversation lives in the memory file");
        }
        let json = self.conversation.to_json();
        let n = json["messages"].as_array().map_or(0, Vec::len);
        let name = path
            .file_name()
            .with_context(|| format!("{} is not a file name", path.display()))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".tmp{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&tmp)?;
            serde_json::to_writer_pretty(&mut file, &json)?;
            file.write_all(b"\n")?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            bail!("cannot save the conversation to {}: {e}", path.display());
        }
        Ok(n)
    }

    /// `/load`: replace the conversation with the one in `path`; the
    /// exchanges loaded. The next reply's prompt renders all of it, and the
    /// scheduler evaluates what its cache does not hold. Nothing changes
    /// on error.
    fn load(&mut self, path: &std::path::Path, max_bytes: usize) -> Result<usize> {
        if self.memory.is_some() {
            bail!("/load does not work with --memory: the conversation lives in the memory file");
        }
        let text = common::read_bounded(path, max_bytes)?;
        let loaded = Conversation::from_json(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        self.conversation = loaded;
        let n = self.conversation.exchanges();
        // Seeds go on as if the loaded exchanges had been typed here.
        self.replies = n as u32;
        Ok(n)
    }

    /// Answer a user message, streaming the reply to stdout; what cannot
    /// be answered is said on stderr and left out of the conversation.
    /// False when stdout is gone (nothing more can be shown).
    fn answer(&mut self, text: String, ctrl_c: &CtrlC) -> Result<bool> {
        let n_ctx = self.n_ctx;
        let vocab = self.vocab;
        if self.memory.is_some() {
            // The memory holds the earlier turns.
            self.conversation.clear();
        }
        self.conversation.push_user(text.clone());
        let fit = self.conversation.fit(
            &self.template,
            // Message text stays text: control tokens only from the
            // template ([`chat::prompt`]) unless --special-in-messages.
            |m, t| chat::tokenize_rendered(&self.template, m, true, t, vocab, self.special),
            n_ctx,
            self.reserve,
        );
        let prompt = match fit {
            Ok(Fit::Fits(prompt)) => prompt,
            Ok(Fit::TooLong { tokens }) => {
                self.conversation.pop();
                eprintln!(
                    "cachefit: that message does not fit: with the system prompt it makes a prompt of {tokens} tokens, and the context holds {n_ctx} (-c); it was not sent"
                );
                return Ok(true);
            }
            Err(e) => {
                self.conversation.pop();
                eprintln!("cachefit: {e}; the message was not sent");
                return Ok(true);
            }
        };
        if prompt.dropped > 0 {
            let which = match prompt.dropped {
                1 => "the oldest exchange".to_string(),
                n => format!("the {n} oldest exchanges"),
            };
            eprintln!(
                "cachefit: context full: dropped {which} of the conversation (the system prompt is kept)"
            );
        }
        if self.verbose_prompt {
            eprintln!(
                "cachefit: prompt, {} tokens:\n{}",
                prompt.tokens.len(),
                prompt.text
            );
        }
        let mut params = self.params.clone();
        params.sampling.seed = Some(self.base_seed.wrapping_add(self.replies));
        params.extra_eog.extend(&self.turn_end.eog);
        params.stop.extend(self.turn_end.stop.iter().cloned());
        let memory = self
            .memory
            .as_ref()
            .map(|(_, s)| engine::JobMemory::new(s.clone(), true));
        self.local.generate(
            prompt.tokens,
            params,
            Box::new(self.printer.clone()),
            memory,
        );
        let printed = self.printer.take();
        // Idle before the report: once it is out, Ctrl-C means "exit".
        ctrl_c.set_busy(false);
        if printed.write_error.is_some() {
            return Ok(false);
        }
        let finish = match printed.end {
            Some(Ok(f)) => f,
            Some(Err(e)) => {
                self.conversation.pop();
                eprintln!("cachefit: {e}; the message was not answered");
                return Ok(true);
            }
            None => bail!("the reply ended without a result"),
        };
        let mut stdout = std::io::stdout().lock();
        let end = if self.json {
            let gen_ms = finish.generation_time.as_secs_f64() * 1e3;
            let prompt_ms = finish.prompt_time.as_secs_f64() * 1e3;
            let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
            let evaluated = finish.prompt_tokens - finish.cached_tokens;
            // run --json's fields, with the message, the cache and the drops.
            serde_json::json!({
                "message": text,
                "text": printed.text,
                "prompt_tokens": finish.prompt_tokens,
                "cached_tokens": finish.cached_tokens,
                "generated_tokens": finish.completion_tokens,
                "stop": finish.reason.name(),
                "stop_string": finish.stop_string,
                "dropped_exchanges": prompt.dropped,
                "n_ctx": n_ctx,
                "seed": finish.seed,
                "prompt_ms": prompt_ms,
                "prompt_tok_s": rate(evaluated, prompt_ms),
                "gen_ms": gen_ms,
                "gen_tok_s": rate(finish.completion_tokens, gen_ms),
            })
            .to_string()
        } else {
            String::new()
        };
        if writeln!(stdout, "{end}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return Ok(false);
        }
        self.replies = self.replies.wrapping_add(1);
        if let (Some(m), Some((path, _))) = (&finish.memory, &self.memory) {
            super::memory::log_use(path, m);
        }
        report(&finish, finish.prompt_tokens, n_ctx, self.style);
        if printed.text.is_empty() && finish.reason == FinishReason::Cancelled {
            self.conversation.pop();
        } else {
            self.conversation.push_assistant(printed.text);
        }
        Ok(true)
    }
}

/// The stats line after a reply, and why it ended if that needs saying.
fn report(f: &engine::Finish, prompt_tokens: usize, n_ctx: usize, style: Style) {
    let rate = |n: usize, t: std::time::Duration| {
        let s = t.as_secs_f64();
        if s > 0.0 {
            n as f64 / s
        } else {
            0.0
        }
    };
    match f.reason {
        FinishReason::Cancelled => style.warn("[interrupted]"),
        FinishReason::ContextFull => style.warn(&format!(
            "cachefit: the context of {n_ctx} tokens is full; the reply was cut short (older exchanges will be dropped)"
        )),
        FinishReason::EndOfGeneration
        | FinishReason::Length
        | FinishReason::StopString
        | FinishReason::GrammarComplete => {}
    }
    let evaluated = prompt_tokens - f.cached_tokens;
    style.note(&format!(
        "cachefit: reply {} tokens, {:.1} tok/s; prompt {prompt_tokens} tokens, {} from the cache, {} evaluated at {:.1} tok/s",
        f.completion_tokens,
        rate(f.completion_tokens, f.generation_time),
        f.cached_tokens,
        evaluated,
        rate(evaluated, f.prompt_time),
    ));
}

/// The Ctrl-C state shared with the handler thread.
struct CtrlC {
    /// A message is being answered (else we are at the prompt).
    busy: AtomicBool,
    /// Ctrl-C was pressed during this answer.
    interrupted: Arc<AtomicBool>,
}

impl CtrlC {
    fn install() -> Result<Arc<CtrlC>> {
        let flags = Arc::new(CtrlC {
            busy: AtomicBool::new(false),
            interrupted: Arc::new(AtomicBool::new(false)),
        });
        let handler = Arc::clone(&flags);
        ctrlc::set_handler(move || {
            if handler.busy.load(Ordering::SeqCst)
                && !handler.interrupted.swap(true, Ordering::SeqCst)
            {
                return; // the scheduler sees the flag and ends the reply
            }
            // At the prompt, or the second press: leave. The main thread
            // may be blocked reading stdin, so exit from here.
            eprintln!();
            std::process::exit(EXIT_INTERRUPTED);
        })
        .context("installing the Ctrl-C handler")?;
        Ok(flags)
    }

    fn set_busy(&self, busy: bool) {
        if busy {
            self.interrupted.store(false, Ordering::SeqCst);
        }
        self.busy.store(busy, Ordering::SeqCst);
    }
}
