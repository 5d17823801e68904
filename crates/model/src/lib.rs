//! Models: what a GGUF file's metadata says about the network
//! ([`ModelConfig`]), its tensors bound in place ([`Weights`]), and the
//! forward pass over a preallocated f16 KV cache ([`State`], [`forward`]).
//!
//! Supported architectures: `llama` (Llama 2/3, TinyLlama, Mistral,
//! SmolLM2), `qwen2` (q/k/v biases) and `qwen3` (per-head q/k RMSNorm).
//! They differ in a few flags on [`ModelConfig`], not in separate code paths.
//! The `cachefit` architecture (convolution and attention blocks, int8
//! weights) has its own weights, state and pass in [`cachefit`], reached
//! through the same [`Weights`], [`State`] and forward functions.
//!
//! One forward pass serves prefill (a batch of tokens) and decode (one);
//! see [`forward_batch`].

pub mod cachefit;
mod config;
mod error;
mod forward;
mod kv_cache;
mod memory;
mod weights;

pub use config::{Arch, ModelConfig, SUPPORTED_ARCHS};
pub use error::Error;
pub use forward::{
    forward, forward_batch, forward_tokens, Logits, State, StateOptions, Token, DEFAULT_BATCH,
};
pub use kv_cache::{KvCache, KvType};
pub use memory::{mem_available, MemoryEstimate};
pub use weights::{LayerWeights, LlamaWeights, Weights};
