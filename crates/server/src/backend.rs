//! The real [`Backend`]: the model's multi-sequence forward pass
//! ([`State::forward`]) over one [`State`] holding a KV cache per
//! slot, on the engine thread's own kernel thread pools (one for
//! decode-only steps, and one for steps that read prompts when
//! `--threads-batch` asks for another thread count).

use kernels::pool::ThreadPool;
use model::{ModelConfig, State, Token};
use tokenize::Vocab;

use crate::scheduler::Backend;

pub struct ModelBackend<'a> {
    cfg: &'a ModelConfig,
    state: State<'a>,
    pool: ThreadPool,
    batch_pool: Option<ThreadPool>,
    vocab: &'a Vocab,
}

impl<'a> ModelBackend<'a> {
    pub fn new(
        cfg: &'a ModelConfig,
        state: State<'a>,
        pool: ThreadPool,
        batch_pool: Option<ThreadPool>,
        vocab: &'a Vocab,
    ) -> ModelBackend<'a> {
        ModelBackend {
            cfg,
            state,
            pool,
            batch_pool,
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
}
