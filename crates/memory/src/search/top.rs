//! The best `c` of a stream of u16 scores, chosen as the coarse pass goes:
//! ranked by score, then by block (the earlier block first among equal
//! scores), the same set the histogram selection of a whole score array
//! gives ([`super::top_u16`]).
//!
//! A scan keeps the blocks that can still be among the best `c` and a
//! floor under which none can: when the kept blocks reach `2c`, the `c`-th
//! best score `v` is found, the blocks above it and the earliest ties at
//! it fill `c`, and the floor becomes `v + 1` (a later block at `v` ranks
//! after those ties). So a pass over millions of scores touches few of
//! them, and a 32-score chunk below the floor costs one vector max.

/// Scores below the floor in a chunk of this many are skipped at once.
const CHUNK: usize = 32;

#[derive(Clone, Debug)]
pub struct TopScores {
    c: usize,
    /// `(score, block)` in block order.
    kept: Vec<(u16, u64)>,
    /// Scores below this cannot be among the best `c` (u32: one past
    /// u16::MAX means nothing more can).
    floor: u32,
}

impl TopScores {
    pub fn new(c: usize) -> TopScores {
        TopScores {
            c,
            kept: Vec::with_capacity(2 * c.min(1 << 16)),
            floor: if c == 0 { 1 << 16 } else { 0 },
        }
    }

    /// Offer `scores[i]` for block `first + i`; blocks must come in
    /// increasing order over all calls.
    pub fn offer(&mut self, scores: &[u16], first: u64) {
        for (ci, chunk) in scores.chunks(CHUNK).enumerate() {
            if (chunk.iter().copied().max().unwrap_or(0) as u32) < self.floor {
                continue;
            }
            for (j, &s) in chunk.iter().enumerate() {
                if s as u32 >= self.floor {
                    self.kept.push((s, first + (ci * CHUNK + j) as u64));
                    if self.kept.len() >= 2 * self.c {
                        self.prune();
                    }
                }
            }
        }
    }

    /// Keep the best `c` of what is kept (by score, then block) and raise
    /// the floor past the `c`-th score.
    fn prune(&mut self) {
        if self.kept.len() <= self.c {
            return;
        }
        let v = nth_best(&self.kept, self.c);
        let above = self.kept.iter().filter(|k| k.0 > v).count();
        let mut ties = self.c - above;
        self.kept.retain(|k| {
            k.0 > v
                || (k.0 == v && ties > 0 && {
                    ties -= 1;
                    true
                })
        });
        self.floor = v as u32 + 1;
    }

    /// Join the tops of consecutive ranges of blocks (`later` after
    /// `self`).
    pub fn append(&mut self, later: TopScores) {
        for &(s, b) in &later.kept {
            if s as u32 >= self.floor {
                self.kept.push((s, b));
            }
        }
        if self.kept.len() >= 2 * self.c {
            self.prune();
        }
    }

    /// The best `c` blocks, in block order.
    pub fn into_blocks(mut self) -> Vec<u64> {
        self.prune();
        self.kept.into_iter().map(|(_, b)| b).collect()
    }
}

/// The `c`-th highest score of `kept` (1-based, `c <= kept.len()`).
fn nth_best(kept: &[(u16, u64)], c: usize) -> u16 {
    let mut s: Vec<u16> = kept.iter().map(|k| k.0).collect();
    let (_, v, _) = s.select_nth_unstable_by(c - 1, |a, b| b.cmp(a));
    *v
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
                    let mut t = TopScores::new(c);
                    let mut at = 0;
                    while at < n {
                        let len = (r.below(70) as usize + 1).min(n - at);
                        t.offer(&scores[at..at + len], at as u64);
                        at += len;
                    }
                    assert_eq!(t.into_blocks(), want, "n {n} distinct {distinct} c {c}");
                    // Two ranges chosen apart, then joined.
                    let cut = r.below(n as u64 + 1) as usize;
                    let mut a = TopScores::new(c);
                    a.offer(&scores[..cut], 0);
                    let mut b = TopScores::new(c);
                    b.offer(&scores[cut..], cut as u64);
                    a.append(b);
                    assert_eq!(a.into_blocks(), want, "split at {cut}: n {n} c {c}");
                }
            }
        }
    }
}
