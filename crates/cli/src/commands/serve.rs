//! `cachefit serve -m FILE`: an OpenAI-compatible HTTP server
//! (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`,
//! `/metrics`, and a chat page at `/`). Thin: flags, loading and the
//! memory check here; the server itself is the `server` crate.

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
    /// Require `Authorization: Bearer KEY` on every route but /health
    /// (printable ASCII, not empty). Also from `--api-key-file` or the
    /// `CACHEFIT_API_KEY` environment variable, which keep it out of `ps`.
    #[arg(long = "api-key", conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from this file (its first line).
    #[arg(long = "api-key-file", value_name = "FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Parse control tokens (`<|im_end|>`) written in chat messages. Only
    /// for trusted clients: without it message text is always text, so a
    /// user cannot forge turns or a system prompt.
    #[arg(long = "special-in-messages")]
    pub special_in_messages: bool,

    /// One line per request on stderr (method, path, status, prompt and
    /// completion tokens, time): `text`, `json` (one object per line, for
    /// machines) or `off`. /health and /metrics are not logged.
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    pub log_format: server::access_log::LogFormat,

    /// How /v1/embeddings pools the tokens' last hidden states: mean, cls
    /// (the first token) or last, as llama.cpp's --pooling (default: what
    /// the file's `{arch}.pooling_type` says, else mean).
    #[arg(long, value_name = "TYPE")]
    pub pooling: Option<engine::embed::Pooling>,
    /// Seconds a client has to send a request's head, from connecting or
    /// from its first byte.
    #[arg(long = "timeout-header", value_name = "SECS", default_value_t = server::conn::DEFAULT_HEADER_TIMEOUT.as_secs_f64())]
    pub timeout_header: f64,
    /// Seconds a request's whole body may take to arrive (408 after).
    #[arg(long = "timeout-body", value_name = "SECS", default_value_t = server::conn::DEFAULT_BODY_TIMEOUT.as_secs_f64())]
    pub timeout_body: f64,
    /// Seconds a kept-alive connection may wait for its next request.
    #[arg(long = "timeout-idle", value_name = "SECS", default_value_t = server::conn::DEFAULT_IDLE_TIMEOUT.as_secs_f64())]
    pub timeout_idle: f64,
    /// Most connections open at once (lowered to fit `ulimit -n`); beyond,
    /// the longest-idle connection is closed, or the new one gets 503.
    #[arg(long = "max-connections", value_name = "N", default_value_t = server::conn::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
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
    /// Give each conversation a memory file in this folder, named by a
    /// request's `memory` field (or OpenAI's `user`): its prompts see that
    /// history and every exchange is appended. With an API key, files live
    /// in a subfolder named by a hash of the key.
    #[arg(long = "memory-dir", value_name = "DIR")]
    pub memory_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub mem: super::memory::MemoryArgs,
    /// Do not serve the chat page at / (it then answers 404 like any
    /// unknown path).
    #[arg(long = "no-webui")]
    pub no_webui: bool,
    /// Let web pages from ORIGIN call the API from a browser
    /// (scheme://host[:port], or * for any; repeat the flag or give a comma
    /// list). Off by default: no CORS headers at all.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origin: Vec<String>,
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
    let secs = |flag: &str, v: f64| -> Result<Duration> {
        if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
            bail!("{flag} must be a number of seconds above 0 and at most 86400");
        }
        Ok(Duration::from_secs_f64(v))
    };
    let header_timeout = secs("--timeout-header", args.timeout_header)?;
    let body_timeout = secs("--timeout-body", args.timeout_body)?;
    let idle_timeout = secs("--timeout-idle", args.timeout_idle)?;
    if args.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    let max_connections = server::conn::connection_cap(args.max_connections);
    if max_connections < args.max_connections
        && args.max_connections != server::conn::DEFAULT_MAX_CONNECTIONS
    {
        eprintln!(
            "cachefit: warning: --max-connections {} lowered to {max_connections} to fit the open-file limit (ulimit -n)",
            args.max_connections
        );
    }
    let api_key = api_key(&args)?;
    let cors = server::cors::Cors::parse(&args.cors_origin)
        .map_err(|e| anyhow::anyhow!("--cors-origin: {e}"))?;
    let choice = common::threads_for(&args.model)?;
    let threads_batch = common::threads_batch(args.model.threads_batch, choice.n)?;
    let opened = common::open_model(&args.model)?;
    let path = args.model.shown();
    let mut opts = common::state_options(&opened, &args.ctx, false)?;
    // Every busy slot puts one token into each decode pass.
    opts.n_seq = args.parallel;
    opts.n_batch = opts.n_batch.max(args.parallel);
    opts.draft_rows = args.gen.draft_rows(args.parallel);
    let weights_bytes: u64 = opened.file.tensors().iter().map(|t| t.n_bytes).sum();
    if let Some(avail) = model::mem_available() {
        MemoryEstimate::for_state(&opened.cfg, weights_bytes, &opts)
            .check(avail)
            .with_context(|| format!("{} slots of {} tokens", opts.n_seq, opts.n_ctx))?;
    }
    let model_name = args
        .alias
        .clone()
        .unwrap_or_else(|| match &args.model.resolved_path() {
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
        api_key,
        max_queue: args.max_queue,
        max_body_bytes: args.max_body,
        body_timeout,
        limits: server::conn::Limits {
            header_timeout,
            idle_timeout,
            max_connections,
        },
        shutdown_timeout: Duration::from_secs_f64(args.shutdown_timeout),
        threads: choice.n,
        threads_batch,
        model_name,
        special_in_messages: args.special_in_messages,
        stream_interval: Duration::from_secs_f64(args.stream_interval / 1000.0),
        defaults: args.gen.params(opts.n_ctx),
        memory_dir: args.memory_dir.clone(),
        memory: args.mem.config(),
        log_format: args.log_format,
        pooling: args.pooling,
        webui: !args.no_webui,
        cors,
    };
    let draft = super::generate::open_draft(&args.gen, &args.model, &opened)?;
    server::serve(
        &opened.file,
        &opened.cfg,
        opened.vocab,
        &opts,
        draft.as_ref().map(|d| (&d.file, &d.cfg)),
        config,
    )
    .with_context(|| format!("serving {path}"))
}

/// The API key from `--api-key`, `--api-key-file` or `CACHEFIT_API_KEY`
/// (in that order), checked: an empty or unusable key is an error, never
/// a server without authentication.
fn api_key(args: &Args) -> Result<Option<String>> {
    let (key, from) = if let Some(k) = &args.api_key {
        (k.clone(), "--api-key".to_string())
    } else if let Some(path) = &args.api_key_file {
        let text = common::read_bounded(path, 4096)
            .with_context(|| format!("--api-key-file {}", path.display()))?;
        let first = text.lines().next().unwrap_or("").trim_end_matches('\r');
        (
            first.to_string(),
            format!("--api-key-file {}", path.display()),
        )
    } else if let Some(k) = std::env::var_os("CACHEFIT_API_KEY") {
        let k = k
            .into_string()
            .map_err(|_| anyhow::anyhow!("CACHEFIT_API_KEY is not valid UTF-8"))?;
        (k, "CACHEFIT_API_KEY".to_string())
    } else {
        return Ok(None);
    };
    server::check_api_key(&key).with_context(|| from)?;
    Ok(Some(key))
}
