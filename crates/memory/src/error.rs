//! The one error type of the crate: every variant names the file and, where
//! there is one, the block, byte offset, field or value at fault.

use std::io;
use std::path::PathBuf;

pub type Result<T> = std::result::Result<T, Error>;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },

    #[error("{path}: writing failed ({source}); the file was cut back to its last commit ({committed_blocks} blocks) and still opens")]
    Write {
        path: PathBuf,
        committed_blocks: u64,
        source: io::Error,
    },

    #[error("{path}: writing failed ({source}) and cutting the file back to its last commit also failed ({cut}); the next writer to open it cuts the torn tail")]
    WriteUnrecovered {
        path: PathBuf,
        source: io::Error,
        cut: io::Error,
    },

    #[error("{path}: not a cachefit memory file (magic {found:?}, expected \"CFMEMORY\")")]
    NotMemoryFile { path: PathBuf, found: String },

    #[error("{path}: memory file format version {found} is newer than this build reads (up to {supported}); upgrade cachefit")]
    NewerVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    #[error("{path}: memory file format version {found} is not supported (this build reads {supported})")]
    BadVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    #[error("{path}: the file header is cut short ({len} bytes; the header needs {needed}): the file was never fully created")]
    HeaderTruncated {
        path: PathBuf,
        len: u64,
        needed: u64,
    },

    #[error("{path}: file header checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the header is damaged")]
    HeaderChecksum {
        path: PathBuf,
        stored: u32,
        computed: u32,
    },

    #[error("{path}: header field {field} = {value} is invalid: {why}")]
    BadField {
        path: PathBuf,
        field: &'static str,
        value: u64,
        why: String,
    },

    #[error("{path}: memory was built for model {} but this model is {}", hex(.file), hex(.expected))]
    FingerprintMismatch {
        path: PathBuf,
        file: [u8; 32],
        expected: [u8; 32],
    },

    #[error("{path}: another writer holds the lock on this memory file; close it first (readers may share)")]
    Locked { path: PathBuf },

    #[error("{path}: already exists; open it instead of creating it")]
    Exists { path: PathBuf },

    #[error("{path}: block {block} at byte {offset} is damaged ({why}) inside committed data; run `cachefit memory verify {}` for a full report", .path.display())]
    Damaged {
        path: PathBuf,
        block: u64,
        offset: u64,
        why: String,
    },

    #[error("{path}: block {block} at byte {offset}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    RecordChecksum {
        path: PathBuf,
        block: u64,
        offset: u64,
        stored: u32,
        computed: u32,
    },

    #[error("block {block} does not exist (the memory holds {len} blocks)")]
    NoSuchBlock { block: u64, len: u64 },

    #[error("bad block to append: {0}")]
    BadBlock(String),

    #[error("bad search input: {0}")]
    BadQuery(String),

    #[error("{path}: opened read-only; appending needs a writer")]
    ReadOnly { path: PathBuf },
}

impl Error {
    pub(crate) fn io(path: &std::path::Path, op: &'static str, source: io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    }
}
