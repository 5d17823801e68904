//! Printing results as they come: a llama-bench-like markdown table, a
//! JSON array, JSON lines or CSV. JSON and CSV carry llama-bench's fields
//! under its names, in its order (GPU fields at llama.cpp's CPU-only
//! defaults, so scripts that key on them still work), then ours. CSV, as
//! llama-bench's, quotes every value, writes booleans as 0/1 and leaves the
//! per-repetition arrays out.

use super::super::levels::{Level, Probes};
use super::evict;
use super::timing::{mean, percentile, stddev, Runs, Test};
use anyhow::Result;
use machine::Machine;
use model::KvType;
use serde_json::{json, Value};
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// The commit the binary was built from, when the build says
/// (`CACHEFIT_BUILD_COMMIT` at compile time).
const BUILD_COMMIT: &str = match option_env!("CACHEFIT_BUILD_COMMIT") {
    Some(c) => c,
    None => "unknown",
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Md,
    Json,
    Jsonl,
    Csv,
}

/// What a row says about the model.
pub struct ModelInfo {
    /// As given on the command line, like llama-bench.
    pub filename: String,
    /// "llama 135M Q4_1": architecture, size, main tensor type.
    pub model_type: String,
    /// Tensor bytes.
    pub size: u64,
    pub n_params: u64,
    /// Weight bytes a forward pass reads per token.
    pub bytes_per_token: u64,
}

/// One test's results.
pub struct Row<'a> {
    pub model: &'a ModelInfo,
    pub n_batch: usize,
    pub n_threads: usize,
    pub kv_type: KvType,
    pub use_mmap: bool,
    pub test: Test,
    pub test_time: String,
    pub clean: Runs,
    /// With `--evict`: the sweeper and what the test measured beside it
    /// (and the sweeper's passes).
    pub evicted: Option<(&'a evict::Plan, (Runs, u64))>,
    pub level: Level,
    pub cpu_info: &'a str,
    pub shares_core: bool,
    /// `--pin`: threads pinned to CPUs.
    pub pinned: bool,
}

/// tokens/s of each repetition.
fn samples_ts(runs: &Runs, n_tokens: usize) -> Vec<f64> {
    runs.samples_ns
        .iter()
        .map(|&ns| n_tokens as f64 * 1e9 / ns as f64)
        .collect()
}

fn ms(ns: Option<u64>) -> Value {
    ns.map_or(Value::Null, |n| json!(n as f64 / 1e6))
}

