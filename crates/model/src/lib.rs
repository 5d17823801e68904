//! Models: what a GGUF file's metadata says about the network
//! ([`ModelConfig`]), its tensors bound in place ([`Model`]), and the
//! forward pass over preallocated caches ([`State`], made by
//! [`Model::new_state`]).
//!
//! ```text
//! let cfg = ModelConfig::from_gguf(file.metadata())?;
//! let model = Model::from_gguf(&file, &cfg)?;          // borrows the file
//! let mut state = model.new_state(&StateOptions::new(n_ctx))?;  // borrows the model
//! let logits = state.forward_seq(&pool, &prompt, 0, Logits::Last);
//! ```
//!
//! Supported architectures, one module each under `arch/`: the llama
//! family ([`arch::llama`]: `llama`, `qwen2`, `qwen3`, which differ in a
//! few flags) and `cachefit` ([`arch::cachefit`]: convolution and attention
//! blocks, int8 weights). `arch/mod.rs` is the only file that names them;
//! each architecture builds on the shared blocks here: `batch`
//! (tokens, state options, batch checks), `attention` (heads over an f16/f32
//! cache, in segments), `kv_cache`, `capture` (pre-RoPE keys and queries of chosen
//! layers), `binder` (tensors by name) and `pass` (the interface a state
//! implements).
//!
//! One forward pass serves prefill (a batch of tokens), decode (one) and a
//! server's slots (one token each, or prompts, of several sequences):
//! [`State::forward`], or [`State::forward_seq`] for one sequence.

pub mod arch;
mod attention;
mod batch;
mod binder;
mod capture;
mod config;
mod error;
mod kv_cache;
mod memory;
mod pass;
pub mod token_codes;

pub use arch::{Model, State, Weights};
pub use batch::{Logits, StateOptions, Token, DEFAULT_BATCH};
pub use config::{
    Activation, Arch, BlockKind, CachefitConfig, Experts, ModelConfig, SlidingWindow, TokenCodes,
    Variant, SUPPORTED_ARCHS,
};
pub use error::Error;
pub use kv_cache::{KvCache, KvType};
pub use memory::{mem_available, MemoryEstimate, WeightsResidency};
