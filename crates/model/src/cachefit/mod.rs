//! The `cachefit` architecture (docs/CACHEFIT-FORMAT.md): a small model of
//! gated short-convolution blocks (`C`) and attention blocks with few KV
//! heads (`A`), each followed by a SwiGLU MLP, with tied embeddings and a
//! logit soft cap; matrices in int8 with one scale per row (or F32).
//!
//! How it plugs in: [`crate::ModelConfig::from_gguf`] reads the
//! `cachefit.*` keys into the llama-style fields plus
//! [`crate::ModelConfig::cachefit`]; [`crate::Weights`] is an enum whose
//! `Cachefit` variant holds [`CachefitWeights`]; [`crate::State`] wraps a
//! [`CachefitState`] for such weights; and [`crate::forward_tokens`] (so
//! `forward_batch` and `forward` too) dispatches on the weights. Callers
//! (run, chat, bench, perplexity, serve) do not know which architecture
//! they run.
//!
//! Per-sequence state, sized by `n_ctx` like a KV cache:
//! - attention blocks: keys and values of every position, f16 (default) or
//!   f32, stored transposed (`(kv head, dim, position)`) so attention works
//!   on many positions per vector op whatever the head size;
//! - convolution blocks: the block's normed input `h` of **every** position
//!   (f32, `(position, dim)`). A token at position `p` reads `h` at
//!   `p-K+1..=p` of its own sequence (zeros before 0). Keeping all positions,
//!   not a rolling window of K−1, makes the conv state behave exactly like
//!   the KV cache: a batch may start at any position `p` whose predecessors
//!   were computed (continuing, or after the server truncated a slot to a
//!   common prefix), and a batch at position 0 needs no reset.

pub(crate) mod config;
mod forward;
mod weights;

pub use config::{BlockKind, CachefitConfig};
pub use forward::CachefitState;
pub(crate) use forward::{attention, forward};
pub use weights::{Block, CachefitWeights, Matrix, Mixer};
