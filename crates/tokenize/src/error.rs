//! Errors from reading a vocabulary out of GGUF metadata. Each names the
//! key, token or value at fault and, where it helps, what is supported.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A key is missing or has the wrong type (the message names both).
    #[error(transparent)]
    Metadata(#[from] gguf::ErrorKind),
    #[error("unknown tokenizer model `{0}` in `tokenizer.ggml.model` (supported: llama, gpt2)")]
    UnknownModel(String),
    #[error("unknown pre-tokenizer `{name}` in `tokenizer.ggml.pre` (supported: {supported})")]
    UnknownPreTokenizer { name: String, supported: String },
    #[error("`tokenizer.ggml.tokens` is empty")]
    NoTokens,
    #[error("`{key}` has {found} entries but `tokenizer.ggml.tokens` has {expected}")]
    LengthMismatch {
        key: &'static str,
        found: usize,
        expected: usize,
    },
    #[error("`{key}`: expected {expected}, found {found}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error("`tokenizer.ggml.tokens`: token {id} {text:?} is a duplicate of token {first}")]
    DuplicateToken { id: u32, first: u32, text: String },
}
