//! `cachefit run [-m FILE] [-p] PROMPT`: load a model (default: the
//! built-in one), evaluate the prompt and stream the continuation to
//! stdout; timings on stderr like llama.cpp.
//!
//! One job on the engine's scheduler with one slot ([`super::generate`]):
//! the same loop `chat` and `serve` run, so the same prompt and settings
//! give the same text through all three. Sampling is llama.cpp's default
//! chain (temperature 0.8, a random seed that is logged); `--temp 0` is
//! greedy. Ctrl-C ends the generation and keeps what was printed.

use super::common::{self, ContextArgs, ModelArgs};
use super::generate::{GenArgs, Local, Printer};
use anyhow::{bail, Context, Result};
use engine::{FinishReason, JobError};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub ctx: ContextArgs,
    #[command(flatten)]
    pub gen: GenArgs,
    #[command(flatten)]
    pub structured: super::structured::StructuredArgs,
    /// Prompt text.
    #[arg(short = 'p', long, conflicts_with_all = ["file", "text"])]
    pub prompt: Option<String>,
    /// The prompt, as a plain argument (`cachefit run "ROMEO:"`).
    #[arg(value_name = "PROMPT", conflicts_with = "file")]
    pub text: Option<String>,
    /// Read the prompt from a UTF-8 file.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Print one JSON line (text, token counts, timings) instead of
    /// streaming.
    #[arg(long)]
    pub json: bool,
    /// With --json: each generated token's log-probability and its N most
    /// likely alternatives (0 to 20), as the server's `logprobs`.
    #[arg(long, value_name = "N", requires = "json",
          value_parser = clap::value_parser!(u8).range(0..=20))]
    pub logprobs: Option<u8>,
    /// A memory file (`cachefit memory ingest`): the prompt sees its
    /// history (the start, the end, and blocks recalled for the prompt).
    #[arg(long, value_name = "FILE")]
    pub memory: Option<PathBuf>,
    #[command(flatten)]
    pub mem: super::memory::MemoryArgs,
    /// Print the prompt the model reads (with a memory: the history it
    /// sees too) on stderr before generating.
    #[arg(long)]
    pub verbose_prompt: bool,
}

