//! Speculative decoding by prompt lookup: guess the next tokens from the
//! sequence itself, check the guesses in one batched pass, keep what the
//! model agrees with.
//!
//! When output copies its input (editing code, quoting a passage, a
//! summary reusing phrases) the tokens after the current n-gram's last
//! earlier occurrence are a good guess. The slot evaluates its sampled
//! token and the guesses together, one logits row each; the scheduler
//! samples row 0 as usual, and while the sampled token equals the next
//! guess, the guess's row already holds the following logits. Decode is
//! bound by streaming the weights, which one pass reads once for all rows,
//! so each accepted guess is a token nearly for free.
//!
//! The output is exactly what decoding without guesses gives: every row is
//! computed with the same bits as it would be alone (the model's kernels
//! promise it), each token is drawn by the job's own sampler from its own
//! row, in order, with the same random draws. A guess is a deterministic
//! (one-hot) draft, so "draw as usual, accept if equal" is the speculative
//! sampling rule for it and the distribution is unchanged at any
//! temperature. Rejected guesses leave keys and values at positions past
//! the accepted ones; attention reads only positions up to a token's own,
//! and the next tokens overwrite them.
//!
//! Guesses cost compute (each row runs the whole model), so a job whose
//! guesses keep failing stops guessing for a while ([`Throttle`]), and
//! work that never copies runs at the plain speed.

/// Prompt-lookup settings of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// Most tokens guessed per step (llama.cpp's `--draft-max`).
    pub draft_max: usize,
    /// Fewer continuation tokens than this: no guess this step
    /// (`--draft-min`).
    pub draft_min: usize,
    /// Longest n-gram matched (the longest match that occurs is used).
    pub ngram_max: usize,
    /// Shortest n-gram matched.
    pub ngram_min: usize,
}

impl Default for Lookup {
    fn default() -> Lookup {
        Lookup {
            draft_max: 8,
            draft_min: 1,
            ngram_max: 4,
            ngram_min: 2,
        }
    }
}

impl Lookup {
    /// Why these settings cannot work, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.draft_max == 0 {
            return Err("the draft length must be at least 1".into());
        }
        if self.draft_min > self.draft_max {
            return Err(format!(
                "the shortest draft ({}) is longer than the longest ({})",
                self.draft_min, self.draft_max
            ));
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max {
            return Err(format!(
                "n-gram sizes {}..={} are not a range of at least 1",
                self.ngram_min, self.ngram_max
            ));
        }
        Ok(())
    }

    /// Guesses for what follows `history` (the slot's tokens, ending in the
    /// token about to be evaluated), at most `room` of them, into `out`:
    /// the tokens after an earlier occurrence of the longest suffix n-gram
    /// that occurs: the most recent one followed by a full draft, else the
    /// earliest (the longest continuation; in a text repeating with a short
    /// period the most recent is followed by only a period's worth). Empty
    /// when nothing matches or fewer than `draft_min` tokens would follow.
    pub fn draft(&self, history: &[u32], room: usize, out: &mut Vec<u32>) {
        out.clear();
        let max = self.draft_max.min(room);
        if max == 0 || max < self.draft_min {
            return;
        }
        let n_hist = history.len();
        for n in (self.ngram_min..=self.ngram_max.min(n_hist.saturating_sub(1))).rev() {
            let suffix = &history[n_hist - n..];
            // Most recent first: the nearest context is the likeliest to
            // be copied on. An occurrence must end before the suffix does,
            // so at least one token follows it.
            let matches = |&start: &usize| &history[start..start + n] == suffix;
            let full = (n_hist - n).saturating_sub(max - 1);
            let found = (0..full)
                .rev()
                .find(matches)
                .or_else(|| (full..n_hist - n).find(matches));
            if let Some(start) = found {
                let from = start + n;
                let take = max.min(n_hist - from);
                if take >= self.draft_min.max(1) {
                    out.extend_from_slice(&history[from..from + take]);
                }
                return;
            }
        }
    }
}

