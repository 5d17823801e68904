//! Connections: the accept loop and what bounds each connection, below
//! the routes of [`crate::http`].
//!
//! Every connection is in one of three phases, tracked in its
//! [`ConnState`]:
//!
//! - *idle*: no byte of a request yet (just accepted, or between requests
//!   on a kept-alive connection). It must start a request within the
//!   header timeout (a new connection) or the idle timeout (kept alive);
//! - *header*: request bytes arrived; the whole head must be in within the
//!   header timeout of the first byte;
//! - *busy*: a handler runs; the body has its own timeout (in
//!   [`crate::http`]) and generation has none, since its length is bounded
//!   by `max_tokens` and the context.
//!
//! The deadline is enforced by [`Deadline`], a wrapper around the socket
//! whose reads fail with `TimedOut` once it passes, which makes hyper
//! close the connection. The handler marks the request busy when it
//! starts and idle again when its response body has been sent or dropped.
//!
//! At most `max_connections` connections are open (by default as many as
//! the open-file limit leaves room for). A new one beyond that evicts the
//! longest-idle connection if there is one, else it gets a 503 and is
//! closed: an answer in either case, never a hang in the accept queue.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::Router;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Sleep;
use tower::ServiceExt;

/// How long a connection may take, and how many may be open.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// From a connection's start or its first request byte to the end of
    /// the request head.
    pub header_timeout: Duration,
    /// Between requests on a kept-alive connection.
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// Default `--timeout-header`.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--timeout-idle`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `--timeout-body`.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `--max-connections`, before the open-file limit lowers it.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// File descriptors kept for everything but client connections: the model
/// file, the listener, the runtime's epoll and wake-up fds, stdio, the
/// connections being turned away.
const RESERVED_FDS: u64 = 48;
/// Turned-away connections being answered at once; beyond, they are
/// closed without an answer.
const MAX_SHEDDING: usize = 16;

/// `max_connections`, lowered so that the connections fit under the
/// process's open-file limit (`ulimit -n`) with [`RESERVED_FDS`] to spare.
pub fn connection_cap(requested: usize) -> usize {
    match open_files_limit() {
        Some(limit) => requested.min(limit.saturating_sub(RESERVED_FDS).max(1) as usize),
        None => requested,
    }
}

/// The soft limit on open files, from `/proc/self/limits` (Linux).
fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_files_limit(&text)
}

fn parse_open_files_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

const IDLE: u8 = 0;
const HEADER: u8 = 1;
const BUSY: u8 = 2;
/// `ConnState::deadline` when there is none.
const NO_DEADLINE: u64 = u64::MAX;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn micros_from_epoch(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_micros() as u64
}

/// One connection's phase and deadline, shared by its socket wrapper, its
/// requests, and the accept loop (which may evict it).
pub struct ConnState {
    phase: AtomicU8,
    /// Microseconds after [`epoch`], or [`NO_DEADLINE`].
    deadline: AtomicU64,
    /// When it last became idle, to evict the longest-idle first.
    idle_since: AtomicU64,
    /// The task reading the socket, to wake when evicted.
    waker: Mutex<Option<Waker>>,
    limits: Limits,
}

impl ConnState {
    fn new(limits: Limits) -> ConnState {
        let now = Instant::now();
        ConnState {
            phase: AtomicU8::new(IDLE),
            deadline: AtomicU64::new(micros_from_epoch(now + limits.header_timeout)),
            idle_since: AtomicU64::new(micros_from_epoch(now)),
            waker: Mutex::new(None),
            limits,
        }
    }

    fn deadline(&self) -> Option<Instant> {
        match self.deadline.load(Ordering::Acquire) {
            NO_DEADLINE => None,
            us => Some(epoch() + Duration::from_micros(us)),
        }
    }

    fn set_deadline(&self, t: Option<Instant>) {
        let v = t.map_or(NO_DEADLINE, micros_from_epoch);
        self.deadline.store(v, Ordering::Release);
    }

    /// Request bytes arrived.
    fn on_bytes(&self) {
        if self
            .phase
            .compare_exchange(IDLE, HEADER, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.set_deadline(Some(Instant::now() + self.limits.header_timeout));
        }
    }

