//! Several queries in one search ([`MemoryFile::search_many`]): one
//! retrieval of the engine is up to 8 queries (one per content token of
//! the prompt), and each tier costs less done for all of them at once.
//!
//! - **Coarse**: the sign tiles are read once for all queries
//!   ([`kernels::fast_scan_many`]: each row loaded and split into nibbles
//!   once, looked up in every query's tables), and each query's best
//!   blocks are kept as the scan goes ([`TopScores`]) instead of storing
//!   and rescanning millions of scores per query. Only the slots some
//!   query has are scanned; a query's zero slots have zero tables.
//! - **Summary**: a block several queries kept is scored for all of them
//!   with its summaries read once and their norms computed once.
//! - **Fine**: a record several queries kept is read and checksummed
//!   once; every distinct record is prefetched before any is read.
//! - Each pass splits its work over the threads once for all queries.
//!
//! Every query's result equals [`MemoryFile::search`] with that query
//! alone: the same tables, kernels and float operations in the same order
//! (tested in `crate::tests`).

use super::top::TopScores;
use super::{
    best, fine_scores_of, fuse, par_map, summary_scores_with, FineTables, Queries, SearchParams,
    SearchResult, SlotScores, SummaryNorms, Timings,
};
use crate::error::{Error, Result};
use crate::index::{Index, TILE_GROUPS};
use crate::kernels::{self, FastScanBatch, FastScanTables, Isa, GROUP};
use crate::store::MemoryFile;
use std::time::Instant;

