//! What the model-running commands share: opening a model file with its
//! config and tokenizer, choosing threads and the context, and checking the
//! memory need before anything large is allocated.

use super::builtin::ModelSource;
use anyhow::{bail, Context, Result};
use gguf::{GgufFile, OpenOptions};
use model::{KvType, MemoryEstimate, ModelConfig, StateOptions, DEFAULT_BATCH};
use std::path::PathBuf;

/// Context used when `-c` is not given, if the model allows that much.
pub const DEFAULT_CTX: usize = 4096;

/// Which model file and how to load and run it.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    /// GGUF model file (default: the built-in cachefit-shakespeare model).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Threads (default: the physical cores this process may use, after
    /// CPU affinity and cgroup limits).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
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
    /// KV cache type: f16, q8_0 (about half the memory) or f32.
    #[arg(
        long = "cache-type",
        visible_alias = "cache-type-k",
        default_value = "f16",
        value_parser = parse_kv_type
    )]
    pub cache_type: KvType,
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
    pub fn source(&self) -> ModelSource {
        ModelSource::from_arg(self.model.as_ref())
    }

    /// The model as messages name it: its path, or the built-in one.
    pub fn shown(&self) -> String {
        self.source().shown()
    }
}

pub fn open_model(args: &ModelArgs) -> Result<Opened> {
    let opts = OpenOptions {
        mmap: !args.no_mmap,
        mlock: args.mlock,
        ..Default::default()
    };
    let file = args.source().open(opts)?;
    let path = args.shown();
    let cfg = ModelConfig::from_gguf(file.metadata())
        .with_context(|| format!("{path}: reading the model config"))?;
    let vocab = tokenize::Vocab::from_gguf(file.metadata())
        .with_context(|| format!("{path}: the model has no usable tokenizer"))?;
    Ok(Opened { file, cfg, vocab })
}

/// The thread count to use and why, for the log line: `-t`, or the
/// physical cores this process may use (affinity, cgroup quota).
pub fn threads(requested: Option<usize>) -> Result<machine::ThreadChoice> {
    match requested {
        Some(0) => bail!("-t must be at least 1"),
        Some(n) => Ok(machine::ThreadChoice {
            n,
            reason: "set with -t".to_string(),
        }),
        None => Ok(machine::default_threads()),
    }
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

/// State options from the flags, with the memory need checked against what
/// the system has available.
pub fn state_options(opened: &Opened, ctx: &ContextArgs, all_logits: bool) -> Result<StateOptions> {
    if ctx.batch_size == 0 {
        bail!("-b must be at least 1");
    }
    let o = StateOptions {
        n_ctx: n_ctx(&opened.cfg, ctx.ctx_size)?,
        n_batch: ctx.batch_size,
        kv_type: ctx.cache_type,
        all_logits,
        n_seq: 1,
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
