//! `cachefit run -m FILE -p PROMPT`: load a model, evaluate the prompt and
//! stream the continuation to stdout; timings on stderr like llama.cpp.
//!
//! The prompt is evaluated one token at a time through the decode path (no
//! batched prefill yet). Sampling is greedy unless `--temp` > 0.

use anyhow::{bail, Context, Result};
use engine::{Sampler, SamplerConfig, StopConditions};
use gguf::{GgufFile, OpenOptions};
use kernels::pool::ThreadPool;
use model::{forward, MemoryEstimate, ModelConfig, State, Weights};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Context used when `-c` is not given, if the model allows that much.
const DEFAULT_CTX: usize = 4096;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file.
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Prompt text.
    #[arg(
        short = 'p',
        long,
        conflicts_with = "file",
        required_unless_present = "file"
    )]
    pub prompt: Option<String>,
    /// Read the prompt from a UTF-8 file.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1: until an end-of-generation token or the
    /// context is full).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Context size in tokens (default: the model's, at most 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Threads (default: available parallelism).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Sampling seed (default: random).
    #[arg(long)]
    pub seed: Option<u32>,
    /// Temperature; 0 (the default) samples greedily.
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Lock the model's pages in RAM.
    #[arg(long)]
    pub mlock: bool,
    /// Read the model into memory instead of memory-mapping it.
    #[arg(long)]
    pub no_mmap: bool,
    /// Print one JSON line (text, token counts, timings) instead of
    /// streaming.
    #[arg(long)]
    pub json: bool,
}

fn read_prompt(args: &Args) -> Result<String> {
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            let bytes =
                std::fs::read(f).with_context(|| format!("reading prompt file {}", f.display()))?;
            String::from_utf8(bytes).map_err(|e| {
                anyhow::anyhow!(
                    "prompt file {} is not valid UTF-8 (at byte {})",
                    f.display(),
                    e.utf8_error().valid_up_to()
                )
            })?
        }
        (None, None) => bail!("no prompt: give -p PROMPT or -f FILE"),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    Ok(prompt)
}

pub fn run(args: Args) -> Result<()> {
    let t_start = Instant::now();
    let prompt = read_prompt(&args)?;
    let threads = match args.threads {
        Some(0) => bail!("-t must be at least 1"),
        Some(t) => t,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };

    let opts = OpenOptions {
        mmap: !args.no_mmap,
        mlock: args.mlock,
        ..Default::default()
    };
    let file = GgufFile::open_with(&args.model, opts)?;
    let path = args.model.display();
    let cfg = ModelConfig::from_gguf(file.metadata())
        .with_context(|| format!("{path}: reading the model config"))?;
    let vocab = tokenize::Vocab::from_gguf(file.metadata())
        .with_context(|| format!("{path}: the model has no usable tokenizer"))?;

    let n_ctx = match args.ctx_size {
        Some(0) => bail!("-c must be at least 1"),
        Some(c) if c > cfg.context_length => bail!(
            "-c {c} is larger than the model's context length {}",
            cfg.context_length
        ),
        Some(c) => c,
        None => cfg.context_length.min(DEFAULT_CTX),
    };
    let weights_bytes: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let need = MemoryEstimate::new(&cfg, weights_bytes, n_ctx);
    if let Some(avail) = model::mem_available() {
        // A mapped file already in the page cache is counted as available,
        // so this errs on the side of letting a load go ahead.
        need.check(avail)?;
    }
    let weights = Weights::from_gguf(&file, &cfg).with_context(|| format!("{path}"))?;
    let pool = ThreadPool::new(threads);
    let mut state = State::new(&cfg, &weights, n_ctx);
    let load_ms = ms(t_start);
    eprintln!(
        "cachefit: {} ({}, {} layers), ctx {n_ctx}, {threads} thread{}{}, kernels {}",
        path,
        cfg.arch.name(),
        cfg.n_layers,
        if threads == 1 { "" } else { "s" },
        if args.threads.is_none() {
            " (available parallelism)"
        } else {
            ""
        },
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

    // Prompt, one token at a time.
    let t_prompt = Instant::now();
    for (pos, &t) in tokens.iter().enumerate() {
        forward(&cfg, &weights, &mut state, &pool, t, pos);
    }
    let prompt_ms = ms(t_prompt);

    let mut sampler = Sampler::new(SamplerConfig {
        temp: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        ..SamplerConfig::greedy()
    });
    let stop = StopConditions {
        eog_tokens: vocab.eog_tokens().to_vec(),
        stop_strings: Vec::new(),
        ignore_eos: args.ignore_eos,
    };
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
        if args.json {
            text.push_str(&piece);
        } else {
            stdout.write_all(piece.as_bytes())?;
            stdout.flush()?;
        }
        if generated >= limit {
            break "length";
        }
        if pos >= n_ctx {
            break "context";
        }
        forward(&cfg, &weights, &mut state, &pool, tok, pos);
        pos += 1;
    };
    let gen_ms = ms(t_gen);
    let tail = stream.finish();
    if args.json {
        text.push_str(&tail);
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
                "n_ctx": n_ctx,
                "threads": threads,
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
