//! The engine loop: slots, a FIFO queue, and one batched forward pass per
//! step across every busy slot (continuous batching).
//!
//! The HTTP side sends [`Msg::Job`]s over a std channel; this loop runs on
//! its own thread and answers each job on the job's own tokio channel with
//! [`Event`]s (text deltas, then one [`Event::Done`] or [`Event::Error`]).
//! Between steps a job may join (a free slot takes the head of the queue)
//! or leave (finished, or its receiver dropped because the client went
//! away), so nothing waits for the slowest generation of a batch.
//!
//! A step builds one batch of [`model::Token`]s:
//!
//! ```text
//! decode:  the token each generating slot sampled last     1 per slot, logits
//! prefill: prompt tokens of slots still reading, oldest    up to n_batch in all,
//!          job first, in chunks                            logits on a prompt's last
//! ```
//!
//! and evaluates it with [`Backend::eval`]; each logits row goes to its
//! slot's sampler. Decode tokens come first so a long prompt arriving never
//! stalls the slots that are already streaming by more than one chunk.
//!
//! Each slot keeps the tokens whose K/V its cache holds. A new job goes to
//! the free slot sharing the longest prefix with its prompt (least recently
//! used on a tie) and continues from there; that prefix is reported as
//! `cached_tokens`. At least the prompt's last token is always evaluated,
//! for its logits.
//!
//! Determinism: every logits row depends only on its own sequence (the
//! model's kernels give bit-identical rows whatever else is in the batch),
//! so a greedy generation is the same alone or among fifteen others.

use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{Sampler, SamplerConfig, StopConditions, StopMatcher};
use model::Token;
use tokenize::Utf8Buffer;
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::Metrics;

/// What the scheduler needs from a model: batched evaluation over per-slot
/// KV caches, and the bytes each token stands for.
pub trait Backend {
    /// Sequences (slots), each with its own cache.
    fn n_slots(&self) -> usize;
    /// Positions each slot's cache holds.
    fn n_ctx(&self) -> usize;
    /// Most tokens per [`Backend::eval`]; at least [`Backend::n_slots`].
    fn n_batch(&self) -> usize;
    fn n_vocab(&self) -> usize;
    /// Evaluate `batch`: afterwards [`Backend::logits`] holds one
    /// `(n_vocab,)` row per token with `logits` set, in order.
    fn eval(&mut self, batch: &[Token]);
    /// The rows of the last [`Backend::eval`].
    fn logits(&self) -> &[f32];
    /// The bytes `token` prints as (nothing for control tokens).
    fn piece(&self, token: u32) -> &[u8];
}

/// How one job generates.
#[derive(Clone, Debug, PartialEq)]
pub struct GenParams {
    /// Most tokens to generate (the context may end it sooner).
    pub max_tokens: usize,
    pub sampling: SamplerConfig,
    /// Generation ends before the first of these; it is not returned.
    pub stop: Vec<String>,
}

/// A request for the engine: a tokenized prompt and where to send events.
#[derive(Debug)]
pub struct Job {
    /// Increasing in arrival order (the queue and prefill go oldest first).
    pub id: u64,
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub events: UnboundedSender<Event>,
    pub queued_at: Instant,
}

/// What the HTTP side sends to the engine thread.
#[derive(Debug)]
pub enum Msg {
    Job(Box<Job>),
    /// Shutdown deadline: end every queued and running job now.
    CancelAll,
    /// End every queued and running job now with this 503 message (the
    /// model file changed on disk).
    Abort(String),
}

/// Why a generation ended, as OpenAI's `finish_reason` says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` or the context.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The end of a job, with its token counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose K/V the slot already held.
    pub cached_tokens: usize,
}

/// What the engine sends back for a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// More text (never empty).
    Text(String),
    Done(Finish),
    /// The job failed; `status` is the HTTP status to answer with.
    Error {
        status: u16,
        message: String,
    },
}

