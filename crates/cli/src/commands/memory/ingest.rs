//! `cachefit memory ingest FILE.mem -m MODEL -f TEXT [-f TEXT ...]`:
//! append documents to a memory file (made, with the model's layout, if it
//! does not exist), with a progress bar. Each document's codes come from
//! the model read over the history in a sliding window (the encoder), so
//! ingest runs at about prompt speed; blocks are committed every 4,096
//! tokens and at the end of each document. SIGINT (Ctrl-C), SIGTERM and
//! SIGHUP stop it after the forward pass in flight (at most [`STEP`]
//! tokens, 4 blocks): what was appended is committed and kept, and the
//! exit status is 128 + the signal's number, as a shell reports a death
//! by that signal. A SIGKILL or a crash loses nothing that reached the
//! file either (the next writer keeps every whole record); only power loss
//! can drop what came after the last commit.

use super::MemoryArgs;
use crate::commands::common::{self, ModelArgs};
use anyhow::{bail, Context, Result};
use engine::memory::ModelEncoder;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// Tokens per append (and progress update), so also how soon a stop
/// signal is seen. The encoder's forward pass: smaller steps would change
/// its batches, and with them the codes (ingest is deterministic for given
/// inputs and history, and the crash tests rely on it); a multiple of it
/// gives the same codes as this.
const STEP: usize = 256;

/// The signals that stop an ingest cleanly.
const STOP_SIGNALS: [(i32, &str); 3] = [
    (signal_hook::consts::SIGINT, "SIGINT"),
    (signal_hook::consts::SIGTERM, "SIGTERM"),
    (signal_hook::consts::SIGHUP, "SIGHUP"),
];

pub fn run(args: Args) -> Result<()> {
    let t0 = Instant::now();
    // Read every document first: a bad file is an error before any work.
    let mut docs = Vec::new();
    for f in &args.files {
        let text = common::read_bounded(f, args.max_bytes)
            .context("reading a document (--max-bytes sets the largest)")?;
        docs.push((f, text));
    }
    let pools = common::Pools::from_args(&args.model)?;
    let opened = common::open_model(&args.model)?;
    // Tokens before the memory file: documents without text are refused
    // before a new file is made for them; the texts are not kept.
    let tokenized: Vec<(&PathBuf, Vec<u32>)> = docs
        .into_iter()
        .map(|(f, text)| (f, engine::prompt::document_tokens(&opened.vocab, &text)))
        .collect();
    let total: usize = tokenized.iter().map(|(_, t)| t.len()).sum();
    if total == 0 {
        bail!("the documents hold no text: nothing to ingest");
    }
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

    // Installed only now: before this point nothing has been written, and
    // a signal's default action (death) loses nothing.
    let stop = Arc::new(AtomicUsize::new(0));
    for (sig, _) in STOP_SIGNALS {
        signal_hook::flag::register_usize(sig, stop.clone(), sig as usize)
            .context("installing the SIGINT/SIGTERM/SIGHUP handlers")?;
    }
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
            if stop.load(Ordering::SeqCst) != 0 {
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
                "interrupted": stop.load(Ordering::SeqCst) != 0,
            })
        );
    } else {
        eprintln!(
            "cachefit: {}: added {added} tokens in {secs:.1} s ({rate:.0} tokens/s); {after} tokens of history (was {before}), {bytes} bytes ({:.1} per token)",
            args.memory.display(),
            bytes as f64 / after.max(1) as f64
        );
    }
    let sig = stop.load(Ordering::SeqCst);
    if sig != 0 {
        let name = STOP_SIGNALS
            .iter()
            .find(|(s, _)| *s as usize == sig)
            .map_or("a signal", |(_, n)| n);
        eprintln!("cachefit: stopped by {name}: what was appended before it is committed and kept");
        std::process::exit(128 + sig as i32);
    }
    Ok(())
}
