//! `cachefit info [-m FILE] [-c CTX] [-t N] [--json] [--quick]`: what this
//! machine offers a model and what a model asks of it.
//!
//! The machine half: CPU, the features the kernels use and the kernel set
//! picked, the CPUs, cores and cgroup quota that decide the default thread
//! count, cache sizes, and the read bandwidth of a buffer sized for each
//! level (half of L1d, half of L2, half of L3, then DRAM). The model half:
//! its weights, KV cache and working set, the smallest level that holds
//! them, and the decode speed that level's bandwidth allows when every
//! token reads all weights plus a full-context KV cache. That is a ceiling:
//! compute, synchronisation and a shorter context move real speed from it
//! in both directions.

use super::inspect::human_bytes;
use super::levels;
use super::stream::PROBE_TIME;
use crate::kernel_env;
use anyhow::{Context, Result};
use kernels::bandwidth::{measure_read, Bandwidth};
use kernels::isa::Isa;
use kernels::pool::ThreadPool;
use machine::{format_cpulist, Cache, Machine};
use model::{MemoryEstimate, Model, ModelConfig, StateOptions, WeightsResidency};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// Time per probe with `--quick`.
const QUICK_PROBE_TIME: Duration = Duration::from_millis(20);
/// What the decode ceiling counts as read per token.
const BYTES_PER_TOKEN_COUNTS: &str = "weights + KV cache at full context";

/// Depth of the short-context ceiling: what `bench`'s tg128 reads (it
/// starts from an empty cache), where the weights are nearly all of it.
const SHORT_CONTEXT: usize = 128;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model to size against this machine (default: the built-in
    /// model).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Context size for the KV cache (default: the model's, at most 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Threads for the bandwidth probes (default: the physical cores this
    /// process may use, capped by its cgroup CPU quota).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Probe for a few milliseconds per level instead of half a second
    /// (noisier numbers).
    #[arg(long)]
    pub quick: bool,
}

/// A memory level the probes and the fit are about.
struct Level {
    /// "L1", "L2", "L3", "DRAM".
    name: &'static str,
    /// What it holds: the sysfs cache size, or the memory available for
    /// DRAM (`None` if unknown).
    capacity: Option<u64>,
    probe_bytes: u64,
    bandwidth: Bandwidth,
}

/// What a model needs, before any probing.
struct ModelNeeds {
    /// Its path, or the built-in model's name.
    file: String,
    n_ctx: usize,
    memory: MemoryEstimate,
    /// What `run` holds resident at the same context: the weights as the
    /// loader's binder leaves them, KV cache and scratch; or why the
    /// weights cannot be bound (`info` still sizes a file `run` refuses).
    budget: std::result::Result<Budget, String>,
}

/// The memory budget of `cachefit run -m FILE -c N`, from the loader's own
/// code ([`model::Model::plan_residency`], [`MemoryEstimate::for_state`]).
struct Budget {
    weights: WeightsResidency,
    state: MemoryEstimate,
}

impl Budget {
    fn total(&self) -> u64 {
        self.state.total()
    }
}

pub fn run(args: Args) -> Result<()> {
    // Model errors first: no point probing for seconds to then fail.
    let needs = Some(model_needs(
        &super::builtin::ModelSource::from_arg(args.model.as_ref())?,
        args.ctx_size,
    )?);
    let machine = Machine::probe();
    let threads = match args.threads {
        Some(_) => super::common::threads(args.threads)?,
        None => machine.threads.clone(),
    };
    let probe_time = if args.quick {
        QUICK_PROBE_TIME
    } else {
        PROBE_TIME
    };
    let pool = ThreadPool::new(threads.n);
    let levels = probe_levels(&machine, &pool, probe_time);
    let fit = needs.as_ref().map(|n| fit(n, &levels));

    if args.json {
        let out = json!({
            "cpu": {"model": machine.cpu.model_name, "vendor": machine.cpu.vendor},
            "features": features().into_iter().map(|(f, on)| (f.to_string(), json!(on))).collect::<serde_json::Map<_, _>>(),
            "kernels": kernels_json(),
            "cpus": {
                "allowed": format_cpulist(&machine.cores.allowed),
                "n_allowed": machine.cores.allowed.len(),
                "physical_cores": machine.cores.physical,
                "cgroup_quota_cpus": machine.cores.quota.as_ref().map(|q| q.cpus),
                "cgroup_quota_file": machine.cores.quota.as_ref().map(|q| q.file.display().to_string()),
            },
            "default_threads": {"n": machine.threads.n, "reason": machine.threads.reason},
            "threads": threads.n,
            "caches": machine.caches.levels().map(cache_json).collect::<Vec<_>>(),
            "probe_ms": probe_time.as_millis() as u64,
            "bandwidth": levels.iter().map(|l| json!({
                "level": l.name,
                "buffer_bytes": l.probe_bytes,
                "threads": threads.n,
                "best_gbps": l.bandwidth.best_gbps,
                "median_gbps": l.bandwidth.median_gbps,
                "passes": l.bandwidth.passes,
            })).collect::<Vec<_>>(),
            "model": match (&needs, &fit) {
                (Some(n), Some(f)) => model_json(n, f, &threads),
                _ => Value::Null,
            },
        });
        outln!("{out}");
        return Ok(());
    }

    print_machine(&machine, &threads, &levels, probe_time);
    if let (Some(n), Some(f)) = (&needs, &fit) {
        print_model(n, f, &threads);
    }
    Ok(())
}

