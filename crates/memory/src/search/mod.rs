//! Tiered search: which blocks of the history best match a set of per-slot
//! query vectors.
//!
//! 1. **Coarse** (every block): the sign bits of each block's summaries,
//!    scored by the nibble fast scan over the coarse slots, fused by summed
//!    z-scores folded into the tables (slot weight 1/‖q‖: for balanced
//!    sign bits `<q, sign>` has standard deviation ‖q‖), split over
//!    threads; the best `coarse_candidates` go on. Skipped when the whole
//!    history is that small.
//! 2. **Summary**: the int4 summaries of those candidates, every slot,
//!    per-slot scores fused; the best `fine_candidates` go on. Skipped
//!    when `fine_candidates` covers the whole history (every block is
//!    scored token by token).
//! 3. **Fine**: the candidates' codes, read from the file (checksummed),
//!    scored per token by byte lookup tables; a block's score per slot is
//!    its best token's; fused into the top `k`.
//!
//! Fusion of per-slot scores: [`Fusion::ZSum`] (each slot's score over its
//! standard deviation under random codes, summed) or [`Fusion::Rrf`]
//! (reciprocal ranks among the candidates).
//!
//! [`MemoryFile::search`] is one query, written plainly; `many` runs
//! several through each tier at once ([`MemoryFile::search_many`]) and is
//! tested to give each one's result exactly.

use crate::error::{Error, Result};
use crate::index::{Index, TILE_GROUPS};
use crate::kernels::{self, FastScanTables, Isa, GROUP};
use crate::store::MemoryFile;
use std::time::{Duration, Instant};

mod many;
#[cfg(test)]
mod tests;
mod top;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fusion {
    /// Σ over slots of score / (its standard deviation for random codes).
    ZSum,
    /// Σ over slots of 1 / (k + rank), ranks counted among candidates.
    Rrf { k: f32 },
}

#[derive(Clone, Debug)]
pub struct SearchParams {
    /// Blocks to return.
    pub k: usize,
    /// Slots the coarse pass scans (all when `None`). Fewer slots read
    /// proportionally fewer bytes.
    pub coarse_slots: Option<Vec<u32>>,
    /// Blocks the coarse pass hands to the summary pass.
    pub coarse_candidates: usize,
    /// Blocks the summary pass hands to the fine pass.
    pub fine_candidates: usize,
    pub fusion: Fusion,
    /// Threads for the coarse scan.
    pub threads: usize,
    /// Kernel set (the process's choice when `None`).
    pub isa: Option<Isa>,
}

impl Default for SearchParams {
    fn default() -> SearchParams {
        SearchParams {
            k: 16,
            coarse_slots: None,
            coarse_candidates: 2048,
            fine_candidates: 128,
            fusion: Fusion::ZSum,
            threads: 2,
            isa: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    pub block: u64,
    pub score: f32,
}

/// Raw per-slot scores of one block in one tier.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotScores {
    pub block: u64,
    /// One per slot (0 for slots whose query is zero).
    pub scores: Vec<f32>,
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub coarse: Duration,
    pub summary: Duration,
    pub fine: Duration,
}

#[derive(Clone, Debug, Default)]
pub struct SearchResult {
    /// The top `k` blocks, best first.
    pub hits: Vec<Hit>,
    /// Blocks the coarse pass kept (all blocks when it was skipped).
    pub coarse: Vec<u64>,
    /// Per-slot summary scores of the coarse candidates.
    pub summary: Vec<SlotScores>,
    /// Per-slot fine scores (best token) of the summary candidates.
    pub fine: Vec<SlotScores>,
    pub timings: Timings,
}

/// Per-slot query vectors, checked: `S` slices of `D` finite floats.
pub struct Queries<'a> {
    q: &'a [f32],
    dims: usize,
    norms: Vec<f32>,
}

impl<'a> Queries<'a> {
    pub fn new(index: &Index, q: &'a [f32]) -> Result<Queries<'a>> {
        let g = index.geometry();
        let (s, d) = (g.slots as usize, g.dims());
        if q.len() != s * d {
            return Err(Error::BadQuery(format!(
                "{} floats where {s} slots × {d} dims need {}",
                q.len(),
                s * d
            )));
        }
        if let Some(i) = q.iter().position(|v| !v.is_finite()) {
            return Err(Error::BadQuery(format!(
                "slot {} dim {} is {}",
                i / d,
                i % d,
                q[i]
            )));
        }
        let norms = q
            .chunks_exact(d)
            .map(|x| x.iter().map(|v| v * v).sum::<f32>().sqrt())
            .collect();
        Ok(Queries { q, dims: d, norms })
    }

    pub fn slot(&self, s: usize) -> &[f32] {
        &self.q[s * self.dims..(s + 1) * self.dims]
    }

    pub fn norm(&self, s: usize) -> f32 {
        self.norms[s]
    }

    /// Slots whose query is not zero: the only ones any tier scores.
    pub fn active(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.norms.len()).filter(|&s| self.norms[s] > 0.0)
    }
}

