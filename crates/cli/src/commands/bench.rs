//! `cachefit bench`: llama-bench for cachefit. The same flags (`-m`, `-p`,
//! `-n`, `-pg`, `-d`, `-t`, `-r`, `-o md|json|jsonl|csv`, comma lists for
//! sweeps) and, in JSON and CSV, the same field names, so scripts written
//! for llama-bench read our output; our own fields come after theirs.
//!
//! Tests are llama-bench's. `pp N` evaluates N random token ids in batches
//! of `-b` from an empty cache; `tg N` decodes N tokens one at a time; `pg`
//! is a prompt then a generation, timed as one. With `-d D` the first D
//! positions are filled (untimed) before each test. A test's context is
//! exactly depth + prompt + generation. Each test runs once to warm up
//! (the whole prompt, one generated token, as llama-bench does) and then
//! `-r` times; t/s is tokens / time per repetition, mean ± sample stdev.
//!
//! Beyond llama-bench: time to first token (the prompt, up to the logits
//! of the first generated token) and time per output token (each decode
//! step), as p50/p99; the weight bytes a token reads times t/s, against the
//! measured read bandwidth of the memory level the model's working set fits
//! (above 100% means a batch reused weights from a cache, as prompts do);
//! and with `--evict read|write`, each test again while one more thread
//! sweeps a buffer of at least 4× the last-level cache, so the report shows
//! what cache residency is worth on this machine.

mod evict;
mod memory;
mod report;
mod timing;

use super::builtin::ModelSource;
use super::levels;
use anyhow::{bail, Context, Result};
use evict::{EvictMode, Evictor};
use gguf::{GgmlType, GgufFile, OpenOptions};
use kernels::pool::ThreadPool;
use machine::Machine;
use model::{KvType, MemoryEstimate, Model, ModelConfig, StateOptions, DEFAULT_BATCH};
use report::{Format, ModelInfo, Printer, Row};
use std::collections::BTreeMap;
use std::path::PathBuf;
use timing::{Test, Tokens};

/// llama-bench's defaults.
const DEFAULT_PROMPT: usize = 512;
const DEFAULT_GEN: usize = 128;
const DEFAULT_REPS: usize = 5;
/// The random token ids are the same from run to run.
const DEFAULT_SEED: u64 = 1234;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model files, comma-separated or repeated (default: the
    /// built-in model).
    #[arg(short = 'm', long = "model", value_name = "FILE[,FILE...]")]
    pub model: Vec<String>,
    /// Prompt lengths to time (pp tests), comma-separated; 0 skips
    /// [default: 512].
    #[arg(short = 'p', long = "n-prompt", value_name = "N[,N...]")]
    pub n_prompt: Vec<String>,
    /// Generation lengths to time (tg tests), comma-separated; 0 skips
    /// [default: 128].
    #[arg(short = 'n', long = "n-gen", value_name = "N[,N...]")]
    pub n_gen: Vec<String>,
    /// -pg PP,TG: a prompt then a generation, as one figure (`-pg
    /// 512,128`); repeatable.
    #[arg(long = "pg", value_name = "PP,TG")]
    pub pg: Vec<String>,
    /// Tokens already in the KV cache when each test starts (filled
    /// untimed), comma-separated [default: 0].
    #[arg(short = 'd', long = "n-depth", value_name = "N[,N...]")]
    pub n_depth: Vec<String>,
    /// Thread counts, comma-separated (default: the physical cores this
    /// process may use).
    #[arg(short = 't', long = "threads", value_name = "N[,N...]")]
    pub threads: Vec<String>,
    /// Timed repetitions of each test, after one warm-up run.
    #[arg(short = 'r', long = "repetitions", default_value_t = DEFAULT_REPS)]
    pub repetitions: usize,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "md")]
    pub output: Format,
    /// Tokens per forward pass while reading a prompt.
    #[arg(short = 'b', long = "batch-size", default_value_t = DEFAULT_BATCH)]
    pub batch_size: usize,
    /// -ub N: at most this many tokens per pass (llama-bench's physical
    /// batch): a pass takes the smaller of -b and -ub.
    #[arg(long = "ubatch-size", value_name = "N")]
    pub ubatch_size: Option<usize>,
    /// KV cache type: f16, q8_0 or f32.
    #[arg(
        long = "cache-type",
        visible_alias = "cache-type-k",
        default_value = "f16",
        value_parser = parse_kv_type
    )]
    pub cache_type: KvType,
    /// Run every test a second time while one more thread sweeps a buffer
    /// of at least 4× the last-level cache, reading it or
    /// read-modify-writing it, and report both speeds and their ratio.
    #[arg(long, value_enum)]
    pub evict: Option<EvictMode>,
    /// Seed of the random token ids.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Pin benchmark thread i to the i-th CPU this process may use (and
    /// the --evict sweeper to the next), like llama-bench's --cpu-strict 1.
    #[arg(long)]
    pub pin: bool,
    /// Lock the model's pages in RAM.
    #[arg(long)]
    pub mlock: bool,
    /// Read the model into memory instead of memory-mapping it.
    #[arg(long)]
    pub no_mmap: bool,
    /// A long-memory file made for the model: also time what recalling
    /// from it costs a generation, against the same hot window without it.
    #[arg(long = "memory", value_name = "FILE")]
    pub memory: Option<PathBuf>,
    #[command(flatten)]
    pub mem: super::memory::MemoryArgs,
    /// Skip the bandwidth probe of the memory level the model lives in
    /// (no "% of level"; the process's peak memory is then the
    /// benchmark's own, e.g. to compare RSS with llama-bench).
    #[arg(long)]
    pub no_probe: bool,
}

