//! `cachefit run [-m FILE] [-p] PROMPT`: load a model (default: the
//! built-in one), evaluate the prompt and stream the continuation to
//! stdout; timings on stderr like llama.cpp.
//!
//! The prompt is evaluated in batches of `-b` tokens, then one token per
//! step. Sampling is greedy unless `--temp` > 0; penalties, min-p and stop
//! strings as in llama.cpp's `llama-cli`.

use super::common::{self, ContextArgs, ModelArgs};
use anyhow::{bail, Context, Result};
use engine::{Sampler, SamplerConfig, StopConditions, StopMatcher};
use model::{forward, forward_batch, Logits, State, Weights};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub ctx: ContextArgs,
    /// Prompt text.
    #[arg(short = 'p', long, conflicts_with_all = ["file", "text"])]
    pub prompt: Option<String>,
    /// The prompt, as a plain argument (`cachefit run "ROMEO:"`).
    #[arg(value_name = "PROMPT", conflicts_with = "file")]
    pub text: Option<String>,
    /// Read the prompt from a UTF-8 file.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1: until an end-of-generation token or the
    /// context is full).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Sampling seed (default: random).
    #[arg(short = 's', long)]
    pub seed: Option<u32>,
    /// Temperature; 0 (the default) samples greedily.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
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
    /// Tokens the penalties look back over (0: off, -1: the context).
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i64,
    /// Subtract this times a token's count in the window (0: off).
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Subtract this once from every token in the window (0: off).
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Stop when the output contains this text (not printed); repeatable.
    #[arg(long = "stop", visible_alias = "reverse-prompt", short = 'r')]
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON line (text, token counts, timings) instead of
    /// streaming.
    #[arg(long)]
    pub json: bool,
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

