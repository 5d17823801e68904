//! What the scheduler needs from a model ([`Backend`]), and the real one
//! ([`ModelBackend`]): the model's multi-sequence forward pass over one
//! state holding a KV cache per slot, on the caller's kernel thread pools
//! (one for decode-only steps, and one for steps that read prompts when
//! `--threads-batch` asks for another thread count).

use kernels::pool::ThreadPool;
use model::{Model, ModelConfig, State, Token};
use tokenize::Vocab;

use crate::draft::DraftModel;
use crate::memory::encoder::{EncoderState, LentEncoder};
use crate::memory::{KeyEncoder, MemoryError};

/// What long memory needs from a backend: the model's keys for text
/// (its own state, not a slot's) and the vocabulary.
pub struct MemoryHost<'a> {
    pub encoder: Box<dyn KeyEncoder + 'a>,
    pub vocab: &'a Vocab,
}

/// Batched evaluation over per-slot KV caches, and the bytes each token
/// stands for.
pub trait Backend {
    /// Sequences (slots), each with its own cache.
    fn n_slots(&self) -> usize;
    /// Positions each slot's cache holds.
    fn n_ctx(&self) -> usize;
    /// Most tokens per [`Backend::eval`]; at least [`Backend::n_slots`].
    fn n_batch(&self) -> usize;
    fn n_vocab(&self) -> usize;
    /// Most tokens of one [`Backend::eval`] that may ask for logits: past
    /// one per slot, the room for speculation's guesses.
    fn logit_rows(&self) -> usize {
        self.n_batch()
    }
    /// Evaluate `batch`: afterwards [`Backend::logits`] holds one
    /// `(n_vocab,)` row per token with `logits` set, in order.
    fn eval(&mut self, batch: &[Token]);
    /// The rows of the last [`Backend::eval`].
    fn logits(&self) -> &[f32];
    /// The bytes `token` prints as (nothing for control tokens).
    fn piece(&self, token: u32) -> &[u8];
    /// The tokens that end a generation (EOS, EOT, ...).
    fn eog_tokens(&self) -> &[u32];
    /// Whether [`Backend::copy_seq`] works. Without it, each choice of a
    /// request ([`crate::Scheduler::submit_choices`]) reads the prompt
    /// itself.
    fn can_copy_seq(&self) -> bool {
        false
    }
    /// Copy what slot `src` caches at `positions` into slot `dst` (the
    /// same as evaluating those tokens there). Called only when
    /// [`Backend::can_copy_seq`].
    fn copy_seq(&mut self, src: usize, dst: usize, positions: std::ops::Range<usize>) {
        let _ = (src, dst, positions);
        panic!("this backend cannot copy a slot's cache");
    }
    /// Whether [`Backend::draft`] has a draft model to ask.
    fn has_draft_model(&self) -> bool {
        false
    }
    /// The draft model's guesses for slot `seq` after `history` (ending
    /// with the token evaluated next), at most `max`, each at least `p_min`
    /// likely to the draft ([`crate::draft::DraftModel::draft`]); none
    /// without a draft model.
    fn draft(&mut self, seq: usize, history: &[u32], max: usize, p_min: f32, out: &mut Vec<u32>) {
        let _ = (seq, history, max, p_min);
        out.clear();
    }
    /// Long memory's access to the model, for backends that have one.
    fn memory_host(&mut self) -> Result<MemoryHost<'_>, MemoryError> {
        Err(MemoryError::Model(
            "this backend has no long-memory support".into(),
        ))
    }
}

pub struct ModelBackend<'a> {
    cfg: &'a ModelConfig,
    model: &'a Model<'a>,
    state: State<'a>,
    /// Made on the first memory job.
    encoder: Option<EncoderState<'a>>,
    pool: ThreadPool,
    batch_pool: Option<ThreadPool>,
    vocab: &'a Vocab,
    /// Guesses for speculative decoding (`-md`), on the decode pool.
    draft: Option<DraftModel<'a>>,
}

impl<'a> ModelBackend<'a> {
    /// `batch_pool`, when given, runs the passes that read prompt tokens.
    pub fn new(
        cfg: &'a ModelConfig,
        model: &'a Model<'a>,
        state: State<'a>,
        pool: ThreadPool,
        batch_pool: Option<ThreadPool>,
        vocab: &'a Vocab,
    ) -> ModelBackend<'a> {
        ModelBackend {
            cfg,
            model,
            state,
            encoder: None,
            pool,
            batch_pool,
            vocab,
            draft: None,
        }
    }

    /// Draft guesses with `draft` (its vocabulary checked against the
    /// model's with [`crate::draft::check_vocab`]).
    pub fn with_draft(mut self, draft: DraftModel<'a>) -> ModelBackend<'a> {
        self.draft = Some(draft);
        self
    }

    /// The draft model's passes so far (0 without one).
    pub fn draft_passes(&self) -> u64 {
        self.draft.as_ref().map_or(0, DraftModel::passes)
    }

    pub fn state(&self) -> &State<'a> {
        &self.state
    }
}

impl Backend for ModelBackend<'_> {
    fn n_slots(&self) -> usize {
        self.state.n_seq()
    }

    fn n_ctx(&self) -> usize {
        self.state.n_ctx()
    }

    fn n_batch(&self) -> usize {
        self.state.n_batch()
    }

    fn n_vocab(&self) -> usize {
        self.cfg.vocab_size
    }

    fn logit_rows(&self) -> usize {
        self.state.logit_rows()
    }

    fn eval(&mut self, batch: &[Token]) {
        // Prompt tokens other than a prompt's last ask for no logits;
        // decode tokens always do.
        let pool = match &self.batch_pool {
            Some(p) if batch.iter().any(|t| !t.logits) => p,
            _ => &self.pool,
        };
        self.state.forward(pool, batch);
    }

    fn logits(&self) -> &[f32] {
        self.state.logits()
    }

    fn piece(&self, token: u32) -> &[u8] {
        self.vocab.token_to_piece(token, false)
    }

    fn eog_tokens(&self) -> &[u32] {
        self.vocab.eog_tokens()
    }

    fn can_copy_seq(&self) -> bool {
        true
    }

    fn copy_seq(&mut self, src: usize, dst: usize, positions: std::ops::Range<usize>) {
        if let Some(d) = &mut self.draft {
            d.copy_seq(src, dst, positions.clone());
        }
        self.state.copy_seq(src, dst, positions);
    }

    fn has_draft_model(&self) -> bool {
        self.draft.is_some()
    }

    fn draft(&mut self, seq: usize, history: &[u32], max: usize, p_min: f32, out: &mut Vec<u32>) {
        match &mut self.draft {
            Some(d) => d.draft(
                &self.pool,
                seq,
                history,
                max,
                p_min,
                self.vocab.eog_tokens(),
                out,
            ),
            None => out.clear(),
        }
    }

    fn memory_host(&mut self) -> Result<MemoryHost<'_>, MemoryError> {
        if self.encoder.is_none() {
            self.encoder = Some(EncoderState::new(self.model)?);
        }
        let core = self.encoder.as_mut().expect("made above");
        Ok(MemoryHost {
            encoder: Box::new(LentEncoder {
                core,
                pool: &self.pool,
            }),
            vocab: self.vocab,
        })
    }
}
