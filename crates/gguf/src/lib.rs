//! GGUF v2/v3 files: reader and writer.

pub mod types;

pub use types::{GgmlType, QK_K};
