//! The real [`Backend`]: the model's multi-sequence forward pass
//! ([`model::forward_tokens`]) over one [`State`] holding a KV cache per
//! slot, on the engine thread's own kernel thread pool.

use kernels::pool::ThreadPool;
use model::{forward_tokens, ModelConfig, State, Token, Weights};
use tokenize::Vocab;

use crate::scheduler::Backend;

pub struct ModelBackend<'a> {
    cfg: &'a ModelConfig,
    weights: Weights<'a>,
    state: State,
    pool: ThreadPool,
    vocab: &'a Vocab,
}

impl<'a> ModelBackend<'a> {
    pub fn new(
        cfg: &'a ModelConfig,
        weights: Weights<'a>,
        state: State,
        pool: ThreadPool,
        vocab: &'a Vocab,
    ) -> ModelBackend<'a> {
        ModelBackend {
            cfg,
            weights,
            state,
            pool,
            vocab,
        }
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

    fn eval(&mut self, batch: &[Token]) {
        forward_tokens(self.cfg, &self.weights, &mut self.state, &self.pool, batch);
    }

    fn logits(&self) -> &[f32] {
        self.state.logits()
    }

    fn piece(&self, token: u32) -> &[u8] {
        self.vocab.token_to_piece(token, false)
    }
}