fn check_sampling(args: &Args) -> Result<()> {
    let finite = [
        ("--temp", args.temp),
        ("--top-p", args.top_p),
        ("--min-p", args.min_p),
        ("--repeat-penalty", args.repeat_penalty),
        ("--frequency-penalty", args.frequency_penalty),
        ("--presence-penalty", args.presence_penalty),
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
    if args.repeat_last_n < -1 {
        bail!("--repeat-last-n must be -1 (the whole context), 0 (off) or positive");
    }
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    let t_start = Instant::now();
    let prompt = read_prompt(&args)?;
    check_sampling(&args)?;
    let pools = common::Pools::from_args(&args.model)?;
    let threads = pools.decode().n_threads();
    let opened = common::open_model(&args.model)?;
    let (cfg, vocab) = (&opened.cfg, &opened.vocab);
    let path = args.model.shown();
    let opts = common::state_options(&opened, &args.ctx, false)?;
    let n_ctx = opts.n_ctx;
    let weights = Weights::from_gguf(&opened.file, cfg).with_context(|| path.clone())?;
    let mut state = State::with_options(cfg, &weights, &opts)?;
    let load_ms = ms(t_start);
    eprintln!(
        "cachefit: {} ({}, {} layers), ctx {n_ctx}, {} KV cache, batch {}, {}, kernels {}",
        path,
        cfg.arch.name(),
        cfg.n_layers,
        opts.kv_type,
        opts.n_batch,
        pools.describe(),
        kernels::isa::selected().name()
    );

    let tokens = vocab.encode(&prompt, true, true);
    if tokens.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    if tokens.len() >= n_ctx {
        bail!(
            "the prompt is {} tokens, which does not leave room in a context of {n_ctx} (use a larger -c or a shorter prompt)",
            tokens.len()
        );
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        bail!(
            "token {bad} from the tokenizer is outside the model's vocabulary of {}",
            cfg.vocab_size
        );
    }
    if args.n_predict == 0 {
        eprintln!("cachefit: -n 0: nothing to generate");
        if args.json {
            println!(
                "{}",
                json!({"text": "", "prompt_tokens": tokens.len(), "generated_tokens": 0,
                       "stop": "length", "load_ms": load_ms})
            );
        }
        return Ok(());
    }

    // Prompt, in batches of -b tokens.
    let t_prompt = Instant::now();
    for (i, chunk) in tokens.chunks(opts.n_batch).enumerate() {
        forward_batch(
            cfg,
            &weights,
            &mut state,
            pools.batch(),
            chunk,
            i * opts.n_batch,
            Logits::Last,
        );
    }
    let prompt_ms = ms(t_prompt);

    let penalty_last_n = match args.repeat_last_n {
        -1 => n_ctx,
        n => n as usize,
    };
    let mut sampler = Sampler::new(SamplerConfig {
        temp: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        frequency_penalty: args.frequency_penalty,
        presence_penalty: args.presence_penalty,
        penalty_last_n,
        seed: args.seed,
        ..SamplerConfig::greedy()
    });
    // The prompt counts for the penalties, as in llama.cpp.
    for &t in &tokens {
        sampler.accept(t);
    }
    let stop = StopConditions {
        eog_tokens: vocab.eog_tokens().to_vec(),
        stop_strings: args.stop.clone(),
        ignore_eos: args.ignore_eos,
    };
    let mut matcher = StopMatcher::new(&args.stop);
    let mut shown = String::new();
    let mut stream = vocab.stream_decoder();
    let mut text = String::new();
    let mut stdout = std::io::stdout().lock();
    let limit = if args.n_predict < 0 {
        usize::MAX
    } else {
        args.n_predict as usize
    };
    let mut pos = tokens.len();
    let mut generated = 0usize;
    let t_gen = Instant::now();
    let stop_reason = loop {
        let logits = state.logits_mut();
        stop.suppress_eog(logits);
        let tok = sampler.sample(logits);
        if stop.stops_at(tok) {
            break "eog";
        }
        sampler.accept(tok);
        generated += 1;
        let piece = stream.push(tok);
        shown.clear();
        let hit_stop = matcher.push(&piece, &mut shown);
        if args.json {
            text.push_str(&shown);
        } else {
            stdout.write_all(shown.as_bytes())?;
            stdout.flush()?;
        }
        if hit_stop {
            break "stop";
        }
        if generated >= limit {
            break "length";
        }
        if pos >= n_ctx {
            break "context";
        }
        forward(cfg, &weights, &mut state, pools.decode(), tok, pos);
        pos += 1;
    };
    let gen_ms = ms(t_gen);
    shown.clear();
    if stop_reason != "stop" {
        matcher.push(&stream.finish(), &mut shown);
        matcher.finish(&mut shown);
    }
    let tail = &shown;
    if args.json {
        text.push_str(tail);
    } else {
        stdout.write_all(tail.as_bytes())?;
        writeln!(stdout)?;
    }
    drop(stdout);
    if stop_reason == "context" {
        eprintln!("cachefit: context of {n_ctx} tokens is full");
    }

    let rate = |n: usize, ms: f64| {
        if ms > 0.0 {
            n as f64 * 1000.0 / ms
        } else {
            0.0
        }
    };
    if args.json {
        println!(
            "{}",
            json!({
                "text": text,
                "prompt_tokens": tokens.len(),
                "generated_tokens": generated,
                "stop": stop_reason,
                "stop_string": matcher.matched(),
                "n_ctx": n_ctx,
                "threads": threads,
                "threads_batch": pools.batch().n_threads(),
                "seed": sampler.seed(),
                "load_ms": load_ms,
                "prompt_ms": prompt_ms,
                "prompt_tok_s": rate(tokens.len(), prompt_ms),
                "gen_ms": gen_ms,
                "gen_tok_s": rate(generated, gen_ms),
            })
        );
    } else {
        eprintln!();
        eprintln!("cachefit: load time        = {load_ms:10.2} ms");
        eprintln!(
            "cachefit: prompt eval time = {prompt_ms:10.2} ms / {:5} tokens ({:8.2} tokens per second)",
            tokens.len(),
            rate(tokens.len(), prompt_ms)
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
