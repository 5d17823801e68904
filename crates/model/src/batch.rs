//! What a forward call takes and how a state is sized: [`Token`]s (each
//! with its sequence, position and whether its logits are wanted),
//! [`StateOptions`], and the checks every architecture applies to a batch
//! before running it, so all fail the same way.

use crate::kv_cache::KvType;

/// Tokens per forward call when not set: enough that a weight row loaded
/// from memory serves many tokens, few enough that the activations stay in
/// L2. A model larger than the last-level cache streams its weights from
/// DRAM once per call, so 64 reads a 512-token prompt's weights 8 times
/// where 32 read them 16: pp512 +10% on SmolLM2 at one thread; at 128 the
/// FFN's activations (2 × 128 × 1536 floats) spill L2 and one thread
/// slows again.
pub const DEFAULT_BATCH: usize = 64;

/// How a [`crate::State`] is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateOptions {
    /// Positions the KV cache holds.
    pub n_ctx: usize,
    /// Most tokens per forward call.
    pub n_batch: usize,
    pub kv_type: KvType,
    /// Keep logits for every token of a batch ([`Logits::All`]), not just
    /// the last (perplexity needs them; generation does not).
    pub all_logits: bool,
    /// Sequences (server slots), each with its own KV cache of `n_ctx`
    /// positions, that one [`crate::State::forward`] call may mix.
    pub n_seq: usize,
    /// Logits rows kept past one per sequence, for speculative decoding's
    /// guesses (each guess asks for its own row).
    pub draft_rows: usize,
}

impl StateOptions {
    pub fn new(n_ctx: usize) -> StateOptions {
        StateOptions {
            n_ctx,
            n_batch: DEFAULT_BATCH,
            kv_type: KvType::F16,
            all_logits: false,
            n_seq: 1,
            draft_rows: 0,
        }
    }

    /// Rows of logits a call can return.
    pub fn logit_rows(&self) -> usize {
        if self.all_logits {
            self.n_batch.max(1)
        } else {
            (self.n_seq.max(1) + self.draft_rows).min(self.n_batch.max(1))
        }
    }
}

/// One token of a [`crate::State::forward`] batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    pub id: u32,
    /// Which sequence's KV cache it belongs to.
    pub seq: usize,
    /// Its position in that sequence.
    pub pos: usize,
    /// Return the logits that follow it.
    pub logits: bool,
}

/// Which logits a [`crate::State::forward_seq`] call computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// The last token's, `(vocab,)`.
    Last,
    /// Every token's, `(n, vocab)` (needs [`StateOptions::all_logits`]).
    All,
    /// None: a prompt's batches before its last fill the cache only (one
    /// vocabulary-wide product saved per batch).
    None,
}

/// The tokens of one call, token `i` given by a function: a slice of
/// [`Token`]s and one sequence's ids at consecutive positions are both
/// read without building anything.
#[derive(Clone, Copy)]
pub(crate) struct Batch<'a> {
    pub n: usize,
    token: &'a (dyn Fn(usize) -> Token + Sync),
}

impl<'a> Batch<'a> {
    pub fn new(n: usize, token: &'a (dyn Fn(usize) -> Token + Sync)) -> Batch<'a> {
        Batch { n, token }
    }

    pub fn get(&self, i: usize) -> Token {
        (self.token)(i)
    }

    pub fn iter(&self) -> impl Iterator<Item = Token> + '_ {
        (0..self.n).map(|i| self.get(i))
    }
}

/// A state's limits, which a batch must keep within.
pub(crate) struct Limits {
    pub n_batch: usize,
    pub n_seq: usize,
    pub n_ctx: usize,
    pub vocab: usize,
    /// Rows of logits the state can return.
    pub logit_rows: usize,
}

/// Check a batch against a state's limits and collect into `rows` the
/// tokens whose logits are asked for. Panics (callers check first) on an
/// empty or oversized batch, a token outside the vocabulary, a sequence or
/// position out of range, or more logit rows than the state keeps.
pub(crate) fn check_batch(lim: &Limits, batch: &Batch<'_>, rows: &mut Vec<usize>) {
    let (n, n_batch, n_seq, n_ctx) = (batch.n, lim.n_batch, lim.n_seq, lim.n_ctx);
    assert!(
        n >= 1 && n <= n_batch,
        "batch of {n} tokens, the state takes 1..={n_batch}"
    );
    rows.clear();
    for (i, t) in batch.iter().enumerate() {
        assert!(
            (t.id as usize) < lim.vocab,
            "token {} outside the vocabulary of {}",
            t.id,
            lim.vocab
        );
        assert!(t.seq < n_seq, "sequence {} of {n_seq}", t.seq);
        assert!(
            t.pos < n_ctx,
            "position {} outside the context of {n_ctx}",
            t.pos
        );
        if t.logits {
            rows.push(i);
        }
    }
    assert!(
        rows.len() <= lim.logit_rows,
        "{} rows of logits asked of a state that keeps {} (all_logits / n_seq)",
        rows.len(),
        lim.logit_rows
    );
}