impl Row<'_> {
    fn avg_ts(&self, runs: &Runs) -> f64 {
        mean(&samples_ts(runs, self.test.n_tokens()))
    }

    fn eff_gbps(&self) -> f64 {
        self.model.bytes_per_token as f64 * self.avg_ts(&self.clean) / 1e9
    }

    /// None when the level's bandwidth was not measured (`--no-probe`).
    fn bandwidth_pct(&self) -> Option<f64> {
        (self.level.gbps > 0.0).then(|| 100.0 * self.eff_gbps() / self.level.gbps)
    }

    /// Every field, in output order.
    fn fields(&self) -> Vec<(&'static str, Value)> {
        let n = self.test.n_tokens();
        let ts = samples_ts(&self.clean, n);
        let ns: Vec<f64> = self.clean.samples_ns.iter().map(|&x| x as f64).collect();
        let kv = self.kv_type.to_string();
        let m = self.model;
        let mut f = vec![
            ("build_commit", json!(BUILD_COMMIT)),
            ("build_number", json!(0)),
            ("cpu_info", json!(self.cpu_info)),
            ("gpu_info", json!("")),
            ("backends", json!("CPU")),
            ("model_filename", json!(m.filename)),
            ("model_type", json!(m.model_type)),
            ("model_size", json!(m.size)),
            ("model_n_params", json!(m.n_params)),
            ("n_batch", json!(self.n_batch)),
            ("n_ubatch", json!(self.n_batch)),
            ("n_threads", json!(self.n_threads)),
            ("cpu_mask", json!("0x0")),
            ("cpu_strict", json!(self.pinned)),
            ("poll", json!(50)),
            ("type_k", json!(kv)),
            ("type_v", json!(kv)),
            ("n_gpu_layers", json!(0)),
            ("split_mode", json!("layer")),
            ("main_gpu", json!(0)),
            ("no_kv_offload", json!(false)),
            ("flash_attn", json!(false)),
            ("tensor_split", json!("0.00")),
            ("use_mmap", json!(self.use_mmap)),
            ("embeddings", json!(false)),
            ("n_prompt", json!(self.test.n_prompt)),
            ("n_gen", json!(self.test.n_gen)),
            ("n_depth", json!(self.test.n_depth)),
            ("test_time", json!(self.test_time)),
            ("avg_ns", json!(mean(&ns) as u64)),
            ("stddev_ns", json!(stddev(&ns) as u64)),
            ("avg_ts", json!(mean(&ts))),
            ("stddev_ts", json!(stddev(&ts))),
            ("samples_ns", json!(self.clean.samples_ns)),
            ("samples_ts", json!(ts)),
            ("test", json!(self.test.name())),
            // Generated tokens per second of wall time, prompt included:
            // the cache-fit reference design's decode figure.
            (
                "gen_ts_wall",
                if self.test.n_gen > 0 {
                    json!(self.test.n_gen as f64 * 1e9 / mean(&ns))
                } else {
                    Value::Null
                },
            ),
            ("kernels", json!(kernels::selected().isa().name())),
            ("ttft_ms_p50", ms(percentile(&self.clean.ttft_ns, 50.0))),
            ("ttft_ms_p99", ms(percentile(&self.clean.ttft_ns, 99.0))),
            ("tpot_ms_p50", ms(percentile(&self.clean.tpot_ns, 50.0))),
            ("tpot_ms_p99", ms(percentile(&self.clean.tpot_ns, 99.0))),
            ("bytes_per_token", json!(m.bytes_per_token)),
            ("eff_bandwidth_gbps", json!(self.eff_gbps())),
            ("mem_level", json!(self.level.name)),
            (
                "level_bandwidth_gbps",
                json!((self.level.gbps > 0.0).then_some(self.level.gbps)),
            ),
            ("bandwidth_pct", json!(self.bandwidth_pct())),
        ];
        if let Some((plan, (runs, passes))) = &self.evicted {
            let ets = samples_ts(runs, n);
            let (clean, evicted) = (mean(&ts), mean(&ets));
            f.extend([
                ("evict_mode", json!(plan.mode.name())),
                ("evict_bytes", json!(plan.bytes)),
                ("evict_shares_core", json!(self.shares_core)),
                ("evict_passes", json!(passes)),
                ("clean_ts", json!(clean)),
                ("evicted_ts", json!(evicted)),
                ("evicted_stddev_ts", json!(stddev(&ets))),
                (
                    "evict_ratio",
                    json!(if clean > 0.0 { evicted / clean } else { 0.0 }),
                ),
                ("evicted_tpot_ms_p50", ms(percentile(&runs.tpot_ns, 50.0))),
                ("evicted_samples_ns", json!(runs.samples_ns)),
            ]);
        }
        f
    }
}

/// An object with the fields in order (serde_json's map would sort them).
fn json_object(fields: &[(&str, Value)]) -> String {
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}: {v}", Value::from(*k)))
        .collect();
    format!("{{{}}}", body.join(", "))
}

