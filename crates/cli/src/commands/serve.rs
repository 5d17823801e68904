//! `cachefit serve -m FILE`: an OpenAI-compatible HTTP server
//! (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`,
//! `/metrics`). Thin: flags, loading and the memory check here; the server
//! itself is the `server` crate.

use super::common::{self, ContextArgs, ModelArgs};
use super::generate::GenArgs;
use anyhow::{bail, Context, Result};
use model::MemoryEstimate;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// `-c` is the context of each slot.
    #[command(flatten)]
    pub ctx: ContextArgs,
    /// Sampling and stop flags set the defaults of requests that do not
    /// set them (`-n`: the default `max_tokens`).
    #[command(flatten)]
    pub gen: GenArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is logged).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Slots: requests generated together, each with its own KV cache.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Requests that may wait for a slot; more get 503 with Retry-After.
    #[arg(long = "max-queue", default_value_t = 64)]
    pub max_queue: usize,
    /// Largest request body in bytes; larger ones get 413.
    #[arg(long = "max-body", default_value_t = 4 << 20)]
    pub max_body: usize,
    /// Seconds running requests get to finish after SIGINT/SIGTERM.
    #[arg(long = "shutdown-timeout", default_value_t = 10.0)]
    pub shutdown_timeout: f64,
    /// Model name in responses and /v1/models (default: the file name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Milliseconds between a stream's text events: tokens generated
    /// sooner go out together (0 = an event per token).
    #[arg(long = "stream-interval", value_name = "MS", default_value_t = 10.0)]
    pub stream_interval: f64,
}

pub fn run(args: Args) -> Result<()> {
    args.gen.check()?;
    if args.gen.n_predict == 0 {
        bail!("-n must be positive, or -1 for no limit");
    }
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    // Every request passes through the queue, however briefly.
    if args.max_queue == 0 {
        bail!("--max-queue must be at least 1");
    }
    if !(args.shutdown_timeout.is_finite() && args.shutdown_timeout >= 0.0) {
        bail!("--shutdown-timeout must be a number of seconds, at least 0");
    }
    if !(args.stream_interval.is_finite() && (0.0..=60_000.0).contains(&args.stream_interval)) {
        bail!("--stream-interval must be a number of milliseconds from 0 to 60000");
    }
    let choice = common::threads_for(&args.model)?;
    let threads_batch = common::threads_batch(args.model.threads_batch, choice.n)?;
    let opened = common::open_model(&args.model)?;
    let path = args.model.shown();
    let mut opts = common::state_options(&opened, &args.ctx, false)?;
    // Every busy slot puts one token into each decode pass.
    opts.n_seq = args.parallel;
    opts.n_batch = opts.n_batch.max(args.parallel);
    let weights_bytes: u64 = opened.file.tensors().iter().map(|t| t.n_bytes).sum();
    if let Some(avail) = model::mem_available() {
        MemoryEstimate::for_state(&opened.cfg, weights_bytes, &opts)
            .check(avail)
            .with_context(|| format!("{} slots of {} tokens", opts.n_seq, opts.n_ctx))?;
    }
    let model_name = args
        .alias
        .clone()
        .unwrap_or_else(|| match &args.model.model {
            Some(p) => p
                .file_name()
                .map_or_else(|| path.clone(), |n| n.to_string_lossy().into_owned()),
            None => super::builtin::NAME.to_string(),
        });
    eprintln!(
        "cachefit: {path} ({}, {} layers), {} KV cache, {}, kernels {}",
        opened.cfg.arch.name(),
        opened.cfg.n_layers,
        opts.kv_type,
        common::describe_threads(choice.n, &choice.reason, threads_batch),
        kernels::selected().isa().name()
    );
    let config = server::Config {
        host: args.host,
        port: args.port,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        max_queue: args.max_queue,
        max_body_bytes: args.max_body,
        shutdown_timeout: Duration::from_secs_f64(args.shutdown_timeout),
        threads: choice.n,
        threads_batch,
        model_name,
        stream_interval: Duration::from_secs_f64(args.stream_interval / 1000.0),
        defaults: args.gen.params(opts.n_ctx),
    };
    server::serve(&opened.file, &opened.cfg, opened.vocab, &opts, config)
        .with_context(|| format!("serving {path}"))
}