/// Backs a job off guessing while its guesses fail. A draft with nothing
/// accepted halves the next draft's length; one with `a` of its guesses
/// accepted allows `a + 1` next (each rejected guess costs a row of the
/// pass: on Qwen2.5's Q4_K, sampled free writing went from 0.87–0.94× to
/// 0.97–1.04× of plain decoding with this instead of `2a + 2`), and one
/// accepted whole allows twice its length. After [`Throttle::MISSES`] failed drafts in a row, no drafts
/// for a pause that doubles each time (from 4 steps up to 256) and resets
/// when a draft is accepted again. Failing work pays for a few short
/// wasted drafts per pause, a small and shrinking share of its steps.
#[derive(Clone, Debug, Default)]
pub struct Throttle {
    misses: u32,
    pause: u32,
    backoff: u32,
    /// Longest next draft (0: not limited yet).
    limit: usize,
}

impl Throttle {
    /// Drafts that may fail in a row before a pause.
    pub const MISSES: u32 = 2;
    const FIRST_PAUSE: u32 = 4;
    const LONGEST_PAUSE: u32 = 256;

    /// Whether to draft this step (counts a paused step).
    pub fn may_draft(&mut self) -> bool {
        if self.pause > 0 {
            self.pause -= 1;
            return false;
        }
        true
    }

    /// How long the next draft may be, under `draft_max`.
    pub fn limit(&self, draft_max: usize) -> usize {
        match self.limit {
            0 => draft_max,
            l => l.min(draft_max),
        }
    }

    /// A draft's outcome: `accepted` of its `drafted` guesses.
    pub fn record(&mut self, accepted: usize, drafted: usize) {
        if accepted > 0 {
            self.misses = 0;
            self.backoff = 0;
            self.limit = if accepted == drafted {
                2 * drafted
            } else {
                accepted + 1
            };
            return;
        }
        self.limit = (drafted / 2).max(1);
        self.misses += 1;
        if self.misses >= Self::MISSES {
            self.misses = 0;
            self.backoff = if self.backoff == 0 {
                Self::FIRST_PAUSE
            } else {
                (self.backoff * 2).min(Self::LONGEST_PAUSE)
            };
            self.pause = self.backoff;
        }
    }
}

