//! The HTTP layer (axum on a single-threaded tokio runtime): routes, the
//! API-key check, bounded body reading, prompt building, and answering
//! from the engine's events, whole or as server-sent events.
//!
//! Nothing here waits on a forward pass: a request becomes a [`Job`] sent
//! to the engine thread, and the handler (or the SSE body) awaits the
//! job's event channel. A long body's template rendering and tokenization
//! run on tokio's blocking pool. When a client goes away, hyper drops the
//! handler or the SSE body, which drops the event receiver; the engine sees
//! that at its next step and frees the slot.

use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use chat::ChatTemplate;
use engine::prompt::TurnEnd;
use engine::{GenParams, Job, Msg};
use futures_core::Stream;
use serde_json::{json, Value};
use tokenize::Vocab;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::access_log;
use crate::api::{self, ChatRequest, CompletionRequest, Envelope, Kind, Options, Prompt};
use crate::choices::{self, ChoiceStream, Polled};
use crate::embeddings;
use crate::error::ApiError;
use crate::events::{self, Event};
use crate::metrics::Metrics;
use crate::utility;

/// Most bytes of an over-long body read (and dropped) before answering
/// 413, so the client gets the answer rather than a reset connection.
const MAX_DRAIN_BYTES: usize = 64 << 20;

/// What every handler shares.
pub struct App {
    pub api_key: Option<String>,
    pub max_queue: usize,
    pub max_body_bytes: usize,
    /// Time for a whole body to arrive.
    pub body_timeout: std::time::Duration,
    pub model_name: String,
    pub vocab: Arc<Vocab>,
    pub template: Arc<ChatTemplate>,
    /// Whether control-token text in chat messages is parsed
    /// (`--special-in-messages`, trusted clients only).
    pub special: chat::Special,
    /// What ends a chat reply besides the vocabulary's end tokens
    /// ([`engine::prompt::turn_end`]), as for `cachefit chat`.
    pub turn_end: TurnEnd,
    /// How requests generate unless they say otherwise (the command line).
    pub defaults: GenParams,
    /// Where this key's memory files live (`--memory-dir`/namespace).
    pub memory_root: Option<std::path::PathBuf>,
    pub jobs: Sender<Msg>,
    pub metrics: Arc<Metrics>,
    /// Positions per slot.
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub created: u64,
    pub next_id: AtomicU64,
    pub shutting_down: AtomicBool,
    /// How request lines are logged (`--log-format`).
    pub log_format: access_log::LogFormat,
    /// The model's token trie for structured output, built on the first
    /// request that asks for it ([`crate::structured`]).
    pub grammars: std::sync::OnceLock<Result<engine::GrammarCompiler, engine::ConstraintError>>,
    /// The embedding thread's queue (`/v1/embeddings`).
    pub embed: Option<std::sync::mpsc::Sender<embeddings::EmbedRequest>>,
    /// Width of an embedding.
    pub embedding_dim: usize,
    /// Whether `/` serves the chat page ([`crate::webui`]; `--no-webui`).
    pub webui: bool,
    /// Origins allowed to call from a browser (`--cors-origin`); `None`:
    /// no CORS headers at all.
    pub cors: Option<crate::cors::Cors>,
}