/// Coarse fused score of every block (for measuring the coarse tier):
/// Σ over `slots` of `<q_s, sign(summary_s)> / ‖q_s‖`, quantized as the
/// fast scan computes it.
pub fn coarse_scores(
    index: &Index,
    queries: &Queries,
    slots: &[u32],
    threads: usize,
    isa: Isa,
) -> Vec<f32> {
    let (t, raw) = coarse_raw(index, queries, slots, threads, isa);
    // <q, sign> = 2·Σ_{set} q − Σ q; the constant per slot does not move
    // ranks but keeps the number comparable to a z-score.
    let constant: f32 = slots
        .iter()
        .filter(|&&s| queries.norm(s as usize) > 0.0)
        .map(|&s| queries.slot(s as usize).iter().sum::<f32>() / queries.norm(s as usize))
        .sum();
    raw.iter()
        .map(|&u| 2.0 * (t.offset + t.step * u as f32) - constant)
        .collect()
}

fn coarse_raw(
    index: &Index,
    queries: &Queries,
    slots: &[u32],
    threads: usize,
    isa: Isa,
) -> (FastScanTables, Vec<u16>) {
    let slots: Vec<u32> = slots
        .iter()
        .copied()
        .filter(|&s| queries.norm(s as usize) > 0.0)
        .collect();
    let qs: Vec<&[f32]> = slots.iter().map(|&s| queries.slot(s as usize)).collect();
    let w: Vec<f32> = slots
        .iter()
        .map(|&s| 1.0 / queries.norm(s as usize))
        .collect();
    let t = FastScanTables::new(&qs, &w);
    let n = index.len();
    let per_tile = GROUP * TILE_GROUPS;
    let tiles = n.div_ceil(per_tile);
    let mut out = vec![0u16; tiles * per_tile];
    let (tb, rb) = (index.tile_bytes(), index.run_bytes());
    let data = index.sign_tiles();
    let threads = threads.clamp(1, tiles.max(1));
    let per = tiles.div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        for (i, chunk) in out.chunks_mut(per * per_tile).enumerate() {
            let (t, slots) = (&t, &slots);
            sc.spawn(move || {
                for (j, o) in chunk.chunks_mut(per_tile).enumerate() {
                    let tile = &data[(i * per + j) * tb..][..tb];
                    let runs: Vec<&[u8]> = slots
                        .iter()
                        .map(|&s| &tile[s as usize * rb..][..rb])
                        .collect();
                    kernels::fast_scan(isa, t, &runs, o);
                }
            });
        }
    });
    out.truncate(n);
    (t, out)
}

/// The `c` highest of `scores` (u16), in no particular order: a histogram
/// finds the threshold in one pass instead of sorting millions of scores.
fn top_u16(scores: &[u16], c: usize) -> Vec<u64> {
    if c >= scores.len() {
        return (0..scores.len() as u64).collect();
    }
    let mut hist = vec![0u32; 1 << 16];
    for &s in scores {
        hist[s as usize] += 1;
    }
    let mut above = 0usize;
    let mut thr = 0usize;
    for v in (0..1 << 16).rev() {
        if above + hist[v] as usize >= c {
            thr = v;
            break;
        }
        above += hist[v] as usize;
    }
    let mut ties = c - above;
    let mut out = Vec::with_capacity(c);
    for (i, &s) in scores.iter().enumerate() {
        if s as usize > thr {
            out.push(i as u64);
        } else if s as usize == thr && ties > 0 {
            out.push(i as u64);
            ties -= 1;
        }
    }
    out
}

/// Per-slot int4 summary scores of `block`, as z-scores: the cosine of
/// query and summary times √D (its standard deviation for random vectors is
/// 1/√D).
pub fn summary_scores(index: &Index, queries: &Queries, block: usize, isa: Isa) -> Vec<f32> {
    let mut norms = SummaryNorms::new(index.geometry().slots as usize);
    summary_scores_with(index, queries, block, isa, &mut norms)
}

/// The norms of one block's summaries, per slot, computed when first
/// asked for: queries that score the same block share them.
pub(crate) struct SummaryNorms(Vec<Option<f32>>);

impl SummaryNorms {
    pub(crate) fn new(slots: usize) -> SummaryNorms {
        SummaryNorms(vec![None; slots])
    }

    /// For another block.
    pub(crate) fn clear(&mut self) {
        self.0.fill(None);
    }

