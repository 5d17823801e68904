//! The best `c` of a stream of u16 scores, chosen as the coarse pass goes:
//! ranked by score, then by block (the earlier block first among equal
//! scores), the same set the histogram selection of a whole score array
//! gives ([`super::top_u16`]).
//!
//! A scan keeps the blocks that can still be among the best `c` and the
//! `c`-th best score so far, `v`: a later block needs more than `v` (at
//! `v` it ranks after the earlier ties). `v` follows the stream through a
//! histogram of the kept scores near it: each kept score above `v` counts
//! one, and while `c` scores are above `v`, `v` steps up past the count
//! at its next value. Which offered scores pass `v` is asked of a kernel
//! as bits ([`kernels::at_least`]), so the millions below it cost a
//! compare per 32 and no branch each; about `c · ln(n / c)` are kept over
//! a scan of `n`. Blocks that fell below `v` are dropped now and then and
//! at the end.

use crate::kernels::{self, Isa};

/// Scores the histogram covers from its base; `v` walking past them
/// rebuilds it from the kept scores.
const WINDOW: usize = 2048;

#[derive(Clone, Debug)]
pub struct TopScores {
    c: usize,
    isa: Isa,
    /// Kept scores and their blocks, in block order (some fallen below
    /// `v` since they came).
    scores: Vec<u16>,
    blocks: Vec<u64>,
    /// Scores below this cannot be among the best `c`: `v + 1` once `c`
    /// are kept (u32: one past u16::MAX means nothing more can).
    floor: u32,
    /// Kept scores above `v` (while `c` are not kept yet: all of them).
    above: usize,
    /// Counts of kept scores `base..base + WINDOW` (empty until `c` are
    /// kept).
    base: u32,
    hist: Vec<u32>,
    /// Scratch: bits per offered score.
    bits: Vec<u64>,
}

impl TopScores {
    pub fn new(c: usize, isa: Isa) -> TopScores {
        let cap = 2 * c.min(1 << 16);
        TopScores {
            c,
            isa,
            scores: Vec::with_capacity(cap),
            blocks: Vec::with_capacity(cap),
            floor: if c == 0 { 1 << 16 } else { 0 },
            above: 0,
            base: 0,
            hist: Vec::new(),
            bits: Vec::new(),
        }
    }

    /// Offer `scores[i]` for block `first + i`; blocks must come in
    /// increasing order over all calls.
    pub fn offer(&mut self, scores: &[u16], first: u64) {
        if self.floor > u16::MAX as u32 {
            return;
        }
        let mut bits = std::mem::take(&mut self.bits);
        bits.resize(scores.len().div_ceil(64), 0);
        kernels::at_least(self.isa, scores, self.floor as u16, &mut bits);
        for (w, &word) in bits.iter().enumerate() {
            let mut m = word;
            while m != 0 {
                let j = w * 64 + m.trailing_zeros() as usize;
                m &= m - 1;
                // The floor may have risen since the bits were taken.
                if scores[j] as u32 >= self.floor {
                    self.push(scores[j], first + j as u64);
                }
            }
        }
        self.bits = bits;
    }

    /// Keep a score at or above the floor and move `v` up as far as it
    /// goes.
    fn push(&mut self, s: u16, block: u64) {
        self.scores.push(s);
        self.blocks.push(block);
        self.above += 1;
        if self.hist.is_empty() {
            // Fewer than `c` kept so far.
            if self.scores.len() == self.c {
                self.prune();
            }
            return;
        }
        if let Some(n) = self.hist.get_mut((s as u32 - self.base) as usize) {
            *n += 1;
        }
        while self.above >= self.c {
            // v = floor − 1 steps up by one: the scores at the new v are
            // no longer above it.
            let at = (self.floor - self.base) as usize;
            match self.hist.get(at) {
                Some(&n) => {
                    self.above -= n as usize;
                    self.floor += 1;
                }
                None => {
                    self.prune();
                    return;
                }
            }
        }
        if self.scores.len() >= 4 * self.c {
            self.prune();
        }
    }