fn parse_kv_type(s: &str) -> Result<KvType, String> {
    s.parse()
}

/// What the flags ask for, checked.
#[derive(Debug, PartialEq)]
struct Plan {
    /// Empty: the built-in model.
    models: Vec<PathBuf>,
    threads: Vec<usize>,
    depths: Vec<usize>,
    /// In llama-bench's order for one depth: pp tests, tg tests, pg tests.
    tests: Vec<(usize, usize)>,
    /// Tokens per forward pass (the smaller of -b and -ub).
    n_batch: usize,
}

impl Plan {
    fn from_args(args: &Args, default_threads: usize) -> Result<Plan> {
        if args.repetitions == 0 {
            bail!("-r must be at least 1");
        }
        let n_batch = super::common::pass_tokens(args.batch_size, args.ubatch_size)?;
        let prompts = parse_list("-p", &args.n_prompt, &[DEFAULT_PROMPT], 0)?;
        let gens = parse_list("-n", &args.n_gen, &[DEFAULT_GEN], 0)?;
        let depths = parse_list("-d", &args.n_depth, &[0], 0)?;
        let threads = parse_list("-t", &args.threads, &[default_threads], 1)?;
        let mut tests: Vec<(usize, usize)> = Vec::new();
        tests.extend(prompts.iter().filter(|&&p| p > 0).map(|&p| (p, 0)));
        tests.extend(gens.iter().filter(|&&n| n > 0).map(|&n| (0, n)));
        for v in &args.pg {
            let pair = parse_list("-pg", std::slice::from_ref(v), &[], 0)?;
            let &[p, n] = pair.as_slice() else {
                bail!("-pg {v}: expected two numbers, PROMPT,GEN (e.g. -pg 512,128)");
            };
            if p + n > 0 {
                tests.push((p, n));
            }
        }
        if tests.is_empty() {
            bail!("nothing to benchmark: every -p and -n is 0 and there is no -pg");
        }
        let mut models = Vec::new();
        for v in &args.model {
            for item in v.split(',') {
                if item.is_empty() {
                    bail!("-m {v}: empty item in the list");
                }
                models.push(PathBuf::from(item));
            }
        }
        Ok(Plan {
            models,
            threads,
            depths,
            tests,
            n_batch,
        })
    }
}

