//! What can go wrong, each naming the repo, file or URL at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("`{0}` is not a hub repo name: expected OWNER/REPO[:QUANT], e.g. bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M")]
    BadRepoName(String),
    #[error("GET {url}: HTTP {status}: {hint}")]
    Http {
        url: String,
        status: u16,
        hint: String,
    },
    #[error("GET {url}: {detail}")]
    Transport { url: String, detail: String },
    #[error("{url}: the hub's answer is not what was expected: {detail}")]
    BadListing { url: String, detail: String },
    #[error("{repo} has no .gguf file{}; its files: {files}", quant.as_ref().map(|q| format!(" for quant {q}")).unwrap_or_default())]
    NoMatch {
        repo: String,
        quant: Option<String>,
        files: String,
    },
    #[error("{repo}: {what} matches several models: {candidates}; name one with --hf-file FILE")]
    Ambiguous {
        repo: String,
        what: String,
        candidates: String,
    },
    #[error("`{query}` matches several cached models: {candidates}; name one of them")]
    AmbiguousName { query: String, candidates: String },
    #[error("{repo}: split model {first} has {count} parts but the repo lists no part {missing}")]
    MissingPart {
        repo: String,
        first: String,
        count: u32,
        missing: u32,
    },
    #[error("{repo}: unsafe file name `{file}` in the listing (absolute, or with `..`)")]
    UnsafeFileName { repo: String, file: String },
    #[error("{url}: checksum mismatch: the hub reports sha256 {expected}, the download has {actual}; the partial download was deleted")]
    ChecksumMismatch {
        url: String,
        expected: String,
        actual: String,
    },
    #[error("{url}: expected {expected} bytes, got {actual}; the partial download was deleted")]
    SizeMismatch {
        url: String,
        expected: u64,
        actual: u64,
    },
    #[error("{url}: the connection kept failing ({detail}); {have} bytes are kept in {} and the next run resumes from there", part.display())]
    GaveUp {
        url: String,
        detail: String,
        have: u64,
        part: PathBuf,
    },
    #[error("interrupted: {have}{} bytes kept in {}; run the same command again to resume", total.map(|t| format!(" of {t}")).unwrap_or_default(), part.display())]
    Interrupted {
        part: PathBuf,
        have: u64,
        total: Option<u64>,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl HubError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> HubError {
        let path = path.into();
        move |source| HubError::Io { path, source }
    }
}
