//! Errors from reading a model: each names the key, tensor or limit at
//! fault.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("architecture `{arch}` is not supported (supported: {})", crate::config::SUPPORTED_ARCHS.join(", "))]
    UnsupportedArch { arch: String },
    #[error("metadata: {0}")]
    Metadata(#[from] gguf::ErrorKind),
    #[error("metadata key `{key}`: {problem}")]
    BadValue { key: String, problem: String },
    #[error("{0}")]
    File(#[from] gguf::Error),
    #[error("tensor `{name}`: {problem}")]
    Tensor { name: String, problem: String },
    /// A layer asked of a state (to capture, or to stop after) that it
    /// cannot give.
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("layer {layer}: {problem}")]
    Layer { layer: usize, problem: String },
    #[error("not enough memory: need {need} (weights {weights} + KV cache {kv} + scratch {scratch}), {available} available; try a smaller context (-c)")]
    OutOfMemory {
        need: String,
        weights: String,
        kv: String,
        scratch: String,
        available: String,
    },
}
