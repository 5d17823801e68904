//! Pre-RoPE keys (and queries) of a stream of tokens, for memory codes:
//! the model run over the history in a sliding window, stopping after the
//! deepest layer a code needs (no later layers, no output head).
//!
//! The window: tokens are read in chunks at consecutive positions of the
//! encoder's own one-sequence state; when the next chunk would not fit,
//! the last [`OVERLAP`] tokens are read again from position 0 and the
//! stream continues after them. So every token is seen after at least
//! `OVERLAP` tokens of what came before it (or all of it), and the cost is
//! about `n_ctx / (n_ctx − OVERLAP)` passes per token. A caller that goes
//! on where it stopped (ingesting a document, appending turns) pays no
//! warm-up; one that jumps pays one window.

use kernels::pool::ThreadPool;
use model::{Logits, Model, State, StateOptions};

use crate::memory::layout::HeadShape;
use crate::memory::MemoryError;

/// Positions of the encoder's window.
pub const WINDOW: usize = 2048;
/// Tokens read again after a slide: the least context any token is
/// encoded with.
pub const OVERLAP: usize = 512;
/// Tokens per forward pass.
const CHUNK: usize = 256;

/// Captured rows for a run of tokens, per captured layer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Encoded {
    /// Tokens encoded.
    pub n: usize,
    /// Per layer (in the order asked): `(n, kv_dim)` pre-RoPE keys.
    pub keys: Vec<Vec<f32>>,
    /// Per layer: `(n, q_dim)` pre-RoPE queries (empty unless asked for).
    pub queries: Vec<Vec<f32>>,
}

/// Keys and queries of token runs, from some model. The real one is
/// [`ModelEncoder`]; tests use fakes.
pub trait KeyEncoder {
    fn shape(&self) -> HeadShape;
    /// Layers whose keys can be slots (the model's attention layers).
    fn attention_layers(&self) -> Vec<usize>;
    /// The keys (and with `queries`, the queries) at `layers` of `tokens`
    /// read after `context` (the history before them; only its end may be
    /// used).
    fn encode(
        &mut self,
        layers: &[usize],
        context: &[u32],
        tokens: &[u32],
        queries: bool,
    ) -> Result<Encoded, MemoryError>;
}

/// The model run for keys: a one-sequence state of its own, on a pool the
/// caller lends each call (a scheduler's backend uses its own pools).
pub struct EncoderState<'m> {
    model: &'m Model<'m>,
    state: State<'m>,
    /// Layers captured now (the deepest is the last one run).
    layers: Vec<usize>,
    /// The tokens in the state's cache, at positions `0..len`.
    held: Vec<u32>,
}

