//! `cachefit memory ingest|inspect|verify FILE ...`: append documents to a
//! long-memory file ([`ingest`]), what a file holds, and a check of every
//! record (exit 1 with a report on damage). Format and crash safety:
//! `crates/memory`; the model side: `engine::memory`; docs/MEMORY.md.

mod ingest;

use super::common::Opened;
use anyhow::{bail, Result};
use engine::memory::{KeyEncoder, MemoryConfig, MemoryError, MemorySession};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand)]
// Parsed once per run: the size of the model flags costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Append documents to a memory file (made for the model if new).
    Ingest(ingest::Args),
    /// Model fingerprint, tokens, bytes, bytes per token, blocks, index.
    Inspect(FileArgs),
    /// Check every record's header chain and checksum; exit 1 on damage.
    Verify(FileArgs),
}

#[derive(clap::Args)]
pub struct FileArgs {
    /// The memory file.
    pub file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// How much of a memory's history a prompt sees; flags of `run`, `chat`,
/// `serve` and `memory ingest`.
#[derive(clap::Args, Debug, Clone)]
pub struct MemoryArgs {
    /// Tokens at the end of the history kept in context (the hot window).
    #[arg(long = "memory-hot", value_name = "N", default_value_t = MemoryConfig::default().hot_tokens)]
    pub hot: usize,
    /// Blocks (of 64 tokens) recalled from older history per prompt.
    #[arg(long = "memory-recall", value_name = "N", default_value_t = MemoryConfig::default().recall_blocks)]
    pub recall: usize,
    /// Tokens at the start of the history kept in context (attention sinks).
    #[arg(long = "memory-sinks", value_name = "N", default_value_t = MemoryConfig::default().sink_tokens)]
    pub sinks: usize,
    /// The prompt's last content tokens that search for what to recall.
    #[arg(long = "memory-query-tokens", value_name = "N", default_value_t = MemoryConfig::default().query_tokens, hide_short_help = true)]
    pub query_tokens: usize,
    /// Evaluation baseline: recall random blocks (seeded) instead of
    /// searching.
    #[arg(
        long = "memory-random-recall",
        value_name = "SEED",
        hide_short_help = true
    )]
    pub random_recall: Option<u64>,
}

impl MemoryArgs {
    pub fn config(&self) -> MemoryConfig {
        MemoryConfig {
            hot_tokens: self.hot,
            recall_blocks: self.recall,
            sink_tokens: self.sinks,
            random_recall: self.random_recall,
            query_tokens: self.query_tokens,
            ..MemoryConfig::default()
        }
    }
}

/// The memory session of a job given `--memory PATH` (none without it):
/// the file opened for `model`, or (writers only) made for it, measuring
/// its layout with an encoder of `threads` threads that lives only that
/// long. `fingerprint` is the model's, hashed before the weights were
/// bound (binding may release pages the hash would read again).
pub fn session_for(
    path: Option<&Path>,
    fingerprint: Option<[u8; 32]>,
    opened: &Opened,
    model: &model::Model<'_>,
    threads: usize,
    mode: memory::Mode,
    config: MemoryConfig,
) -> Result<Option<std::sync::Arc<std::sync::Mutex<MemorySession>>>> {
    let (Some(path), Some(fingerprint)) = (path, fingerprint) else {
        return Ok(None);
    };
    let session = if path.exists() {
        let shape = engine::memory::HeadShape::of(&opened.cfg);
        MemorySession::open(path, fingerprint, shape, mode, config)?
    } else {
        let mut enc =
            engine::memory::ModelEncoder::new(model, kernels::pool::ThreadPool::new(threads))?;
        open_session(path, opened, fingerprint, &mut enc, mode, config)?
    };
    Ok(Some(std::sync::Arc::new(std::sync::Mutex::new(session))))
}

/// Open the memory file at `path` for `opened`'s model (`fingerprint`),
/// or make it with the layout `enc` measures.
pub fn open_session(
    path: &Path,
    opened: &Opened,
    fingerprint: [u8; 32],
    enc: &mut dyn KeyEncoder,
    mode: memory::Mode,
    config: MemoryConfig,
) -> Result<MemorySession> {
    let vocab = &opened.vocab;
    let id_bytes = if vocab.len() <= 1 << 16 { 2 } else { 4 };
    let new = !path.exists();
    if new {
        eprintln!(
            "cachefit: {}: a new memory file; measuring which of the model's heads retrieve",
            path.display()
        );
    }
    let made = MemorySession::open_or_create(
        path,
        fingerprint,
        enc,
        |t| engine::prompt::document_tokens(vocab, t),
        id_bytes,
        mode,
        config,
    );
    let (s, new) = match made {
        // Another process made the file while this one measured: use
        // theirs (its lock refuses a second writer while they write).
        Err(MemoryError::File(memory::Error::Exists { .. })) if new => (
            MemorySession::open(path, fingerprint, enc.shape(), mode, config)?,
            false,
        ),
        made => (made?, new),
    };
    if new {
        let slots: Vec<String> = s
            .layout()
            .slots
            .iter()
            .map(|x| format!("{}.{}", x.layer, x.kv_head))
            .collect();
        eprintln!(
            "cachefit: {}: {} slots (layer.head): {}",
            path.display(),
            slots.len(),
            slots.join(" ")
        );
    }
    Ok(s)
}