    /// Keep exactly the best `c` of what is kept (by score, then block),
    /// set `v` to the `c`-th and rebuild the histogram from it.
    fn prune(&mut self) {
        if self.scores.len() < self.c || self.c == 0 {
            return;
        }
        let (v, above) = self.nth_best();
        let mut ties = self.c - above;
        let mut w = 0;
        for i in 0..self.scores.len() {
            let s = self.scores[i];
            let keep = s > v || (s == v && ties > 0);
            ties -= (keep && s == v) as usize;
            self.scores[w] = s;
            self.blocks[w] = self.blocks[i];
            w += keep as usize;
        }
        self.scores.truncate(w);
        self.blocks.truncate(w);
        self.floor = v as u32 + 1;
        self.above = above;
        self.base = v as u32;
        self.hist.clear();
        self.hist.resize(WINDOW, 0);
        for &s in &self.scores {
            if let Some(n) = self.hist.get_mut((s - v) as usize) {
                *n += 1;
            }
        }
    }

    /// The `c`-th highest kept score (`c <= kept`) and how many kept are
    /// higher, by counting the scores between the lowest and highest.
    fn nth_best(&self) -> (u16, usize) {
        let lo = self.scores.iter().copied().min().unwrap_or(0) as usize;
        let hi = self.scores.iter().copied().max().unwrap_or(0) as usize;
        let mut count = vec![0u32; hi - lo + 1];
        for &s in &self.scores {
            count[s as usize - lo] += 1;
        }
        let mut above = 0usize;
        for v in (lo..=hi).rev() {
            let here = count[v - lo] as usize;
            if above + here >= self.c {
                return (v as u16, above);
            }
            above += here;
        }
        (lo as u16, above)
    }

    /// Join the tops of consecutive ranges of blocks (`later` after
    /// `self`).
    pub fn append(&mut self, later: TopScores) {
        for (&s, &b) in later.scores.iter().zip(&later.blocks) {
            if s as u32 >= self.floor {
                self.push(s, b);
            }
        }
    }

    /// The best `c` blocks, in block order.
    pub fn into_blocks(mut self) -> Vec<u64> {
        self.prune();
        self.blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::Rng;

    /// Against the histogram selection over the whole array, for scores
    /// with many ties, few distinct values, all equal, and any split of
    /// the stream into calls and ranges.
    #[test]
    fn streaming_top_equals_the_whole_array_selection() {
        let mut r = Rng::new(11);
        for n in [0usize, 1, 5, 31, 32, 33, 100, 1000, 5000] {
            for distinct in [1u64, 2, 7, 300, 65536] {
                let scores: Vec<u16> = (0..n).map(|_| r.below(distinct) as u16).collect();
                for c in [0usize, 1, 2, 3, 17, 64, 999, 6000] {
                    let want = super::super::top_u16(&scores, c);
                    let isa = Isa::supported()[r.below(Isa::supported().len() as u64) as usize];
                    let mut t = TopScores::new(c, isa);
                    let mut at = 0;
                    while at < n {
                        let len = (r.below(70) as usize + 1).min(n - at);
                        t.offer(&scores[at..at + len], at as u64);
                        at += len;
                    }
                    assert_eq!(t.into_blocks(), want, "n {n} distinct {distinct} c {c}");
                    // Two ranges chosen apart, then joined.
                    let cut = r.below(n as u64 + 1) as usize;
                    let mut a = TopScores::new(c, isa);
                    a.offer(&scores[..cut], 0);
                    let mut b = TopScores::new(c, isa);
                    b.offer(&scores[cut..], cut as u64);
                    a.append(b);
                    assert_eq!(a.into_blocks(), want, "split at {cut}: n {n} c {c}");
                }
            }
        }
    }
}
