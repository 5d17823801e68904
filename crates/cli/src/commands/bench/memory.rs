//! `cachefit bench --memory FILE`: what a long memory costs a generation.
//!
//! For each thread count and generation length N, two runs at the same
//! hot window:
//!
//! - **off**: the history's start and end (sinks + hot) read, then N
//!   tokens decoded: an ordinary context of the same size;
//! - **on**: the same, plus what a memory adds at the end of a prompt:
//!   the probe and search (recall), the recalled spans and the prompt read
//!   after the hot window, then N tokens decoded over the longer context.
//!
//! The prompt is 16 tokens from the middle of the history (so the search
//! has something to find). Reported: the recall time, the extra reading,
//! decode speed of each, and "on" with recall and extra reading spread
//! over the N tokens — the retrieval cost amortized per token. Recall runs
//! at the prompt's end only (there is no recall during generation), so
//! that is its whole cost.

use anyhow::{bail, Context, Result};
use engine::memory::{HeadShape, MemorySession, ModelEncoder};
use kernels::pool::ThreadPool;
use model::{Logits, Model, State, StateOptions};
use std::path::Path;
use std::time::Instant;

/// The prompt: this many tokens of the history's middle.
const PROMPT_TOKENS: usize = 16;

/// One row of the table.
struct Row {
    threads: usize,
    n_gen: usize,
    context_off: usize,
    context_on: usize,
    recall_ms: f64,
    extra_read_ms: f64,
    off_tps: f64,
    on_tps: f64,
}

impl Row {
    /// Tokens per second of "on" with recall and extra reading counted.
    fn on_amortized(&self) -> f64 {
        let decode_s = self.n_gen as f64 / self.on_tps;
        self.n_gen as f64 / (decode_s + (self.recall_ms + self.extra_read_ms) / 1e3)
    }
}

#[allow(clippy::too_many_arguments)]
pub fn bench(
    path: &Path,
    file: &gguf::GgufFile,
    vocab: &tokenize::Vocab,
    model: &Model<'_>,
    fingerprint: [u8; 32],
    threads: &[usize],
    gens: &[usize],
    n_batch: usize,
    config: engine::memory::MemoryConfig,
) -> Result<()> {
    let cfg = model.config();
    let session = MemorySession::open(
        path,
        fingerprint,
        HeadShape::of(cfg),
        memory::Mode::Read,
        config,
    )
    .with_context(|| format!("--memory {}", path.display()))?;
    let total = session.tokens();
    if total == 0 {
        bail!("--memory {}: the memory is empty", path.display());
    }
    let _ = file;
    let middle = session
        .file()
        .index()
        .block_of_token(total / 2)
        .map_or(0, |b| b as u64);
    let mut prompt = session.file().read_block(middle)?.ids();
    prompt.truncate(PROMPT_TOKENS);
    let mut rows = Vec::new();
    for &t in threads {
        let pool = ThreadPool::new(t);
        let mut enc = ModelEncoder::new(model, ThreadPool::new(t))?;
        for &n_gen in gens.iter().filter(|&&n| n > 0) {
            let n_ctx = cfg.context_length.min(super::super::common::DEFAULT_CTX);
            let room = n_ctx.saturating_sub(prompt.len() + n_gen + 1);
            // Off: the view without recall.
            let off_view = {
                let mut c = config;
                c.recall_blocks = 0;
                let s = MemorySession::open(
                    path,
                    fingerprint,
                    HeadShape::of(cfg),
                    memory::Mode::Read,
                    c,
                )?;
                s.view(&mut enc, &prompt, &|t| !vocab.is_control(t), room)?
            };
            let t0 = Instant::now();
            let on_view = session.view(&mut enc, &prompt, &|t| !vocab.is_control(t), room)?;
            let recall_ms = t0.elapsed().as_secs_f64() * 1e3;

            let opts = StateOptions {
                n_batch,
                ..StateOptions::new(n_ctx)
            };
            let mut state = model.new_state(&opts)?;
            // Off: sinks + hot, then the prompt, then decode.
            let mut off: Vec<u32> = off_view.tokens.clone();
            off.extend_from_slice(&prompt);
            read(&mut state, &pool, &off, n_batch);
            let off_tps = decode(&mut state, &pool, off.len(), n_gen, cfg.vocab_size);
            // On: sinks + hot as before (the common prefix), then the
            // recalled spans and the prompt (timed), then decode.
            let common = on_view.sinks + on_view.hot;
            let mut on: Vec<u32> = on_view.tokens.clone();
            on.extend_from_slice(&prompt);
            read(&mut state, &pool, &on[..common], n_batch);
            let t1 = Instant::now();
            read_from(&mut state, &pool, &on[common..], common, n_batch);
            let extra_read_ms = t1.elapsed().as_secs_f64() * 1e3;
            let on_tps = decode(&mut state, &pool, on.len(), n_gen, cfg.vocab_size);
            rows.push(Row {
                threads: t,
                n_gen,
                context_off: off.len(),
                context_on: on.len(),
                recall_ms,
                extra_read_ms,
                off_tps,
                on_tps,
            });
        }
    }
    outln!(
        "\nlong memory {} ({} tokens of history): the cost at the end of a prompt, amortized over the generation",
        path.display(),
        total
    );
    outln!("| threads | test | context off / on | recall ms | extra read ms | off t/s | on t/s | on t/s with recall | cost per token |");
    outln!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let amortized = r.on_amortized();
        outln!(
            "| {} | tg{} | {} / {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} ms ({:+.0}%) |",
            r.threads,
            r.n_gen,
            r.context_off,
            r.context_on,
            r.recall_ms,
            r.extra_read_ms,
            r.off_tps,
            r.on_tps,
            amortized,
            1e3 / amortized - 1e3 / r.off_tps,
            100.0 * (r.off_tps / amortized - 1.0),
        );
    }
    Ok(())
}

/// Read `tokens` from position 0.
fn read(state: &mut State<'_>, pool: &ThreadPool, tokens: &[u32], n_batch: usize) {
    read_from(state, pool, tokens, 0, n_batch);
}

fn read_from(
    state: &mut State<'_>,
    pool: &ThreadPool,
    tokens: &[u32],
    pos0: usize,
    n_batch: usize,
) {
    for (i, chunk) in tokens.chunks(n_batch.max(1)).enumerate() {
        state.forward_seq(pool, chunk, pos0 + i * n_batch.max(1), Logits::Last);
    }
}

/// Decode `n` tokens after `pos` positions; tokens per second.
fn decode(state: &mut State<'_>, pool: &ThreadPool, pos: usize, n: usize, vocab: usize) -> f64 {
    let t = Instant::now();
    let mut tok = 1u32;
    for i in 0..n {
        let logits = state.forward_seq(pool, &[tok], pos + i, Logits::Last);
        // The greedy token keeps the work honest (no constant input).
        tok = engine::argmax(logits).unwrap_or(0) % vocab as u32;
    }
    n as f64 / t.elapsed().as_secs_f64()
}