    fn get(&mut self, s: usize, sum: &[u8], isa: Isa) -> f32 {
        *self.0[s].get_or_insert_with(|| {
            let sq = kernels::int4_sq(isa, sum);
            crate::format::summary::scale(sum) * (sq as f32).sqrt()
        })
    }
}

/// [`summary_scores`] with norms from `norms` (which must be this
/// block's).
pub(crate) fn summary_scores_with(
    index: &Index,
    queries: &Queries,
    block: usize,
    isa: Isa,
    norms: &mut SummaryNorms,
) -> Vec<f32> {
    let g = index.geometry();
    let sb = g.summary_bytes();
    let sums = index.summaries(block);
    let sqrt_d = (g.dims() as f32).sqrt();
    let mut out = vec![0f32; g.slots as usize];
    let mut one = [0f32];
    for s in queries.active() {
        let sum = &sums[s * sb..(s + 1) * sb];
        kernels::int4_dots(isa, queries.slot(s), sum, sb, &mut one);
        let norm = norms.get(s, sum, isa);
        if norm > 0.0 {
            out[s] = one[0] / (queries.norm(s) * norm) * sqrt_d;
        }
    }
    out
}

/// Scratch for fine scoring: lookup tables per slot, built once per query.
pub struct FineTables {
    tables: Vec<Vec<f32>>,
    sums: Vec<f32>,
}

impl FineTables {
    pub fn new(queries: &Queries, slots: usize) -> FineTables {
        let mut tables = vec![Vec::new(); slots];
        let mut sums = vec![0f32; slots];
        for s in queries.active() {
            let q = queries.slot(s);
            let mut t = vec![0f32; q.len() / 8 * 256];
            kernels::lut_tables(q, &mut t);
            tables[s] = t;
            sums[s] = q.iter().sum();
        }
        FineTables { tables, sums }
    }
}

/// Per-slot fine scores of one block: the best token's `<q, sign(code)>`
/// over ‖q‖ (a z-score for random sign bits).
pub fn fine_scores(
    mf: &MemoryFile,
    queries: &Queries,
    tables: &FineTables,
    block: u64,
    isa: Isa,
    buf: &mut Vec<u8>,
) -> Result<Vec<f32>> {
    mf.read_record(block, buf)?;
    Ok(fine_scores_of(mf, queries, tables, block, isa, buf))
}

/// [`fine_scores`] of a record already read into `record`.
pub(crate) fn fine_scores_of(
    mf: &MemoryFile,
    queries: &Queries,
    tables: &FineTables,
    block: u64,
    isa: Isa,
    record: &[u8],
) -> Vec<f32> {
    let mut tok = Vec::new();
    let mut out = vec![0f32; mf.geometry().slots as usize];
    for s in queries.active() {
        let codes = record_codes(mf, block, record, s);
        out[s] = fine_slot_score(queries, tables, s, codes, isa, &mut tok);
    }
    out
}

/// Slot `s`'s codes in `record` (block `block`'s record, header first).
pub(crate) fn record_codes<'r>(
    mf: &MemoryFile,
    block: u64,
    record: &'r [u8],
    s: usize,
) -> &'r [u8] {
    let g = mf.geometry();
    let n = mf.index().meta(block as usize).n_tokens as usize;
    let at = crate::format::RECORD_HEADER + g.payload_parts(n).codes;
    let len = n * g.code_bytes as usize;
    &record[at + s * len..at + (s + 1) * len]
}

/// One slot's fine score of a block with slot codes `codes`: its best
/// token's `<q, sign(code)>` over ‖q‖. `tok` is scratch.
pub(crate) fn fine_slot_score(
    queries: &Queries,
    tables: &FineTables,
    s: usize,
    codes: &[u8],
    isa: Isa,
    tok: &mut Vec<f32>,
) -> f32 {
    let cb = tables.tables[s].len() / 256;
    tok.resize(codes.len() / cb, 0.0);
    kernels::lut_scores(isa, &tables.tables[s], codes, tok);
    let best = tok.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    (2.0 * best - tables.sums[s]) / queries.norm(s)
}

/// Fuse per-slot scores of candidates into one score each.
pub fn fuse(rows: &[SlotScores], fusion: Fusion) -> Vec<f32> {
    match fusion {
        Fusion::ZSum => rows.iter().map(|r| r.scores.iter().sum()).collect(),
        Fusion::Rrf { k } => {
            let slots = rows.first().map_or(0, |r| r.scores.len());
            let mut fused = vec![0f32; rows.len()];
            let mut order: Vec<usize> = (0..rows.len()).collect();
            for s in 0..slots {
                if rows.iter().all(|r| r.scores[s] == 0.0) {
                    continue;
                }
                order.sort_by(|&a, &b| rows[b].scores[s].total_cmp(&rows[a].scores[s]));
                for (rank, &i) in order.iter().enumerate() {
                    fused[i] += 1.0 / (k + rank as f32 + 1.0);
                }
            }
            fused
        }
    }
}