fn model_needs(
    source: &super::builtin::ModelSource,
    ctx_size: Option<usize>,
) -> Result<ModelNeeds> {
    let file = source.open(gguf::OpenOptions::default())?;
    let cfg = ModelConfig::from_gguf(file.metadata())
        .with_context(|| format!("{}: reading the model config", source.shown()))?;
    let n_ctx = super::common::n_ctx(&cfg, ctx_size)?;
    let weights_bytes: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    // Opened as `run` opens it (mapped), bound by the same code without
    // repacking.
    let budget = Model::plan_residency(&file, &cfg)
        .map(|weights| Budget {
            weights,
            state: MemoryEstimate::for_state(&cfg, weights.total(), &StateOptions::new(n_ctx)),
        })
        .map_err(|e| e.to_string());
    Ok(ModelNeeds {
        file: source.shown(),
        n_ctx,
        memory: MemoryEstimate::new(&cfg, weights_bytes, n_ctx),
        budget,
    })
}

/// Read bandwidth of a buffer half the size of each known cache level, and
/// of a DRAM-sized one ([`levels::specs`]).
fn probe_levels(machine: &Machine, pool: &ThreadPool, probe_time: Duration) -> Vec<Level> {
    levels::specs(machine, model::mem_available())
        .into_iter()
        .map(|s| probe(pool, s.name, s.capacity, s.probe_bytes, probe_time))
        .collect()
}

fn probe(
    pool: &ThreadPool,
    name: &'static str,
    capacity: Option<u64>,
    bytes: u64,
    probe_time: Duration,
) -> Level {
    let probe_bytes = bytes.max(8);
    let bandwidth = measure_read(
        pool,
        usize::try_from(probe_bytes).unwrap_or(usize::MAX),
        probe_time,
    );
    Level {
        name,
        capacity,
        probe_bytes,
        bandwidth,
    }
}

/// Where a model's working set lives and how fast decode can go there.
struct Fit<'a> {
    /// The smallest level that holds the working set (DRAM if no cache
    /// does, even when DRAM is too small: the probe says nothing faster).
    level: &'a Level,
    /// False only when the working set exceeds even the available memory.
    fits: bool,
    /// Whether it fits in half that level (`None` for DRAM of unknown
    /// size). Half, because the activations, the KV cache being written
    /// and everything else running compete for the rest.
    fits_in_half: Option<bool>,
    bytes_per_token: u64,
    ceiling_tok_s: f64,
    /// The same at [`SHORT_CONTEXT`] tokens of cache: the level that
    /// holds that working set, and its ceiling.
    short_level: &'a Level,
    short_bytes_per_token: u64,
    short_ceiling_tok_s: f64,
}

fn fit<'a>(needs: &ModelNeeds, levels: &'a [Level]) -> Fit<'a> {
    let working_set = needs.memory.total();
    // `probe_levels` always ends with DRAM.
    let dram = &levels[levels.len() - 1];
    let level = levels
        .iter()
        .find(|l| l.capacity.is_some_and(|c| working_set <= c))
        .unwrap_or(dram);
    let bytes_per_token = needs.memory.weights + needs.memory.kv_cache;
    // The caches grow linearly with the context (KV and conv history).
    let short = SHORT_CONTEXT.min(needs.n_ctx.max(1)) as u64;
    let short_kv = needs.memory.kv_cache * short / needs.n_ctx.max(1) as u64;
    let short_set = working_set - needs.memory.kv_cache + short_kv;
    let short_level = levels
        .iter()
        .find(|l| l.capacity.is_some_and(|c| short_set <= c))
        .unwrap_or(dram);
    let short_bytes_per_token = needs.memory.weights + short_kv;
    Fit {
        level,
        fits: level.capacity.is_none_or(|c| working_set <= c),
        fits_in_half: level.capacity.map(|c| working_set <= c / 2),
        bytes_per_token,
        ceiling_tok_s: level.bandwidth.best_gbps * 1e9 / bytes_per_token.max(1) as f64,
        short_level,
        short_bytes_per_token,
        short_ceiling_tok_s: short_level.bandwidth.best_gbps * 1e9
            / short_bytes_per_token.max(1) as f64,
    }
}

