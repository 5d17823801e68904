//! `cachefit chat -m FILE`: talk to an instruction-tuned model.
//!
//! Each turn the whole conversation goes through the model's chat template
//! ([`chat::ChatTemplate`], ChatML when the GGUF has none) and is tokenized
//! again; only the part after the longest prefix already in the KV cache is
//! evaluated, as llama.cpp does, so a turn costs its new tokens, not the
//! whole history. The reply streams to stdout until an end-of-generation
//! token, `-n` tokens, the end of the context or Ctrl-C, and is kept in the
//! history as text. When the next prompt would not leave room for a reply,
//! the oldest exchanges are dropped ([`conversation`]).
//!
//! stdout carries only the replies, one per message, each ending in a
//! newline; prompts, notices and timings go to stderr. So piping messages
//! in (one per line, [`input`] rules) gives a transcript of answers, which
//! is how the tests drive it.
//!
//! Ctrl-C is a flag the loops poll: during a reply it ends the reply (what
//! was written is kept), at the prompt, or a second time during one reply,
//! it exits with status 130 as llama.cpp does.

mod conversation;
mod input;

use super::common::{self, ContextArgs, ModelArgs};
use anyhow::{bail, Context, Result};
use chat::ChatTemplate;
use conversation::{Conversation, Fit};
use engine::{Sampler, SamplerConfig, StopMatcher};
use input::{Command, Input, InputReader};
use model::{forward, forward_batch, Logits, ModelConfig, State, Weights};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
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
  /clear   forget the conversation (the --system prompt stays)
  /exit    leave (also /quit, or end of input: Ctrl-D)
  /help    show this
Ctrl-C stops a reply and keeps what it wrote; Ctrl-C at the prompt, or a
second one during a reply, exits with status 130.

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
    /// System prompt, kept at the top of the conversation (default: the
    /// template's own, if it has one).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per reply (-1: until the model ends it or the context is
    /// full). Also the room kept for a reply when old exchanges are dropped;
    /// with -1, a quarter of the context.
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Sampling seed (default: random). Reply k after the start or a
    /// /clear uses seed + k, so a cleared chat replays exactly.
    #[arg(short = 's', long)]
    pub seed: Option<u32>,
    /// Temperature; 0 samples greedily.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the best one (0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalize repeats of the last --repeat-last-n tokens (1: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over (0: off).
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Print each rendered prompt on stderr before its reply.
    #[arg(long)]
    pub verbose_prompt: bool,
    /// Let control tokens typed in messages (`<|im_end|>`) act as control
    /// tokens; by default message text is always text.
    #[arg(long = "special-in-messages")]
    pub special_in_messages: bool,
}

