//! `cachefit serve`: an OpenAI-compatible HTTP server over the model.
//!
//! Two sides joined by channels. The engine thread runs the session
//! engine's [`engine::Scheduler`] (the same loop `cachefit run` and `chat`
//! use) over one [`model::State`] (borrowing the model) with a KV cache per slot,
//! and the kernel thread pool; each step it runs one batched forward pass
//! over every busy slot (continuous batching: requests join and leave
//! between steps). The HTTP side ([`http`], axum on a single-threaded
//! tokio runtime) parses requests ([`api`]), renders chat templates and
//! tokenizes, sends an [`engine::Job`] down a std channel, and answers
//! from the job's event channel ([`events`]), whole or streamed as
//! server-sent events. It never waits on a forward pass, and a bounded
//! queue turns overload into 503s with `Retry-After`.
//!
//! ```text
//! client ─HTTP─▶ axum handler ─Job─▶ engine thread: queue → slots → forward_tokens
//!        ◀─SSE── event receiver ◀─Text/Done─┘
//! ```
//!
//! SIGINT/SIGTERM: stop accepting, let running requests finish, and at
//! the deadline end whatever is left ([`engine::Msg::CancelAll`]); then
//! the engine thread drains and [`serve`] returns.
//!
//! A second SIGINT/SIGTERM exits at once. If the model file changes on
//! disk while mapped ([`mapguard`]), every queued and running request
//! fails with 503, the server stops, and [`serve`] returns
//! [`Error::ModelChanged`] (the process exits non-zero; a supervisor
//! restarts it on the new file).
//!
//! Layout: [`api`] (OpenAI request/response shapes), [`conn`] (accept
//! loop, timeouts, connection cap), [`http`] (routes, auth, SSE),
//! [`webui`] (the chat page at `/`), [`cors`] (`--cors-origin`),
//! [`events`] (the engine's output as a channel), [`metrics`]
//! (Prometheus text), [`error`]. HTTP status codes are chosen here only.

pub mod access_log;
pub mod api;
pub mod choices;
pub mod conn;
pub mod cors;
mod embeddings;
pub mod error;
pub mod events;
pub mod http;
pub mod metrics;
pub mod structured;
pub mod tools;
mod utility;
mod webui;

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use chat::ChatTemplate;
use engine::{GenParams, ModelBackend, Msg, Scheduler, Stats};
use gguf::GgufFile;
use kernels::pool::ThreadPool;
use model::{Model, ModelConfig, StateOptions};
use tokenize::Vocab;

pub use error::{ApiError, Error};