pub(crate) fn best(rows: &[SlotScores], fused: &[f32], n: usize) -> Vec<Hit> {
    let mut hits: Vec<Hit> = rows
        .iter()
        .zip(fused)
        .map(|(r, &score)| Hit {
            block: r.block,
            score,
        })
        .collect();
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.block.cmp(&b.block)));
    hits.truncate(n);
    hits
}

impl MemoryFile {
    /// Search the history for the blocks that best match `queries`
    /// (`slots × dims` floats, rotated and centred as the codes were).
    pub fn search(&self, queries: &[f32], p: &SearchParams) -> Result<SearchResult> {
        let index = self.index();
        let q = Queries::new(index, queries)?;
        let isa = p.isa.unwrap_or_else(Isa::selected);
        let n_slots = index.geometry().slots;
        let mut res = SearchResult::default();
        if index.is_empty() || p.k == 0 {
            return Ok(res);
        }
        let t0 = Instant::now();
        res.coarse = if index.len() <= p.coarse_candidates.max(p.fine_candidates) {
            (0..index.len() as u64).collect()
        } else {
            let all: Vec<u32> = (0..n_slots).collect();
            let slots = p.coarse_slots.as_deref().unwrap_or(&all);
            if let Some(&s) = slots.iter().find(|&&s| s >= n_slots) {
                return Err(Error::BadQuery(format!(
                    "coarse slot {s} does not exist (the file has {n_slots})"
                )));
            }
            let (_, raw) = coarse_raw(index, &q, slots, p.threads, isa);
            top_u16(&raw, p.coarse_candidates)
        };
        res.timings.coarse = t0.elapsed();

        let t1 = Instant::now();
        let threads = p.threads.max(1);
        let fine_in = if p.fine_candidates >= index.len() {
            // Every block goes to the fine pass: summaries would only
            // order them.
            every_block(index.len())
        } else {
            res.summary = par_map(&res.coarse, threads, |&b| {
                Ok(SlotScores {
                    block: b,
                    scores: summary_scores(index, &q, b as usize, isa),
                })
            })?;
            let fused = fuse(&res.summary, p.fusion);
            best(&res.summary, &fused, p.fine_candidates.max(p.k))
        };
        res.timings.summary = t1.elapsed();

        let t2 = Instant::now();
        // Ask the kernel for every candidate record at once, so a cold file
        // is read with the disk's parallelism instead of one pread at a time.
        for h in &fine_in {
            self.prefetch(h.block);
        }
        let tables = FineTables::new(&q, n_slots as usize);
        res.fine = par_map(&fine_in, threads, |h| {
            let mut buf = Vec::new();
            Ok(SlotScores {
                block: h.block,
                scores: fine_scores(self, &q, &tables, h.block, isa, &mut buf)?,
            })
        })?;
        let fused = fuse(&res.fine, p.fusion);
        res.hits = best(&res.fine, &fused, p.k);
        res.timings.fine = t2.elapsed();
        Ok(res)
    }
}

/// Every block of a history of `n`, as fine-pass candidates.
pub(crate) fn every_block(n: usize) -> Vec<Hit> {
    (0..n as u64)
        .map(|block| Hit { block, score: 0.0 })
        .collect()
}

/// `f` over `items` in order, split into `threads` contiguous chunks run
/// on scoped threads (one thread: no spawn).
pub(crate) fn par_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    par_chunks(items, threads, |chunk| chunk.iter().map(&f).collect())
}

/// `f` over `threads` contiguous chunks of `items`, the first on this
/// thread and the others on scoped threads; the results joined in order.
/// Few items stay on one thread (a spawn costs more than they do).
pub(crate) fn par_chunks<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&[T]) -> Result<Vec<R>> + Sync,
) -> Result<Vec<R>> {
    if threads <= 1 || items.len() < 2 * threads {
        return f(items);
    }
    let per = items.len().div_ceil(threads);
    let parts: Vec<Result<Vec<R>>> = std::thread::scope(|sc| {
        let f = &f;
        let handles: Vec<_> = items
            .chunks(per)
            .skip(1)
            .map(|chunk| sc.spawn(move || f(chunk)))
            .collect();
        let mut parts = vec![f(&items[..per])];
        parts.extend(
            handles
                .into_iter()
                .map(|h| h.join().expect("search thread panicked")),
        );
        parts
    });
    let mut out = Vec::with_capacity(items.len());
    for p in parts {
        out.extend(p?);
    }
    Ok(out)
}
