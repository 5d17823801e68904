//! The llama family: `llama` (Llama 2/3, TinyLlama, Mistral, SmolLM2),
//! `qwen2` (q/k/v biases) and `qwen3` (per-head q/k RMSNorm). They differ
//! in a few flags on [`crate::ModelConfig`], not in separate code paths:
//! `config.rs` reads the keys, [`Weights`] binds the tensors, [`State`]
//! runs the pass (`pass.rs` has the steps).

mod config;
mod pass;
mod weights;

pub(crate) use config::read as read_config;
pub(crate) use pass::memory;
pub use pass::State;
pub use weights::{Ffn, LayerWeights, LongShort, Weights};