fn check_args(args: &Args) -> Result<()> {
    let finite = [
        ("--temp", args.temp),
        ("--top-p", args.top_p),
        ("--min-p", args.min_p),
        ("--repeat-penalty", args.repeat_penalty),
    ];
    if let Some((name, v)) = finite.iter().find(|(_, v)| !v.is_finite()) {
        bail!("{name} {v} is not a number");
    }
    if args.temp < 0.0 {
        bail!("--temp must be at least 0");
    }
    if !(0.0..=1.0).contains(&args.top_p) || !(0.0..=1.0).contains(&args.min_p) {
        bail!("--top-p and --min-p must be between 0 and 1");
    }
    if args.repeat_penalty <= 0.0 {
        bail!("--repeat-penalty must be positive (1 is off)");
    }
    if args.n_predict == 0 || args.n_predict < -1 {
        bail!("-n must be positive, or -1 for no limit");
    }
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    check_args(&args)?;
    let pools = common::Pools::from_args(&args.model)?;
    let opened = common::open_model(&args.model)?;
    let (cfg, vocab) = (&opened.cfg, &opened.vocab);
    let path = args.model.shown();
    let opts = common::state_options(&opened, &args.ctx, false)?;
    let n_ctx = opts.n_ctx;
    let token_text = |id: Option<u32>| id.and_then(|id| vocab.token_text(id));
    let template = ChatTemplate::from_gguf(
        opened.file.metadata(),
        token_text(vocab.bos()),
        token_text(vocab.eos()),
    )
    .with_context(|| format!("{path}: reading the chat template"))?;
    let weights = Weights::from_gguf(&opened.file, cfg).with_context(|| path.clone())?;
    let engine = Engine {
        cfg,
        weights: &weights,
        state: State::with_options(cfg, &weights, &opts)?,
        pools,
        n_batch: opts.n_batch,
        cached: Vec::new(),
    };
    eprintln!(
        "cachefit: {} ({}, {} layers), ctx {n_ctx}, {} KV cache, batch {}, {}, kernels {}",
        path,
        cfg.arch.name(),
        cfg.n_layers,
        opts.kv_type,
        opts.n_batch,
        engine.pools.describe(),
        kernels::isa::selected().name()
    );
    if template.is_fallback() {
        eprintln!("cachefit: {}", chat::FALLBACK_NOTICE);
    }

    // With the ChatML fallback the model may not know <|im_end|> as an
    // end-of-generation token, or even as a token: stop at either.
    let im_end = "<|im_end|>";
    let mut eog = vocab.eog_tokens().to_vec();
    let mut stop_strings = Vec::new();
    if template.is_fallback() {
        eog.extend(vocab.token_id(im_end));
        stop_strings.push(im_end.to_string());
    }
    // A model without an end-of-turn token (the built-in one's Q:/A:
    // format) writes the next question itself: stop where it begins.
    stop_strings.extend(template.turn_stop());
    let sampling = SamplerConfig {
        temp: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        penalty_last_n: args.repeat_last_n,
        seed: args.seed,
        ..SamplerConfig::greedy()
    };
    let limit = usize::try_from(args.n_predict).unwrap_or(usize::MAX);
    let mut chat = Chat {
        engine,
        vocab,
        template,
        conversation: Conversation::new(args.system.clone()),
        base_seed: Sampler::new(sampling.clone()).seed(),
        sampling,
        replies: 0,
        eog,
        stop_strings,
        limit,
        reserve: if args.n_predict > 0 { limit } else { n_ctx / 4 },
        verbose_prompt: args.verbose_prompt,
        special: if args.special_in_messages {
            chat::Special::Parse
        } else {
            chat::Special::Text
        },
    };

    let ctrl_c = CtrlC::install()?;
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    if interactive {
        eprintln!(
            "cachefit: chatting; /help for commands, Ctrl-C stops a reply, /exit or Ctrl-D leaves"
        );
    }
    let mut reader =
        InputReader::new(stdin.lock(), interactive).with_limit(args.ctx.max_prompt_bytes());
    loop {
        ctrl_c.set_busy(false);
        match reader.next().context("reading stdin")? {
            Input::Message(text) => {
                ctrl_c.set_busy(true);
                chat.answer(text, &ctrl_c)?;
            }
            Input::Eof => {
                if interactive {
                    eprintln!();
                }
                return Ok(());
            }
            Input::Command(Command::Exit) => return Ok(()),
            Input::Command(Command::Clear) => {
                let n = chat.clear();
                eprintln!(
                    "cachefit: conversation cleared ({n} exchange{} forgotten)",
                    if n == 1 { "" } else { "s" }
                );
            }
            Input::Command(Command::Help) => eprintln!("{INPUT_HELP}"),
            Input::Command(Command::Unknown(word)) => eprintln!(
                "cachefit: unknown command /{word} (/help lists them; to send it as a message, put it between \"\"\" lines)"
            ),
        }
    }
}

