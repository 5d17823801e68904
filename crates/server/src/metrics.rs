//! Counters the engine and the HTTP side update, rendered as Prometheus
//! text at `GET /metrics`. Plain atomics: nothing here ever blocks the
//! engine for longer than a short lock around the recent-steps window.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Throughput gauges average over this much recent time.
const RATE_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct Metrics {
    started: Instant,
    pub n_slots: usize,
    /// Jobs sent to the engine and not yet on a slot (the queue depth).
    pub queued: AtomicUsize,
    /// Slots running a job.
    pub active: AtomicUsize,
    /// Responses by (route, status code).
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
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
    request_us: AtomicU64,
    request_count: AtomicU64,
    /// (when, prompt tokens evaluated, tokens generated) per recent step.
    recent: Mutex<VecDeque<(Instant, usize, usize)>>,
}

impl Metrics {
    pub fn new(n_slots: usize) -> Metrics {
        Metrics {
            started: Instant::now(),
            n_slots,
            queued: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            requests: Mutex::new(BTreeMap::new()),
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
            request_us: AtomicU64::new(0),
            request_count: AtomicU64::new(0),
            recent: Mutex::new(VecDeque::new()),
        }
    }

    /// An HTTP response went out.
    pub fn response(&self, route: &'static str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        *map.entry((route, status)).or_insert(0) += 1;
    }

    pub fn start_job(&self, prompt_tokens: usize, cached: usize) {
        self.jobs_started.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(cached as u64, Ordering::Relaxed);
    }

    pub fn first_token(&self, since_queued: Duration) {
        self.ttft_us
            .fetch_add(since_queued.as_micros() as u64, Ordering::Relaxed);
        self.ttft_count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn finish_job(&self, since_queued: Duration) {
        self.request_us
            .fetch_add(since_queued.as_micros() as u64, Ordering::Relaxed);
        self.request_count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cancelled(&self, n: usize) {
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

    /// Prometheus text exposition format, version 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        let secs = |a: &AtomicU64| format!("{:.6}", a.load(Ordering::Relaxed) as f64 / 1e6);
        metric(
            "cachefit_slots",
            "gauge",
            "Slots (sequences decoded together).",
            self.n_slots.to_string(),
        );
        metric(
            "cachefit_slots_busy",
            "gauge",
            "Slots running a request.",
            self.active.load(Ordering::Relaxed).to_string(),
        );
        metric(
            "cachefit_queue_depth",
            "gauge",
            "Requests waiting for a slot.",
            self.queued.load(Ordering::Relaxed).to_string(),
        );
        metric(
            "cachefit_generations_started_total",
            "counter",
            "Generations that got a slot.",
            get(&self.jobs_started),
        );
        metric(
            "cachefit_generations_cancelled_total",
            "counter",
            "Generations dropped because the client went away.",
            get(&self.jobs_cancelled),
        );
        metric(
            "cachefit_prompt_tokens_total",
            "counter",
            "Prompt tokens of started generations.",
            get(&self.prompt_tokens),
        );
        metric(
            "cachefit_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a slot's cache.",
            get(&self.cached_tokens),
        );
        metric(
            "cachefit_prompt_tokens_evaluated_total",
            "counter",
            "Prompt tokens run through the model.",
            get(&self.prompt_tokens_evaluated),
        );
        metric(
            "cachefit_generated_tokens_total",
            "counter",
            "Tokens generated.",
            get(&self.generated_tokens),
        );
        metric(
            "cachefit_forward_passes_total",
            "counter",
            "Batched forward passes.",
            get(&self.forward_passes),
        );
        metric(
            "cachefit_batch_tokens_total",
            "counter",
            "Tokens evaluated over all forward passes.",
            get(&self.batch_tokens),
        );
        metric(
            "cachefit_forward_seconds_total",
            "counter",
            "Time spent in forward passes.",
            secs(&self.forward_us),
        );
        let (prompt_rate, gen_rate) = self.rates();
        metric(
            "cachefit_prompt_tokens_per_second",
            "gauge",
            "Prompt tokens evaluated per second over the last 10 s.",
            format!("{prompt_rate:.3}"),
        );
        metric(
            "cachefit_generated_tokens_per_second",
            "gauge",
            "Tokens generated per second over the last 10 s.",
            format!("{gen_rate:.3}"),
        );
        let _ = writeln!(
            out,
            "# HELP cachefit_time_to_first_token_seconds Time from arrival to the first sampled token.\n\
             # TYPE cachefit_time_to_first_token_seconds summary\n\
             cachefit_time_to_first_token_seconds_sum {}\n\
             cachefit_time_to_first_token_seconds_count {}",
            secs(&self.ttft_us),
            get(&self.ttft_count)
        );
        let _ = writeln!(
            out,
            "# HELP cachefit_generation_seconds Time from arrival to the end of a generation.\n\
             # TYPE cachefit_generation_seconds summary\n\
             cachefit_generation_seconds_sum {}\n\
             cachefit_generation_seconds_count {}",
            secs(&self.request_us),
            get(&self.request_count)
        );
        let _ = writeln!(
            out,
            "# HELP cachefit_http_requests_total HTTP responses by route and status.\n\
             # TYPE cachefit_http_requests_total counter"
        );
        let map = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        for ((route, code), n) in map.iter() {
            let _ = writeln!(
                out,
                "cachefit_http_requests_total{{route=\"{route}\",code=\"{code}\"}} {n}"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::new(4);
        m.response("/v1/completions", 200);
        m.response("/v1/completions", 200);
        m.response("/health", 200);
        m.record_step(5, 3, 2, Duration::from_millis(10));
        m.queued.store(2, Ordering::Relaxed);
        let text = m.render();
        assert!(text.contains("cachefit_queue_depth 2\n"));
        assert!(text.contains("cachefit_generated_tokens_total 2\n"));
        assert!(text
            .contains("cachefit_http_requests_total{route=\"/v1/completions\",code=\"200\"} 2\n"));
        assert!(text.contains("# TYPE cachefit_generated_tokens_per_second gauge\n"));
        // Every sample line is `name{labels} value`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