/// Counts of one job's speculation, for its finish and the server's
/// metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Tokens guessed and evaluated.
    pub drafted: usize,
    /// Guesses the sampled tokens matched.
    pub accepted: usize,
    /// Steps that evaluated a draft.
    pub drafts: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(l: &Lookup, h: &[u32], room: usize) -> Vec<u32> {
        let mut out = vec![99];
        l.draft(h, room, &mut out);
        out
    }

    #[test]
    fn the_longest_most_recent_match_is_continued() {
        let l = Lookup::default();
        // Suffix [2, 3]: seen at 1 and at 5. Room for 3: the most recent
        // is followed by 3 tokens, so it wins; room for 8: neither is
        // followed by 8, so the earliest (the longer continuation) wins.
        let h = [1, 2, 3, 4, 5, 2, 3, 9, 2, 3];
        assert_eq!(draft(&l, &h, 3), vec![9, 2, 3]);
        assert_eq!(draft(&l, &h, 8), vec![4, 5, 2, 3, 9, 2, 3]);
        // A short period: the earliest occurrence gives a full draft.
        let h = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3];
        assert_eq!(draft(&l, &h, 8), vec![1, 2, 3, 1, 2, 3]);
        assert_eq!(draft(&l, &h, 3), vec![1, 2, 3]);
        // Suffix [7, 2, 3] occurs earlier: the longer match wins over the
        // more recent shorter one.
        let h = [7, 2, 3, 4, 5, 6, 2, 3, 8, 7, 2, 3];
        assert_eq!(draft(&l, &h, 8), vec![4, 5, 6, 2, 3, 8, 7, 2]);
        // Room and draft_max bound the guess.
        assert_eq!(draft(&l, &h, 3), vec![4, 5, 6]);
        let short = Lookup { draft_max: 2, ..l };
        assert_eq!(draft(&short, &h, 8), vec![4, 5]);
    }

    #[test]
    fn no_match_too_short_or_no_room_gives_nothing() {
        let l = Lookup::default();
        assert_eq!(draft(&l, &[1, 2, 3, 4, 5], 8), Vec::<u32>::new());
        assert_eq!(draft(&l, &[], 8), Vec::<u32>::new());
        assert_eq!(draft(&l, &[1], 8), Vec::<u32>::new());
        assert_eq!(draft(&l, &[1, 2, 1, 2], 0), Vec::<u32>::new());
        // [1, 2] then only [1, 2] follows: two tokens, below draft_min 3.
        let picky = Lookup { draft_min: 3, ..l };
        assert_eq!(draft(&picky, &[1, 2, 1, 2], 8), Vec::<u32>::new());
        assert_eq!(draft(&l, &[1, 2, 1, 2], 8), vec![1, 2]);
        // A single repeated token matches itself with unigrams only.
        let uni = Lookup { ngram_min: 1, ..l };
        assert_eq!(draft(&uni, &[5, 6, 5], 8), vec![6, 5]);
        assert_eq!(draft(&l, &[5, 6, 5], 8), Vec::<u32>::new());
    }

    #[test]
    fn drafts_equal_a_brute_force_search_on_random_histories() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let l = Lookup::default();
        for _ in 0..2000 {
            let len = (next() % 40) as usize;
            let alphabet = 2 + next() % 5;
            let h: Vec<u32> = (0..len).map(|_| (next() % alphabet) as u32).collect();
            let room = (next() % 10) as usize;
            // Brute force: every (n, start), longest n first; the latest
            // start with a full draft after it, else the earliest.
            let mut want = Vec::new();
            let max = l.draft_max.min(room);
            for n in (l.ngram_min..=l.ngram_max).rev() {
                if n + 1 > len || max == 0 {
                    continue;
                }
                let starts: Vec<usize> = (0..len - n)
                    .filter(|&s| h[s..s + n] == h[len - n..])
                    .collect();
                let pick = starts
                    .iter()
                    .rev()
                    .find(|&&s| len - s - n >= max)
                    .or(starts.first());
                if let Some(&start) = pick {
                    let take = max.min(len - start - n);
                    if take >= l.draft_min {
                        want = h[start + n..start + n + take].to_vec();
                    }
                    break;
                }
            }
            assert_eq!(draft(&l, &h, room), want, "history {h:?} room {room}");
        }
    }

    #[test]
    fn failing_drafts_pause_longer_each_time_and_success_resets() {
        let mut t = Throttle::default();
        let paused = |t: &mut Throttle| {
            let mut n = 0;
            while !t.may_draft() {
                n += 1;
            }
            n
        };
        assert_eq!(paused(&mut t), 0);
        t.record(0, 8);
        assert_eq!(paused(&mut t), 0);
        t.record(0, 8);
        assert_eq!(paused(&mut t), 4);
        t.record(0, 8);
        t.record(0, 8);
        assert_eq!(paused(&mut t), 8);
        for _ in 0..20 {
            t.record(0, 8);
            t.record(0, 8);
            paused(&mut t);
        }
        t.record(0, 8);
        t.record(0, 8);
        assert_eq!(paused(&mut t), 256);
        t.record(3, 8);
        t.record(0, 8);
        t.record(0, 8);
        assert_eq!(paused(&mut t), 4);
        // Draft lengths follow the outcomes.
        let mut t = Throttle::default();
        assert_eq!(t.limit(8), 8);
        t.record(0, 8);
        assert_eq!(t.limit(8), 4);
        t.record(1, 4);
        assert_eq!(t.limit(8), 2);
        t.record(0, 2);
        assert_eq!(t.limit(8), 1);
        t.record(1, 1);
        assert_eq!(t.limit(8), 2);
        t.record(2, 2);
        assert_eq!(t.limit(8), 4);
        t.record(3, 4);
        assert_eq!(t.limit(8), 4);
        t.record(7, 8);
        assert_eq!(t.limit(8), 8);
    }

    #[test]
    fn settings_are_checked() {
        assert!(Lookup::default().check().is_ok());
        for bad in [
            Lookup {
                draft_max: 0,
                ..Lookup::default()
            },
            Lookup {
                draft_min: 9,
                ..Lookup::default()
            },
            Lookup {
                ngram_min: 0,
                ..Lookup::default()
            },
            Lookup {
                ngram_min: 5,
                ..Lookup::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