pub fn router(app: Arc<App>) -> Router {
    let page = if app.webui {
        crate::webui::routes()
    } else {
        Router::new()
    };
    Router::new()
        .merge(page)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(utility::model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/tokenize", post(utility::tokenize))
        .route("/detokenize", post(utility::detokenize))
        .route("/props", get(utility::props))
        .route("/slots", get(utility::slots))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

pub fn unix_time() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Routes as metrics label them (anything else is "other", so a scanner
/// cannot grow the label set).
fn route_label(path: &str) -> &'static str {
    match path {
        "/health" => "/health",
        "/metrics" => "/metrics",
        "/v1/models" => "/v1/models",
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        "/v1/embeddings" => "/v1/embeddings",
        "/tokenize" => "/tokenize",
        "/detokenize" => "/detokenize",
        "/props" => "/props",
        "/slots" => "/slots",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        "/" => "/",
        p if p.starts_with("/webui/") => "/webui",
        _ => "other",
    }
}

/// Protocol checks, CORS preflights (before the key: browsers send none
/// on them), the API key (everything but /health and the chat page's
/// static files), CORS headers, response counting, and the request's log
/// line (all but /health and /metrics, which load balancers and scrapers
/// poll).
async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let route = route_label(req.uri().path());
    let (method, path) = (req.method().to_string(), req.uri().path().to_string());
    let started = std::time::Instant::now();
    let tally = Arc::new(access_log::Tally::default());
    let origin = app
        .cors
        .as_ref()
        .and_then(|_| req.headers().get(header::ORIGIN).cloned());
    let open = route == "/health" || (app.webui && crate::webui::is_asset(req.uri().path()));
    let protocol = check_protocol(&req);
    let preflight = match (&app.cors, &protocol) {
        (Some(cors), Ok(())) => cors.preflight(req.method(), req.headers()),
        _ => None,
    };
    let answered_preflight = preflight.is_some();
    let mut response = if let Err(e) = protocol {
        error_response(e)
    } else if let Some(r) = preflight {
        r
    } else if !open && !authorized(&app, req.headers()) {
        error_response(ApiError::unauthorized())
    } else {
        access_log::scope(tally.clone(), next.run(req)).await
    };
    if let (Some(cors), false) = (&app.cors, answered_preflight) {
        cors.decorate(origin.as_ref(), &mut response);
    }
    let status = response.status().as_u16();
    app.metrics.response(route, status);
    if matches!(route, "/health" | "/metrics") {
        return response;
    }
    let line = access_log::Line {
        format: app.log_format,
        method,
        path,
        status,
        started,
        tally,
    };
    access_log::logged(response, line)
}

/// What HTTP/1.1 requires of a request before we look at it: a `Host`
/// header (RFC 9112 §3.2), and no expectation but `100-continue` (RFC
/// 9110 §10.1.1: 417 otherwise). hyper sends the `100 Continue` only when
/// the body is first read, so a body refused from its declared length is
/// never invited.
fn check_protocol(req: &Request) -> Result<(), ApiError> {
    if req.version() == axum::http::Version::HTTP_11 && !req.headers().contains_key(header::HOST) {
        return Err(ApiError::invalid(
            "HTTP/1.1 requests must have a Host header",
        ));
    }
    for v in req.headers().get_all(header::EXPECT) {
        if !v.as_bytes().eq_ignore_ascii_case(b"100-continue") {
            return Err(ApiError::expectation_failed(&String::from_utf8_lossy(
                v.as_bytes(),
            )));
        }
    }
    Ok(())
}

fn authorized(app: &App, headers: &HeaderMap) -> bool {
    let Some(key) = &app.api_key else {
        return true;
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // Compare every byte whatever the first difference, so the time taken
    // does not tell how much of a guess was right.
    given.len() == key.len()
        && given
            .bytes()
            .zip(key.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

pub fn error_response(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json_response(status, &e.body());
    if let Some(secs) = e.retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if e.status == 401 {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if e.close {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

pub(crate) fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

async fn not_found(req: Request) -> Response {
    error_response(ApiError::not_found(&format!(
        "{} {}",
        req.method(),
        req.uri().path()
    )))
}

async fn method_not_allowed() -> Response {
    error_response(ApiError::method_not_allowed())
}

async fn health(State(app): State<Arc<App>>) -> Response {
    if app.shutting_down.load(Ordering::Relaxed) {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "shutting down"}),
        );
    }
    let m = &app.metrics.stats;
    let busy = m.active.load(Ordering::Relaxed);
    json_response(
        StatusCode::OK,
        &json!({
            "status": "ok",
            "slots_idle": m.n_slots.saturating_sub(busy),
            "slots_busy": busy,
            "queue": m.queued.load(Ordering::Relaxed),
        }),
    )
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

async fn models(State(app): State<Arc<App>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [model_entry(&app)]}),
    )
}

/// The model as `/v1/models` lists it.
pub(crate) fn model_entry(app: &App) -> Value {
    json!({
        "id": app.model_name,
        "object": "model",
        "created": app.created,
        "owned_by": "cachefit",
        "meta": {"n_ctx_per_slot": app.n_ctx, "n_vocab": app.n_vocab, "slots": app.metrics.stats.n_slots},
    })
}

async fn chat_completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate(app, Kind::Chat, headers, body)
        .await
        .unwrap_or_else(error_response)
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate(app, Kind::Completion, headers, body)
        .await
        .unwrap_or_else(error_response)
}

/// The body, at most `limit` bytes (413 beyond), within `timeout` (408
/// after). A declared `Content-Length` over the limit is answered at once,
/// without reading (or inviting, for `Expect: 100-continue`) the body.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Vec<u8>, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit).closing());
    }
    let read = async {
        let mut stream = body.into_data_stream();
        let mut out = Vec::new();
        let mut seen = 0usize;
        while let Some(chunk) = poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
            let chunk =
                chunk.map_err(|e| ApiError::invalid(format!("Reading the body failed: {e}")))?;
            seen = seen.saturating_add(chunk.len());
            if seen > limit {
                // A body without a declared length that runs over: keep
                // reading (up to a bound) so the client, still sending,
                // gets our answer instead of a reset.
                if seen > MAX_DRAIN_BYTES {
                    break;
                }
                continue;
            }
            out.extend_from_slice(&chunk);
        }
        if seen > limit {
            return Err(ApiError::too_large(limit).closing());
        }
        Ok(out)
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or_else(|_| Err(ApiError::request_timeout(timeout.as_secs_f64()).closing()))
}

