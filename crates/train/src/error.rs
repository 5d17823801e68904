use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in a stage. Each names the file at fault; none is a
/// panic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A stage's input is missing: say which stage makes it.
    #[error("{} does not exist: run `cachefit-train {stage}` first", path.display())]
    MissingInput { path: PathBuf, stage: &'static str },
    #[error(
        "{}: not UTF-8 text: invalid byte 0x{byte:02x} at line {line}, column {column} \
         (byte offset {offset})",
        path.display()
    )]
    NotUtf8 {
        path: PathBuf,
        byte: u8,
        offset: usize,
        line: usize,
        column: usize,
    },
    /// A file that exists but whose content a stage cannot use.
    #[error("{}: {problem}", path.display())]
    Invalid { path: PathBuf, problem: String },
    /// A setting out of range.
    #[error("{0}")]
    Config(String),
    #[error("BPE training failed: {0}")]
    Train(String),
    /// `tokenizers` and our `tokenize` crate disagree on a text.
    #[error("tokenizer mismatch on {what}: {detail}")]
    Mismatch { what: String, detail: String },
    /// Reading or writing a GGUF file (the error names the file).
    #[error(transparent)]
    Gguf(#[from] gguf::Error),
    /// Our tokenizer refused the vocabulary; not a `#[source]`, its text is
    /// already in the message.
    #[error("{}: {err}", path.display())]
    Vocab { path: PathBuf, err: tokenize::Error },
}