fn read_prompt(args: &Args) -> Result<String> {
    let prompt = match (args.prompt.as_ref().or(args.text.as_ref()), &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => common::read_bounded(f, args.ctx.max_prompt_bytes())
            .context("reading the prompt file (--max-prompt-bytes raises the limit)")?,
        (None, None) => {
            bail!("no prompt: give one (`cachefit run \"ROMEO:\"`), -p PROMPT or -f FILE")
        }
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    Ok(prompt)
}

pub fn run(args: Args) -> Result<()> {
    let t_start = Instant::now();
    let prompt = read_prompt(&args)?;
    args.gen.check()?;
    let spec = args.structured.spec()?;
    let pools = common::Pools::from_args(&args.model)?;
    let (threads, threads_batch) = (pools.decode().n_threads(), pools.batch().n_threads());
    let pools_line = pools.describe();
    let opened = common::open_model(&args.model)?;
    let (cfg, vocab) = (&opened.cfg, &opened.vocab);
    let path = args.model.shown();
    let mut opts = common::state_options(&opened, &args.ctx, false)?;
    opts.draft_rows = args.gen.draft_rows(1);
    let n_ctx = opts.n_ctx;
    // Before binding: binding may release pages the hash would read again.
    let fingerprint = args
        .memory
        .as_ref()
        .map(|_| engine::memory::fingerprint(&opened.file, vocab));
    let model = super::generate::bind(&opened, &args.model)?;
    let draft_opened = super::generate::open_draft(&args.gen, &args.model, &opened)?;
    let draft = super::generate::bind_draft(draft_opened.as_ref(), &args.gen)?;
    let mut local = Local::new(&opened, &model, draft.as_ref(), &opts, pools)?;
    let load_ms = ms(t_start);
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

    let tokens = engine::prompt::completion_tokens(vocab, &prompt);
    if tokens.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    if tokens.len() >= n_ctx {
        bail!(
            "the prompt is {} tokens, which does not leave room in a context of {n_ctx} (use a larger -c or a shorter prompt)",
            tokens.len()
        );
    }
    let memory = super::memory::session_for(
        args.memory.as_deref(),
        fingerprint,
        &opened,
        &model,
        threads,
        memory::Mode::Read,
        args.mem.config(),
    )?;
    let n_prompt = tokens.len();
    if args.verbose_prompt {
        let text = vocab.decode_with(
            &tokens,
            tokenize::DecodeOptions {
                unparse_special: true,
                keep_spaces: true,
                ..Default::default()
            },
        );
        eprintln!(
            "cachefit: prompt, {n_prompt} tokens:\n{}",
            String::from_utf8_lossy(&text)
        );
    }
    if args.gen.n_predict == 0 {
        eprintln!("cachefit: -n 0: nothing to generate");
        if args.json {
            outln!(
                "{}",
                json!({"text": "", "prompt_tokens": n_prompt, "generated_tokens": 0,
                       "stop": "length", "load_ms": load_ms})
            );
        }
        return Ok(());
    }
    let mut params = args.gen.params(n_ctx);
    params.logprobs = args.logprobs.map(usize::from);
    params.constraint = args.structured.compile(spec, vocab, cfg.vocab_size)?;
    // Resolved here so it can be logged before anything is printed.
    let seed = *params
        .sampling
        .seed
        .get_or_insert_with(engine::sample::random_seed);
    if params.sampling.temp > 0.0 && args.gen.seed.is_none() {
        eprintln!("cachefit: sampling with seed {seed} (-s {seed} repeats this run)");
    }

    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        // A second Ctrl-C (the first one's generation did not stop) exits.
        ctrlc::set_handler(move || {
            if flag.swap(true, Ordering::SeqCst) {
                std::process::exit(super::chat::EXIT_INTERRUPTED);
            }
        })
        .context("installing the Ctrl-C handler")?;
    }
    let printer = Printer::new(interrupted, !args.json);
    local.generate(
        tokens,
        params,
        Box::new(printer.clone()),
        memory.map(|s| engine::JobMemory::new(s, false)),
    );
    let printed = printer.take();
    if let Some(e) = &printed.write_error {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Ok(()); // `run ... | head`: the reader has what it wanted
        }
        return Err(anyhow::anyhow!("writing the output: {e}"));
    }
    let finish = match printed.end {
        Some(Ok(f)) => f,
        Some(Err(JobError::PromptTooLong { tokens, n_ctx })) => bail!(
            "the prompt is {tokens} tokens, which does not leave room in a context of {n_ctx}"
        ),
        Some(Err(e)) => bail!("{e}"),
        None => bail!("the generation ended without a result"),
    };
    if !args.json {
        let mut stdout = std::io::stdout().lock();
        if let Err(e) = writeln!(stdout).and_then(|()| stdout.flush()) {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                return Err(anyhow::anyhow!("writing the output: {e}"));
            }
        }
    }
    if let (Some(m), Some(path)) = (&finish.memory, &args.memory) {
        super::memory::log_use(path, m);
        if args.verbose_prompt {
            let text = vocab.decode_with(
                &m.view.tokens,
                tokenize::DecodeOptions {
                    unparse_special: true,
                    keep_spaces: true,
                    ..Default::default()
                },
            );
            eprintln!(
                "cachefit: the memory's part of the prompt, {} tokens:\n{}",
                m.view.tokens.len(),
                String::from_utf8_lossy(&text)
            );
        }
    }
    match finish.reason {
        FinishReason::ContextFull => eprintln!("cachefit: context of {n_ctx} tokens is full"),
        FinishReason::Cancelled => eprintln!("[interrupted]"),
        _ => {}
    }

    let prompt_ms = finish.prompt_time.as_secs_f64() * 1000.0;
    let gen_ms = finish.generation_time.as_secs_f64() * 1000.0;
    let generated = finish.completion_tokens;
    let rate = |n: usize, ms: f64| {
        if ms > 0.0 {
            n as f64 * 1000.0 / ms
        } else {
            0.0
        }
    };
    if args.json {
        outln!(
            "{}",
            json!({
                "text": printed.text,
                "prompt_tokens": n_prompt,
                "generated_tokens": generated,
                "stop": finish.reason.name(),
                "stop_string": finish.stop_string,
                "n_ctx": n_ctx,
                "threads": threads,
                "threads_batch": threads_batch,
                "seed": finish.seed,
                "logprobs": args.logprobs.map(|_| logprobs_json(&printed.logprobs)),
                "load_ms": load_ms,
                "prompt_ms": prompt_ms,
                "prompt_tok_s": rate(n_prompt, prompt_ms),
                "gen_ms": gen_ms,
                "gen_tok_s": rate(generated, gen_ms),
                "speculation": (args.gen.lookup || args.gen.model_draft.is_some()).then(|| {
                    let s = finish.speculation;
                    json!({
                        "drafts": s.drafts,
                        "drafted": s.drafted,
                        "accepted": s.accepted,
                        "draft_model_passes": local.scheduler.backend().draft_passes(),
                    })
                }),
                "memory": finish.memory.as_ref().map(|m| {
                    let v = &m.view;
                    json!({
                        "history_tokens": m.history_tokens,
                        "context_tokens": v.tokens.len(),
                        "sinks": v.sinks,
                        "hot": v.hot,
                        "recalled_tokens": v.recalled_tokens,
                        "recalled_blocks": v.recalled,
                        "recalled_text": vocab.decode(&v.tokens[v.sinks + v.hot..]),
                        "recall_ms": v.recall_time.as_secs_f64() * 1e3,
                    })
                }),
            })
        );
    } else {
        eprintln!();
        eprintln!("cachefit: load time        = {load_ms:10.2} ms");
        eprintln!(
            "cachefit: prompt eval time = {prompt_ms:10.2} ms / {n_prompt:5} tokens ({:8.2} tokens per second)",
            rate(n_prompt, prompt_ms)
        );
        eprintln!(
            "cachefit:        eval time = {gen_ms:10.2} ms / {generated:5} tokens ({:8.2} tokens per second)",
            rate(generated, gen_ms)
        );
        eprintln!("cachefit:       total time = {:10.2} ms", ms(t_start));
    }
    Ok(())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// `--logprobs`: per token its id, text, log-probability and alternatives.
fn logprobs_json(entries: &[engine::TokenLogprob]) -> serde_json::Value {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    entries
        .iter()
        .map(|e| {
            let top: Vec<_> = e
                .top
                .iter()
                .map(|t| json!({"id": t.token, "token": text(&t.bytes), "logprob": t.logprob}))
                .collect();
            json!({"id": e.token, "token": text(&e.bytes), "logprob": e.logprob, "top_logprobs": top})
        })
        .collect()
}
