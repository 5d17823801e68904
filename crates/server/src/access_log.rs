//! One line on stderr per request, when its response has been sent (a
//! stream: when its last event has gone, or the client left): method,
//! path, status, prompt and completion tokens, time. `--log-format text`
//! (the default) writes `cachefit: POST /v1/chat/completions 200 in=24
//! out=12 0.412s`, `--log-format json` one JSON object per line for
//! machines.
//!
//! Tokens reach the line through a [`Tally`] that the request's jobs fill
//! when they finish: [`scope`] makes it the current request's for the
//! handler's future, and [`tally_sink`] wraps each job's sink in it.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::response::Response;
use engine::{Finish, JobError, Sink};
use http_body::Frame;
use serde_json::json;

/// How request lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
    /// No request lines.
    Off,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            "off" => Ok(LogFormat::Off),
            _ => Err(format!("`{s}`: the log format is text, json or off")),
        }
    }
}

/// Tokens of one request's jobs: the prompt (the largest one: `n` choices
/// share it) and completions (summed over choices).
#[derive(Debug, Default)]
pub struct Tally {
    prompt: AtomicU64,
    completion: AtomicU64,
}

tokio::task_local! {
    static CURRENT: Arc<Tally>;
}

/// Run a request's handler with `tally` as its current one.
pub async fn scope<F: std::future::Future>(tally: Arc<Tally>, f: F) -> F::Output {
    CURRENT.scope(tally, f).await
}

/// `sink`, counting into the current request's tally (as is, outside a
/// request).
pub fn tally_sink(sink: Box<dyn Sink>) -> Box<dyn Sink> {
    match CURRENT.try_with(Arc::clone) {
        Ok(tally) => Box::new(TallySink { inner: sink, tally }),
        Err(_) => sink,
    }
}

struct TallySink {
    inner: Box<dyn Sink>,
    tally: Arc<Tally>,
}

impl Sink for TallySink {
    fn text(&mut self, text: String) {
        self.inner.text(text)
    }

    fn logprobs(&mut self, entries: Vec<engine::TokenLogprob>) {
        self.inner.logprobs(entries)
    }

    fn finish(&mut self, end: Result<Finish, JobError>) {
        if let Ok(f) = &end {
            let t = &self.tally;
            t.prompt
                .fetch_max(f.prompt_tokens as u64, Ordering::Relaxed);
            t.completion
                .fetch_add(f.completion_tokens as u64, Ordering::Relaxed);
        }
        self.inner.finish(end)
    }

    fn cancelled(&self) -> bool {
        self.inner.cancelled()
    }
}

/// What the line says, written when the response body is dropped.
pub struct Line {
    pub format: LogFormat,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub started: Instant,
    pub tally: Arc<Tally>,
}

impl Line {
    fn write(&self) {
        let (tin, tout) = (
            self.tally.prompt.load(Ordering::Relaxed),
            self.tally.completion.load(Ordering::Relaxed),
        );
        let secs = self.started.elapsed().as_secs_f64();
        match self.format {
            LogFormat::Off => {}
            LogFormat::Text => eprintln!(
                "cachefit: {} {} {} in={tin} out={tout} {secs:.3}s",
                self.method, self.path, self.status
            ),
            LogFormat::Json => eprintln!(
                "{}",
                json!({
                    "method": self.method,
                    "path": self.path,
                    "status": self.status,
                    "prompt_tokens": tin,
                    "completion_tokens": tout,
                    "seconds": (secs * 1e6).round() / 1e6,
                })
            ),
        }
    }
}

/// `response` with its body wrapped so that `line` is written when the
/// body is done with (sent in full, or dropped because the client left).
pub fn logged(response: Response, line: Line) -> Response {
    if line.format == LogFormat::Off {
        return response;
    }
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(LoggedBody {
            inner: body,
            line: Some(line),
        }),
    )
}

struct LoggedBody {
    inner: Body,
    line: Option<Line>,
}

impl Drop for LoggedBody {
    fn drop(&mut self) {
        if let Some(line) = self.line.take() {
            line.write();
        }
    }
}

impl http_body::Body for LoggedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
