//! What the model-running commands share: opening a model file with its
//! config and tokenizer, choosing threads and the context, and checking the
//! memory need before anything large is allocated.

use super::builtin::ModelSource;
use anyhow::{bail, Context, Result};
use gguf::{GgufFile, OpenOptions};
use kernels::pool::ThreadPool;
use model::{KvType, MemoryEstimate, ModelConfig, StateOptions, DEFAULT_BATCH};
use std::path::PathBuf;

/// Context used when `-c` is not given, if the model allows that much.
pub const DEFAULT_CTX: usize = 4096;

/// Which model file and how to load and run it.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    /// GGUF model file, or the name of a cached model (`owner/repo:QUANT`,
    /// `repo`, a file stem: see `cachefit models`) (default: the built-in
    /// cachefit-ternary model).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// -hf OWNER/REPO[:QUANT]: a model on the Hugging Face hub (or
    /// HF_ENDPOINT), downloaded into the cache if not there yet; the quant
    /// picks the .gguf file (default Q4_K_M), as llama.cpp.
    #[arg(
        long = "hf-repo",
        value_name = "REPO[:QUANT]",
        conflicts_with = "model"
    )]
    pub hf_repo: Option<String>,
    /// -hff FILE: this file of the -hf repo instead of a quant's.
    #[arg(long = "hf-file", value_name = "FILE", requires = "hf_repo")]
    pub hf_file: Option<String>,
    /// The model once found (and downloaded): resolved once per run.
    #[arg(skip)]
    resolved: std::sync::OnceLock<ModelSource>,
    /// Threads (default: the physical cores this process may use, after
    /// CPU affinity and cgroup limits).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// -tb N: threads for reading prompts, in batches of many tokens, as in
    /// llama.cpp (default: as -t). Prompt reading is bound by arithmetic,
    /// generation by memory bandwidth, so the best counts can differ.
    #[arg(long = "threads-batch", value_name = "N")]
    pub threads_batch: Option<usize>,
    /// Run only on these CPUs, a hex mask as in llama.cpp (`-C 0x3`: CPUs 0
    /// and 1). Every thread inherits it; without -t, the thread count is
    /// the physical cores among them.
    #[arg(short = 'C', long = "cpu-mask", value_name = "HEX")]
    pub cpu_mask: Option<String>,
    /// Run only on these CPUs, as a list (`--cpu-range 2-3`, or `0,2`).
    #[arg(long = "cpu-range", value_name = "LIST", conflicts_with = "cpu_mask")]
    pub cpu_range: Option<String>,
    /// Lock the model's pages in RAM.
    #[arg(long)]
    pub mlock: bool,
    /// Read the model into memory instead of memory-mapping it.
    #[arg(long)]
    pub no_mmap: bool,
}

/// How large a context and batch to prepare.
#[derive(clap::Args, Debug)]
pub struct ContextArgs {
    /// Context size in tokens (default: the model's, at most 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Tokens evaluated per forward pass while reading a prompt.
    #[arg(short = 'b', long = "batch-size", default_value_t = DEFAULT_BATCH)]
    pub batch_size: usize,
    /// -ub N: at most this many tokens per pass (llama.cpp's physical
    /// batch): a pass takes the smaller of -b and -ub.
    #[arg(long = "ubatch-size", value_name = "N")]
    pub ubatch_size: Option<usize>,
    /// KV cache type: f16, q8_0 (about half the memory) or f32.
    #[arg(
        long = "cache-type",
        visible_alias = "cache-type-k",
        default_value = "f16",
        value_parser = parse_kv_type
    )]
    pub cache_type: KvType,
    /// Longest prompt accepted, in bytes, from a file or stdin (default:
    /// the context size × 128, at least 1 MiB): longer text cannot fit, and
    /// reading it whole could exhaust memory.
    #[arg(long = "max-prompt-bytes", value_name = "BYTES")]
    pub max_prompt_bytes: Option<usize>,
}

/// Bytes per token assumed when bounding input by the context: more than
/// the longest token of any vocabulary we load, so the bound never
/// refuses text that fits.
pub const BYTES_PER_TOKEN: usize = 128;

impl ContextArgs {
    /// The most bytes of prompt text worth reading: `--max-prompt-bytes`,
    /// or `-c` (else [`DEFAULT_CTX`]) × [`BYTES_PER_TOKEN`], at least 1 MiB.
    pub fn max_prompt_bytes(&self) -> usize {
        self.max_prompt_bytes.unwrap_or_else(|| {
            (self.ctx_size.unwrap_or(DEFAULT_CTX))
                .saturating_mul(BYTES_PER_TOKEN)
                .max(1 << 20)
        })
    }
}