/// The CPU features the kernel sets are written for, and whether this CPU
/// has each (the checks `kernels::isa` makes).
fn features() -> Vec<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        vec![
            ("avx2", has!("avx2")),
            ("fma", has!("fma")),
            ("f16c", has!("f16c")),
            ("avx512f", has!("avx512f")),
            ("avx512bw", has!("avx512bw")),
            ("avx512vl", has!("avx512vl")),
            ("avx512dq", has!("avx512dq")),
            ("avx512vnni", has!("avx512vnni")),
        ]
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        vec![("neon", has!("neon")), ("dotprod", has!("dotprod"))]
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Vec::new()
    }
}

fn kernels_json() -> Value {
    let choice = kernel_env::choice();
    json!({
        "selected": kernels::selected().isa().name(),
        "best_supported": Isa::detect().name(),
        "supported": Isa::supported().iter().map(|i| i.name()).collect::<Vec<_>>(),
        "forced": choice.forced(),
        "forced_by_env": choice.requested,
        "tiles": kernels::config().tiles,
    })
}

fn cache_json(c: &Cache) -> Value {
    json!({
        "name": c.name(),
        "level": c.level,
        "bytes": c.size_bytes,
        "shared_cpus": c.shared_cpus.as_deref().map(format_cpulist),
    })
}

fn model_json(needs: &ModelNeeds, fit: &Fit, threads: &machine::ThreadChoice) -> Value {
    let m = &needs.memory;
    json!({
        "file": needs.file,
        "n_ctx": needs.n_ctx,
        "weights_bytes": m.weights,
        "kv_bytes": m.kv_cache,
        "scratch_bytes": m.scratch,
        "working_set_bytes": m.total(),
        "fits_level": fit.level.name,
        "fits_level_bytes": fit.level.capacity,
        "fits_in_memory": fit.fits,
        "fits_in_half": fit.fits_in_half,
        "bytes_per_token": fit.bytes_per_token,
        "bytes_per_token_counts": BYTES_PER_TOKEN_COUNTS,
        "level_read_gbps": fit.level.bandwidth.best_gbps,
        "decode_ceiling_tok_s": fit.ceiling_tok_s,
        "short_context": SHORT_CONTEXT.min(needs.n_ctx),
        "short_context_level": fit.short_level.name,
        "short_context_bytes_per_token": fit.short_bytes_per_token,
        "decode_ceiling_short_tok_s": fit.short_ceiling_tok_s,
        "recommended_threads": threads.n,
        "recommended_threads_reason": threads.reason,
        "budget": match &needs.budget {
            Ok(b) => budget_json(b),
            Err(e) => json!({"error": e}),
        },
    })
}

fn budget_json(b: &Budget) -> Value {
    let w = &b.weights;
    json!({
        "counts": BUDGET_COUNTS,
        "weights_made_bytes": w.made,
        "weights_in_place_bytes": w.in_place,
        "weights_by_row_bytes": w.by_row,
        "weights_file_copy_bytes": w.file_copy,
        "weights_bytes": w.total(),
        "kv_bytes": b.state.kv_cache,
        "scratch_bytes": b.state.scratch,
        "total_bytes": b.total(),
    })
}

/// What the budget is, in one line for the JSON.
const BUDGET_COUNTS: &str = "what `cachefit run -m FILE -c N` holds resident with default flags: \
    weights as bound (row tiles and copies made at load, file pages read in place every token, \
    embedding tables read by row counted whole, or the whole file when read into memory), \
    KV cache, scratch; not the binary, the tokenizer's tables or the allocator's slack";

