//! Speculative decoding with a draft model (`-md`): a second, smaller model
//! with the target's vocabulary guesses the next tokens greedily, one
//! token per pass of its own; the target checks them all in one pass.
//!
//! The draft's guesses are its argmax tokens, so a draft is deterministic
//! (one-hot) given the text, and the scheduler verifies it exactly as it
//! verifies prompt lookup's guesses (see [`crate::speculate`]): the target
//! samples each row as usual and keeps a guess while it equals the token
//! drawn. For a one-hot draft that is the speculative-sampling acceptance
//! rule (accept `x` with probability `min(1, p(x)/q(x)) = p(x)`, else draw
//! from `max(0, p − q)` normalized, which is `p` without `x`), so output is
//! exactly what the target alone gives, greedy or sampled, with the same
//! seed. A sampled draft would accept more often when sampling at a high
//! temperature, at the cost of that exactness; llama.cpp drafts greedily
//! too.
//!
//! The draft model keeps its own KV cache per slot, and remembers which
//! tokens it holds at positions `0..`: before drafting it evaluates only
//! what differs from the slot's tokens (the prompt the first time, then the
//! accepted tokens), so rejected guesses need no rollback (their positions
//! are overwritten, and attention reads only positions up to a token's
//! own), and a slot reused for another prompt shares its cached prefix.

use kernels::pool::ThreadPool;
use model::{Model, State, StateOptions, Token};
use tokenize::Vocab;

/// Settings of a job's draft-model guesses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelDraft {
    /// Most tokens guessed per step (`--draft-max`).
    pub draft_max: usize,
    /// Fewer guesses than this: none this step (`--draft-min`).
    pub draft_min: usize,
    /// Stop drafting at a token the draft gives less probability than
    /// this (`--draft-p-min`): a guess it doubts is likely rejected, and
    /// costs the target a row and the draft a pass.
    pub p_min: f32,
}

impl Default for ModelDraft {
    fn default() -> ModelDraft {
        ModelDraft {
            draft_max: 8,
            draft_min: 1,
            p_min: 0.5,
        }
    }
}

impl ModelDraft {
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
        if !(0.0..=1.0).contains(&self.p_min) {
            return Err(format!(
                "the least draft probability {} is not in 0..=1",
                self.p_min
            ));
        }
        Ok(())
    }
}

/// Why a model cannot draft for another: the first difference between
/// their vocabularies (token ids must mean the same text, or guesses are
/// nonsense to the target).
pub fn check_vocab(target: &Vocab, draft: &Vocab) -> Result<(), String> {
    if target.len() != draft.len() {
        return Err(format!(
            "the draft model has {} tokens and the model {}: a draft model needs the same vocabulary",
            draft.len(),
            target.len()
        ));
    }
    for id in 0..target.len() as u32 {
        let (t, d) = (target.token_text(id), draft.token_text(id));
        if t != d {
            return Err(format!(
                "token {id} is {:?} in the model and {:?} in the draft model: a draft model needs the same vocabulary",
                t.unwrap_or(""),
                d.unwrap_or("")
            ));
        }
    }
    Ok(())
}

/// A draft model's state beside the target's: one KV cache per slot.
pub struct DraftModel<'a> {
    state: State<'a>,
    /// Per slot: the tokens its cache holds, at positions `0..len`.
    cached: Vec<Vec<u32>>,
    batch: Vec<Token>,
    n_vocab: usize,
    /// Draft passes run (the catch-up of new tokens and one per guess).
    passes: u64,
}

