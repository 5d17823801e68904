//! The long-memory file (issue 18): a crash-safe, append-only history of
//! tokens with per-token search codes, and the tiered search over it. The
//! model-facing part (computing keys and queries, bringing retrieved
//! blocks back into the KV cache) lives elsewhere; this crate stores bytes
//! it does not interpret and scores them against the vectors it is given.
//!
//! # File format (version 1, little-endian)
//!
//! ```text
//! header   "CFMEMORY" | version u32 | header_len u32 | file_id [16] |
//!          fingerprint [32] | block_tokens B | slots S | dims D |
//!          code_bytes | extra_bytes | id_bytes | params_len | 0 (u32 each) |
//!          params [params_len] | crc32c u32 (over everything before it)
//! commit   one 4 KiB page from the next page boundary: two 32-byte slots
//!          (at +0 and +512) "CFMC" | crc32c | generation u64 | end u64 |
//!          blocks u64; the valid slot with the higher generation wins
//! records  from the page after, back to back, one per block of 1..=B tokens:
//!          "CFMR" | n_tokens u16 | flags u16 | seq u64 | first_token u64 |
//!          payload_len u32 | crc32c u32 (over the 28 bytes before it and
//!          the payload)
//!          payload: summaries [S][D/2 + 2] (f16 scale, then D int4 values
//!                   as nibbles + 8, even dims low) |
//!                   ids [n][id_bytes] | codes [S][n][code_bytes] |
//!                   extra [n][extra_bytes]
//! ```
//!
//! Summaries come first so that opening reads a record's header and
//! summaries in one `pread`; codes are slot-major so one slot's codes are
//! contiguous. D is 8 · code_bytes (one dimension per code bit). The
//! `params` blob (slot list, rotation seed, centring means) belongs to the
//! caller, at most 64 KiB. Geometry fields are bounded so no record exceeds
//! 64 MiB: a hostile header cannot make a reader allocate more.
//!
//! **Budget** for SmolLM2 (S = 36, code_bytes = 8, u16 ids, B = 64, full
//! blocks): 19,816 bytes per block = 309.6 bytes per token, of which codes
//! 288 (93.0%), ids 2 (0.6%), summaries 19.1 (6.2%), record header 0.5
//! (0.2%); the file header and commit page add a fixed 8 KiB. A partial
//! block costs its tokens plus a whole block's summaries. The derived index
//! file `NAME.idx` ([`sidecar`]) adds 19.6 bytes per token (1,252 per block)
//! and can be deleted at any time.
//!
//! # Crash safety
//!
//! - Records are only appended, each written whole with one `pwrite` at the
//!   end of the last; nothing already written is ever rewritten (the commit
//!   slots are the one exception, and they alternate).
//! - [`MemoryFile::commit`] = `fdatasync`, then the new committed length
//!   goes into the older commit slot. The slot write is made durable by the
//!   next commit's sync; until then the other slot is a valid lower bound.
//!   So a slot never claims bytes that are not on disk.
//! - Creation writes header and commit page to a temporary file, `fsync`s
//!   it, hard-links it into place (failing if the name exists) and `fsync`s
//!   the directory: a crash leaves no file or a whole one.
//! - Opening walks the records from the first: sequence numbers, history
//!   indices and lengths must chain; records past the committed length are
//!   also checksummed (those before it were checksummed when appended, and
//!   every read checks again). The first record that fails is
//!   - **a torn tail** when it lies at or past the committed length: a
//!     writer cuts the file there (`ftruncate` + `fdatasync`), a reader
//!     ignores the bytes; [`OpenReport`] says how many.
//!   - **damage** when it lies before the committed length and the file is
//!     at least that long: [`Error::Damaged`], naming block and offset and
//!     pointing at `cachefit memory verify`. Committed data is never
//!     silently dropped.
//!   - a file **cut short from outside** (shorter than its committed
//!     length, as truncating it at any byte simulates): it opens at the
//!     last whole record and [`OpenReport::truncated_below_commit`] says so.
//! - One writer: a writer takes `flock(LOCK_EX | LOCK_NB)`; a second one
//!   gets [`Error::Locked`]. Readers take no lock and read by `pread` only
//!   (no mmap: a file cut under a reader gives a short read, not SIGBUS).
//! - Any write or sync error (disk full included) cuts the file back to the
//!   last commit, drops the uncommitted blocks from the index and returns
//!   [`Error::Write`]; the file opens afterwards.
//!
//! **Fsync policy for callers:** commit every 64 blocks (4,096 tokens)
//! while ingesting a document and at the end of every chat turn. A crash
//! loses at most what was appended since the last commit.
//!
//! # Index
//!
//! Opening builds the in-RAM [`Index`] (block places, int4 summaries and
//! their sign bits: 1.5 KB per block = 24 bytes per token with 36 slots,
//! 8.3 bytes per token with the 12 slots SmolLM2's layout keeps today)
//! from the index file for the blocks it covers and from the records for
//! the rest.
//! At 100M tokens and 12 slots: 825 MB of RAM; opening takes 0.5–0.8 s
//! from the index file in the page cache, 7 s with a cold page cache, 18 s
//! from the records alone.
//!
//! # Search
//!
//! See [`search`]: a coarse fast scan of every block's summary sign bits,
//! int4 summary rescoring of the candidates, and LUT scoring of the best
//! candidates' codes, fused across slots; when the fine pass is asked to
//! cover the whole history (the engine does up to 1M tokens), every
//! block's codes are scored and the first two tiers are skipped.
//! [`MemoryFile::search_many`]
//! runs several queries (one retrieval of the engine) with one pass over
//! the index per tier. Kernels in [`kernels`]. Measured numbers are in
//! docs/MEMORY.md.

pub mod error;
pub mod format;
pub mod index;
pub mod kernels;
pub mod search;
pub mod sidecar;
pub mod store;
pub mod synth;
pub mod verify;

pub use error::{Error, Result};
pub use format::{summary, Geometry, Header, FLAG_DOC_START};
pub use index::{BlockMeta, Index};
pub use search::{Fusion, Hit, SearchParams, SearchResult, SlotScores};
pub use store::{Block, BlockIn, MemoryFile, Mode, OpenReport};
pub use verify::{inspect, verify, Budget, Inspect, Problem, VerifyReport};

#[cfg(test)]
mod tests;
