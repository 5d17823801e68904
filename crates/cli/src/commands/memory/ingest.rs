//! `cachefit memory ingest FILE.mem -m MODEL -f TEXT [-f TEXT ...]`:
//! append documents to a memory file (made, with the model's layout, if it
//! does not exist), with a progress bar. Each document's codes come from
//! the model read over the history in a sliding window (the encoder), so
//! ingest runs at about prompt speed; blocks are committed every 4,096
//! tokens and at the end of each document, and Ctrl-C stops at the next
//! block with everything before it kept.

use super::MemoryArgs;
use crate::commands::common::{self, ModelArgs};
use anyhow::{bail, Context, Result};
use engine::memory::ModelEncoder;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The memory file (created when it does not exist).
    pub memory: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
    /// A UTF-8 text to append; repeatable, appended in order.
    #[arg(short = 'f', long = "file", required = true)]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub mem: MemoryArgs,
    /// Print one JSON line of totals at the end.
    #[arg(long)]
    pub json: bool,
    /// Largest document read, in bytes (an endless input is refused).
    #[arg(long = "max-bytes", value_name = "BYTES", default_value_t = 1 << 30)]
    pub max_bytes: usize,
}

/// Tokens per append (and progress update).
const STEP: usize = 1024;

pub fn run(args: Args) -> Result<()> {
    let t0 = Instant::now();
    // Read every document first: a bad file is an error before any work.
    let mut docs = Vec::new();
    for f in &args.files {
        docs.push((f, common::read_bounded(f, args.max_bytes)?));
    }
    let pools = common::Pools::from_args(&args.model)?;
    let opened = common::open_model(&args.model)?;
    let fingerprint = engine::memory::fingerprint(&opened.file, &opened.vocab);
    let model = crate::commands::generate::bind(&opened, &args.model)?;
    let (pool, _) = pools.into_parts();
    let mut enc = ModelEncoder::new(&model, pool)?;
    let mut session = super::open_session(
        &args.memory,
        &opened,
        fingerprint,
        &mut enc,
        memory::Mode::Write,
        args.mem.config(),
    )?;
    let before = session.tokens();

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }
    let tokenized: Vec<(&PathBuf, Vec<u32>)> = docs
        .iter()
        .map(|(f, text)| (*f, engine::prompt::document_tokens(&opened.vocab, text)))
        .collect();
    let total: usize = tokenized.iter().map(|(_, t)| t.len()).sum();
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tokens, {per_sec}, ETA {eta}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let t_ingest = Instant::now();
    let mut added = 0usize;
    'docs: for (f, tokens) in &tokenized {
        if tokens.is_empty() {
            continue;
        }
        bar.set_message(f.file_name().map_or_else(
            || f.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ));
        for (i, step) in tokens.chunks(STEP).enumerate() {
            if stop.load(Ordering::SeqCst) {
                break 'docs;
            }
            session.append(&mut enc, step, i == 0)?;
            added += step.len();
            bar.inc(step.len() as u64);
        }
        session.commit()?;
    }
    session.commit()?;
    bar.finish_and_clear();
    let secs = t_ingest.elapsed().as_secs_f64();
    let rate = added as f64 / secs.max(1e-9);
    let bytes = session.file().file_bytes();
    let after = session.tokens();
    if args.json {
        outln!(
            "{}",
            serde_json::json!({
                "memory": args.memory.display().to_string(),
                "added_tokens": added,
                "tokens": after,
                "file_bytes": bytes,
                "bytes_per_token": bytes as f64 / after.max(1) as f64,
                "ingest_seconds": secs,
                "tokens_per_second": rate,
                "total_seconds": t0.elapsed().as_secs_f64(),
                "interrupted": stop.load(Ordering::SeqCst),
            })
        );
    } else {
        eprintln!(
            "cachefit: {}: added {added} tokens in {secs:.1} s ({rate:.0} tokens/s); {after} tokens of history (was {before}), {bytes} bytes ({:.1} per token)",
            args.memory.display(),
            bytes as f64 / after.max(1) as f64
        );
    }
    if stop.load(Ordering::SeqCst) {
        eprintln!("cachefit: interrupted: what was appended before Ctrl-C is kept");
        std::process::exit(crate::commands::chat::EXIT_INTERRUPTED);
    }
    if total == 0 {
        bail!("the documents hold no text");
    }
    Ok(())
}