impl<'a> DraftModel<'a> {
    /// A state for `model` with `opts` (the target's slots and context;
    /// logits for one token per pass); [`check_vocab`] should have passed.
    pub fn new(model: &'a Model<'a>, opts: &StateOptions) -> Result<DraftModel<'a>, model::Error> {
        let opts = StateOptions {
            all_logits: false,
            draft_rows: 0,
            ..*opts
        };
        let state = model.new_state(&opts)?;
        Ok(DraftModel {
            cached: vec![Vec::new(); state.n_seq()],
            n_vocab: model.config().vocab_size,
            batch: Vec::with_capacity(state.n_batch()),
            state,
            passes: 0,
        })
    }

    /// Passes the draft model has run.
    pub fn passes(&self) -> u64 {
        self.passes
    }

    /// Forget what slot `seq` caches (its target cache was overwritten
    /// other than by evaluation).
    pub fn forget(&mut self, seq: usize) {
        if let Some(c) = self.cached.get_mut(seq) {
            c.clear();
        }
    }

    /// Guesses for slot `seq` after `history` (its tokens, ending with the
    /// one the target evaluates next), into `out`: the draft's most likely
    /// token, then the next given it, …, at most `max`, stopping before a
    /// token whose probability is under `p_min`, at the end of the
    /// context, or at an end-of-generation token in `eog`.
    #[allow(clippy::too_many_arguments)]
    pub fn draft(
        &mut self,
        pool: &ThreadPool,
        seq: usize,
        history: &[u32],
        max: usize,
        p_min: f32,
        eog: &[u32],
        out: &mut Vec<u32>,
    ) {
        out.clear();
        let n_ctx = self.state.n_ctx();
        if history.is_empty() || max == 0 || seq >= self.cached.len() {
            return;
        }
        let max = max.min(n_ctx.saturating_sub(history.len()));
        if max == 0 {
            return;
        }
        // Evaluate what the cache lacks, the last token always (its
        // logits are the first guess's).
        let cached = &mut self.cached[seq];
        let common = cached
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(history.len() - 1);
        cached.truncate(common);
        let n_batch = self.state.n_batch();
        let mut from = common;
        while from < history.len() {
            let to = history.len().min(from + n_batch);
            self.batch.clear();
            self.batch.extend((from..to).map(|pos| Token {
                id: history[pos],
                seq,
                pos,
                logits: pos + 1 == history.len(),
            }));
            self.state.forward(pool, &self.batch);
            self.passes += 1;
            from = to;
        }
        cached.extend_from_slice(&history[common..]);
        loop {
            let (token, p) = most_likely(&self.state.logits()[..self.n_vocab]);
            if p < p_min || eog.contains(&token) {
                return;
            }
            out.push(token);
            if out.len() == max {
                return;
            }
            let pos = cached.len();
            self.batch.clear();
            self.batch.push(Token {
                id: token,
                seq,
                pos,
                logits: true,
            });
            self.state.forward(pool, &self.batch);
            self.passes += 1;
            cached.push(token);
        }
    }

    /// Copy slot `src`'s cached `positions` into `dst`, as the target did.
    pub fn copy_seq(&mut self, src: usize, dst: usize, positions: std::ops::Range<usize>) {
        if positions.start != 0 || positions.end > self.cached[src].len() {
            // The draft never evaluated all of them: it catches up later.
            self.forget(dst);
            return;
        }
        self.state.copy_seq(src, dst, positions.clone());
        self.cached[dst] = self.cached[src][..positions.end].to_vec();
    }
}

/// The argmax of a logits row (the first of equal ones) and its softmax
/// probability.
pub fn most_likely(row: &[f32]) -> (u32, f32) {
    let (mut best, mut max) = (0usize, f32::NEG_INFINITY);
    for (i, &l) in row.iter().enumerate() {
        if l > max {
            (best, max) = (i, l);
        }
    }
    if !max.is_finite() {
        return (best as u32, 0.0);
    }
    // f32 lanes and the kernels' polynomial exp: an f64 `exp` per entry
    // cost ~1 ms a guess over SmolLM2's 49,152 logits, more than the draft
    // model's whole forward pass.
    let mut lanes = [0.0f32; 16];
    let mut chunks = row.chunks_exact(16);
    for c in &mut chunks {
        for (a, &l) in lanes.iter_mut().zip(c) {
            *a += kernels::vecops::exp(l - max);
        }
    }
    let tail: f32 = chunks
        .remainder()
        .iter()
        .map(|&l| kernels::vecops::exp(l - max))
        .sum();
    let sum = lanes.iter().sum::<f32>() + tail;
    (best as u32, 1.0 / sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_likely_is_the_first_max_with_its_softmax() {
        let (t, p) = most_likely(&[0.0, 2.0, 2.0, -1.0]);
        assert_eq!(t, 1);
        let e = [(-2.0f64).exp(), 1.0, 1.0, (-3.0f64).exp()];
        let want = 1.0 / e.iter().sum::<f64>();
        assert!((f64::from(p) - want).abs() < 1e-6, "{p} vs {want}");
        let (t, p) = most_likely(&[5.0]);
        assert_eq!((t, p), (0, 1.0));
        assert_eq!(most_likely(&[f32::NEG_INFINITY; 3]).1, 0.0);
        // A vocabulary-sized row with a tail past the 16 lanes, against f64.
        let row: Vec<f32> = (0..49_157)
            .map(|i| ((i * 7919) % 1000) as f32 / 97.0)
            .collect();
        let (t, p) = most_likely(&row);
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(row[t as usize], max);
        assert_eq!(row.iter().position(|&l| l == max), Some(t as usize));
        let want = 1.0 / row.iter().map(|&l| f64::from(l - max).exp()).sum::<f64>();
        assert!((f64::from(p) / want - 1.0).abs() < 1e-4, "{p} vs {want}");
    }

    #[test]
    fn settings_are_checked() {
        assert!(ModelDraft::default().check().is_ok());
        let bad = |f: fn(&mut ModelDraft)| {
            let mut d = ModelDraft::default();
            f(&mut d);
            d.check().is_err()
        };
        assert!(bad(|d| d.draft_max = 0));
        assert!(bad(|d| d.draft_min = 9));
        assert!(bad(|d| d.p_min = 1.5));
        assert!(bad(|d| d.p_min = f32::NAN));
    }
}
