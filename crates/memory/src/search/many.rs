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
    best, every_block, fine_slot_score, fuse, par_chunks, record_codes, summary_scores_with,
    FineTables, Queries, SearchParams, SearchResult, SlotScores, SummaryNorms, Timings,
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
        let (summary, fine_in) = if p.fine_candidates >= index.len() {
            (vec![Vec::new(); m], vec![every_block(index.len()); m])
        } else {
            let summary = summary_many(index, &qs, &coarse, threads, isa)?;
            let fine_in: Vec<Vec<super::Hit>> = summary
                .iter()
                .map(|rows| best(rows, &fuse(rows, p.fusion), p.fine_candidates.max(p.k)))
                .collect();
            (summary, fine_in)
        };
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

    /// Fine scores of each query's candidates (in its order). Each
    /// distinct record is read once; the records a thread reads are then
    /// scored query by query and slot by slot, so one slot's lookup
    /// tables (8 KB for 8-byte codes) stay in L1 over all of a query's
    /// records instead of each record bringing a query's 8 tables back.
    fn fine_many(
        &self,
        qs: &[Queries],
        fine_in: &[Vec<super::Hit>],
        threads: usize,
        isa: Isa,
    ) -> Result<Vec<Vec<SlotScores>>> {
        let g = *self.geometry();
        let n_slots = g.slots as usize;
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
        let record_len = |b: u64| g.record_len(self.index().meta(b as usize).n_tokens as usize);
        let scored = par_chunks(&runs, threads, |chunk| {
            let mut out = Vec::new();
            let mut records: Vec<Vec<u8>> = Vec::new();
            let mut tok = Vec::new();
            let mut rest = chunk;
            while !rest.is_empty() {
                // Records held at once: at most FINE_BYTES (one at least).
                let mut take = 1;
                let mut bytes = record_len(wanted[rest[0].0].0);
                while take < rest.len() {
                    bytes += record_len(wanted[rest[take].0].0);
                    if bytes > FINE_BYTES {
                        break;
                    }
                    take += 1;
                }
                let (now, later) = rest.split_at(take);
                rest = later;
                records.resize_with(now.len(), Vec::new);
                // (query, record, place), by query.
                let mut jobs: Vec<(usize, usize, usize)> = Vec::new();
                for (r, &(a, e)) in now.iter().enumerate() {
                    self.read_record(wanted[a].0, &mut records[r])?;
                    jobs.extend(wanted[a..e].iter().map(|&(_, q, i)| (q, r, i)));
                }
                jobs.sort_unstable();
                for same in jobs.chunk_by(|x, y| x.0 == y.0) {
                    let q = same[0].0;
                    let mut scores = vec![vec![0f32; n_slots]; same.len()];
                    for s in qs[q].active() {
                        for (&(_, r, _), sc) in same.iter().zip(scores.iter_mut()) {
                            let block = wanted[now[r].0].0;
                            let codes = record_codes(self, block, &records[r], s);
                            sc[s] = fine_slot_score(&qs[q], &tables[q], s, codes, isa, &mut tok);
                        }
                    }
                    out.extend(same.iter().zip(scores).map(|(&(q, _, i), sc)| (q, i, sc)));
                }
            }
            Ok(out)
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
        for (q, i, scores) in scored {
            out[q][i].scores = scores;
        }
        Ok(out)
    }
}

/// Bytes of records a thread of the fine pass holds at once (small in
/// tests, so that a pass takes several rounds there).
const FINE_BYTES: u64 = if cfg!(test) { 64 << 10 } else { 512 << 10 };

/// Blocks ahead of the one being scored whose summaries the summary pass
/// asks the CPU for.
const SUMMARY_AHEAD: usize = 8;

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
        let mut tops: Vec<TopScores> = (0..m).map(|_| TopScores::new(c, isa)).collect();
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
/// The candidates' summaries are scattered over the index (each a few
/// cache lines): the next ones are prefetched while one is scored, so the
/// pass is not a chain of memory latencies.
fn summary_many(
    index: &Index,
    qs: &[Queries],
    coarse: &[Vec<u64>],
    threads: usize,
    isa: Isa,
) -> Result<Vec<Vec<SlotScores>>> {
    let g = index.geometry();
    let (n_slots, sb) = (g.slots as usize, g.summary_bytes());
    // The bytes of a block's summaries any query reads.
    let first = qs
        .iter()
        .filter_map(|q| q.active().next())
        .min()
        .unwrap_or(0);
    let end = qs
        .iter()
        .filter_map(|q| q.active().last())
        .max()
        .map_or(0, |s| s + 1);
    let span = first * sb..end.max(first) * sb;
    // (block, query), by block; each query's candidates are in block
    // order, so they come out in their order.
    let mut pairs: Vec<(u64, usize)> = coarse
        .iter()
        .enumerate()
        .flat_map(|(q, c)| c.iter().map(move |&b| (b, q)))
        .collect();
    pairs.sort_unstable();
    let runs = runs_by_block(&pairs, |p| p.0);
    let scored = par_chunks(&runs, threads, |chunk| {
        let mut norms = SummaryNorms::new(n_slots);
        let mut out = Vec::new();
        for (i, &(a, e)) in chunk.iter().enumerate() {
            if let Some(&(ahead, _)) = chunk.get(i + SUMMARY_AHEAD) {
                kernels::prefetch(&index.summaries(pairs[ahead].0 as usize)[span.clone()]);
            }
            let block = pairs[a].0 as usize;
            norms.clear();
            out.extend(
                pairs[a..e]
                    .iter()
                    .map(|&(_, q)| summary_scores_with(index, &qs[q], block, isa, &mut norms)),
            );
        }
        Ok(out)
    })?;
    let mut out: Vec<Vec<SlotScores>> =
        coarse.iter().map(|c| Vec::with_capacity(c.len())).collect();
    for (&(block, q), scores) in pairs.iter().zip(scored) {
        out[q].push(SlotScores { block, scores });
    }
    Ok(out)
}
