//! GGUF v2/v3 files: a reader that validates everything a hostile file could
//! get wrong, with zero-copy tensor views over a memory map, and a writer
//! whose output the reader reads back byte for byte.
//!
//! Layout: [`types`] (ggml tensor types and block geometry), [`value`]
//! (metadata values and typed getters), [`read`] (header parser), [`file`]
//! (opening: mmap, `--no-mmap`, `--mlock`), [`split`] (models split over
//! several files, llama.cpp's gguf-split), [`write`] (writer), [`error`].

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod error;
pub mod file;
pub mod read;
pub mod split;
pub mod types;
pub mod value;
pub mod write;

pub use error::{Error, ErrorKind, Result};
pub use file::{GgufFile, OpenOptions, Shard};
pub use read::{parse_header, Header, Limits, TensorInfo, DEFAULT_ALIGNMENT};
pub use types::{GgmlType, QK_K};
pub use value::{Metadata, Value, ValueType};
pub use write::{Builder, TensorSpec, TensorWriter};