    /// A handler started: the head is in.
    fn busy(&self) {
        self.phase.store(BUSY, Ordering::Release);
        self.set_deadline(None);
    }

    /// The response went out (or was dropped): waiting for the next
    /// request.
    fn idle(&self) {
        let now = Instant::now();
        self.idle_since
            .store(micros_from_epoch(now), Ordering::Relaxed);
        self.phase.store(IDLE, Ordering::Release);
        self.set_deadline(Some(now + self.limits.idle_timeout));
        self.wake();
    }

    /// Close it at its next read: the deadline is now.
    fn evict(&self) {
        self.deadline.store(0, Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        if let Some(w) = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            w.wake();
        }
    }
}

/// The open connections.
#[derive(Default)]
struct Registry {
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
    next: AtomicU64,
}

impl Registry {
    fn len(&self) -> usize {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn add(&self, state: Arc<ConnState>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, state);
        id
    }

    fn remove(&self, id: u64) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// Evict the connection idle the longest; false if none is idle.
    fn evict_idle(&self) -> bool {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = conns
            .values()
            .filter(|c| c.phase.load(Ordering::Acquire) == IDLE)
            .filter(|c| c.deadline.load(Ordering::Acquire) != 0)
            .min_by_key(|c| c.idle_since.load(Ordering::Relaxed));
        match oldest {
            Some(c) => {
                c.evict();
                true
            }
            None => false,
        }
    }
}

/// The socket, failing reads once its connection's deadline has passed.
struct Deadline {
    inner: TcpStream,
    state: Arc<ConnState>,
    sleep: Pin<Box<Sleep>>,
    armed: Option<Instant>,
}

impl Deadline {
    fn new(inner: TcpStream, state: Arc<ConnState>) -> Deadline {
        Deadline {
            inner,
            state,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
        }
    }
}

fn timed_out(state: &ConnState) -> io::Error {
    let what = match state.phase.load(Ordering::Acquire) {
        HEADER => "request head not received in time",
        _ => "connection idle too long (or evicted)",
    };
    io::Error::new(io::ErrorKind::TimedOut, what)
}

impl AsyncRead for Deadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(deadline) = this.state.deadline() else {
            let r = Pin::new(&mut this.inner).poll_read(cx, buf);
            if r.is_pending() {
                // Woken when the request ends and the idle deadline starts.
                *this.state.waker.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(cx.waker().clone());
            }
            return r;
        };
        if Instant::now() >= deadline {
            return Poll::Ready(Err(timed_out(&this.state)));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.state.on_bytes();
                }
                return Poll::Ready(Ok(()));
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => {}
        }
        *this.state.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        // The deadline may have moved (eviction, a phase change) since
        // the last arming.
        let deadline = this.state.deadline().unwrap_or(deadline);
        if this.armed != Some(deadline) {
            this.sleep.as_mut().reset(deadline.into());
            this.armed = Some(deadline);
        }
        if this.sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(timed_out(&this.state)));
        }
        Poll::Pending
    }
}

impl AsyncWrite for Deadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A response body that marks its connection idle once sent or dropped.
struct Tracked {
    inner: Body,
    state: Arc<ConnState>,
}

impl HttpBody for Tracked {
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
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.state.idle();
    }
}

