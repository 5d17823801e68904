//! The interface between [`crate::State`] and an architecture's own state
//! ([`Pass`]), and what every architecture's state keeps alike
//! ([`Outputs`]: logits, captured keys and queries, where to stop).

use crate::batch::{Batch, Limits, StateOptions};
use crate::capture::Capture;
use crate::config::ModelConfig;
use crate::kv_cache::KvType;
use crate::Error;
use kernels::pool::ThreadPool;

/// An architecture's state: its caches and buffers, paired with the
/// weights it was made for.
pub(crate) trait Pass {
    /// Run a batch and return the logits of its tokens that asked for
    /// them, `(rows, vocab)` (none when the state stops before the head).
    /// Panics as [`crate::State::forward`] documents.
    fn forward(&mut self, pool: &ThreadPool, batch: Batch<'_>) -> &[f32];
    fn outputs(&self) -> &Outputs;
    fn outputs_mut(&mut self) -> &mut Outputs;
    fn n_ctx(&self) -> usize;
    fn n_batch(&self) -> usize;
    fn n_seq(&self) -> usize;
    fn kv_type(&self) -> KvType;
    /// Bytes of the per-sequence caches.
    fn kv_bytes(&self) -> usize;
    /// Capture these layers' pre-RoPE keys and queries from the next call
    /// on; errors if one has none.
    fn capture(&mut self, layers: &[usize]) -> Result<(), Error>;
    /// Copy sequence `src`'s cached `positions` into sequence `dst`.
    fn copy_seq(&mut self, src: usize, dst: usize, positions: std::ops::Range<usize>);
}

/// What a call leaves besides the caches, and how far it goes.
pub(crate) struct Outputs {
    pub logits: Vec<f32>, // (logit rows, vocab)
    /// Floats of `logits` the last call filled.
    pub n_logits: usize,
    /// Tokens of the last call whose logits were asked for.
    pub rows: Vec<usize>,
    pub capture: Capture,
    /// Evaluate layers `0..=last` only and skip the output head.
    last_layer: Option<usize>,
    n_layers: usize,
    vocab: usize,
    /// The head stops at the final norm: rows asked for logits get their
    /// normed hidden state in `embd` instead (for embeddings).
    pub embeddings: bool,
    pub embd: Vec<f32>, // (logit rows, dim)
    /// Floats of `embd` the last call filled.
    pub n_embd: usize,
    embd_rows: usize,
}

impl Outputs {
    pub fn new(cfg: &ModelConfig, o: &StateOptions) -> Outputs {
        let nb = o.n_batch.max(1);
        Outputs {
            logits: vec![0.0; o.logit_rows() * cfg.vocab_size],
            n_logits: 0,
            rows: Vec::with_capacity(nb),
            capture: Capture::new(cfg.n_layers, nb, cfg.q_dim(), cfg.kv_dim()),
            last_layer: None,
            n_layers: cfg.n_layers,
            vocab: cfg.vocab_size,
            embeddings: false,
            embd: Vec::new(),
            n_embd: 0,
            embd_rows: 0,
        }
    }

    /// Switch the head to hidden states (`dim` floats per row, for every
    /// token of a batch of `n_batch` if they all ask) or back.
    pub fn set_embeddings(&mut self, on: bool, dim: usize, n_batch: usize) {
        self.embeddings = on;
        if on && self.embd.len() < n_batch * dim {
            self.embd = vec![0.0; n_batch * dim];
            self.embd_rows = n_batch;
        }
    }

    pub fn logits(&self) -> &[f32] {
        &self.logits[..self.n_logits]
    }

    pub fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits[..self.n_logits]
    }

    /// The last layer a call evaluates.
    pub fn last_layer(&self) -> usize {
        self.last_layer.unwrap_or(self.n_layers - 1)
    }

    /// Whether a call ends with the output head.
    pub fn head(&self) -> bool {
        self.last_layer.is_none()
    }

    pub fn set_last_layer(&mut self, last: Option<usize>) -> Result<(), Error> {
        if let Some(l) = last.filter(|&l| l >= self.n_layers) {
            return Err(Error::Layer {
                layer: l,
                problem: format!("the model has {} layers", self.n_layers),
            });
        }
        self.last_layer = last;
        Ok(())
    }

    /// Rows of logits a call may ask for (without the head, none are
    /// kept: [`usize::MAX`] as in [`Outputs::limits`]).
    pub fn logit_rows(&self) -> usize {
        self.limits(0, 0, 0).logit_rows
    }

    /// A state's limits for [`crate::batch::check_batch`]: without the
    /// head, any token may ask for logits (it gets none).
    pub fn limits(&self, n_batch: usize, n_seq: usize, n_ctx: usize) -> Limits {
        Limits {
            n_batch,
            n_seq,
            n_ctx,
            vocab: self.vocab,
            logit_rows: if !self.head() {
                usize::MAX
            } else if self.embeddings {
                self.embd_rows
            } else {
                self.logits.len() / self.vocab.max(1)
            },
        }
    }

    /// A call of `n` tokens begins: no logits yet, captures sized to it.
    pub fn begin(&mut self, n: usize) {
        self.n_logits = 0;
        self.n_embd = 0;
        let last = self.last_layer();
        self.capture.begin(n, last);
    }
}

/// Elements `a` (shared) and `b` (mutable) of `v`, which must differ.
pub(crate) fn two_mut<T>(v: &mut [T], a: usize, b: usize) -> (&T, &mut T) {
    assert_ne!(a, b, "two_mut of one element");
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        (&lo[a], &mut hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(a);
        (&hi[0], &mut lo[b])
    }
}
