//! Models by name: a client for the Hugging Face hub (or a mirror) that
//! lists a repo, picks the GGUF file of a quant as llama.cpp's `-hf` does,
//! and downloads it resumably with its checksum verified; and the local
//! model cache that `cachefit models` lists and `-m NAME` searches.
//!
//! The hub's URL layout, which mirrors and the test server share:
//! `GET {endpoint}/api/models/{owner}/{repo}?blobs=true` lists the files
//! (`siblings[].rfilename`, `.size`, `.lfs.sha256`), and
//! `GET {endpoint}/{owner}/{repo}/resolve/main/{file}` serves one (with
//! `Range`, and the LFS sha256 in `X-Linked-Etag` or `ETag`).
//!
//! The cache: `$CACHEFIT_MODELS/{owner}/{repo}/{file}` (default
//! `${XDG_CACHE_HOME:-~/.cache}/cachefit/models`). A download writes
//! `{file}.part`, which only ever holds a prefix of the file (so a killed
//! or interrupted run resumes it with `Range`), and is renamed to `{file}`
//! only after its sha256 matched what the hub reported: a file without
//! `.part` is complete.

mod cache;
mod client;
mod download;
mod error;
mod progress;
mod repo;
/// For tests here and in the CLI: plain std, so always built.
pub mod test_server;

pub use cache::{models_dir, scan, CachedModel, Partial, Scan};
pub use client::{Client, DEFAULT_ENDPOINT};
pub use download::{Downloaded, Outcome};
pub use error::HubError;
pub use progress::Reporter;
pub use repo::{
    choose, find_tag, is_split_part, split_part, RepoFile, RepoSpec, DEFAULT_QUANT, KNOWN_QUANTS,
    QUANT_PREFERENCE,
};