fn print_machine(
    machine: &Machine,
    threads: &machine::ThreadChoice,
    levels: &[Level],
    probe_time: Duration,
) {
    let cpu = &machine.cpu;
    outln!(
        "cpu:       {}{}",
        cpu.model_name.as_deref().unwrap_or("unknown"),
        cpu.vendor
            .as_deref()
            .map_or(String::new(), |v| format!(" ({v})"))
    );
    let feats = features();
    let list = |on: bool| {
        let v: Vec<&str> = feats
            .iter()
            .filter(|(_, h)| *h == on)
            .map(|(f, _)| *f)
            .collect();
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(" ")
        }
    };
    outln!("features:  {} (missing: {})", list(true), list(false));
    let selected = kernels::selected().isa();
    let choice = kernel_env::choice();
    let why = match (&choice.requested, &choice.refused) {
        (Some(v), None) if choice.forced() => format!("forced by {}={v}", kernel_env::KERNELS_VAR),
        (_, Some(refused)) => format!("the best this CPU supports; {refused}"),
        _ => "the best this CPU supports".to_string(),
    };
    let tiles = if kernels::config().tiles {
        ""
    } else {
        ", row tiles off"
    };
    outln!("kernels:   {} ({why}){tiles}", selected.name());
    let cores = &machine.cores;
    outln!(
        "cpus:      {} allowed ({}), {} physical core{}, cgroup quota {}",
        cores.allowed.len(),
        format_cpulist(&cores.allowed),
        cores.physical,
        if cores.physical == 1 { "" } else { "s" },
        cores.quota.as_ref().map_or("none".to_string(), |q| format!(
            "{} CPUs ({})",
            q.cpus,
            q.file.display()
        ))
    );
    outln!(
        "threads:   {} by default: {}",
        machine.threads.n,
        machine.threads.reason
    );
    let caches: Vec<String> = machine
        .caches
        .levels()
        .map(|c| {
            let shared = match &c.shared_cpus {
                Some(cpus) if cpus.len() > 1 => format!(" shared by CPUs {}", format_cpulist(cpus)),
                Some(_) => " per core".to_string(),
                None => String::new(),
            };
            format!("{} {}{shared}", c.name(), human_bytes(c.size_bytes))
        })
        .collect();
    outln!(
        "caches:    {}",
        if caches.is_empty() {
            "unknown".to_string()
        } else {
            caches.join(", ")
        }
    );
    outln!(
        "\nread bandwidth with {} thread{}, best pass over {} ms per level:",
        threads.n,
        if threads.n == 1 { "" } else { "s" },
        probe_time.as_millis()
    );
    for l in levels {
        outln!(
            "  {:<5} {:>11}  {:>8.1} GB/s  (median {:.1})",
            l.name,
            human_bytes(l.probe_bytes),
            l.bandwidth.best_gbps,
            l.bandwidth.median_gbps
        );
    }
}

fn print_model(needs: &ModelNeeds, fit: &Fit, threads: &machine::ThreadChoice) {
    let m = &needs.memory;
    outln!("\nmodel:     {}", needs.file);
    outln!("  weights        {}", human_bytes(m.weights));
    outln!(
        "  KV cache       {} at {} tokens",
        human_bytes(m.kv_cache),
        needs.n_ctx
    );
    outln!("  scratch        {}", human_bytes(m.scratch));
    outln!("  working set    {}", human_bytes(m.total()));
    let l = fit.level;
    let capacity = match (l.capacity, l.name) {
        (None, _) => "size unknown".to_string(),
        (Some(c), "DRAM") => format!("{} available", human_bytes(c)),
        (Some(c), _) => human_bytes(c),
    };
    if fit.fits {
        let half = match fit.fits_in_half {
            Some(true) => ", within half of it",
            Some(false) => ", but not within half of it",
            None => "",
        };
        outln!("  fits in        {} ({capacity}){half}", l.name);
    } else {
        outln!("  fits in        nothing: more than the {capacity} of memory");
    }
    outln!(
        "  decode ceiling {:.1} tok/s = {:.1} GB/s ({}) / {} per token ({BYTES_PER_TOKEN_COUNTS})",
        fit.ceiling_tok_s,
        l.bandwidth.best_gbps,
        l.name,
        human_bytes(fit.bytes_per_token),
    );
    outln!(
        "  short context  {:.1} tok/s = {:.1} GB/s ({}) / {} per token (KV cache at {} tokens, as bench's tg128 starts)",
        fit.short_ceiling_tok_s,
        fit.short_level.bandwidth.best_gbps,
        fit.short_level.name,
        human_bytes(fit.short_bytes_per_token),
        SHORT_CONTEXT.min(needs.n_ctx),
    );
    outln!("  threads        {}: {}", threads.n, threads.reason);
    match &needs.budget {
        Ok(b) => print_budget(b, needs.n_ctx),
        Err(e) => outln!("\nmemory budget of `run`: none, the weights do not bind: {e}"),
    }
}

fn print_budget(b: &Budget, n_ctx: usize) {
    let w = &b.weights;
    outln!("\nmemory budget of `run` at {n_ctx} tokens (what it holds resident):");
    outln!("  weights        {}", human_bytes(w.total()));
    let parts = [
        (w.made, "made at load (row tiles, copies, f32 vectors)"),
        (w.in_place, "file pages read in place every token"),
        (w.by_row, "embedding table, read by row (counted whole)"),
        (w.file_copy, "the file, read into memory"),
    ];
    for (bytes, what) in parts.into_iter().filter(|(b, _)| *b > 0) {
        outln!("    {:>11}  {what}", human_bytes(bytes));
    }
    outln!("  KV cache       {}", human_bytes(b.state.kv_cache));
    outln!("  scratch        {}", human_bytes(b.state.scratch));
    outln!(
        "  total          {} (plus the binary, the tokenizer's tables and the allocator)",
        human_bytes(b.total())
    );
}