/// A conversation with the model and how its replies are made.
struct Chat<'a> {
    engine: Engine<'a>,
    vocab: &'a Vocab,
    template: ChatTemplate,
    conversation: Conversation,
    sampling: SamplerConfig,
    /// Reply k (from 0) since the start or the last /clear samples with
    /// `base_seed + k`, so a cleared chat replays the same.
    base_seed: u32,
    replies: u32,
    eog: Vec<u32>,
    stop_strings: Vec<String>,
    /// Most tokens per reply.
    limit: usize,
    /// Room kept for a reply when fitting the conversation in the context.
    reserve: usize,
    verbose_prompt: bool,
    /// `--special-in-messages`.
    special: chat::Special,
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

    /// Answer a user message, streaming the reply to stdout; what cannot
    /// be answered is said on stderr and left out of the conversation.
    fn answer(&mut self, text: String, ctrl_c: &CtrlC) -> Result<()> {
        let n_ctx = self.engine.state.n_ctx();
        let vocab = self.vocab;
        self.conversation.push_user(text);
        let fit = self.conversation.fit(
            &self.template,
            |m, t| tokenize(&self.template, m, t, vocab, self.special),
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
                return Ok(());
            }
            Err(e) => {
                self.conversation.pop();
                eprintln!("cachefit: {e}; the message was not sent");
                return Ok(());
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
        let vocab_size = self.engine.cfg.vocab_size;
        if let Some(&bad) = prompt.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            bail!(
                "token {bad} from the tokenizer is outside the model's vocabulary of {vocab_size}"
            );
        }

        let mut sampler = Sampler::new(SamplerConfig {
            seed: Some(self.base_seed.wrapping_add(self.replies)),
            ..self.sampling.clone()
        });
        // The prompt counts for the penalties, as in llama.cpp.
        let window = prompt
            .tokens
            .len()
            .saturating_sub(self.sampling.penalty_last_n);
        for &t in &prompt.tokens[window..] {
            sampler.accept(t);
        }
        let generation = Generation {
            sampler,
            eog: &self.eog,
            stop: StopMatcher::new(&self.stop_strings),
            limit: self.limit,
        };
        let reply = self.engine.reply(
            &prompt.tokens,
            generation,
            vocab,
            &ctrl_c.interrupted,
            &mut std::io::stdout().lock(),
        )?;
        // Idle before the report: once it is out, Ctrl-C means "exit".
        ctrl_c.set_busy(false);
        self.replies = self.replies.wrapping_add(1);
        report(&reply, prompt.tokens.len(), n_ctx);
        if reply.text.is_empty() && reply.end == End::Interrupted {
            self.conversation.pop();
        } else {
            self.conversation.push_assistant(reply.text);
        }
        Ok(())
    }
}

/// Tokens for a rendered prompt: control tokens from the template's own
/// text only, message text as text unless `--special-in-messages`
/// ([`chat::prompt`]); BOS where the model wants one, never EOS.
fn tokenize(
    template: &ChatTemplate,
    messages: &[chat::Message],
    text: &str,
    vocab: &Vocab,
    special: chat::Special,
) -> Result<Vec<u32>, chat::Error> {
    chat::tokenize_rendered(template, messages, true, text, vocab, special)
}

/// The stats line after a reply, and why it ended if that needs saying.
fn report(reply: &Reply, prompt_tokens: usize, n_ctx: usize) {
    let rate = |n: usize, ms: f64| {
        if ms > 0.0 {
            n as f64 * 1000.0 / ms
        } else {
            0.0
        }
    };
    match reply.end {
        End::Interrupted => eprintln!("[interrupted]"),
        End::Context => eprintln!(
            "cachefit: the context of {n_ctx} tokens is full; the reply was cut short (older exchanges will be dropped)"
        ),
        End::Eog | End::Length | End::Stop => {}
    }
    eprintln!(
        "cachefit: reply {} tokens, {:.1} tok/s; prompt {prompt_tokens} tokens, {} from the cache, {} evaluated at {:.1} tok/s",
        reply.generated,
        rate(reply.generated, reply.gen_ms),
        prompt_tokens - reply.evaluated,
        reply.evaluated,
        rate(reply.evaluated, reply.prompt_ms),
    );
}

/// The Ctrl-C state shared with the handler thread.
struct CtrlC {
    /// A message is being answered (else we are at the prompt).
    busy: AtomicBool,
    /// Ctrl-C was pressed during this answer.
    interrupted: AtomicBool,
}