/// What a request asks the model to continue.
enum Source {
    /// A conversation and extra template variables (`tools`).
    Messages(Vec<chat::Message>, serde_json::Map<String, Value>),
    Prompt(Prompt),
}

/// Request bodies up to this size have their prompt built on the HTTP
/// thread (tens of microseconds); longer ones on tokio's blocking pool.
const INLINE_TOKENIZE_BYTES: usize = 2048;

async fn generate(
    app: Arc<App>,
    kind: Kind,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&headers, body, app.max_body_bytes, app.body_timeout).await?;
    let obj = api::parse_body(&bytes)?;
    let (source, options, tools) = match kind {
        Kind::Chat => {
            let r = ChatRequest::from_json(&obj, &app.defaults)?;
            // Tools are shown through the template (or the Hermes way);
            // `reader` reads the calls back out of the reply.
            let (messages, extra, reader) =
                crate::tools::prompt(&app.template, r.messages, r.tools.as_ref());
            let grammar = r
                .tools
                .as_ref()
                .zip(reader.as_ref())
                .and_then(|(t, reader)| crate::tools::call_grammar(t, reader.format));
            (
                Source::Messages(messages, extra),
                r.options,
                reader.map(|r| (r, grammar)),
            )
        }
        Kind::Completion => {
            let r = CompletionRequest::from_json(&obj, &app.defaults)?;
            (Source::Prompt(r.prompt), r.options, None)
        }
    };
    let param = match kind {
        Kind::Chat => "messages",
        Kind::Completion => "prompt",
    };
    // A short body is tokenized here: handing it to the blocking pool and
    // back costs two thread wake-ups, which on a machine whose cores the
    // engine keeps busy take longer than the work (under 4 clients, slot
    // steps left idle between requests: 6.5–7.1% with the hand-off,
    // 4.7–6.7% without).
    let prompt = if bytes.len() <= INLINE_TOKENIZE_BYTES {
        app.tokenize(source)?
    } else {
        let worker = app.clone();
        tokio::task::spawn_blocking(move || worker.tokenize(source))
            .await
            .map_err(|_| ApiError::internal("Building the prompt failed"))??
    };
    if prompt.is_empty() {
        return Err(ApiError::param(param, "The prompt is empty (no tokens)"));
    }
    if prompt.len() >= app.n_ctx {
        return Err(ApiError::param(
            param,
            format!(
                "This model's maximum context length is {} tokens per slot, and the prompt is {} tokens; at least one token must be left to generate. Shorten the prompt or start the server with a larger -c.",
                app.n_ctx,
                prompt.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let mut options = options;
    // Structured output: `response_format`, `json_schema` or `grammar`.
    if let Some((field, spec)) = crate::structured::spec(&obj)? {
        options.params.constraint = Some(crate::structured::compile(&app, field, spec).await?);
    }
    // `tool_choice` "required" or a named function: the reply is a call.
    let tool_reader = match tools {
        Some((reader, Some(lark))) => {
            if options.params.constraint.is_some() {
                return Err(ApiError::param(
                    "tool_choice",
                    "`tool_choice` that requires a call cannot be combined with `response_format`, `json_schema` or `grammar`",
                ));
            }
            let spec = engine::ConstraintSpec::Lark(lark);
            options.params.constraint =
                Some(crate::structured::compile(&app, "tool_choice".into(), spec).await?);
            Some(reader)
        }
        Some((reader, None)) => Some(reader),
        None => None,
    };
    if matches!(kind, Kind::Chat) {
        let p = &mut options.params;
        p.extra_eog.extend(&app.turn_end.eog);
        p.stop.extend(app.turn_end.stop.iter().cloned());
    }
    // Without --memory-dir, `user` is only OpenAI's end-user label.
    let memory = match (api::memory_name(&obj)?, &app.memory_root) {
        (None, _) | (Some(("user", _)), None) => None,
        (Some((_, name)), Some(root)) => Some(engine::JobMemory::file(
            root.join(format!("{name}.mem")),
            true,
        )),
        (Some(_), None) => {
            return Err(ApiError::param(
                "memory",
                "This server keeps no memories: start it with --memory-dir DIR",
            ))
        }
    };
    if options.n > 1 && memory.is_some() {
        return Err(ApiError::param(
            "n",
            "`n` > 1 cannot be used with a memory: each choice would append its own turn",
        ));
    }
    api::check_logit_bias(&options.params, app.n_vocab)?;
    let (id, rxs) = submit(&app, prompt, &options, memory)?;
    let envelope = Envelope {
        kind,
        id: format!(
            "{}-{id}",
            match kind {
                Kind::Chat => "chatcmpl",
                Kind::Completion => "cmpl",
            }
        ),
        created: unix_time(),
        model: obj
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .unwrap_or(&app.model_name)
            .to_string(),
    };
    let logprobs = options.params.logprobs.is_some();
    if options.stream {
        let stream = SseStream {
            choices: ChoiceStream::new(rxs, envelope, options.include_usage, logprobs)
                .with_tools(tool_reader.as_ref()),
            done: false,
        };
        let mut r = Response::new(Body::from_stream(stream));
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(r);
    }
    let mut done = Vec::with_capacity(rxs.len());
    for mut rx in rxs {
        done.push(choices::collect(&mut rx).await?);
    }
    let mut answer = choices::response(&envelope, &done, logprobs);
    if let Some(reader) = &tool_reader {
        crate::tools::read_response(&mut answer, reader);
    }
    Ok(json_response(StatusCode::OK, &answer))
}

impl App {
    /// Render (chat) and tokenize; on the blocking pool for a long body.
    fn tokenize(&self, source: Source) -> Result<Vec<u32>, ApiError> {
        match source {
            // Message text stays text: control tokens come from the
            // template only (unless the operator opted in).
            Source::Messages(messages, extra) => chat::prompt_tokens_with(
                &self.template,
                &messages,
                true,
                &extra,
                &self.vocab,
                self.special,
            )
            .map(|p| p.tokens)
            .map_err(|e| match e {
                chat::Error::ControlTextInMessage { .. } => {
                    ApiError::param("messages", e.to_string())
                }
                chat::Error::ControlTextOutsideContent { ref what, .. } => {
                    let field = if what.contains("tools") {
                        "tools"
                    } else {
                        "messages"
                    };
                    ApiError::param(field, e.to_string())
                }
                e => ApiError::param("messages", format!("The chat template failed: {e}")),
            }),
            Source::Prompt(Prompt::Text(text)) => {
                Ok(engine::prompt::completion_tokens(&self.vocab, &text))
            }
            Source::Prompt(Prompt::Tokens(tokens)) => {
                if let Some(bad) = tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
                    return Err(ApiError::param(
                        "prompt",
                        format!(
                            "Token id {bad} is outside the model's vocabulary of {}",
                            self.n_vocab
                        ),
                    ));
                }
                Ok(tokens)
            }
        }
    }
}

/// Queue a job per choice for the engine (the choices of `n` > 1 as one
/// [`Msg::Choices`], which reads the prompt once; choice `i` draws with
/// seed `seed + i`), or 503 when the queue is full or the server is
/// stopping. Each choice is a place in the queue, so `n` beyond the queue
/// is a 400; beyond the slots, later choices wait for a slot.
fn submit(
    app: &App,
    prompt: Vec<u32>,
    options: &Options,
    memory: Option<engine::JobMemory>,
) -> Result<(u64, Vec<UnboundedReceiver<Event>>), ApiError> {
    if app.shutting_down.load(Ordering::Relaxed) {
        return Err(ApiError::unavailable("The server is shutting down"));
    }
    let n = options.n;
    if n > app.max_queue {
        return Err(ApiError::param(
            "n",
            format!(
                "`n` = {n} is more than this server queues at once ({}, --max-queue)",
                app.max_queue
            ),
        ));
    }
    let queued = &app.metrics.stats.queued;
    if queued
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
            (q + n <= app.max_queue).then_some(q + n)
        })
        .is_err()
    {
        return Err(ApiError::unavailable(format!(
            "All {} slots are busy and {} requests are already queued; retry later",
            app.metrics.stats.n_slots, app.max_queue
        )));
    }
    let mut memory = memory;
    let (mut jobs, mut rxs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut first = 0;
    for i in 0..n {
        let (sink, rx) = events::channel();
        let id = app.next_id.fetch_add(1, Ordering::Relaxed);
        if i == 0 {
            first = id;
        }
        let sink = access_log::tally_sink(Box::new(sink));
        let mut params = options.params.clone();
        params.sampling.seed = params.sampling.seed.map(|s| s.wrapping_add(i as u32));
        let mut job = Job::new(id, prompt.clone(), params, sink);
        job.memory = memory.take();
        jobs.push(job);
        rxs.push(rx);
    }
    let msg = if n == 1 {
        Msg::Job(Box::new(jobs.pop().expect("one job")))
    } else {
        Msg::Choices(jobs)
    };
    if app.jobs.send(msg).is_err() {
        queued.fetch_sub(n, Ordering::AcqRel);
        return Err(ApiError::unavailable("The engine has stopped"));
    }
    Ok((first, rxs))
}

/// The SSE body: OpenAI chunks as the engine's events arrive (every
/// choice's, [`ChoiceStream`]), then `data: [DONE]`. Dropped by hyper when
/// the client goes away, which drops the receivers and so cancels the jobs.
struct SseStream {
    choices: ChoiceStream,
    done: bool,
}

impl Stream for SseStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        // Everything ready goes out in one write.
        let out = match this.choices.poll(cx) {
            Polled::Chunks(out) => out,
            Polled::End(out) => {
                this.done = true;
                out
            }
        };
        if out.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(Some(Ok(Bytes::from(out))))
        }
    }
}
