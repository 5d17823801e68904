//! Running one test: the token ids, the untimed depth fill, the warm-up
//! and the timed repetitions, with the time of each decode step kept for
//! the per-token percentiles.

use kernels::pool::ThreadPool;
use model::{Logits, State};
use std::hint::black_box;
use std::time::Instant;

/// One llama-bench test: `n_prompt` tokens in batches, then `n_gen`
/// decodes, after `n_depth` positions filled untimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Test {
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_depth: usize,
}

impl Test {
    /// "pp512", "tg128", "pp512+tg128", with " @ d4096" for a depth.
    pub fn name(&self) -> String {
        let mut s = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, n) => format!("tg{n}"),
            (p, n) => format!("pp{p}+tg{n}"),
        };
        if self.n_depth > 0 {
            s += &format!(" @ d{}", self.n_depth);
        }
        s
    }

    /// Tokens a repetition evaluates (t/s counts these).
    pub fn n_tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }

    /// The context the test fills exactly.
    pub fn n_ctx(&self) -> usize {
        self.n_depth + self.n_prompt + self.n_gen
    }
}

/// Random token ids (a fixed-seed xorshift, so every run reads the same
/// rows of the embedding): the depth fill, the prompt, the decode inputs.
pub struct Tokens {
    pub depth: Vec<u32>,
    pub prompt: Vec<u32>,
    pub gen: Vec<u32>,
}

impl Tokens {
    pub fn random(test: &Test, vocab: usize, seed: u64) -> Tokens {
        let mut x = seed | 1;
        let mut next = |n: usize| -> Vec<u32> {
            (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % vocab.max(1) as u64) as u32
                })
                .collect()
        };
        Tokens {
            depth: next(test.n_depth),
            prompt: next(test.n_prompt),
            gen: next(test.n_gen),
        }
    }
}

/// What repetitions measured: whole-repetition times, the prompt time of
/// each (time to first token) and every decode step's time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Runs {
    pub samples_ns: Vec<u64>,
    pub ttft_ns: Vec<u64>,
    pub tpot_ns: Vec<u64>,
}

/// A pool and how to run a test on it (the state holds the model).
pub struct Bench<'a> {
    pub pool: &'a ThreadPool,
    /// Tokens per forward pass (at most the state's).
    pub n_batch: usize,
    pub reps: usize,
}

/// Fill positions `0..n_depth` (untimed). Repetitions write only the
/// positions after them, so one fill serves every repetition: the cache
/// holds the same entries as llama-bench's refill before each one.
pub fn fill_depth(b: &Bench, state: &mut State<'_>, tokens: &Tokens) {
    prompt(b, state, &tokens.depth, 0);
}

fn prompt(b: &Bench, state: &mut State<'_>, tokens: &[u32], pos0: usize) {
    let n_batch = b.n_batch.min(state.n_batch()).max(1);
    let n_chunks = tokens.len().div_ceil(n_batch);
    for (i, chunk) in tokens.chunks(n_batch).enumerate() {
        // The prompt's last token's logits, as llama-bench's one call asks for.
        let which = if i + 1 == n_chunks {
            Logits::Last
        } else {
            Logits::None
        };
        let logits = state.forward_seq(b.pool, chunk, pos0 + i * n_batch, which);
        black_box(logits);
    }
}

impl Bench<'_> {
    /// One warm-up (the whole prompt and one decode step, as llama-bench
    /// does), then `reps` timed repetitions.
    pub fn measure(&self, state: &mut State<'_>, test: &Test, tokens: &Tokens) -> Runs {
        let pos0 = test.n_depth;
        prompt(self, state, &tokens.prompt, pos0);
        if let Some(&t) = tokens.gen.first() {
            black_box(state.forward_seq(self.pool, &[t], pos0 + test.n_prompt, Logits::Last));
        }
        let mut runs = Runs::default();
        for _ in 0..self.reps {
            let start = Instant::now();
            prompt(self, state, &tokens.prompt, pos0);
            if test.n_prompt > 0 {
                runs.ttft_ns.push(ns(start));
            }
            for (i, &t) in tokens.gen.iter().enumerate() {
                let pos = pos0 + test.n_prompt + i;
                let step = Instant::now();
                black_box(state.forward_seq(self.pool, &[t], pos, Logits::Last));
                runs.tpot_ns.push(ns(step));
            }
            runs.samples_ns.push(ns(start).max(1));
        }
        runs
    }
}

fn ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Mean of `v` (0 when empty).
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Sample standard deviation (n − 1), 0 for fewer than two values, as
/// llama-bench reports it.
pub fn stddev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// The `p`-th percentile (0..=100) by nearest rank; `None` when empty.
pub fn percentile(v: &[u64], p: f64) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_bench() {
        let t = |p, n, d| Test {
            n_prompt: p,
            n_gen: n,
            n_depth: d,
        };
        assert_eq!(t(512, 0, 0).name(), "pp512");
        assert_eq!(t(0, 128, 0).name(), "tg128");
        assert_eq!(t(65, 959, 0).name(), "pp65+tg959");
        assert_eq!(t(0, 32, 4096).name(), "tg32 @ d4096");
        assert_eq!(t(65, 959, 10).n_ctx(), 1034);
    }

    #[test]
    fn stats() {
        assert_eq!(mean(&[]), 0.0);
        assert_eq!(stddev(&[5.0]), 0.0);
        assert!((stddev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]) - 2.138).abs() < 1e-3);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&[7, 3], 99.0), Some(7));
        assert_eq!(percentile(&[7], 50.0), Some(7));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn tokens_are_in_the_vocabulary_and_repeatable() {
        let t = Test {
            n_prompt: 100,
            n_gen: 10,
            n_depth: 5,
        };
        let a = Tokens::random(&t, 50, 1);
        assert_eq!((a.depth.len(), a.prompt.len(), a.gen.len()), (5, 100, 10));
        assert!(a.prompt.iter().all(|&x| x < 50));
        assert_eq!(Tokens::random(&t, 50, 1).prompt, a.prompt);
    }
}