impl<'m> EncoderState<'m> {
    pub fn new(model: &'m Model<'m>) -> Result<EncoderState<'m>, MemoryError> {
        let n_ctx = WINDOW.min(model.config().context_length);
        if n_ctx <= OVERLAP + CHUNK {
            return Err(MemoryError::Model(format!(
                "a context of {n_ctx} tokens is too short for the memory encoder"
            )));
        }
        let opts = StateOptions {
            n_batch: CHUNK,
            ..StateOptions::new(n_ctx)
        };
        let state = model
            .new_state(&opts)
            .map_err(|e| MemoryError::Model(e.to_string()))?;
        Ok(EncoderState {
            model,
            state,
            layers: Vec::new(),
            held: Vec::new(),
        })
    }

    pub fn shape(&self) -> HeadShape {
        let c = self.model.config();
        HeadShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        }
    }

    pub fn attention_layers(&self) -> Vec<usize> {
        match &self.model.config().cachefit {
            Some(cf) => cf
                .blocks
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == model::BlockKind::Attn)
                .map(|(i, _)| i)
                .collect(),
            None => (0..self.model.config().n_layers).collect(),
        }
    }

    fn set_layers(&mut self, layers: &[usize]) -> Result<(), MemoryError> {
        if self.layers == layers {
            return Ok(());
        }
        let model_err = |e: model::Error| MemoryError::Model(e.to_string());
        self.state.capture(layers).map_err(model_err)?;
        let deepest = layers.iter().copied().max();
        self.state.set_last_layer(deepest).map_err(model_err)?;
        // The cache's deeper layers may be unwritten: start over.
        self.held.clear();
        self.layers = layers.to_vec();
        Ok(())
    }

    /// Read `tokens` at positions `held.len()..`, appending their captured
    /// rows to `out` when given.
    fn read(&mut self, pool: &ThreadPool, tokens: &[u32], mut out: Option<(&mut Encoded, bool)>) {
        for chunk in tokens.chunks(CHUNK) {
            if self.held.len() + chunk.len() > self.state.n_ctx() {
                // Slide: the last OVERLAP tokens again, from position 0.
                let keep = self.held[self.held.len() - OVERLAP..].to_vec();
                self.held.clear();
                self.read(pool, &keep, None);
            }
            let pos0 = self.held.len();
            self.state.forward_seq(pool, chunk, pos0, Logits::Last);
            self.held.extend_from_slice(chunk);
            if let Some((enc, queries)) = out.as_mut() {
                for i in 0..self.layers.len() {
                    enc.keys[i].extend_from_slice(self.state.captured_keys(i));
                    if *queries {
                        enc.queries[i].extend_from_slice(self.state.captured_queries(i));
                    }
                }
                enc.n += chunk.len();
            }
        }
    }

    /// [`KeyEncoder::encode`] on `pool`.
    pub fn encode(
        &mut self,
        pool: &ThreadPool,
        layers: &[usize],
        context: &[u32],
        tokens: &[u32],
        queries: bool,
    ) -> Result<Encoded, MemoryError> {
        let vocab = self.model.config().vocab_size;
        if let Some(&t) = context.iter().chain(tokens).find(|&&t| t as usize >= vocab) {
            return Err(MemoryError::Model(format!(
                "token {t} is outside the model's vocabulary of {vocab}"
            )));
        }
        self.set_layers(layers)?;
        // Go on where the last call stopped if its tokens end the context
        // (with enough of it, or all); otherwise read the context's end.
        let held = self.held.len();
        let continues = held <= context.len()
            && context[context.len() - held..] == self.held[..]
            && held >= OVERLAP.min(context.len());
        if !continues {
            self.held.clear();
            let from = context.len().saturating_sub(OVERLAP);
            let tail = context[from..].to_vec();
            self.read(pool, &tail, None);
        }
        let kv_dim = self.shape().kv_dim();
        let mut enc = Encoded {
            n: 0,
            keys: vec![Vec::with_capacity(tokens.len() * kv_dim); layers.len()],
            queries: vec![Vec::new(); layers.len()],
        };
        self.read(pool, tokens, Some((&mut enc, queries)));
        Ok(enc)
    }
}

/// [`KeyEncoder`] over a model, with a state and a thread pool of its own
/// (`memory ingest`).
pub struct ModelEncoder<'m> {
    core: EncoderState<'m>,
    pool: ThreadPool,
}

impl<'m> ModelEncoder<'m> {
    pub fn new(model: &'m Model<'m>, pool: ThreadPool) -> Result<ModelEncoder<'m>, MemoryError> {
        Ok(ModelEncoder {
            core: EncoderState::new(model)?,
            pool,
        })
    }
}

impl KeyEncoder for ModelEncoder<'_> {
    fn shape(&self) -> HeadShape {
        self.core.shape()
    }

    fn attention_layers(&self) -> Vec<usize> {
        self.core.attention_layers()
    }

    fn encode(
        &mut self,
        layers: &[usize],
        context: &[u32],
        tokens: &[u32],
        queries: bool,
    ) -> Result<Encoded, MemoryError> {
        self.core
            .encode(&self.pool, layers, context, tokens, queries)
    }
}

/// [`KeyEncoder`] over an [`EncoderState`] and a pool lent for the call
/// (a scheduler's backend lends its own).
pub struct LentEncoder<'e, 'm> {
    pub core: &'e mut EncoderState<'m>,
    pub pool: &'e ThreadPool,
}

impl KeyEncoder for LentEncoder<'_, '_> {
    fn shape(&self) -> HeadShape {
        self.core.shape()
    }

    fn attention_layers(&self) -> Vec<usize> {
        self.core.attention_layers()
    }

    fn encode(
        &mut self,
        layers: &[usize],
        context: &[u32],
        tokens: &[u32],
        queries: bool,
    ) -> Result<Encoded, MemoryError> {
        self.core
            .encode(self.pool, layers, context, tokens, queries)
    }
}