impl CtrlC {
    fn install() -> Result<Arc<CtrlC>> {
        let flags = Arc::new(CtrlC {
            busy: AtomicBool::new(false),
            interrupted: AtomicBool::new(false),
        });
        let handler = Arc::clone(&flags);
        ctrlc::set_handler(move || {
            if handler.busy.load(Ordering::SeqCst)
                && !handler.interrupted.swap(true, Ordering::SeqCst)
            {
                return; // the reply loop sees the flag and stops
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

/// Why a reply ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// An end-of-generation token.
    Eog,
    /// `-n` tokens.
    Length,
    /// A stop string.
    Stop,
    /// The context is full.
    Context,
    /// Ctrl-C.
    Interrupted,
}

struct Reply {
    /// What was shown, which is what goes into the history.
    text: String,
    end: End,
    /// Prompt tokens evaluated (the rest came from the cache).
    evaluated: usize,
    generated: usize,
    prompt_ms: f64,
    gen_ms: f64,
}

/// How to pick and end one reply.
struct Generation<'a> {
    sampler: Sampler,
    eog: &'a [u32],
    stop: StopMatcher,
    limit: usize,
}

/// The model and its one sequence's cache, which outlives turns.
struct Engine<'a> {
    cfg: &'a ModelConfig,
    weights: &'a Weights<'a>,
    state: State,
    pools: common::Pools,
    n_batch: usize,
    /// The tokens whose keys and values the cache holds, by position.
    cached: Vec<u32>,
}

impl Engine<'_> {
    /// Evaluate `prompt` (non-empty, shorter than the context) past what
    /// the cache already holds of it, then sample and stream the reply to
    /// `out` until it ends.
    fn reply(
        &mut self,
        prompt: &[u32],
        mut gen: Generation<'_>,
        vocab: &Vocab,
        interrupted: &AtomicBool,
        out: &mut impl Write,
    ) -> Result<Reply> {
        let n_ctx = self.state.n_ctx();
        debug_assert!(!prompt.is_empty() && prompt.len() < n_ctx);
        // Keys and values depend only on the tokens up to them, so a common
        // prefix can stay; one token is always evaluated, for the logits.
        let keep = common_prefix(&self.cached, prompt).min(prompt.len() - 1);
        self.cached.truncate(keep);
        let mut reply = Reply {
            text: String::new(),
            end: End::Interrupted,
            evaluated: 0,
            generated: 0,
            prompt_ms: 0.0,
            gen_ms: 0.0,
        };
        let t_prompt = Instant::now();
        for chunk in prompt[keep..].chunks(self.n_batch) {
            if interrupted.load(Ordering::SeqCst) {
                reply.prompt_ms = ms(t_prompt);
                return Ok(reply);
            }
            let pos = self.cached.len();
            forward_batch(
                self.cfg,
                self.weights,
                &mut self.state,
                self.pools.batch(),
                chunk,
                pos,
                Logits::Last,
            );
            self.cached.extend_from_slice(chunk);
            reply.evaluated += chunk.len();
        }
        reply.prompt_ms = ms(t_prompt);

        let mut stream = vocab.stream_decoder();
        let mut shown = String::new();
        let t_gen = Instant::now();
        reply.end = loop {
            if interrupted.load(Ordering::SeqCst) {
                break End::Interrupted;
            }
            let tok = gen.sampler.sample(self.state.logits_mut());
            if gen.eog.contains(&tok) {
                break End::Eog;
            }
            gen.sampler.accept(tok);
            reply.generated += 1;
            shown.clear();
            let hit_stop = gen.stop.push(&stream.push(tok), &mut shown);
            out.write_all(shown.as_bytes())?;
            out.flush()?;
            reply.text.push_str(&shown);
            if hit_stop {
                break End::Stop;
            }
            if reply.generated >= gen.limit {
                break End::Length;
            }
            let pos = self.cached.len();
            if pos >= n_ctx {
                break End::Context;
            }
            forward(
                self.cfg,
                self.weights,
                &mut self.state,
                self.pools.decode(),
                tok,
                pos,
            );
            self.cached.push(tok);
        };
        reply.gen_ms = ms(t_gen);
        shown.clear();
        if reply.end != End::Stop {
            gen.stop.push(&stream.finish(), &mut shown);
            gen.stop.finish(&mut shown);
        }
        reply.text.push_str(&shown);
        shown.push('\n');
        out.write_all(shown.as_bytes())?;
        out.flush()?;
        Ok(reply)
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