impl MemoryFile {
    /// Search for each of `queries` (each `slots × dims` floats, as
    /// [`MemoryFile::search`] takes) in one pass per tier. Result `i` is
    /// what `search(queries[i], p)` returns, but for `timings`, which are
    /// the whole batch's time in each pass. A record that fails its
    /// checksum fails the whole batch.
    pub fn search_many(&self, queries: &[&[f32]], p: &SearchParams) -> Result<Vec<SearchResult>> {
        let index = self.index();
        let qs = queries
            .iter()
            .enumerate()
            .map(|(i, q)| {
                Queries::new(index, q).map_err(|e| match e {
                    Error::BadQuery(why) => Error::BadQuery(format!("query {i}: {why}")),
                    e => e,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let isa = p.isa.unwrap_or_else(Isa::selected);
        let n_slots = index.geometry().slots;
        let m = qs.len();
        let mut res = vec![SearchResult::default(); m];
        if m == 0 || index.is_empty() || p.k == 0 {
            return Ok(res);
        }
        let threads = p.threads.max(1);
        let mut timings = Timings::default();

        let t0 = Instant::now();
        let coarse: Vec<Vec<u64>> = if index.len() <= p.coarse_candidates.max(p.fine_candidates) {
            vec![(0..index.len() as u64).collect(); m]
        } else {
            let all: Vec<u32> = (0..n_slots).collect();
            let slots = p.coarse_slots.as_deref().unwrap_or(&all);
            if let Some(&s) = slots.iter().find(|&&s| s >= n_slots) {
                return Err(Error::BadQuery(format!(
                    "coarse slot {s} does not exist (the file has {n_slots})"
                )));
            }
            coarse_many(index, &qs, slots, p.coarse_candidates, threads, isa)
        };
        timings.coarse = t0.elapsed();

        let t1 = Instant::now();
        let summary = summary_many(index, &qs, &coarse, threads, isa)?;
        let fine_in: Vec<Vec<super::Hit>> = summary
            .iter()
            .map(|rows| best(rows, &fuse(rows, p.fusion), p.fine_candidates.max(p.k)))
            .collect();
        timings.summary = t1.elapsed();

        let t2 = Instant::now();
        let fine = self.fine_many(&qs, &fine_in, threads, isa)?;
        timings.fine = t2.elapsed();

        for (((r, c), s), f) in res.iter_mut().zip(coarse).zip(summary).zip(fine) {
            r.hits = best(&f, &fuse(&f, p.fusion), p.k);
            r.coarse = c;
            r.summary = s;
            r.fine = f;
            r.timings = timings.clone();
        }
        Ok(res)
    }

    /// Fine scores of each query's candidates (in its order), each
    /// distinct record read once.
    fn fine_many(
        &self,
        qs: &[Queries],
        fine_in: &[Vec<super::Hit>],
        threads: usize,
        isa: Isa,
    ) -> Result<Vec<Vec<SlotScores>>> {
        let n_slots = self.geometry().slots as usize;
        // (block, query, place in that query's list), by block.
        let mut wanted: Vec<(u64, usize, usize)> = fine_in
            .iter()
            .enumerate()
            .flat_map(|(q, hits)| hits.iter().enumerate().map(move |(i, h)| (h.block, q, i)))
            .collect();
        wanted.sort_unstable();
        let runs = runs_by_block(&wanted, |w| w.0);
        // Ask the kernel for every record at once (in file order), so a
        // cold file is read with the disk's parallelism.
        for &(a, _) in &runs {
            self.prefetch(wanted[a].0);
        }
        let tables: Vec<FineTables> = qs.iter().map(|q| FineTables::new(q, n_slots)).collect();
        let scored = par_map(&runs, threads, |&(a, e)| {
            let block = wanted[a].0;
            let mut buf = Vec::new();
            self.read_record(block, &mut buf)?;
            Ok(wanted[a..e]
                .iter()
                .map(|&(_, q, _)| fine_scores_of(self, &qs[q], &tables[q], block, isa, &buf))
                .collect::<Vec<_>>())
        })?;
        let mut out: Vec<Vec<SlotScores>> = fine_in
            .iter()
            .map(|hits| {
                hits.iter()
                    .map(|h| SlotScores {
                        block: h.block,
                        scores: Vec::new(),
                    })
                    .collect()
            })
            .collect();
        for (&(a, e), scores) in runs.iter().zip(scored) {
            for (&(_, q, i), s) in wanted[a..e].iter().zip(scores) {
                out[q][i].scores = s;
            }
        }
        Ok(out)
    }
}

/// `[start, end)` of each run of equal blocks in `items` (sorted by block).
fn runs_by_block<T>(items: &[T], block: impl Fn(&T) -> u64) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut a = 0;
    for i in 1..=items.len() {
        if i == items.len() || block(&items[i]) != block(&items[a]) {
            runs.push((a, i));
            a = i;
        }
    }
    runs
}

/// Each query's best `c` blocks by its coarse score over `slots`, in block
/// order: the tiles read once for all queries, split over `threads`.
fn coarse_many(
    index: &Index,
    qs: &[Queries],
    slots: &[u32],
    c: usize,
    threads: usize,
    isa: Isa,
) -> Vec<Vec<u64>> {
    let m = qs.len();
    let cb = index.geometry().code_bytes as usize;
    let active = |q: &Queries, s: u32| q.norm(s as usize) > 0.0;
    // The slots some query has, in the caller's order (repeats kept: a
    // single search counts a repeated slot twice).
    let batch_slots: Vec<u32> = slots
        .iter()
        .copied()
        .filter(|&s| qs.iter().any(|q| active(q, s)))
        .collect();
    let mut batch = FastScanBatch::new(m, batch_slots.len(), cb);
    for (qi, q) in qs.iter().enumerate() {
        // The tables a search of this query alone builds: its own slots,
        // in order, weighted by 1/‖q‖.
        let own: Vec<usize> = (0..batch_slots.len())
            .filter(|&i| active(q, batch_slots[i]))
            .collect();
        let vs: Vec<&[f32]> = own
            .iter()
            .map(|&i| q.slot(batch_slots[i] as usize))
            .collect();
        let w: Vec<f32> = own
            .iter()
            .map(|&i| 1.0 / q.norm(batch_slots[i] as usize))
            .collect();
        let t = FastScanTables::new(&vs, &w);
        for (j, &i) in own.iter().enumerate() {
            batch.set(qi, i, &t, j);
        }
    }
    let n = index.len();
    let per_tile = GROUP * TILE_GROUPS;
    let tiles = n.div_ceil(per_tile);
    let (tb, rb) = (index.tile_bytes(), index.run_bytes());
    let data = index.sign_tiles();
    let threads = threads.clamp(1, tiles.max(1));
    let per = tiles.div_ceil(threads).max(1);
    let scan = |from: usize, to: usize| {
        let mut tops: Vec<TopScores> = (0..m).map(|_| TopScores::new(c)).collect();
        let mut scores = vec![0u16; m * per_tile];
        for tile in from..to {
            let t = &data[tile * tb..][..tb];
            let runs: Vec<&[u8]> = batch_slots
                .iter()
                .map(|&s| &t[s as usize * rb..][..rb])
                .collect();
            kernels::fast_scan_many(isa, &batch, &runs, &mut scores);
            let first = tile * per_tile;
            let valid = per_tile.min(n - first);
            for (top, s) in tops.iter_mut().zip(scores.chunks_exact(per_tile)) {
                top.offer(&s[..valid], first as u64);
            }
        }
        tops
    };
    let parts: Vec<Vec<TopScores>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (1..threads)
            .map(|i| {
                let scan = &scan;
                sc.spawn(move || scan((i * per).min(tiles), ((i + 1) * per).min(tiles)))
            })
            .collect();
        let mut parts = vec![scan(0, per.min(tiles))];
        parts.extend(
            handles
                .into_iter()
                .map(|h| h.join().expect("search thread panicked")),
        );
        parts
    });
    let mut parts = parts.into_iter();
    let mut tops = parts.next().expect("one part at least");
    for later in parts {
        for (top, l) in tops.iter_mut().zip(later) {
            top.append(l);
        }
    }
    tops.into_iter().map(TopScores::into_blocks).collect()
}

/// Each query's summary scores of its coarse candidates (in their order):
/// a block kept by several queries is scored for all of them together.
fn summary_many(
    index: &Index,
    qs: &[Queries],
    coarse: &[Vec<u64>],
    threads: usize,
    isa: Isa,
) -> Result<Vec<Vec<SlotScores>>> {
    let n_slots = index.geometry().slots as usize;
    // (block, query), by block; each query's candidates are in block
    // order, so they come out in their order.
    let mut pairs: Vec<(u64, usize)> = coarse
        .iter()
        .enumerate()
        .flat_map(|(q, c)| c.iter().map(move |&b| (b, q)))
        .collect();
    pairs.sort_unstable();
    let runs = runs_by_block(&pairs, |p| p.0);
    let scored = par_map(&runs, threads, |&(a, e)| {
        let block = pairs[a].0 as usize;
        let mut norms = SummaryNorms::new(n_slots);
        Ok(pairs[a..e]
            .iter()
            .map(|&(_, q)| summary_scores_with(index, &qs[q], block, isa, &mut norms))
            .collect::<Vec<_>>())
    })?;
    let mut out: Vec<Vec<SlotScores>> =
        coarse.iter().map(|c| Vec::with_capacity(c.len())).collect();
    for (&(a, e), scores) in runs.iter().zip(scored) {
        for (&(block, q), s) in pairs[a..e].iter().zip(scores) {
            out[q].push(SlotScores { block, scores: s });
        }
    }
    Ok(out)
}