/// A job running on a slot.
struct Active {
    job: Box<Job>,
    /// Prompt tokens found in the slot's cache when the job started.
    cached: usize,
    sampler: Sampler,
    stop: StopConditions,
    matcher: StopMatcher,
    utf8: Utf8Buffer,
    generated: usize,
    /// The token sampled last, to evaluate next step (none while the
    /// prompt is still being read).
    next: Option<u32>,
    first_token_at: Option<Instant>,
    /// Text not yet sent ([`send_text`]) and when text last went out.
    pending: String,
    sent_at: Option<Instant>,
}

/// Text generated within this long of the last send waits for the next one
/// (or the end), unless [`Engine::with_stream_interval`] says otherwise: a
/// model at thousands of tokens per second would otherwise wake the HTTP
/// thread and the client once per token, and on a small machine those
/// wake-ups preempt the engine's threads (one lane of a two-lane pass
/// stalled, the other waiting for it). 10 ms is below a screen frame;
/// against 2 ms it gave 4 clients of the built-in model ~20% more tokens/s
/// on the 2-core test machine (docs/PERFORMANCE.md).
pub const DEFAULT_STREAM_INTERVAL: Duration = Duration::from_millis(10);

struct Slot {
    /// Tokens whose K/V the slot's cache holds, at positions `0..len`.
    cache: Vec<u32>,
    active: Option<Active>,
    /// Step at which the slot last took a job (for least-recently-used).
    last_used: u64,
}

/// The scheduler and its backend; [`Engine::run`] is the engine thread.
pub struct Engine<B: Backend> {
    backend: B,
    slots: Vec<Slot>,
    queue: VecDeque<Box<Job>>,
    eog_tokens: Vec<u32>,
    metrics: Arc<Metrics>,
    /// A row of logits copied out for a sampler that modifies it.
    row: Vec<f32>,
    /// Which slot each logits row of the current batch belongs to.
    row_slots: Vec<usize>,
    batch: Vec<Token>,
    /// Decode tokens at the head of `batch` (the rest is prompt).
    n_decode: usize,
    steps: u64,
    /// See [`DEFAULT_STREAM_INTERVAL`].
    stream_interval: Duration,
}

impl<B: Backend> Engine<B> {
    pub fn new(backend: B, eog_tokens: Vec<u32>, metrics: Arc<Metrics>) -> Engine<B> {
        assert!(
            backend.n_batch() >= backend.n_slots() && backend.n_slots() >= 1,
            "a batch must hold one token of every slot"
        );
        let slots = (0..backend.n_slots())
            .map(|_| Slot {
                cache: Vec::new(),
                active: None,
                last_used: 0,
            })
            .collect();
        Engine {
            row: Vec::with_capacity(backend.n_vocab()),
            backend,
            slots,
            queue: VecDeque::new(),
            eog_tokens,
            metrics,
            row_slots: Vec::new(),
            batch: Vec::new(),
            n_decode: 0,
            steps: 0,
            stream_interval: DEFAULT_STREAM_INTERVAL,
        }
    }

    /// Send a generation's text at most once per `interval` (zero: every
    /// token at once); the first text and the end always go at once.
    pub fn with_stream_interval(mut self, interval: Duration) -> Engine<B> {
        self.stream_interval = interval;
        self
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// No job queued or running.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.slots.iter().all(|s| s.active.is_none())
    }

    /// Serve `rx` until every sender is gone and the last job has ended.
    /// Blocks while idle; a step that panics fails its jobs, not the
    /// server.
    pub fn run(mut self, rx: Receiver<Msg>) {
        let mut open = true;
        loop {
            if self.is_idle() {
                if !open {
                    return;
                }
                match rx.recv() {
                    Ok(m) => self.on_msg(m),
                    Err(_) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(m) => self.on_msg(m),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            if panic::catch_unwind(AssertUnwindSafe(|| self.step())).is_err() {
                self.recover_from_panic();
            }
        }
    }

    /// Take a message from the HTTP side.
    pub fn on_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Job(job) => self.queue.push_back(job),
            Msg::CancelAll => self.cancel_all("the server is shutting down"),
            Msg::Abort(why) => self.cancel_all(&why),
        }
    }