/// One stderr line on what a prompt saw of a memory.
pub fn log_use(path: &Path, m: &engine::MemoryUse) {
    let v = &m.view;
    let appended = if m.appended > 0 {
        format!("; {} tokens appended", m.appended)
    } else {
        String::new()
    };
    eprintln!(
        "cachefit: memory {}: {} tokens of history; the prompt saw {} (start {}, end {}, {} recalled around block{} {:?} found in {:.0} ms){appended}",
        path.display(),
        m.history_tokens,
        v.tokens.len(),
        v.sinks,
        v.hot,
        v.recalled_tokens,
        if v.recalled.len() == 1 { "" } else { "s" },
        v.recalled,
        v.recall_time.as_secs_f64() * 1e3
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn run(args: Args) -> Result<()> {
    match args.command {
        Command::Ingest(a) => ingest::run(a),
        Command::Inspect(a) => inspect(a),
        Command::Verify(a) => verify(a),
    }
}

fn inspect(a: FileArgs) -> Result<()> {
    let i = memory::inspect(&a.file)?;
    let g = i.geometry;
    let b = i.budget;
    if a.json {
        let v = serde_json::json!({
            "file": a.file.display().to_string(),
            "version": i.version,
            "fingerprint": hex(&i.fingerprint),
            "tokens": i.tokens,
            "blocks": i.blocks,
            "partial_blocks": i.partial_blocks,
            "doc_starts": i.doc_starts,
            "file_bytes": i.file_bytes,
            "bytes_per_token": i.bytes_per_token(),
            "committed_blocks": i.committed_blocks,
            "torn_tail_bytes": i.tail_bytes,
            "geometry": {
                "block_tokens": g.block_tokens, "slots": g.slots, "dims": g.dims(),
                "code_bytes": g.code_bytes, "extra_bytes": g.extra_bytes, "id_bytes": g.id_bytes,
            },
            "params_bytes": i.params_bytes,
            "full_block_bytes_per_token": {
                "codes": b.codes, "ids": b.ids, "extra": b.extra,
                "summaries": b.summaries, "record_header": b.header, "total": b.total(),
            },
            "index": {
                "ram_bytes": i.index_ram_bytes,
                "index_file_blocks": i.index_file_blocks,
            },
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    outln!(
        "file:        {} (format version {})",
        a.file.display(),
        i.version
    );
    outln!("fingerprint: {}", hex(&i.fingerprint));
    outln!(
        "history:     {} tokens in {} blocks ({} partial, {} document starts)",
        i.tokens,
        i.blocks,
        i.partial_blocks,
        i.doc_starts
    );
    outln!(
        "bytes:       {} ({:.1} per token)",
        i.file_bytes,
        i.bytes_per_token()
    );
    match i.committed_blocks {
        Some(c) => outln!("committed:   {c} blocks"),
        None => outln!("committed:   unknown (commit slots unreadable)"),
    }
    if i.tail_bytes > 0 {
        outln!(
            "torn tail:   {} bytes past the last record (the next writer cuts them)",
            i.tail_bytes
        );
    }
    outln!(
        "geometry:    {} tokens per block, {} slots × {} dims ({} code bytes), {} extra bytes, {}-byte ids, {} bytes of params",
        g.block_tokens, g.slots, g.dims(), g.code_bytes, g.extra_bytes, g.id_bytes, i.params_bytes
    );
    outln!(
        "per token:   {:.1} bytes in full blocks: codes {:.1}, ids {:.1}, extra {:.1}, summaries {:.1}, record headers {:.1}",
        b.total(), b.codes, b.ids, b.extra, b.summaries, b.header
    );
    let source = match i.index_file_blocks {
        Some(n) if n == i.blocks => "all from the index file".to_string(),
        Some(n) => format!("{n} blocks from the index file, the rest from the records"),
        None => "from the records (no index file)".to_string(),
    };
    outln!(
        "index:       {:.1} MB in RAM, built {source}",
        i.index_ram_bytes as f64 / 1e6
    );
    Ok(())
}

fn verify(a: FileArgs) -> Result<()> {
    let r = memory::verify(&a.file)?;
    if a.json {
        let v = serde_json::json!({
            "file": a.file.display().to_string(),
            "clean": r.is_clean(),
            "valid_blocks": r.valid_blocks,
            "tokens": r.tokens,
            "file_bytes": r.file_bytes,
            "committed_blocks": r.commit.map(|m| m.blocks),
            "problems": r.problems.iter().map(|p| serde_json::json!({
                "block": p.block, "offset": p.offset, "what": p.what,
            })).collect::<Vec<_>>(),
            "notes": r.notes,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!(
            "{}: {} valid blocks, {} tokens, {} bytes",
            a.file.display(),
            r.valid_blocks,
            r.tokens,
            r.file_bytes
        );
        for n in &r.notes {
            outln!("note: {n}");
        }
        for p in &r.problems {
            outln!("DAMAGE: {p}");
        }
        if r.is_clean() {
            outln!("ok: every record verifies");
        }
    }
    if !r.is_clean() {
        bail!(
            "{}: {} problem(s) found; the blocks before the first one are intact",
            a.file.display(),
            r.problems.len()
        );
    }
    Ok(())
}
