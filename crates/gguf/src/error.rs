//! Errors from reading and writing GGUF files. Every variant names what was
//! wrong (the field, key or tensor) and what was expected; [`Error`] adds the
//! file it came from.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("is a directory, not a GGUF file")]
    IsDirectory,
    #[error("is not a regular file (a FIFO, socket or device): a model must be a file")]
    NotRegular,
    #[error("file is empty (0 bytes), not a GGUF file")]
    Empty,
    #[error("not a GGUF file: magic is {0:?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error("GGUF version {0} is not supported (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("truncated: {what} needs {need} bytes at offset {offset}, but the file ends at {len}")]
    Truncated {
        what: String,
        offset: u64,
        need: u64,
        len: u64,
    },
    #[error("{what}: {count} exceeds the limit of {limit}")]
    TooLarge {
        what: String,
        count: u64,
        limit: u64,
    },
    #[error("{what}: string is not valid UTF-8")]
    BadUtf8 { what: String },
    #[error("{what}: unknown metadata value type {ty}")]
    BadValueType { what: String, ty: u32 },
    #[error("{what}: arrays nested deeper than {limit} levels")]
    TooDeep { what: String, limit: usize },
    #[error("duplicate metadata key `{0}`")]
    DuplicateKey(String),
    #[error("metadata key `general.alignment`: {0} is not a power of two that is a multiple of 8 (as the GGUF spec requires)")]
    BadAlignment(u64),
    #[error("tensor `{name}`: {problem}")]
    Tensor { name: String, problem: String },
    #[error("duplicate tensor name `{0}`")]
    DuplicateTensor(String),
    #[error("metadata key `{key}` is missing")]
    MissingKey { key: String },
    #[error("metadata key `{key}`: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: String,
        found: String,
    },
    #[error("no tensor named `{0}`")]
    MissingTensor(String),
    #[error("mlock of {bytes} bytes refused by the OS: {source} (raise the locked-memory limit, e.g. `ulimit -l unlimited`, or run without --mlock)")]
    Mlock { bytes: u64, source: std::io::Error },
    #[error("writer: {0}")]
    Write(String),
    /// A model split into several files (llama.cpp's gguf-split) whose
    /// files do not fit together.
    #[error("split model: {0}")]
    Split(String),
}

/// An error with the file it concerns.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct Error {
    pub path: PathBuf,
    /// Not a `#[source]`: its text is already in this error's message, and
    /// a chain printer would repeat it.
    pub kind: ErrorKind,
}

impl Error {
    pub fn new(path: impl Into<PathBuf>, kind: ErrorKind) -> Error {
        Error {
            path: path.into(),
            kind,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
