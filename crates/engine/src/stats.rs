//! Counters the scheduler keeps as it runs, for a server's `/metrics` and
//! `/health`. Plain atomics: reading them never blocks the scheduler for
//! longer than a short lock around the recent-steps window.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Throughput rates average over this much recent time.
const RATE_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct Stats {
    started: Instant,
    pub n_slots: usize,
    /// Jobs submitted and not yet on a slot (the queue depth). Whoever
    /// submits increments it (so it can refuse work past a bound before
    /// sending); the scheduler decrements it when a job leaves the queue.
    pub queued: AtomicUsize,
    /// Slots running a job.
    pub active: AtomicUsize,
    jobs_started: AtomicU64,
    jobs_cancelled: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    prompt_tokens_evaluated: AtomicU64,
    generated_tokens: AtomicU64,
    forward_passes: AtomicU64,
    batch_tokens: AtomicU64,
    forward_us: AtomicU64,
    ttft_us: AtomicU64,
    ttft_count: AtomicU64,
    job_us: AtomicU64,
    job_count: AtomicU64,
    /// (when, prompt tokens evaluated, tokens generated) per recent step.
    recent: Mutex<VecDeque<(Instant, usize, usize)>>,
    /// Each slot as of the last step.
    slots: Mutex<Vec<SlotInfo>>,
}

/// One slot as of the scheduler's last step (`/slots`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotInfo {
    pub id: usize,
    /// Positions its KV cache holds (a later prompt with the same start
    /// reuses them).
    pub cached_tokens: usize,
    /// The job on it, if any.
    pub job: Option<u64>,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
}

/// The counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub n_slots: usize,
    pub queued: usize,
    pub active: usize,
    pub jobs_started: u64,
    pub jobs_cancelled: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub prompt_tokens_evaluated: u64,
    pub generated_tokens: u64,
    pub forward_passes: u64,
    pub batch_tokens: u64,
    pub forward_seconds: f64,
    /// Sum and count of times from arrival to the first sampled token.
    pub ttft_seconds: f64,
    pub ttft_count: u64,
    /// Sum and count of times from arrival to the end of a job.
    pub job_seconds: f64,
    pub job_count: u64,
    /// Prompt tokens evaluated and tokens generated per second, over the
    /// last 10 s.
    pub prompt_rate: f64,
    pub generation_rate: f64,
}

impl Stats {
    pub fn new(n_slots: usize) -> Stats {
        Stats {
            started: Instant::now(),
            n_slots,
            queued: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            jobs_started: AtomicU64::new(0),
            jobs_cancelled: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            prompt_tokens_evaluated: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            forward_passes: AtomicU64::new(0),
            batch_tokens: AtomicU64::new(0),
            forward_us: AtomicU64::new(0),
            ttft_us: AtomicU64::new(0),
            ttft_count: AtomicU64::new(0),
            job_us: AtomicU64::new(0),
            job_count: AtomicU64::new(0),
            recent: Mutex::new(VecDeque::new()),
            slots: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn start_job(&self, prompt_tokens: usize, cached: usize) {
        self.jobs_started.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(cached as u64, Ordering::Relaxed);
    }

    /// Prompt tokens a job found cached after it started (a choice that
    /// shares another's prompt reading).
    pub(crate) fn add_cached(&self, cached: usize) {
        self.cached_tokens
            .fetch_add(cached as u64, Ordering::Relaxed);
    }

    pub(crate) fn set_slots(&self, slots: impl Iterator<Item = SlotInfo>) {
        let mut v = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        v.clear();
        v.extend(slots);
    }

    /// Each slot as of the scheduler's last step (idle slots before the
    /// first step).
    pub fn slots(&self) -> Vec<SlotInfo> {
        let v = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if v.is_empty() {
            return (0..self.n_slots)
                .map(|id| SlotInfo {
                    id,
                    ..SlotInfo::default()
                })
                .collect();
        }
        v.clone()
    }

    pub(crate) fn first_token(&self, since_queued: Duration) {
        self.ttft_us
            .fetch_add(since_queued.as_micros() as u64, Ordering::Relaxed);
        self.ttft_count.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn finish_job(&self, since_queued: Duration) {
        self.job_us
            .fetch_add(since_queued.as_micros() as u64, Ordering::Relaxed);
        self.job_count.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn cancelled(&self, n: usize) {
        self.jobs_cancelled.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn record_step(&self, batch: usize, prompt: usize, generated: usize, took: Duration) {
        self.forward_passes.fetch_add(1, Ordering::Relaxed);
        self.batch_tokens.fetch_add(batch as u64, Ordering::Relaxed);
        self.prompt_tokens_evaluated
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
        self.forward_us
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        recent.push_back((now, prompt, generated));
        while recent
            .front()
            .is_some_and(|(t, _, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            recent.pop_front();
        }
    }

    /// (prompt, generated) tokens per second over the recent window.
    fn rates(&self) -> (f64, f64) {
        let now = Instant::now();
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut p, mut g) = (0usize, 0usize);
        for &(t, pt, gt) in recent.iter() {
            if now.duration_since(t) <= RATE_WINDOW {
                p += pt;
                g += gt;
            }
        }
        let window = RATE_WINDOW
            .min(now.duration_since(self.started))
            .as_secs_f64()
            .max(1e-3);
        (p as f64 / window, g as f64 / window)
    }

    pub fn snapshot(&self) -> Snapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let secs = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
        let (prompt_rate, generation_rate) = self.rates();
        Snapshot {
            n_slots: self.n_slots,
            queued: self.queued.load(Ordering::Relaxed),
            active: self.active.load(Ordering::Relaxed),
            jobs_started: get(&self.jobs_started),
            jobs_cancelled: get(&self.jobs_cancelled),
            prompt_tokens: get(&self.prompt_tokens),
            cached_tokens: get(&self.cached_tokens),
            prompt_tokens_evaluated: get(&self.prompt_tokens_evaluated),
            generated_tokens: get(&self.generated_tokens),
            forward_passes: get(&self.forward_passes),
            batch_tokens: get(&self.batch_tokens),
            forward_seconds: secs(&self.forward_us),
            ttft_seconds: secs(&self.ttft_us),
            ttft_count: get(&self.ttft_count),
            job_seconds: secs(&self.job_us),
            job_count: get(&self.job_count),
            prompt_rate,
            generation_rate,
        }
    }
}