/// Comma lists from every occurrence of `flag`, or `default` when it was
/// not given; each number at least `min`.
fn parse_list(flag: &str, values: &[String], default: &[usize], min: usize) -> Result<Vec<usize>> {
    if values.is_empty() {
        return Ok(default.to_vec());
    }
    let mut out = Vec::new();
    for v in values {
        for item in v.split(',') {
            let item = item.trim();
            if item.is_empty() {
                bail!("{flag} {v}: empty item in the list");
            }
            let n: usize = item
                .parse()
                .map_err(|_| anyhow::anyhow!("{flag} {v}: `{item}` is not a whole number"))?;
            if n < min {
                bail!("{flag} {v}: must be at least {min}");
            }
            out.push(n);
        }
    }
    Ok(out)
}

pub fn run(args: Args) -> Result<()> {
    let machine = Machine::probe();
    let mut plan = Plan::from_args(&args, machine.threads.n)?;
    for t in &mut plan.threads {
        *t = super::common::cap_threads("-t", *t);
    }
    plan.threads.dedup();
    let models: Vec<ModelSource> = if plan.models.is_empty() {
        vec![ModelSource::BuiltIn]
    } else {
        plan.models
            .iter()
            .map(|p| ModelSource::from_arg(Some(p)))
            .collect::<Result<_>>()?
    };
    // Fail on a missing file before spending minutes on the ones before it.
    for m in &models {
        m.check_exists()?;
    }
    if args.threads.is_empty() {
        eprintln!(
            "cachefit bench: {} thread{} ({})",
            machine.threads.n,
            if machine.threads.n == 1 { "" } else { "s" },
            machine.threads.reason
        );
    }
    let evict = args
        .evict
        .map(|mode| evict::Plan::new(mode, &machine, args.pin));
    let mut printer = Printer::new(args.output, evict.is_some());
    let mut levels = if args.no_probe {
        levels::Probes::skipped(&machine)
    } else {
        levels::Probes::new(&machine)
    };
    for source in &models {
        bench_model(
            source,
            &args,
            &plan,
            &machine,
            evict.as_ref(),
            &mut levels,
            &mut printer,
        )?;
    }
    printer.finish(&machine, &levels, evict.as_ref());
    Ok(())
}

