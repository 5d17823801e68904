//! The architectures, and the one file that lists them: [`Model`] (a
//! config and the weights of one architecture), [`State`] (that
//! architecture's caches and buffers, borrowing the model's weights), and
//! the dispatch from a file's `general.architecture` to the module that
//! reads its keys, binds its tensors, sizes its state and runs its pass.
//!
//! Each architecture is one module (`llama`, `cachefit`) built from the
//! shared blocks (`batch`, `attention`, `kv_cache`, `capture`, `binder`,
//! `pass`); none imports another, nor this file. docs/DESIGN.md says how
//! to add one.

pub mod cachefit;
pub mod llama;

use crate::batch::{Batch, Logits, StateOptions, Token};
use crate::binder::Binder;
use crate::config::{Arch, ModelConfig};
use crate::kv_cache::KvType;
use crate::memory::{MemoryEstimate, WeightsResidency};
use crate::pass::Pass;
use crate::Error;
use gguf::{GgufFile, Metadata};
use kernels::pool::ThreadPool;

/// The weights of one architecture, bound in place from a file.
pub enum Weights<'a> {
    /// The llama family: every [`Arch`] but `cachefit`.
    Llama(llama::Weights<'a>),
    Cachefit(cachefit::Weights<'a>),
}

/// The caches, activations and scratch of one architecture, made by
/// [`Model::new_state`] and holding that model's weights: a state can
/// only ever run the weights it was made for.
pub enum State<'m> {
    Llama(Box<llama::State<'m>>),
    Cachefit(Box<cachefit::State<'m>>),
}

impl ModelConfig {
    /// Read the config from metadata, with the reader of the file's
    /// `general.architecture`.
    pub fn from_gguf(md: &Metadata) -> Result<ModelConfig, Error> {
        let name = md.get_str("general.architecture")?;
        let arch = Arch::from_name(name).ok_or_else(|| Error::UnsupportedArch {
            arch: name.to_string(),
        })?;
        match arch {
            Arch::Cachefit => cachefit::read_config(md),
            _ => llama::read_config(md, arch),
        }?
        .checked_numbers(name)
    }
}

impl MemoryEstimate {
    /// For an f16 cache of `n_ctx` positions and the default batch.
    pub fn new(cfg: &ModelConfig, weights_bytes: u64, n_ctx: usize) -> MemoryEstimate {
        MemoryEstimate::for_state(cfg, weights_bytes, &StateOptions::new(n_ctx))
    }

    /// For a [`State`] made with `o` (an unusable cache type counts as f16
    /// here; making the state reports it).
    pub fn for_state(cfg: &ModelConfig, weights_bytes: u64, o: &StateOptions) -> MemoryEstimate {
        match cfg.arch {
            Arch::Cachefit => cachefit::memory(cfg, weights_bytes, o),
            _ => llama::memory(cfg, weights_bytes, o),
        }
    }
}

/// A model: its config and weights, borrowed from the file. `Sync`, so
/// several threads (a server's) may read it while each owns a [`State`].
pub struct Model<'a> {
    cfg: ModelConfig,
    weights: Weights<'a>,
    residency: WeightsResidency,
}

/// Bind with `b`, the arch's own binding code either way.
fn bind<'a>(b: &Binder<'a>, cfg: &ModelConfig) -> Result<Weights<'a>, Error> {
    Ok(match cfg.arch {
        Arch::Cachefit => Weights::Cachefit(cachefit::Weights::from_binder(b, cfg)?),
        _ => Weights::Llama(llama::Weights::from_binder(b, cfg)?),
    })
}