    /// One scheduling step: drop jobs whose client left, start queued jobs
    /// on free slots, evaluate one batch, sample every slot that has
    /// logits. Returns false if there was nothing to evaluate.
    pub fn step(&mut self) -> bool {
        self.reap_cancelled();
        self.admit();
        self.metrics
            .active
            .store(self.busy_slots(), Ordering::Relaxed);
        self.build_batch();
        if self.batch.is_empty() {
            return false;
        }
        self.steps += 1;
        let t0 = Instant::now();
        self.backend.eval(&self.batch);
        // The model file changed under the pass: its logits are garbage.
        if let Some(fault) = mapguard::faulted() {
            self.cancel_all(&fault.to_string());
            return true;
        }
        let eval_time = t0.elapsed();
        let (n_vocab, n_ctx) = (self.backend.n_vocab(), self.backend.n_ctx());
        let logits = self.backend.logits();
        assert_eq!(
            logits.len(),
            self.row_slots.len() * n_vocab,
            "the backend returned the wrong number of logits rows"
        );
        let mut generated = 0;
        for (r, &si) in self.row_slots.iter().enumerate() {
            let row = &logits[r * n_vocab..(r + 1) * n_vocab];
            let slot = &mut self.slots[si];
            let a = slot.active.as_ref().expect("a row belongs to a busy slot");
            let (first, before) = (a.first_token_at.is_none(), a.generated);
            let ended = sample_slot(
                slot,
                row,
                &mut self.row,
                &self.backend,
                n_ctx,
                self.stream_interval,
            );
            let a = slot.active.as_ref().expect("still on its slot");
            generated += a.generated - before;
            if first {
                self.metrics.first_token(a.job.queued_at.elapsed());
            }
            if let Some(finish) = ended {
                let mut a = slot.active.take().expect("still on its slot");
                self.metrics.finish_job(a.job.queued_at.elapsed());
                send_pending(&mut a);
                let _ = a.job.events.send(Event::Done(finish));
            }
        }
        let prompt_tokens = self.batch.len() - self.n_decode;
        self.metrics
            .record_step(self.batch.len(), prompt_tokens, generated, eval_time);
        self.metrics
            .active
            .store(self.busy_slots(), Ordering::Relaxed);
        true
    }