fn csv_value(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => u8::from(*b).to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// A markdown column: header and width (negative: left-aligned).
struct Col {
    name: &'static str,
    width: isize,
}

const fn col(name: &'static str, width: isize) -> Col {
    Col { name, width }
}

const MD_COLS: [Col; 11] = [
    col("model", -30),
    col("size", 10),
    col("params", 10),
    col("backend", -7),
    col("threads", 7),
    col("test", 15),
    col("t/s", 20),
    col("ttft ms p50/p99", 19),
    col("tpot ms p50/p99", 17),
    col("weights GB/s", 12),
    col("% of level", 12),
];
const MD_EVICT_COLS: [Col; 2] = [col("evicted t/s", 20), col("evicted/clean", 13)];

fn md_line(cols: &[&Col], values: &[String]) -> String {
    let mut s = String::from("|");
    for (c, v) in cols.iter().zip(values) {
        let w = c.width.unsigned_abs();
        if c.width < 0 {
            s += &format!(" {v:<w$} |");
        } else {
            s += &format!(" {v:>w$} |");
        }
    }
    s
}

fn pair_ms(a: Option<u64>, b: Option<u64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:.2} / {:.2}", a as f64 / 1e6, b as f64 / 1e6),
        _ => "-".to_string(),
    }
}