/// Serve `router` on `listener` until `stop` turns true; then stop
/// accepting, let every connection finish its request, and return once
/// all are closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) {
    let registry = Arc::new(Registry::default());
    let shedding = Arc::new(AtomicUsize::new(0));
    // Each connection holds a receiver; `closed()` resolves when all are gone.
    let (open_tx, open_rx) = watch::channel(());
    let mut last_accept_error: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors (or another passing error): the
                // connection waits in the backlog; try again shortly
                // instead of spinning.
                if last_accept_error.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    eprintln!("cachefit: warning: accepting a connection failed: {e}");
                    last_accept_error = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if registry.len() >= limits.max_connections && !registry.evict_idle() {
            shed(stream, &shedding);
            continue;
        }
        let state = Arc::new(ConnState::new(limits));
        let id = registry.add(state.clone());
        let registry = registry.clone();
        let router = router.clone();
        let mut stop = stop.clone();
        let open = open_rx.clone();
        tokio::spawn(async move {
            let io = TokioIo::new(Deadline::new(stream, state.clone()));
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let state = state.clone();
                state.busy();
                let router = router.clone();
                Box::pin(async move {
                    let response = router
                        .oneshot(req.map(Body::new))
                        .await
                        .unwrap_or_else(|e| match e {});
                    Ok::<_, Infallible>(response.map(|inner| Body::new(Tracked { inner, state })))
                })
            });
            let mut conn = hyper::server::conn::http1::Builder::new()
                // The client may shut its sending side after the request
                // and still want the answer.
                .half_close(true)
                .header_read_timeout(None)
                .serve_connection(io, service);
            let mut stopping = false;
            let done = loop {
                tokio::select! {
                    r = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => break r,
                    _ = stop.wait_for(|s| *s), if !stopping => {
                        stopping = true;
                        Pin::new(&mut conn).graceful_shutdown();
                    }
                }
            };
            // Ended cleanly: close gently. (After an error, such as a
            // timeout, the socket is dropped at once.)
            if done.is_ok() {
                linger(conn.into_parts().io.into_inner().inner).await;
            }
            registry.remove(id);
            drop(open);
        });
    }
    drop(listener);
    drop(open_rx);
    open_tx.closed().await;
}

/// Close after an answer without losing it: a request body we did not
/// read (a 413 from the declared length) left unread in the socket makes
/// the kernel reset the connection, which can destroy the answer before
/// the client reads it. So: send FIN, then read and drop what the client
/// still sends, for a short bounded while, before closing.
async fn linger(mut stream: TcpStream) {
    let _ = tokio::time::timeout(LINGER, async {
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            let n = tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await?;
            if n == 0 {
                break;
            }
            left -= n.min(left);
        }
        io::Result::Ok(())
    })
    .await;
}

/// How long and how much [`linger`] reads before closing anyway.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 256 << 10;

/// Over the connection cap with none idle: answer 503 and close, or just
/// close when too many are already being answered.
fn shed(mut stream: TcpStream, shedding: &Arc<AtomicUsize>) {
    if shedding.fetch_add(1, Ordering::AcqRel) >= MAX_SHEDDING {
        shedding.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    let shedding = shedding.clone();
    tokio::spawn(async move {
        let body = r#"{"error":{"message":"The server has too many open connections; retry later","type":"server_error","param":null,"code":"too_many_connections"}}"#;
        let response = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let written = tokio::time::timeout(LINGER, stream.write_all(response.as_bytes())).await;
        if matches!(written, Ok(Ok(()))) {
            linger(stream).await;
        }
        shedding.fetch_sub(1, Ordering::AcqRel);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_files_limit_from_proc_self_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max cpu time              unlimited            unlimited            seconds   \n\
                    Max open files            128                  4096                 files     \n";
        assert_eq!(parse_open_files_limit(text), Some(128));
        assert_eq!(parse_open_files_limit("nothing"), None);
        assert!(connection_cap(usize::MAX) < usize::MAX || open_files_limit().is_none());
    }

    #[test]
    fn phases_move_the_deadline() {
        let limits = Limits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(100),
            max_connections: 4,
        };
        let s = ConnState::new(limits);
        let fresh = s.deadline().unwrap();
        assert!(fresh <= Instant::now() + Duration::from_secs(10));
        s.on_bytes();
        assert_eq!(s.phase.load(Ordering::Relaxed), HEADER);
        s.busy();
        assert_eq!(s.deadline(), None);
        // Bytes while busy (a pipelined request) do not restart the head.
        s.on_bytes();
        assert_eq!(s.phase.load(Ordering::Relaxed), BUSY);
        s.idle();
        assert!(s.deadline().unwrap() > Instant::now() + Duration::from_secs(50));
        let r = Registry::default();
        r.add(Arc::new(s));
        assert!(r.evict_idle());
        // Evicted already: nothing else idle to evict.
        assert!(!r.evict_idle());
    }
}
