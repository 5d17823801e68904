//! The engine's counters ([`engine::Stats`]) and the HTTP side's response
//! counts, rendered as Prometheus text at `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex, PoisonError};

use engine::Stats;

#[derive(Debug)]
pub struct Metrics {
    /// The engine's counters.
    pub stats: Arc<Stats>,
    /// Responses by (route, status code).
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
}

impl Metrics {
    pub fn new(stats: Arc<Stats>) -> Metrics {
        Metrics {
            stats,
            requests: Mutex::new(BTreeMap::new()),
        }
    }

    /// An HTTP response went out.
    pub fn response(&self, route: &'static str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        *map.entry((route, status)).or_insert(0) += 1;
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
        let st = self.stats.snapshot();
        let secs = |s: f64| format!("{s:.6}");
        metric(
            "cachefit_slots",
            "gauge",
            "Slots (sequences decoded together).",
            st.n_slots.to_string(),
        );
        metric(
            "cachefit_slots_busy",
            "gauge",
            "Slots running a request.",
            st.active.to_string(),
        );
        metric(
            "cachefit_queue_depth",
            "gauge",
            "Requests waiting for a slot.",
            st.queued.to_string(),
        );
        metric(
            "cachefit_generations_started_total",
            "counter",
            "Generations that got a slot.",
            st.jobs_started.to_string(),
        );
        metric(
            "cachefit_generations_cancelled_total",
            "counter",
            "Generations dropped because the client went away.",
            st.jobs_cancelled.to_string(),
        );
        metric(
            "cachefit_prompt_tokens_total",
            "counter",
            "Prompt tokens of started generations.",
            st.prompt_tokens.to_string(),
        );
        metric(
            "cachefit_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a slot's cache.",
            st.cached_tokens.to_string(),
        );
        metric(
            "cachefit_prompt_tokens_evaluated_total",
            "counter",
            "Prompt tokens run through the model.",
            st.prompt_tokens_evaluated.to_string(),
        );
        metric(
            "cachefit_generated_tokens_total",
            "counter",
            "Tokens generated.",
            st.generated_tokens.to_string(),
        );
        metric(
            "cachefit_forward_passes_total",
            "counter",
            "Batched forward passes.",
            st.forward_passes.to_string(),
        );
        metric(
            "cachefit_batch_tokens_total",
            "counter",
            "Tokens evaluated over all forward passes.",
            st.batch_tokens.to_string(),
        );
        metric(
            "cachefit_forward_seconds_total",
            "counter",
            "Time spent in forward passes.",
            secs(st.forward_seconds),
        );
        let (prompt_rate, gen_rate) = (st.prompt_rate, st.generation_rate);
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
            secs(st.ttft_seconds),
            st.ttft_count
        );
        let _ = writeln!(
            out,
            "# HELP cachefit_generation_seconds Time from arrival to the end of a generation.\n\
             # TYPE cachefit_generation_seconds summary\n\
             cachefit_generation_seconds_sum {}\n\
             cachefit_generation_seconds_count {}",
            secs(st.job_seconds),
            st.job_count
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
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::new(Arc::new(Stats::new(4)));
        m.response("/v1/completions", 200);
        m.response("/v1/completions", 200);
        m.response("/health", 200);
        m.stats.record_step(5, 3, 2, Duration::from_millis(10));
        m.stats.queued.store(2, Ordering::Relaxed);
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