fn human_size(bytes: u64) -> String {
    if bytes < 1 << 30 {
        format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}

fn human_params(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

impl Row<'_> {
    fn md_values(&self) -> Vec<String> {
        let n = self.test.n_tokens();
        let ts = samples_ts(&self.clean, n);
        let c = &self.clean;
        let mut v = vec![
            self.model.model_type.clone(),
            human_size(self.model.size),
            human_params(self.model.n_params),
            "CPU".to_string(),
            self.n_threads.to_string(),
            self.test.name(),
            format!("{:.2} ± {:.2}", mean(&ts), stddev(&ts)),
            pair_ms(percentile(&c.ttft_ns, 50.0), percentile(&c.ttft_ns, 99.0)),
            pair_ms(percentile(&c.tpot_ns, 50.0), percentile(&c.tpot_ns, 99.0)),
            format!("{:.2}", self.eff_gbps()),
            match self.bandwidth_pct() {
                Some(p) => format!("{p:.1}% {}", self.level.name),
                None => format!("- {}", self.level.name),
            },
        ];
        if let Some((_, (runs, _))) = &self.evicted {
            let ets = samples_ts(runs, n);
            let clean = mean(&ts);
            v.push(format!("{:.2} ± {:.2}", mean(&ets), stddev(&ets)));
            v.push(if clean > 0.0 {
                format!("{:.2}", mean(&ets) / clean)
            } else {
                "-".to_string()
            });
        }
        v
    }
}

/// Writes rows to stdout as they finish.
pub struct Printer {
    format: Format,
    evict: bool,
    rows: usize,
    /// For the markdown notes: bytes per token of each model.
    models: Vec<(String, u64)>,
    shared_core_threads: Vec<usize>,
}

impl Printer {
    pub fn new(format: Format, evict: bool) -> Printer {
        Printer {
            format,
            evict,
            rows: 0,
            models: Vec::new(),
            shared_core_threads: Vec::new(),
        }
    }

    fn md_cols(&self) -> Vec<&'static Col> {
        let mut c: Vec<&Col> = MD_COLS.iter().collect();
        if self.evict {
            c.extend(MD_EVICT_COLS.iter());
        }
        c
    }

    pub fn row(&mut self, row: &Row) -> Result<()> {
        let mut out = std::io::stdout().lock();
        let first = self.rows == 0;
        match self.format {
            Format::Md => {
                let cols = self.md_cols();
                if first {
                    let names: Vec<String> = cols.iter().map(|c| c.name.to_string()).collect();
                    writeln!(out, "{}", md_line(&cols, &names))?;
                    let rule: Vec<String> = cols
                        .iter()
                        .map(|c| {
                            let w = c.width.unsigned_abs();
                            let end = if c.width > 0 { ":" } else { "-" };
                            format!("{}{end}", "-".repeat(w - 1))
                        })
                        .collect();
                    writeln!(out, "{}", md_line(&cols, &rule))?;
                }
                writeln!(out, "{}", md_line(&cols, &row.md_values()))?;
            }
            Format::Json => {
                let sep = if first { "[\n" } else { ",\n" };
                write!(out, "{sep}  {}", json_object(&row.fields()))?;
            }
            Format::Jsonl => writeln!(out, "{}", json_object(&row.fields()))?,
            Format::Csv => {
                let fields: Vec<(&str, Value)> = row
                    .fields()
                    .into_iter()
                    .filter(|(_, v)| !v.is_array())
                    .collect();
                if first {
                    let names: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
                    writeln!(out, "{}", names.join(","))?;
                }
                let values: Vec<String> = fields.iter().map(|(_, v)| csv_value(v)).collect();
                writeln!(out, "{}", values.join(","))?;
            }
        }
        out.flush()?;
        self.rows += 1;
        let m = (row.model.model_type.clone(), row.model.bytes_per_token);
        if !self.models.contains(&m) {
            self.models.push(m);
        }
        if row.shares_core && !self.shared_core_threads.contains(&row.n_threads) {
            self.shared_core_threads.push(row.n_threads);
        }
        Ok(())
    }

    /// Close the JSON array; under the markdown table, what the extra
    /// columns mean and what they were measured against.
    pub fn finish(&self, machine: &Machine, levels: &Probes, evict: Option<&evict::Plan>) {
        match self.format {
            Format::Json if self.rows > 0 => outln!("\n]"),
            Format::Json => outln!("[]"),
            Format::Md => self.notes(machine, levels, evict),
            Format::Jsonl | Format::Csv => {}
        }
    }

    fn notes(&self, machine: &Machine, levels: &Probes, evict: Option<&evict::Plan>) {
        let human = super::super::inspect::human_bytes;
        outln!(
            "\nbuild: {BUILD_COMMIT} (cachefit {}), kernels {}, {}",
            env!("CARGO_PKG_VERSION"),
            kernels::selected().isa().name(),
            machine.cpu.model_name.as_deref().unwrap_or("unknown CPU")
        );
        for (model, bpt) in &self.models {
            outln!(
                "weights GB/s: {} read per token ({model}) × t/s; % of level: of that level's read bandwidth (over 100%: a batch reused weights from a cache)",
                human(*bpt)
            );
        }
        let probes: Vec<String> = levels
            .probed()
            .map(|l| {
                format!(
                    "{} {:.1} GB/s with {} thread{} ({} buffer)",
                    l.name,
                    l.gbps,
                    l.n_threads,
                    if l.n_threads == 1 { "" } else { "s" },
                    human(l.probe_bytes)
                )
            })
            .collect();
        if probes.is_empty() {
            outln!("level read bandwidth: not measured (--no-probe)");
        } else {
            outln!("level read bandwidth (best pass): {}", probes.join("; "));
        }
        if let Some(plan) = evict {
            outln!(
                "evict: {}; evicted/clean = evicted t/s ÷ t/s",
                plan.describe()
            );
            if !self.shared_core_threads.is_empty() {
                let t: Vec<String> = self
                    .shared_core_threads
                    .iter()
                    .map(|t| t.to_string())
                    .collect();
                outln!(
                    "evict: with {} benchmark thread(s) the sweeper shares a core with the benchmark ({} CPUs available)",
                    t.join(", "),
                    plan.cpus
                );
            }
        }
        outln!("timings on a shared machine are noisy; compare runs with care");
    }
}

/// Now as RFC 3339 UTC, as llama-bench's `test_time`.
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

fn rfc3339(secs: u64) -> String {
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        s / 3600,
        s % 3600 / 60,
        s % 60
    )
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_704_067_200), "2024-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_709_210_096), "2024-02-29T12:34:56Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn csv_quotes_like_llama_bench() {
        assert_eq!(csv_value(&json!("a\"b")), "\"a\"\"b\"");
        assert_eq!(csv_value(&json!(true)), "\"1\"");
        assert_eq!(csv_value(&json!(12)), "\"12\"");
        assert_eq!(csv_value(&Value::Null), "\"\"");
    }

    #[test]
    fn json_objects_keep_field_order() {
        let s = json_object(&[("z", json!(1)), ("a", json!("x\"y"))]);
        assert_eq!(s, r#"{"z": 1, "a": "x\"y"}"#);
        assert!(serde_json::from_str::<Value>(&s).is_ok());
    }
}
