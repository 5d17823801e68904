//! The `cachefit` architecture (docs/CACHEFIT-FORMAT.md): a small model of
//! gated short-convolution blocks (`C`) and attention blocks with few KV
//! heads (`A`), each followed by a SwiGLU MLP, with tied embeddings and a
//! logit soft cap; matrices in int8 with one scale per row (or F32).
//!
//! Its keys are read in `config.rs` into the llama-style fields of
//! [`crate::ModelConfig`] plus [`crate::ModelConfig::cachefit`]; its
//! tensors are bound in [`Weights`] and run by [`State`] (`pass.rs` has
//! the steps and the per-sequence caches). A "layer" of this architecture
//! (capture, stop-after) is a block, counted over both kinds.

mod config;
mod pass;
mod weights;

pub use crate::config::{BlockKind, CachefitConfig};
pub(crate) use config::read as read_config;
pub(crate) use pass::memory;
pub use pass::State;
pub use weights::{Activations, Block, Input, Matrix, Mixer, Weights, TOKENS_PER_PASS};
