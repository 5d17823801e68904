//! Errors from planning and running a quantization. Each names the file,
//! tensor or type at fault and, where there is one, the way out.

use gguf::GgmlType;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown quantization type `{name}`; supported: {supported}")]
    UnknownTarget { name: String, supported: String },
    #[error(transparent)]
    Gguf(#[from] gguf::Error),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: writing GGUF: {kind}", path.display())]
    Write {
        path: PathBuf,
        kind: gguf::ErrorKind,
    },
    #[error("output {} is the input file; refusing to overwrite the model being read", path.display())]
    SameFile { path: PathBuf },
    #[error("tensor `{tensor}` is already quantized ({ty}); requantizing loses quality, pass --allow-requantize to do it anyway")]
    Requantize { tensor: String, ty: GgmlType },
    #[error("tensor `{tensor}`: cannot dequantize its type {ty} (no dequantizer in the kernels table; these can be read: {supported})")]
    NoDequantizer {
        tensor: String,
        ty: GgmlType,
        supported: String,
    },
    #[error("tensor `{tensor}`: cannot quantize to {ty} (no quantizer in the kernels table; available: {supported})")]
    NoQuantizer {
        tensor: String,
        ty: GgmlType,
        supported: String,
    },
    #[error("tensor `{tensor}`: row length {row_len} does not fit {ty} and llama.cpp defines no fallback for it")]
    NoFallback {
        tensor: String,
        ty: GgmlType,
        row_len: u64,
    },
    #[error("tensor `{tensor}`: {problem}")]
    Layer { tensor: String, problem: String },
    #[error("tensor `{tensor}`: row {row} holds a non-finite value (NaN or infinity); the quantized file would be garbage")]
    NonFinite { tensor: String, row: u64 },
    #[error("interrupted; no output was written")]
    Interrupted,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