    fn busy_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.active.is_some()).count()
    }

    /// End every job (shutdown deadline).
    fn cancel_all(&mut self, why: &str) {
        let error = || Event::Error {
            status: 503,
            message: why.to_string(),
        };
        for job in self.queue.drain(..) {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            let _ = job.events.send(error());
        }
        for slot in &mut self.slots {
            if let Some(a) = slot.active.take() {
                self.metrics.finish_job(a.job.queued_at.elapsed());
                let _ = a.job.events.send(error());
            }
        }
        self.metrics.active.store(0, Ordering::Relaxed);
    }

    /// After a panic inside a step: the caches may be half written, so
    /// forget them, and fail the jobs that were running.
    fn recover_from_panic(&mut self) {
        eprintln!("cachefit: error: the engine step panicked; failing the running requests");
        for slot in &mut self.slots {
            slot.cache.clear();
            if let Some(a) = slot.active.take() {
                self.metrics.finish_job(a.job.queued_at.elapsed());
                let _ = a.job.events.send(Event::Error {
                    status: 500,
                    message: "internal error while generating".to_string(),
                });
            }
        }
        self.metrics.active.store(0, Ordering::Relaxed);
    }

    /// Drop jobs whose receiver is gone: the client disconnected.
    fn reap_cancelled(&mut self) {
        let before = self.queue.len();
        self.queue.retain(|j| !j.events.is_closed());
        let dropped = before - self.queue.len();
        if dropped > 0 {
            self.metrics.queued.fetch_sub(dropped, Ordering::Relaxed);
            self.metrics.cancelled(dropped);
        }
        for slot in &mut self.slots {
            if slot
                .active
                .as_ref()
                .is_some_and(|a| a.job.events.is_closed())
            {
                let a = slot.active.take().expect("checked");
                self.metrics.finish_job(a.job.queued_at.elapsed());
                self.metrics.cancelled(1);
            }
        }
    }

    /// Start queued jobs, oldest first, on free slots.
    fn admit(&mut self) {
        while let Some(job) = self.queue.front() {
            let prompt = &job.prompt;
            let best = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.active.is_none())
                .max_by_key(|(_, s)| {
                    (
                        common_prefix(&s.cache, prompt),
                        std::cmp::Reverse(s.last_used),
                    )
                })
                .map(|(i, _)| i);
            let Some(si) = best else { break };
            let job = self.queue.pop_front().expect("front exists");
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            self.start(si, job);
        }
    }

    fn start(&mut self, si: usize, job: Box<Job>) {
        let n_ctx = self.backend.n_ctx();
        if job.prompt.is_empty() || job.prompt.len() >= n_ctx {
            // The HTTP side checks this; a job that gets here anyway fails.
            let _ = job.events.send(Event::Error {
                status: 400,
                message: format!(
                    "the prompt is {} tokens; a slot's context holds {n_ctx}",
                    job.prompt.len()
                ),
            });
            return;
        }
        let slot = &mut self.slots[si];
        let cached = common_prefix(&slot.cache, &job.prompt).min(job.prompt.len() - 1);
        slot.cache.truncate(cached);
        slot.last_used = self.steps;
        let mut sampler = Sampler::new(job.params.sampling.clone());
        // The prompt counts for the penalties, as in llama.cpp.
        for &t in &job.prompt {
            sampler.accept(t);
        }
        let stop = StopConditions {
            eog_tokens: self.eog_tokens.clone(),
            stop_strings: job.params.stop.clone(),
            ignore_eos: false,
        };
        self.metrics.start_job(job.prompt.len(), cached);
        slot.active = Some(Active {
            matcher: stop.matcher(),
            stop,
            cached,
            sampler,
            utf8: Utf8Buffer::default(),
            generated: 0,
            next: None,
            first_token_at: None,
            pending: String::new(),
            sent_at: None,
            job,
        });
    }

    /// Fill `batch`: each generating slot's next token, then prompt chunks
    /// oldest job first, up to `n_batch` tokens.
    fn build_batch(&mut self) {
        self.batch.clear();
        self.row_slots.clear();
        for (si, slot) in self.slots.iter_mut().enumerate() {
            let Some(a) = &mut slot.active else { continue };
            if let Some(tok) = a.next.take() {
                self.batch.push(Token {
                    id: tok,
                    seq: si,
                    pos: slot.cache.len(),
                    logits: true,
                });
                self.row_slots.push(si);
                slot.cache.push(tok);
            }
        }
        self.n_decode = self.batch.len();
        let mut reading: Vec<(u64, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(si, s)| {
                let a = s.active.as_ref()?;
                (s.cache.len() < a.job.prompt.len()).then_some((a.job.id, si))
            })
            .collect();
        reading.sort_unstable();
        let n_batch = self.backend.n_batch();
        for (_, si) in reading {
            let room = n_batch - self.batch.len();
            if room == 0 {
                break;
            }
            let slot = &mut self.slots[si];
            let prompt = &slot.active.as_ref().expect("reading").job.prompt;
            let from = slot.cache.len();
            let to = prompt.len().min(from + room);
            for (pos, &id) in prompt.iter().enumerate().take(to).skip(from) {
                let last = pos + 1 == prompt.len();
                self.batch.push(Token {
                    id,
                    seq: si,
                    pos,
                    logits: last,
                });
                if last {
                    self.row_slots.push(si);
                }
            }
            slot.cache.extend_from_slice(&prompt[from..to]);
        }
    }
}

