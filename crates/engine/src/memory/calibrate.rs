//! Which (layer, KV head) pairs of a model retrieve: measured once when a
//! memory file is made, from the model alone, so every file of a model
//! gets the same [`Layout`].
//!
//! Few heads find earlier text by its content (Wu et al. 2024: under 5%
//! of heads do retrieval). A code only helps search if it comes from one
//! of them, so each candidate slot is scored on a copy task: a run of `N`
//! tokens and then the same run again. A query at position `N + j` of the
//! second run should find position `j` (the same token) or `j + 1` (what
//! came after it, the induction pattern) among the first run's keys. The
//! score is how often one of them ranks in the top [`TOP`] by the
//! **pre-RoPE** dot product the search will use — a head whose attention
//! finds them only through position does not count. The best slots, up to
//! the byte budget, become the layout, strongest first; the centring means
//! come from the keys of a natural text.
//!
//! The texts: `calibration.txt` is 5 KB of Shakespeare (public domain,
//! from `data/tinyshakespeare.txt`, itself karpathy/char-rnn's); the copy
//! run is a seeded shuffle of its tokens.

use crate::memory::encoder::KeyEncoder;
use crate::memory::layout::{Layout, Slot};
use crate::memory::MemoryError;

/// The natural text for centring means and the copy task's tokens.
pub const TEXT: &str = include_str!("calibration.txt");

/// Tokens in the copy task's run.
const RUN: usize = 160;
/// A target found within this many best keys counts as retrieved.
const TOP: usize = 4;
/// Keys this close before the query are left out (local attention is not
/// retrieval).
const NEAR: usize = 8;

/// Bytes per token the codes may take (with ids and summaries), the
/// design budget for SmolLM2-sized models.
pub const BYTES_PER_TOKEN: usize = 320;
/// Most slots a layout takes. The search uses the strongest 8 by default
/// ([`crate::memory::MemoryConfig::search_slots`]; on needle questions 6
/// to 12 found every needle first, 24 and 36 ranked some 3rd to 6th: the
/// weaker slots add noise); 12 keep room to change that without a new file.
pub const MAX_SLOTS: usize = 12;

/// Slots that fit the byte budget for codes of `code_bytes` per slot in
/// blocks of `block_tokens` (full blocks), with `id_bytes` per id.
pub fn slots_in_budget(code_bytes: usize, block_tokens: usize, id_bytes: usize) -> usize {
    let summary = (code_bytes * 8 / 2 + 2) as f64 / block_tokens as f64;
    let header = 32.0 / block_tokens as f64;
    let per_slot = code_bytes as f64 + summary;
    (((BYTES_PER_TOKEN as f64 - id_bytes as f64 - header) / per_slot) as usize).clamp(1, MAX_SLOTS)
}

/// Each candidate slot's copy-task score, strongest first.
pub fn slot_scores(
    enc: &mut dyn KeyEncoder,
    tokens: &[u32],
    seed: u64,
) -> Result<Vec<(Slot, f32)>, MemoryError> {
    let shape = enc.shape();
    let layers = enc.attention_layers();
    let (hd, group) = (shape.head_dim, shape.group());
    let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
    // The run: a seeded shuffle of the text's tokens, then itself again.
    let mut pool: Vec<u32> = tokens.to_vec();
    pool.sort_unstable();
    pool.dedup();
    if pool.len() < RUN {
        return Err(MemoryError::Model(format!(
            "the calibration text has {} distinct tokens; {RUN} are needed",
            pool.len()
        )));
    }
    let mut state = seed | 1;
    for i in (1..pool.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        pool.swap(i, (state % (i as u64 + 1)) as usize);
    }
    let run = &pool[..RUN];
    let seq: Vec<u32> = run.iter().chain(run).copied().collect();
    let e = enc.encode(&layers, &[], &seq, true)?;

    let mut scores = Vec::new();
    let mut q = vec![0.0f32; hd];
    let mut dots = vec![0.0f32; 2 * RUN];
    for (li, &layer) in layers.iter().enumerate() {
        let (keys, queries) = (&e.keys[li], &e.queries[li]);
        for g in 0..shape.n_kv_heads {
            let mut hits = 0usize;
            for i in RUN..2 * RUN {
                q.fill(0.0);
                for h in g * group..(g + 1) * group {
                    for (a, x) in q.iter_mut().zip(&queries[i * q_dim + h * hd..][..hd]) {
                        *a += x;
                    }
                }
                let span = i - NEAR;
                for (p, d) in dots[..span].iter_mut().enumerate() {
                    let k = &keys[p * kv_dim + g * hd..][..hd];
                    *d = q.iter().zip(k).map(|(a, b)| a * b).sum();
                }
                let rank = |p: usize| dots[..span].iter().filter(|&&d| d > dots[p]).count();
                let j = i - RUN;
                if rank(j) < TOP || (j + 1 < span && rank(j + 1) < TOP) {
                    hits += 1;
                }
            }
            let slot = Slot {
                layer: layer as u16,
                kv_head: g as u16,
            };
            scores.push((slot, hits as f32 / RUN as f32));
        }
    }
    // Strongest first; ties by position in the model.
    scores.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(scores)
}

/// The layout for the model behind `enc`: the best `max_slots` slots and
/// their centring means over `tokens` (the calibration text, tokenized).
pub fn calibrate(
    enc: &mut dyn KeyEncoder,
    tokens: &[u32],
    max_slots: usize,
    seed: u64,
) -> Result<Layout, MemoryError> {
    let shape = enc.shape();
    let scores = slot_scores(enc, tokens, seed)?;
    let slots: Vec<Slot> = scores
        .iter()
        .take(max_slots.max(1))
        .map(|(s, _)| *s)
        .collect();
    // Means of each chosen slot's keys over the natural text.
    let mut layers: Vec<usize> = slots.iter().map(|s| s.layer as usize).collect();
    layers.sort_unstable();
    layers.dedup();
    let e = enc.encode(&layers, &[], tokens, true)?;
    let (hd, kv_dim, q_dim, group) = (shape.head_dim, shape.kv_dim(), shape.q_dim(), shape.group());
    let mut means = vec![0.0f32; slots.len() * hd];
    let mut query_means = vec![0.0f32; slots.len() * hd];
    for (s, slot) in slots.iter().enumerate() {
        let li = layers
            .binary_search(&(slot.layer as usize))
            .expect("listed");
        let (keys, queries) = (&e.keys[li], &e.queries[li]);
        let g = slot.kv_head as usize;
        for t in 0..e.n {
            let k = &keys[t * kv_dim + g * hd..][..hd];
            for (m, x) in means[s * hd..(s + 1) * hd].iter_mut().zip(k) {
                *m += x / e.n as f32;
            }
            for h in g * group..(g + 1) * group {
                let q = &queries[t * q_dim + h * hd..][..hd];
                for (m, x) in query_means[s * hd..(s + 1) * hd].iter_mut().zip(q) {
                    *m += x / (e.n * group) as f32;
                }
            }
        }
    }
    Ok(Layout::new(
        shape,
        slots,
        means,
        query_means,
        seed ^ 0x6d65_6d6f_7279,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_gives_smollm2_its_36_slots() {
        assert_eq!(slots_in_budget(8, 64, 2), MAX_SLOTS);
        // The built-in model's 18-dimension heads: 3 bytes a slot, all fit.
        assert_eq!(slots_in_budget(3, 64, 2), MAX_SLOTS);
        assert!(slots_in_budget(16, 64, 4) < 36);
    }
}