impl<'a> Model<'a> {
    /// Bind the tensors `cfg.arch` needs, checking every shape; then
    /// release the pages of the file no weight reads in place.
    pub fn from_gguf(file: &'a GgufFile, cfg: &ModelConfig) -> Result<Model<'a>, Error> {
        let b = Binder::new(file);
        let weights = bind(&b, cfg)?;
        Ok(Model {
            cfg: cfg.clone(),
            weights,
            residency: b.finish(),
        })
    }

    /// What [`Model::from_gguf`] would hold resident, from the same
    /// binding code, without repacking anything.
    pub fn plan_residency(file: &GgufFile, cfg: &ModelConfig) -> Result<WeightsResidency, Error> {
        let b = Binder::plan(file);
        bind(&b, cfg)?;
        Ok(b.finish())
    }

    /// What the weights hold resident.
    pub fn residency(&self) -> WeightsResidency {
        self.residency
    }

    /// Allocate a state: every buffer a call needs, so a call allocates
    /// nothing. Errors if the cache type cannot store this model's heads.
    pub fn new_state(&self, o: &StateOptions) -> Result<State<'_>, Error> {
        let cfg = &self.cfg;
        Ok(match &self.weights {
            Weights::Llama(w) => State::Llama(Box::new(llama::State::new(cfg, w, o)?)),
            Weights::Cachefit(w) => State::Cachefit(Box::new(cachefit::State::new(cfg, w, o)?)),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn arch(&self) -> Arch {
        self.cfg.arch
    }

    pub fn weights(&self) -> &Weights<'a> {
        &self.weights
    }

    /// Bytes of weight data the forward pass reads per token (every matrix
    /// once, the embedding row aside).
    pub fn bytes_per_token(&self) -> usize {
        match &self.weights {
            Weights::Llama(w) => w.bytes_per_token(),
            Weights::Cachefit(w) => w.bytes_per_token(),
        }
    }
}

impl<'m> State<'m> {
    fn pass(&self) -> &dyn Pass {
        match self {
            State::Llama(s) => &**s,
            State::Cachefit(s) => &**s,
        }
    }

    fn pass_mut(&mut self) -> &mut dyn Pass {
        match self {
            State::Llama(s) => &mut **s,
            State::Cachefit(s) => &mut **s,
        }
    }

    /// Run a batch of tokens from any of the state's sequences and return
    /// one row of logits `(vocab,)` per token whose `logits` is set, in
    /// order. A token at `(seq, pos)` attends to positions `0..=pos` of its
    /// sequence; earlier positions must already be in that sequence's
    /// cache, and tokens of one sequence in a batch must have distinct
    /// positions. This is how a server decodes its slots in one pass:
    /// every matrix row is loaded once for all of them.
    ///
    /// Panics on an empty batch, more than `n_batch` tokens, more logit
    /// rows than the state keeps, or a token, sequence or position out of
    /// range (callers check).
    pub fn forward(&mut self, pool: &ThreadPool, tokens: &[Token]) -> &[f32] {
        let token = |i: usize| tokens[i];
        self.pass_mut()
            .forward(pool, Batch::new(tokens.len(), &token))
    }

    /// Run `ids` at positions `pos0..pos0 + n` of sequence 0 (positions
    /// before `pos0` must already be in the cache) and return the logits
    /// `which` asks for: the last token's `(vocab,)`, every token's
    /// `(n, vocab)` (which needs [`StateOptions::all_logits`]), or none. Panics as
    /// [`State::forward`] does.
    pub fn forward_seq(
        &mut self,
        pool: &ThreadPool,
        ids: &[u32],
        pos0: usize,
        which: Logits,
    ) -> &[f32] {
        let n = ids.len();
        let token = |i: usize| Token {
            id: ids[i],
            seq: 0,
            pos: pos0 + i,
            logits: match which {
                Logits::All => true,
                Logits::Last => i + 1 == n,
                Logits::None => false,
            },
        };
        self.pass_mut().forward(pool, Batch::new(n, &token))
    }

    /// The logits of the last call: one row `(vocab,)` per token that asked
    /// for them (none after a call that stopped early, see
    /// [`State::set_last_layer`]).
    pub fn logits(&self) -> &[f32] {
        self.pass().outputs().logits()
    }

    /// The same, for samplers that modify them in place.
    pub fn logits_mut(&mut self) -> &mut [f32] {
        self.pass_mut().outputs_mut().logits_mut()
    }

    pub fn n_ctx(&self) -> usize {
        self.pass().n_ctx()
    }

    pub fn n_batch(&self) -> usize {
        self.pass().n_batch()
    }

    pub fn n_seq(&self) -> usize {
        self.pass().n_seq()
    }

    /// Tokens of one call that may ask for logits (see
    /// [`crate::StateOptions::draft_rows`]).
    pub fn logit_rows(&self) -> usize {
        self.pass().outputs().logit_rows()
    }

    pub fn kv_type(&self) -> KvType {
        self.pass().kv_type()
    }

    /// Bytes of the per-sequence caches (KV, and a cachefit model's
    /// convolution inputs).
    pub fn kv_bytes(&self) -> usize {
        self.pass().kv_bytes()
    }

    /// From the next call on, keep the pre-RoPE keys `(n, kv_dim)` and
    /// queries `(n, q_dim)` of every token of a call for `layers` (after
    /// qwen2's biases and qwen3's q/k norms, before RoPE), readable with
    /// [`State::captured_keys`] and [`State::captured_queries`] by index
    /// in `layers`. An empty list stops capturing. For `cachefit` a layer
    /// is a block, and only attention blocks have keys. Errors on a layer
    /// out of range, without keys, or listed twice.
    pub fn capture(&mut self, layers: &[usize]) -> Result<(), Error> {
        self.pass_mut().capture(layers)
    }

    /// Copy what sequence `src` caches at `positions` (keys and values,
    /// and whatever else the architecture keeps per position) into
    /// sequence `dst`, so `dst` continues from `src`'s prefix without
    /// evaluating it: the same bits as evaluating it (a position's cache
    /// depends only on its sequence's tokens). How a server's choices of
    /// one request share a prompt read once. Panics on a sequence or
    /// position out of range.
    pub fn copy_seq(&mut self, src: usize, dst: usize, positions: std::ops::Range<usize>) {
        self.pass_mut().copy_seq(src, dst, positions)
    }

    /// The layers being captured, in the order [`State::capture`] got them.
    pub fn captured_layers(&self) -> &[usize] {
        self.pass().outputs().capture.layers()
    }

    /// Keys of the last call for the `i`-th captured layer, `(n, kv_dim)`,
    /// rows in the call's token order (empty if the call stopped before
    /// that layer). Panics if fewer than `i + 1` layers are captured.
    pub fn captured_keys(&self, i: usize) -> &[f32] {
        self.pass().outputs().capture.keys(i)
    }

    /// Queries of the last call for the `i`-th captured layer,
    /// `(n, q_dim)`, as [`State::captured_keys`].
    pub fn captured_queries(&self, i: usize) -> &[f32] {
        self.pass().outputs().capture.queries(i)
    }

    /// `true`: calls stop at the final norm and keep, for each token that
    /// asks for logits (every token of a batch may), its normed hidden
    /// state `(dim,)`, read with
    /// [`State::embeddings`] (no logits; the vocabulary matmul is skipped).
    /// The llama family only: a `cachefit` model's head is fused with its
    /// embedding, and errors.
    pub fn set_embeddings(&mut self, on: bool) -> Result<(), Error> {
        match self {
            State::Llama(s) => {
                let (dim, n_batch) = (s.config().dim, s.n_batch());
                s.outputs_mut().set_embeddings(on, dim, n_batch);
                Ok(())
            }
            State::Cachefit(_) => Err(Error::Unsupported(
                "embeddings of a cachefit model (its output head shares the token embedding)"
                    .into(),
            )),
        }
    }

    /// The hidden states of the last call's rows `(rows, dim)` while
    /// [`State::set_embeddings`] is on.
    pub fn embeddings(&self) -> &[f32] {
        let o = self.pass().outputs();
        &o.embd[..o.n_embd]
    }

    /// `Some(l)`: calls evaluate layers `0..=l` only and no output head
    /// (so they return no logits, and any token may ask for them), and the
    /// caches are written for those layers only: a cheap way to compute
    /// keys when ingesting text. Such a state's later layers are stale, so
    /// it must not be used for generation, even after `None` restores full
    /// calls, unless its positions are evaluated again. Errors if `l` is
    /// not a layer of the model.
    pub fn set_last_layer(&mut self, last: Option<usize>) -> Result<(), Error> {
        self.pass_mut().outputs_mut().set_last_layer(last)
    }
}

/// A server's threads share one model.
const _: () = {
    const fn sync<T: Sync>() {}
    sync::<Model<'static>>();
};