/// Sample the slot's next token from `logits` (copied into `scratch` if the
/// sampler modifies them), send its text, and say whether (and how) the
/// job ended.
fn sample_slot<B: Backend>(
    slot: &mut Slot,
    logits: &[f32],
    scratch: &mut Vec<f32>,
    backend: &B,
    n_ctx: usize,
    interval: Duration,
) -> Option<Finish> {
    let a = slot.active.as_mut().expect("a row belongs to a busy slot");
    let finish = |a: &Active, reason| Finish {
        reason,
        prompt_tokens: a.job.prompt.len(),
        completion_tokens: a.generated,
        cached_tokens: a.cached,
    };
    let tok = a.sampler.sample_from(logits, scratch);
    if a.first_token_at.is_none() {
        a.first_token_at = Some(Instant::now());
    }
    let mut shown = String::new();
    if a.stop.stops_at(tok) {
        flush(a, &mut shown);
        send_text(a, shown, interval);
        return Some(finish(a, FinishReason::Stop));
    }
    a.sampler.accept(tok);
    a.generated += 1;
    let piece = a.utf8.push(backend.piece(tok));
    if a.matcher.push(&piece, &mut shown) {
        send_text(a, shown, interval);
        return Some(finish(a, FinishReason::Stop));
    }
    if a.generated >= a.job.params.max_tokens || slot.cache.len() >= n_ctx {
        flush(a, &mut shown);
        send_text(a, shown, interval);
        return Some(finish(a, FinishReason::Length));
    }
    send_text(a, shown, interval);
    a.next = Some(tok);
    None
}

/// The held-back tail at the end of a generation that no stop string cut.
fn flush(a: &mut Active, shown: &mut String) {
    let rest = a.utf8.finish();
    if !a.matcher.push(&rest, shown) {
        a.matcher.finish(shown);
    }
}

/// Queue `text` for the client; send what is queued unless text went out
/// less than `interval` ago (the first text goes at once).
fn send_text(a: &mut Active, text: String, interval: Duration) {
    a.pending.push_str(&text);
    if a.sent_at.is_none_or(|t| t.elapsed() >= interval) {
        send_pending(a);
    }
}

/// Send the queued text, if any.
fn send_pending(a: &mut Active) {
    if !a.pending.is_empty() {
        let _ = a
            .job
            .events
            .send(Event::Text(std::mem::take(&mut a.pending)));
        a.sent_at = Some(Instant::now());
    }
}