/// A UTF-8 text file of at most `max_bytes` bytes, with an error naming
/// the file (and the limit's flag) otherwise. Reads at most one byte past
/// the limit, so `/dev/zero` or an endless pipe is refused, not read.
pub fn read_bounded(path: &std::path::Path, max_bytes: usize) -> Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(max_bytes as u64 + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() > max_bytes {
        bail!(
            "{} is longer than {max_bytes} bytes, more than can be used",
            path.display()
        );
    }
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{} is not valid UTF-8 (at byte {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

fn parse_kv_type(s: &str) -> Result<KvType, String> {
    s.parse()
}

/// A model file opened, with what its metadata says.
pub struct Opened {
    pub file: GgufFile,
    pub cfg: ModelConfig,
    pub vocab: tokenize::Vocab,
}

impl ModelArgs {
    /// The model `-m` or `-hf` names (downloading it for `-hf` when not
    /// cached), or the built-in one; found once, then remembered.
    pub fn source(&self) -> Result<ModelSource> {
        if let Some(s) = self.resolved.get() {
            return Ok(s.clone());
        }
        let source = match &self.hf_repo {
            Some(repo) => ModelSource::File(super::pull::fetch(repo, self.hf_file.as_deref())?),
            None => ModelSource::from_arg(self.model.as_ref())?,
        };
        Ok(self.resolved.get_or_init(|| source).clone())
    }

    /// The model as messages name it: its path, or the built-in one.
    pub fn shown(&self) -> String {
        match (self.resolved.get(), &self.hf_repo, &self.model) {
            (Some(s), _, _) => s.shown(),
            (None, Some(r), _) => r.clone(),
            (None, None, m) => ModelSource::from_arg(m.as_ref())
                .map(|s| s.shown())
                .unwrap_or_else(|_| {
                    m.as_ref()
                        .map_or_else(String::new, |p| p.display().to_string())
                }),
        }
    }

    /// The model's path once found: `-m` resolved, or the `-hf` download.
    pub fn resolved_path(&self) -> Option<PathBuf> {
        match self.resolved.get() {
            Some(ModelSource::File(p)) => Some(p.clone()),
            _ => None,
        }
    }
}

pub fn open_model(args: &ModelArgs) -> Result<Opened> {
    let opts = OpenOptions {
        mmap: !args.no_mmap,
        mlock: args.mlock,
        ..Default::default()
    };
    let file = args.source()?.open(opts)?;
    let path = args.shown();
    let cfg = ModelConfig::from_gguf(file.metadata())
        .with_context(|| format!("{path}: reading the model config"))?;
    let vocab = tokenize::Vocab::from_gguf(file.metadata())
        .with_context(|| format!("{path}: the model has no usable tokenizer"))?;
    Ok(Opened { file, cfg, vocab })
}

/// `-C`/`--cpu-range` applied to the calling thread (so to every thread
/// started after it), then the thread count as [`threads`] chooses it.
/// Call before starting any thread that should obey the mask.
pub fn threads_for(args: &ModelArgs) -> Result<machine::ThreadChoice> {
    let chosen = match (&args.cpu_mask, &args.cpu_range) {
        (Some(m), _) => Some((
            format!("-C {m}"),
            machine::parse_cpu_mask(m)
                .with_context(|| format!("-C {m}: not a hexadecimal CPU mask (e.g. 0x3)"))?,
        )),
        (None, Some(r)) => Some((
            format!("--cpu-range {r}"),
            machine::parse_cpulist(r)
                .with_context(|| format!("--cpu-range {r}: not a CPU list (e.g. 0-3 or 0,2)"))?,
        )),
        (None, None) => None,
    };
    if let Some((flag, cpus)) = chosen {
        if cpus.is_empty() {
            bail!("{flag} selects no CPU");
        }
        let allowed = machine::allowed_cpus();
        if let Some(c) = cpus.iter().find(|c| !allowed.contains(c)) {
            bail!(
                "{flag} selects CPU {c}, which this process may not use (it may use {})",
                machine::format_cpulist(&allowed)
            );
        }
        machine::set_thread_affinity(&cpus)
            .with_context(|| format!("{flag}: setting the CPU affinity"))?;
    }
    threads(args.threads)
}

/// The thread count to use and why, for the log line: `-t`, or the
/// physical cores this process may use (affinity, cgroup quota).
pub fn threads(requested: Option<usize>) -> Result<machine::ThreadChoice> {
    match requested {
        Some(0) => bail!("-t must be at least 1"),
        Some(n) => Ok(machine::ThreadChoice {
            n: cap_threads("-t", n),
            reason: "set with -t".to_string(),
        }),
        None => Ok(machine::default_threads()),
    }
}

/// `n` threads, or (with a warning) the CPUs this process may use if
/// fewer: more threads than CPUs only wait on each other at every barrier
/// (`-t 1000` ran 992 threads that produced nothing in a minute).
pub fn cap_threads(flag: &str, n: usize) -> usize {
    let available = machine::allowed_cpus().len().max(1);
    if n > available {
        eprintln!(
            "cachefit: warning: {flag} {n} is more than the {available} CPU{} this process may use; using {available}",
            if available == 1 { "" } else { "s" }
        );
        available
    } else {
        n
    }
}

/// The kernel threads of a model-running command: one pool for generation
/// (`-t`) and, when `--threads-batch` asks for another count, a second one
/// for batches of prompt tokens. A pool's idle workers park, so the pool
/// not in use costs no CPU.
pub struct Pools {
    decode: ThreadPool,
    batch: Option<ThreadPool>,
    /// Why `-t` is what it is, for the log line.
    why: String,
}

impl Pools {
    /// Pools from `-t` and `--threads-batch` (each at least 1).
    pub fn from_args(args: &ModelArgs) -> Result<Pools> {
        let choice = threads_for(args)?;
        let n_batch = threads_batch(args.threads_batch, choice.n)?;
        Ok(Pools {
            decode: ThreadPool::new(choice.n),
            batch: (n_batch != choice.n).then(|| ThreadPool::new(n_batch)),
            why: choice.reason,
        })
    }

    /// For generation: one token per sequence.
    pub fn decode(&self) -> &ThreadPool {
        &self.decode
    }

    /// For prompt tokens, several of a sequence in one pass.
    pub fn batch(&self) -> &ThreadPool {
        self.batch.as_ref().unwrap_or(&self.decode)
    }

    /// The decode pool, and the prompt pool when it is another one.
    pub fn into_parts(self) -> (ThreadPool, Option<ThreadPool>) {
        (self.decode, self.batch)
    }

    /// For the log line (see [`describe_threads`]).
    pub fn describe(&self) -> String {
        let n = self.decode.n_threads();
        describe_threads(n, &self.why, self.batch().n_threads())
    }
}

/// `--threads-batch` checked: its count, or `threads` when not given.
pub fn threads_batch(requested: Option<usize>, threads: usize) -> Result<usize> {
    match requested {
        Some(0) => bail!("--threads-batch must be at least 1"),
        Some(n) => Ok(cap_threads("--threads-batch", n)),
        None => Ok(threads),
    }
}

/// "2 threads (why)", plus ", 1 for prompts" when `--threads-batch`
/// differs from `-t`.
pub fn describe_threads(threads: usize, why: &str, batch: usize) -> String {
    let mut s = format!(
        "{threads} thread{} ({why})",
        if threads == 1 { "" } else { "s" }
    );
    if batch != threads {
        s.push_str(&format!(", {batch} for prompts"));
    }
    s
}

/// The context size: `-c` checked against the model, or the default.
pub fn n_ctx(cfg: &ModelConfig, requested: Option<usize>) -> Result<usize> {
    Ok(match requested {
        Some(0) => bail!("-c must be at least 1"),
        Some(c) if c > cfg.context_length => bail!(
            "-c {c} is larger than the model's context length {}",
            cfg.context_length
        ),
        Some(c) => c,
        None => cfg.context_length.min(DEFAULT_CTX),
    })
}

/// Tokens per forward pass from `-b` and `-ub` (each at least 1): the
/// smaller of the two.
pub fn pass_tokens(batch: usize, ubatch: Option<usize>) -> Result<usize> {
    if batch == 0 {
        bail!("-b must be at least 1");
    }
    match ubatch {
        Some(0) => bail!("-ub must be at least 1"),
        Some(u) => Ok(batch.min(u)),
        None => Ok(batch),
    }
}

/// State options from the flags, with the memory need checked against what
/// the system has available.
pub fn state_options(opened: &Opened, ctx: &ContextArgs, all_logits: bool) -> Result<StateOptions> {
    let o = StateOptions {
        n_ctx: n_ctx(&opened.cfg, ctx.ctx_size)?,
        n_batch: pass_tokens(ctx.batch_size, ctx.ubatch_size)?,
        kv_type: ctx.cache_type,
        all_logits,
        n_seq: 1,
        draft_rows: 0,
    };
    let weights_bytes: u64 = opened.file.tensors().iter().map(|t| t.n_bytes).sum();
    let need = MemoryEstimate::for_state(&opened.cfg, weights_bytes, &o);
    if let Some(avail) = model::mem_available() {
        // A mapped file already in the page cache counts as available, so
        // this errs on the side of letting a load go ahead.
        need.check(avail)?;
    }
    Ok(o)
}