/// How to serve.
#[derive(Clone, Debug)]
pub struct Config {
    pub host: String,
    /// 0 picks a free port (the address is logged).
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` when set; see
    /// [`check_api_key`].
    pub api_key: Option<String>,
    /// Requests waiting for a slot before new ones get 503.
    pub max_queue: usize,
    pub max_body_bytes: usize,
    /// Time for a request's whole body to arrive (408 after).
    pub body_timeout: Duration,
    /// Connection timeouts and cap ([`conn::Limits`]).
    pub limits: conn::Limits,
    /// How long running requests may take to finish after SIGINT/SIGTERM.
    pub shutdown_timeout: Duration,
    /// Kernel threads of the engine for decode-only steps.
    pub threads: usize,
    /// Kernel threads for steps that read prompt tokens (llama.cpp's
    /// `--threads-batch`); a second pool only when it differs from
    /// `threads`.
    pub threads_batch: usize,
    /// The name `/v1/models` gives.
    pub model_name: String,
    /// Parse control tokens written in chat messages (trusted clients
    /// only: otherwise a message forges turns); see [`chat::prompt`].
    pub special_in_messages: bool,
    /// A streamed generation's text goes out at most this often (zero:
    /// one event per token); see [`engine::DEFAULT_STREAM_INTERVAL`].
    pub stream_interval: Duration,
    /// How requests generate unless they say otherwise.
    pub defaults: GenParams,
    /// Per-conversation memory files live here (`--memory-dir`), chosen by
    /// a request's `memory` (or `user`) field.
    pub memory_dir: Option<std::path::PathBuf>,
    pub memory: engine::memory::MemoryConfig,
    /// One line per request on stderr: text, json or off (`--log-format`).
    pub log_format: access_log::LogFormat,
    /// How `/v1/embeddings` pools token states (`--pooling`); `None`: as
    /// the file says (`{arch}.pooling_type`), else mean.
    pub pooling: Option<engine::embed::Pooling>,
    /// Serve the chat page at `/` ([`webui`]); off with `--no-webui`.
    pub webui: bool,
    /// Origins allowed to call the API from a browser (`--cors-origin`,
    /// [`cors::Cors::parse`]); `None`: no CORS headers.
    pub cors: Option<cors::Cors>,
}

/// Serve the model until SIGINT/SIGTERM. `opts.n_seq` is the number of
/// slots and `opts.n_ctx` each slot's context; `opts.n_batch` must be at
/// least `opts.n_seq`.
pub fn serve(
    file: &GgufFile,
    cfg: &ModelConfig,
    vocab: Vocab,
    opts: &StateOptions,
    draft: Option<(&GgufFile, &ModelConfig)>,
    config: Config,
) -> Result<(), Error> {
    if opts.n_seq == 0 {
        return Err(Error::NoSlots);
    }
    if let Some(key) = &config.api_key {
        check_api_key(key)?;
    }
    let vocab = Arc::new(vocab);
    let template = chat_template(file, &vocab);
    // Before binding: binding may release pages the hash would read again.
    let memories = config.memory_dir.as_ref().map(|_| {
        let fingerprint = engine::memory::fingerprint(file, &vocab);
        let id_bytes = if vocab.len() <= 1 << 16 { 2 } else { 4 };
        engine::memory::Memories::new(
            fingerprint,
            engine::memory::HeadShape::of(cfg),
            id_bytes,
            config.memory,
        )
    });
    let model = Model::from_gguf(file, cfg)?;
    let state = model.new_state(opts)?;
    // A draft model (`-md`) guesses for every slot, from its own caches.
    let draft_model = draft.map(|(f, c)| Model::from_gguf(f, c)).transpose()?;
    let draft_state = draft_model
        .as_ref()
        .map(|m| engine::draft::DraftModel::new(m, opts))
        .transpose()?;
    let addr = format!("{}:{}", config.host, config.port);
    let listener = TcpListener::bind(&addr).map_err(|source| Error::Bind {
        addr: addr.clone(),
        source,
    })?;
    let local = listener.local_addr().map_err(|source| Error::Bind {
        addr: addr.clone(),
        source,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| Error::Bind { addr, source })?;

    let stats = Arc::new(Stats::new(opts.n_seq));
    let metrics = Arc::new(metrics::Metrics::new(stats.clone()));
    let (jobs, rx) = mpsc::channel();
    let (embed_tx, embed_rx) = mpsc::channel();
    let pooling = config
        .pooling
        .or_else(|| engine::embed::Pooling::of_file(file.metadata()))
        .unwrap_or(engine::embed::Pooling::Mean);
    let app = Arc::new(http::App {
        api_key: config.api_key.clone(),
        max_queue: config.max_queue,
        max_body_bytes: config.max_body_bytes,
        body_timeout: config.body_timeout,
        model_name: config.model_name.clone(),
        vocab: vocab.clone(),
        turn_end: engine::prompt::turn_end(&template, &vocab),
        template: Arc::new(template),
        special: if config.special_in_messages {
            chat::Special::Parse
        } else {
            chat::Special::Text
        },
        defaults: config.defaults.clone(),
        memory_root: config
            .memory_dir
            .as_ref()
            .map(|d| d.join(memory_namespace(config.api_key.as_deref()))),
        jobs,
        metrics: metrics.clone(),
        n_ctx: opts.n_ctx,
        n_vocab: cfg.vocab_size,
        created: http::unix_time(),
        next_id: AtomicU64::new(1),
        shutting_down: AtomicBool::new(false),
        log_format: config.log_format,
        grammars: std::sync::OnceLock::new(),
        embed: Some(embed_tx),
        embedding_dim: cfg.dim,
        webui: config.webui,
        cors: config.cors.clone(),
    });
    // A fault in the mapped model file: fail every request at once, then
    // stop (the engine also checks after each forward pass, so nothing
    // computed from the zeroed pages is sampled).
    let fault = Arc::new(tokio::sync::Notify::new());
    {
        let fault = fault.clone();
        mapguard::set_fault_handler(move |_| fault.notify_one()).map_err(Error::Runtime)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;

    let model = &model;
    std::thread::scope(|scope| -> Result<(), Error> {
        let engine_vocab = vocab.clone();
        let (threads, threads_batch) = (config.threads, config.threads_batch);
        let stream_interval = config.stream_interval;
        let engine = std::thread::Builder::new()
            .name("engine".into())
            .spawn_scoped(scope, move || {
                let pool = ThreadPool::new(threads);
                let batch_pool = (threads_batch != threads).then(|| ThreadPool::new(threads_batch));
                let mut backend =
                    ModelBackend::new(cfg, model, state, pool, batch_pool, &engine_vocab);
                if let Some(d) = draft_state {
                    backend = backend.with_draft(d);
                }
                let mut scheduler = Scheduler::new(backend);
                if let Some(m) = memories {
                    scheduler = scheduler.with_memories(m);
                }
                scheduler
                    .with_stats(stats)
                    .with_stream_interval(stream_interval)
                    .run(rx);
            })
            .map_err(Error::Thread)?;
        // Embeddings on a state and thread of their own (one kernel thread:
        // generation keeps the rest), the state made on first use.
        let embed_opts = StateOptions {
            n_seq: 1,
            draft_rows: 0,
            ..*opts
        };
        let embedder = engine::embed::Embedder::new(model, embed_opts, pooling, 1);
        let embed_thread = std::thread::Builder::new()
            .name("embed".into())
            .spawn_scoped(scope, move || embeddings::run(embedder, embed_rx))
            .map_err(Error::Thread)?;
        eprintln!(
            "cachefit: {} slot{}, ctx {} per slot, batch {}, queue {}, {} thread{}{}",
            opts.n_seq,
            if opts.n_seq == 1 { "" } else { "s" },
            opts.n_ctx,
            opts.n_batch,
            config.max_queue,
            config.threads,
            if config.threads == 1 { "" } else { "s" },
            if config.threads_batch == config.threads {
                String::new()
            } else {
                format!(", {} for prompts", config.threads_batch)
            }
        );
        eprintln!(
            "cachefit: at most {} connections; timeouts: header {} s, body {} s, idle {} s",
            config.limits.max_connections,
            config.limits.header_timeout.as_secs_f64(),
            config.body_timeout.as_secs_f64(),
            config.limits.idle_timeout.as_secs_f64()
        );
        eprintln!("cachefit: listening on http://{local}");
        if config.webui {
            eprintln!("cachefit: chat page at http://{local}/ (--no-webui turns it off)");
        }
        let result = runtime.block_on(run_http(
            listener,
            app.clone(),
            config.limits,
            config.shutdown_timeout,
            fault,
        ));
        // Connections the deadline gave up on hold the App: drop them, then
        // ours, so the engine sees its channel close.
        runtime.shutdown_timeout(Duration::from_secs(1));
        drop(app);
        let _ = engine.join();
        let _ = embed_thread.join();
        eprintln!("cachefit: stopped");
        result?;
        match mapguard::faulted() {
            Some(fault) => Err(Error::ModelChanged(fault.to_string())),
            None => Ok(()),
        }
    })
}

/// Refuse an API key that cannot protect anything: empty (it used to turn
/// authentication off silently) or with bytes a header cannot carry
/// as-is (non-ASCII or control characters, which would never match).
pub fn check_api_key(key: &str) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::BadApiKey(
            "the API key is empty; give a non-empty key, or no --api-key to serve without one"
                .into(),
        ));
    }
    if let Some(c) = key.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(Error::BadApiKey(format!(
            "the API key contains {c:?}; use printable ASCII without spaces (as a Bearer token can carry)"
        )));
    }
    Ok(())
}

/// The folder of `--memory-dir` a key's memories live in: a hash of the
/// key, so clients of one key never name another key's files, and memories
/// made under a key stay unreadable after it changes.
fn memory_namespace(key: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    match key {
        Some(k) => {
            let h = Sha256::digest(k.as_bytes());
            format!(
                "key-{}",
                h[..8]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            )
        }
        None => "open".to_string(),
    }
}

fn chat_template(file: &GgufFile, vocab: &Vocab) -> ChatTemplate {
    let text = |id: Option<u32>| id.and_then(|i| vocab.token_text(i));
    let (bos, eos) = (text(vocab.bos()), text(vocab.eos()));
    let template = ChatTemplate::from_gguf(file.metadata(), bos, eos).unwrap_or_else(|e| {
        eprintln!("cachefit: warning: the model's chat template does not compile ({e})");
        ChatTemplate::chatml_fallback(bos, eos).expect("the ChatML template compiles")
    });
    if let Some(notice) = template.fallback_notice() {
        eprintln!("cachefit: {notice}");
    }
    template
}

async fn run_http(
    listener: TcpListener,
    app: Arc<http::App>,
    limits: conn::Limits,
    shutdown_timeout: Duration,
    fault: Arc<tokio::sync::Notify>,
) -> Result<(), Error> {
    let listener = tokio::net::TcpListener::from_std(listener).map_err(Error::Runtime)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopping = {
        let app = app.clone();
        async move {
            tokio::select! {
                why = wait_for_signal() => {
                    eprintln!(
                        "cachefit: {why}: no new connections; waiting up to {:.0} s for running requests (again to exit now)",
                        shutdown_timeout.as_secs_f64()
                    );
                    tokio::spawn(async {
                        let again = wait_for_signal().await;
                        eprintln!("cachefit: second {again}: exiting now");
                        std::process::exit(if again == "SIGINT" { 130 } else { 143 });
                    });
                }
                () = fault.notified() => {
                    let why = mapguard::faulted().map_or_else(
                        || "the model file changed on disk while in use".to_string(),
                        |f| f.to_string(),
                    );
                    eprintln!("cachefit: error: {why}; failing every request and stopping");
                    let _ = app.jobs.send(Msg::CancelAll(why));
                }
            }
            app.shutting_down.store(true, Ordering::Relaxed);
            let _ = stop_tx.send(true);
        }
    };
    tokio::spawn(stopping);
    let deadline = {
        let mut rx = stop_rx.clone();
        let app = app.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
            tokio::time::sleep(shutdown_timeout).await;
            eprintln!("cachefit: shutdown deadline: ending the requests still running");
            let _ = app
                .jobs
                .send(Msg::CancelAll("the server is shutting down".into()));
            // Time for their handlers to answer before connections are cut.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    };
    let server = conn::serve(listener, http::router(app), limits, stop_rx);
    tokio::select! {
        () = server => Ok(()),
        () = deadline => Ok(()),
    }
}

/// Resolves on SIGINT or SIGTERM and says which.
async fn wait_for_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                "SIGINT"
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "interrupt"
    }
}