/// Length of the longest common prefix.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    /// A model whose next token is a hash of the whole sequence so far, so
    /// any mix-up of positions, slots or caches changes the output. It
    /// keeps each slot's tokens by position and checks that a batch only
    /// reads positions already written.
    struct Fake {
        n_slots: usize,
        n_ctx: usize,
        n_batch: usize,
        seqs: Vec<Vec<Option<u32>>>,
        logits: Vec<f32>,
        calls: Vec<Vec<Token>>,
        pieces: Vec<Vec<u8>>,
    }

    const VOCAB: usize = 16;
    const EOG: u32 = 15;

    impl Fake {
        fn new(n_slots: usize, n_ctx: usize, n_batch: usize) -> Fake {
            Fake {
                n_slots,
                n_ctx,
                n_batch,
                seqs: vec![vec![None; n_ctx]; n_slots],
                logits: Vec::new(),
                calls: Vec::new(),
                // Token i prints as the letter a + i; EOG prints nothing.
                pieces: (0..VOCAB as u8)
                    .map(|i| {
                        if i as u32 == EOG {
                            vec![]
                        } else {
                            vec![b'a' + i]
                        }
                    })
                    .collect(),
            }
        }

        fn next_of(seq: &[Option<u32>], pos: usize) -> u32 {
            let mut h: u64 = 1469598103934665603;
            for t in &seq[..=pos] {
                h = (h ^ t.expect("read a position never written") as u64)
                    .wrapping_mul(1099511628211);
            }
            // Bias away from EOG so generations run a while.
            ((h >> 7) % (VOCAB as u64 - 1)) as u32
        }
    }

    impl Backend for Fake {
        fn n_slots(&self) -> usize {
            self.n_slots
        }
        fn n_ctx(&self) -> usize {
            self.n_ctx
        }
        fn n_batch(&self) -> usize {
            self.n_batch
        }
        fn n_vocab(&self) -> usize {
            VOCAB
        }
        fn logits(&self) -> &[f32] {
            &self.logits
        }
        fn eval(&mut self, batch: &[Token]) {
            assert!(!batch.is_empty() && batch.len() <= self.n_batch);
            self.logits.clear();
            for t in batch {
                assert!(t.pos < self.n_ctx);
                let seq = &mut self.seqs[t.seq];
                assert!(
                    t.pos == 0 || seq[t.pos - 1].is_some(),
                    "position {} of slot {} read before {} was written",
                    t.pos,
                    t.seq,
                    t.pos - 1
                );
                seq[t.pos] = Some(t.id);
                // Later positions are stale now.
                for p in seq.iter_mut().skip(t.pos + 1) {
                    *p = None;
                }
            }
            for t in batch.iter().filter(|t| t.logits) {
                let next = Fake::next_of(&self.seqs[t.seq], t.pos);
                let mut row = vec![0.0; VOCAB];
                row[next as usize] = 10.0;
                self.logits.extend_from_slice(&row);
            }
            self.calls.push(batch.to_vec());
        }
        fn piece(&self, token: u32) -> &[u8] {
            &self.pieces[token as usize]
        }
    }

    fn params(max_tokens: usize) -> GenParams {
        GenParams {
            max_tokens,
            sampling: SamplerConfig::greedy(),
            stop: vec![],
        }
    }

    fn job(id: u64, prompt: &[u32], p: GenParams) -> (Box<Job>, UnboundedReceiver<Event>) {
        let (tx, rx) = unbounded_channel();
        let job = Box::new(Job {
            id,
            prompt: prompt.to_vec(),
            params: p,
            events: tx,
            queued_at: Instant::now(),
        });
        (job, rx)
    }

    fn engine(n_slots: usize, n_ctx: usize, n_batch: usize) -> Engine<Fake> {
        Engine::new(
            Fake::new(n_slots, n_ctx, n_batch),
            vec![EOG],
            Arc::new(Metrics::new(n_slots)),
        )
    }

    fn submit(e: &mut Engine<Fake>, job: Box<Job>) {
        e.metrics.queued.fetch_add(1, Ordering::Relaxed);
        e.on_msg(Msg::Job(job));
    }

    fn drain(rx: &mut UnboundedReceiver<Event>) -> (String, Option<Finish>) {
        let mut text = String::new();
        while let Ok(ev) = rx.try_recv() {
            match ev {
                Event::Text(t) => text.push_str(&t),
                Event::Done(f) => return (text, Some(f)),
                Event::Error { message, .. } => panic!("error: {message}"),
            }
        }
        (text, None)
    }

    fn run_to_idle(e: &mut Engine<Fake>) {
        for _ in 0..10_000 {
            if e.is_idle() {
                return;
            }
            e.step();
        }
        panic!("the engine did not finish");
    }

    /// The text a job produces alone on a fresh one-slot engine.
    fn alone(prompt: &[u32], p: GenParams) -> (String, Finish) {
        let mut e = engine(1, 64, 8);
        let (j, mut rx) = job(0, prompt, p);
        submit(&mut e, j);
        run_to_idle(&mut e);
        let (text, f) = drain(&mut rx);
        (text, f.expect("finished"))
    }

    #[test]
    fn batched_generations_equal_one_at_a_time() {
        let prompts: Vec<Vec<u32>> = (0..10)
            .map(|i| {
                (0..(3 + i * 2))
                    .map(|k| ((k * 7 + i) % 14) as u32)
                    .collect()
            })
            .collect();
        let mut e = engine(4, 64, 8);
        let mut rxs = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let (j, rx) = job(i as u64, p, params(12));
            submit(&mut e, j);
            rxs.push(rx);
        }
        run_to_idle(&mut e);
        for (p, rx) in prompts.iter().zip(&mut rxs) {
            let (text, f) = drain(rx);
            let (want, want_f) = alone(p, params(12));
            assert_eq!(text, want);
            assert_eq!(f.unwrap().completion_tokens, want_f.completion_tokens);
        }
        // More than one slot's token went through some pass.
        let calls = &e.backend().calls;
        assert!(calls.iter().any(|b| {
            let mut seqs: Vec<_> = b.iter().map(|t| t.seq).collect();
            seqs.dedup();
            seqs.len() > 1
        }));
        assert!(calls.iter().all(|b| b.len() <= 8));
        assert_eq!(e.metrics.queued.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_slot_reuses_the_common_prefix() {
        let mut e = engine(1, 64, 8);
        let first: Vec<u32> = (0..20).map(|k| k % 13).collect();
        let (j, mut rx) = job(0, &first, params(5));
        submit(&mut e, j);
        run_to_idle(&mut e);
        assert_eq!(drain(&mut rx).1.unwrap().cached_tokens, 0);

        let mut second = first[..15].to_vec();
        second.extend([3, 4, 5]);
        let (j, mut rx) = job(1, &second, params(5));
        submit(&mut e, j);
        let calls_before = e.backend().calls.len();
        run_to_idle(&mut e);
        let (text, f) = drain(&mut rx);
        let f = f.unwrap();
        assert_eq!(f.cached_tokens, 15);
        assert_eq!(f.prompt_tokens, 18);
        // The first pass of the second job starts at position 15.
        assert_eq!(e.backend().calls[calls_before][0].pos, 15);
        assert_eq!((text, f.completion_tokens), {
            let (t, f) = alone(&second, params(5));
            (t, f.completion_tokens)
        });

        // The same prompt again: everything but the last token is cached.
        let (j, mut rx) = job(2, &second, params(5));
        submit(&mut e, j);
        run_to_idle(&mut e);
        assert_eq!(drain(&mut rx).1.unwrap().cached_tokens, 17);
    }

    #[test]
    fn a_new_job_goes_to_the_slot_with_its_prefix() {
        let mut e = engine(3, 64, 8);
        let a: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
        let b: Vec<u32> = vec![7, 8, 9, 10, 11, 12];
        for (i, p) in [&a, &b].iter().enumerate() {
            let (j, mut rx) = job(i as u64, p, params(2));
            submit(&mut e, j);
            run_to_idle(&mut e);
            drain(&mut rx);
        }
        let mut b2 = b.clone();
        b2.push(13);
        let (j, mut rx) = job(5, &b2, params(2));
        submit(&mut e, j);
        run_to_idle(&mut e);
        assert_eq!(drain(&mut rx).1.unwrap().cached_tokens, b.len());
    }

    #[test]
    fn max_tokens_stop_strings_and_eog() {
        let prompt = [1, 2, 3];
        let (text, f) = alone(&prompt, params(6));
        assert_eq!(f.reason, FinishReason::Length);
        assert_eq!(f.completion_tokens, 6);
        assert_eq!(text.len(), 6);

        // Stop on the text's third character: output is what came before.
        let stop = text[2..3].to_string();
        let cut = text.find(&stop).unwrap();
        let (t2, f2) = alone(
            &prompt,
            GenParams {
                stop: vec![stop],
                ..params(6)
            },
        );
        assert_eq!(t2, text[..cut]);
        assert_eq!(f2.reason, FinishReason::Stop);

        // Make the "model" end with EOG: with EOG as the only candidate.
        let mut e = engine(1, 64, 8);
        e.eog_tokens = (0..VOCAB as u32).collect();
        let (j, mut rx) = job(0, &prompt, params(6));
        submit(&mut e, j);
        run_to_idle(&mut e);
        let (t3, f3) = drain(&mut rx);
        assert_eq!((t3.as_str(), f3.unwrap().reason), ("", FinishReason::Stop));
    }

    #[test]
    fn the_stream_interval_groups_text_events() {
        // Text events of one generation, and their concatenation.
        let events = |interval: Duration| {
            let mut e = engine(1, 64, 8).with_stream_interval(interval);
            let (j, mut rx) = job(0, &[1, 2, 3], params(20));
            submit(&mut e, j);
            run_to_idle(&mut e);
            let mut texts = Vec::new();
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    Event::Text(t) => texts.push(t),
                    Event::Done(f) => assert_eq!(f.completion_tokens, 20),
                    Event::Error { message, .. } => panic!("error: {message}"),
                }
            }
            texts
        };
        // Zero: one event per token (every piece of the fake is one letter,
        // and this prompt's generation has no end-of-generation token).
        let each = events(Duration::ZERO);
        assert_eq!(each.len(), 20);
        assert!(each.iter().all(|t| t.len() == 1));
        // An hour: the first token at once, the rest with the end.
        let grouped = events(Duration::from_secs(3600));
        assert_eq!(grouped.len(), 2);
        assert_eq!(grouped[0].len(), 1);
        assert_eq!(grouped.concat(), each.concat());
    }

    #[test]
    fn the_context_ends_a_generation() {
        let mut e = engine(1, 10, 4);
        let (j, mut rx) = job(0, &[1, 2, 3, 4, 5, 6, 7], params(100));
        submit(&mut e, j);
        run_to_idle(&mut e);
        let f = drain(&mut rx).1.unwrap();
        assert_eq!(f.reason, FinishReason::Length);
        // Positions 7, 8, 9 take generated tokens 1..3; the 4th is sampled
        // from position 9's logits and has nowhere to go.
        assert_eq!(f.completion_tokens, 4);

        let (j, mut rx) = job(1, &[1; 10], params(5));
        submit(&mut e, j);
        run_to_idle(&mut e);
        assert!(matches!(
            rx.try_recv(),
            Ok(Event::Error { status: 400, .. })
        ));
    }

    #[test]
    fn a_dropped_receiver_frees_its_slot() {
        let mut e = engine(1, 64, 8);
        let (j, rx) = job(0, &[1, 2, 3], params(50));
        submit(&mut e, j);
        let (j2, mut rx2) = job(1, &[4, 5, 6], params(3));
        submit(&mut e, j2);
        e.step();
        e.step();
        drop(rx);
        run_to_idle(&mut e);
        let f = drain(&mut rx2).1.unwrap();
        assert_eq!(f.completion_tokens, 3);
        // The first job stopped within a step of its client leaving.
        assert!(e.backend().calls.len() <= 2 + 1 + 3);
        assert_eq!(e.metrics.active.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn queued_jobs_wait_for_a_slot_and_prefill_is_chunked() {
        let mut e = engine(2, 64, 4);
        let mut rxs = Vec::new();
        for i in 0..5 {
            let (j, rx) = job(i, &[1 + i as u32; 9], params(3));
            submit(&mut e, j);
            rxs.push(rx);
        }
        e.step();
        assert_eq!(e.metrics.queued.load(Ordering::Relaxed), 3);
        run_to_idle(&mut e);
        for rx in &mut rxs {
            assert_eq!(drain(rx).1.unwrap().completion_tokens, 3);
        }
        assert!(e.backend().calls.iter().all(|b| b.len() <= 4));
    }

    #[test]
    fn cancel_all_ends_everything() {
        let mut e = engine(1, 64, 8);
        let (j, mut rx) = job(0, &[1, 2, 3], params(50));
        submit(&mut e, j);
        let (j2, mut rx2) = job(1, &[4, 5, 6], params(3));
        submit(&mut e, j2);
        e.step();
        e.on_msg(Msg::CancelAll);
        assert!(e.is_idle());
        let last = |rx: &mut UnboundedReceiver<Event>| {
            let mut last = None;
            while let Ok(ev) = rx.try_recv() {
                last = Some(ev);
            }
            last
        };
        assert!(matches!(
            last(&mut rx),
            Some(Event::Error { status: 503, .. })
        ));
        assert!(matches!(
            last(&mut rx2),
            Some(Event::Error { status: 503, .. })
        ));
    }

    #[test]
    fn run_serves_a_channel_and_returns_when_it_closes() {
        let e = engine(2, 64, 8);
        let metrics = e.metrics.clone();
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || e.run(rx));
        let mut rxs = Vec::new();
        for i in 0..4 {
            let (j, r) = job(i, &[2, 3, i as u32], params(4));
            metrics.queued.fetch_add(1, Ordering::Relaxed);
            tx.send(Msg::Job(j)).unwrap();
            rxs.push(r);
        }
        drop(tx);
        thread.join().unwrap();
        for r in &mut rxs {
            assert_eq!(drain(r).1.unwrap().completion_tokens, 4);
        }
    }

    #[test]
    fn common_prefix_lengths() {
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }
}