fn bench_model(
    source: &ModelSource,
    args: &Args,
    plan: &Plan,
    machine: &Machine,
    evict: Option<&evict::Plan>,
    levels: &mut levels::Probes,
    printer: &mut Printer,
) -> Result<()> {
    let opts = OpenOptions {
        mmap: !args.no_mmap,
        mlock: args.mlock,
        ..Default::default()
    };
    let file = source.open(opts)?;
    let shown = source.shown();
    let cfg = ModelConfig::from_gguf(file.metadata())
        .with_context(|| format!("{shown}: reading the model config"))?;
    let vocab = match &args.memory {
        Some(_) => Some(
            tokenize::Vocab::from_gguf(file.metadata())
                .with_context(|| format!("{shown}: the model has no usable tokenizer"))?,
        ),
        None => None,
    };
    // Before binding: binding may release pages the hash would read again.
    let fingerprint = vocab
        .as_ref()
        .map(|v| engine::memory::fingerprint(&file, v));
    let model = Model::from_gguf(&file, &cfg).with_context(|| shown.clone())?;
    let info = model_info(source, &file, &cfg, &model);
    eprintln!(
        "cachefit bench: {shown} ({}, {} layers, {} params, {} read per token), kernels {}",
        info.model_type,
        cfg.n_layers,
        info.n_params,
        super::inspect::human_bytes(info.bytes_per_token),
        kernels::selected().isa().name()
    );

    for &n_threads in &plan.threads {
        let pool = ThreadPool::new(n_threads);
        let sweeper_cpu = if args.pin {
            pin_threads(&pool, &machine.cores.allowed)?;
            machine.cores.allowed.get(n_threads).copied()
        } else {
            None
        };
        for &depth in &plan.depths {
            for &(n_prompt, n_gen) in &plan.tests {
                let test = Test {
                    n_prompt,
                    n_gen,
                    n_depth: depth,
                };
                let n_ctx = test.n_ctx();
                if n_ctx > cfg.context_length {
                    bail!(
                        "{}: test {} needs a context of {n_ctx} tokens, more than the model's {}",
                        shown,
                        test.name(),
                        cfg.context_length
                    );
                }
                let o = StateOptions {
                    n_ctx,
                    n_batch: plan.n_batch.min(n_prompt.max(depth).max(1)),
                    kv_type: args.cache_type,
                    ..StateOptions::new(n_ctx)
                };
                let need = MemoryEstimate::for_state(&cfg, info.size, &o);
                if let Some(avail) = model::mem_available() {
                    need.check(avail)
                        .with_context(|| format!("{shown}: test {}", test.name()))?;
                }
                let mut state = model
                    .new_state(&o)
                    .with_context(|| format!("{shown}: test {}", test.name()))?;
                let level = levels.for_working_set(need.total(), n_threads);
                let tokens = Tokens::random(&test, cfg.vocab_size, args.seed);
                let run = timing::Bench {
                    pool: &pool,
                    n_batch: plan.n_batch,
                    reps: args.repetitions,
                };
                let test_time = report::now_rfc3339();
                timing::fill_depth(&run, &mut state, &tokens);
                let clean = run.measure(&mut state, &test, &tokens);
                let evicted = match evict {
                    Some(plan) => {
                        let evictor = Evictor::start(plan, sweeper_cpu)?;
                        let runs = run.measure(&mut state, &test, &tokens);
                        let passes = evictor.stop();
                        Some((runs, passes))
                    }
                    None => None,
                };
                printer.row(&Row {
                    model: &info,
                    n_batch: plan.n_batch,
                    n_threads,
                    kv_type: args.cache_type,
                    use_mmap: !args.no_mmap,
                    test,
                    test_time,
                    clean,
                    evicted: evict.zip(evicted),
                    level,
                    cpu_info: machine.cpu.model_name.as_deref().unwrap_or("unknown"),
                    shares_core: evict.is_some_and(|e| e.shares_core(n_threads)),
                    pinned: args.pin,
                })?;
            }
        }
    }
    if let (Some(path), Some(vocab), Some(fp)) = (&args.memory, &vocab, fingerprint) {
        let gens: Vec<usize> = plan
            .tests
            .iter()
            .map(|&(_, n)| n)
            .filter(|&n| n > 0)
            .collect();
        memory::bench(
            path,
            &file,
            vocab,
            &model,
            fp,
            &plan.threads,
            &gens,
            plan.n_batch,
            args.mem.config(),
        )?;
    }
    Ok(())
}

/// Pin thread i of `pool` (the caller is 0) to `cpus[i]`.
fn pin_threads(pool: &ThreadPool, cpus: &[usize]) -> Result<()> {
    let n = pool.n_threads();
    if n > cpus.len() {
        bail!(
            "--pin: {n} threads but this process may use only {} CPUs",
            cpus.len()
        );
    }
    let refused = std::sync::atomic::AtomicBool::new(false);
    pool.run(|ctx| {
        if machine::pin_current_thread(cpus[ctx.thread_index]).is_err() {
            refused.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    if refused.into_inner() {
        bail!("--pin: the OS refused to pin a thread to CPUs {cpus:?}");
    }
    Ok(())
}

/// llama.cpp's name for an `enum llama_ftype` (`llama_model_ftype_name`).
pub(crate) fn ftype_name(ftype: u32) -> Option<&'static str> {
    Some(match ftype {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        21 => "Q2_K - Small",
        32 => "BF16",
        36 => "TQ1_0 - 1.69 bpw ternary",
        37 => "TQ2_0 - 2.06 bpw ternary",
        _ => return None,
    })
}

fn model_info(
    source: &ModelSource,
    file: &GgufFile,
    cfg: &ModelConfig,
    model: &Model<'_>,
) -> ModelInfo {
    let size: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    // The type holding most of the bytes names the file, as "Q4_1" does
    // in llama.cpp's description of a Q4_1 file with a Q8_0 embedding.
    let mut by_type: BTreeMap<GgmlType, u64> = BTreeMap::new();
    for t in file.tensors() {
        *by_type.entry(t.ty).or_default() += t.n_bytes;
    }
    // A file that says its `general.file_type` (a quantization mix such
    // as Q4_K_M) is named by it, as llama-bench does.
    let ftype = file.metadata().get_u32("general.file_type").ok();
    let main_type = match ftype.and_then(ftype_name) {
        Some(name) => name,
        None => by_type
            .iter()
            .max_by_key(|(_, &b)| b)
            .map_or("?", |(ty, _)| ty.name()),
    };
    let params = match n_params {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.0}M", n as f64 / 1e6),
        n => format!("{:.0}K", n as f64 / 1e3),
    };
    ModelInfo {
        filename: source.shown(),
        model_type: format!("{} {params} {}", cfg.arch.name(), main_type),
        size,
        n_params,
        bytes_per_token: model.bytes_per_token() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::ffi::OsString;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: Cmd,
    }
    #[derive(clap::Subcommand)]
    enum Cmd {
        Bench(Args),
    }

    fn plan(argv: &[&str]) -> Result<Plan> {
        let argv = crate::commands::rewrite_args(
            ["cachefit", "bench"]
                .iter()
                .chain(argv)
                .map(|s| OsString::from(*s)),
        );
        let Cmd::Bench(args) = Cli::try_parse_from(argv)?.cmd;
        Plan::from_args(&args, 3)
    }

    #[test]
    fn defaults_are_llama_benchs() {
        let p = plan(&["-m", "a.gguf"]).unwrap();
        assert_eq!(p.tests, vec![(512, 0), (0, 128)]);
        assert_eq!(p.threads, vec![3]);
        assert_eq!(p.depths, vec![0]);
        assert_eq!(p.models, vec![PathBuf::from("a.gguf")]);
    }

    #[test]
    fn a_pass_takes_the_smaller_of_b_and_ub() {
        assert_eq!(plan(&[]).unwrap().n_batch, DEFAULT_BATCH);
        assert_eq!(plan(&["-b", "64", "-ub", "16"]).unwrap().n_batch, 16);
        assert_eq!(
            plan(&["-b", "8", "--ubatch-size", "512"]).unwrap().n_batch,
            8
        );
    }

    #[test]
    fn lists_sweep_and_pg_comes_last() {
        let p = plan(&[
            "-m", "a,b", "-p", "16,0,32", "-n", "8", "-pg", "4,4", "-pg=2,0", "-t", "1,2", "-d",
            "0,64",
        ])
        .unwrap();
        assert_eq!(p.models.len(), 2);
        assert_eq!(p.tests, vec![(16, 0), (32, 0), (0, 8), (4, 4), (2, 0)]);
        assert_eq!(p.threads, vec![1, 2]);
        assert_eq!(p.depths, vec![0, 64]);
        // Repeated flags add to the list, as in llama-bench.
        let p = plan(&["-p", "1", "-p", "2", "-n", "0"]).unwrap();
        assert_eq!(p.tests, vec![(1, 0), (2, 0)]);
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        let err = |a: &[&str]| plan(a).unwrap_err().to_string();
        assert!(err(&["-t", "1,,2"]).contains("empty item"));
        assert!(err(&["-p", "x"]).contains("`x` is not a whole number"));
        assert!(err(&["-t", "0"]).contains("at least 1"));
        assert!(err(&["-r", "0"]).contains("-r must be at least 1"));
        assert!(err(&["-b", "0"]).contains("-b must be at least 1"));
        assert!(err(&["-ub", "0"]).contains("-ub must be at least 1"));
        assert!(err(&["-pg", "1,2,3"]).contains("two numbers"));
        assert!(err(&["-p", "0", "-n", "0"]).contains("nothing to benchmark"));
        assert!(err(&["-m", "a,,b"]).contains("empty item"));
    }
}
