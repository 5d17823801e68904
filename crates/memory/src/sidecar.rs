//! The derived index file `NAME.idx`: the in-RAM index's contents (block
//! places and summaries) for the committed blocks, so opening a large file
//! reads ~1.2 KB per block sequentially instead of one scattered `pread`
//! per record (at 100M tokens: 2 GB in one stream instead of 1.56M
//! random reads). The data file stays the truth: this file is checked
//! against it and ignored (then rewritten by the next writer) when it does
//! not match; deleting it is always safe.
//!
//! ```text
//! header  "CFMIDX\0\x01" | version u32 | entry_len u32 | data file_id [16] |
//!         data header crc u32 | 0 [24] | crc32c u32 (64 bytes)
//! entries one per committed block, entry_len bytes each:
//!         offset u64 | first_token u64 | n_tokens u16 | flags u16 |
//!         record crc u32 | summaries [S][D/2 + 2] | crc32c u32
//! ```
//!
//! Loading accepts the longest prefix of entries whose checksums hold and
//! whose places chain (each record right after the last, history indices
//! adding up, inside the data file and the committed length), then checks
//! the last accepted entry against that record's header in the data file.
//! Writers append entries at each commit without syncing (a torn entry
//! fails its checksum and is rebuilt from the records).

use crate::format::{Header, RecordHeader, RECORD_HEADER};
use crate::index::{BlockMeta, Index};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"CFMIDX\0\x01";
const VERSION: u32 = 1;
const HEADER: u64 = 64;

pub fn path_for(data: &Path) -> PathBuf {
    let mut s = data.as_os_str().to_owned();
    s.push(".idx");
    PathBuf::from(s)
}

fn entry_len(h: &Header) -> usize {
    24 + h.geometry.summaries_len() + 4
}

fn data_header_crc(h: &Header) -> u32 {
    let b = h.encode();
    u32::from_le_bytes(b[b.len() - 4..].try_into().unwrap())
}

fn encode_header(h: &Header) -> [u8; HEADER as usize] {
    let mut b = [0u8; HEADER as usize];
    b[0..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(entry_len(h) as u32).to_le_bytes());
    b[16..32].copy_from_slice(&h.file_id);
    b[32..36].copy_from_slice(&data_header_crc(h).to_le_bytes());
    let crc = crc32c::crc32c(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Where loading the sidecar left the index.
pub struct Loaded {
    pub index: Index,
    /// End of the last covered record in the data file.
    pub end: u64,
    pub first_token: u64,
}

/// Load the sidecar of the data file `data` (already open as `file`,
/// `len` bytes, committed up to `committed`), if it exists and matches.
pub fn load(data: &Path, file: &File, h: &Header, len: u64, committed: u64) -> Option<Loaded> {
    let idx = File::open(path_for(data)).ok()?;
    let mut head = [0u8; HEADER as usize];
    idx.read_exact_at(&mut head, 0).ok()?;
    if head != encode_header(h) {
        return None;
    }
    let g = h.geometry;
    let el = entry_len(h);
    let mut index = Index::new(g);
    let idx_len = idx.metadata().ok()?.len();
    let n_max = (idx_len.saturating_sub(HEADER) / el as u64) as usize;
    index.reserve(n_max);
    let mut off = h.data_start();
    let mut first_token = 0u64;
    let per_read = ((4 << 20) / el).max(1);
    let mut buf = vec![0u8; per_read * el];
    let mut i = 0usize;
    'read: while i < n_max {
        let n = per_read.min(n_max - i);
        idx.read_exact_at(&mut buf[..n * el], HEADER + (i * el) as u64)
            .ok()?;
        for e in buf[..n * el].chunks_exact(el) {
            let stored = u32::from_le_bytes(e[el - 4..].try_into().unwrap());
            if crc32c::crc32c(&e[..el - 4]) != stored {
                break 'read;
            }
            let meta = BlockMeta {
                offset: u64::from_le_bytes(e[0..8].try_into().unwrap()),
                first_token: u64::from_le_bytes(e[8..16].try_into().unwrap()),
                n_tokens: u16::from_le_bytes([e[16], e[17]]),
                flags: u16::from_le_bytes([e[18], e[19]]),
                crc: u32::from_le_bytes(e[20..24].try_into().unwrap()),
            };
            let rlen = g.record_len(meta.n_tokens as usize);
            if meta.offset != off
                || meta.first_token != first_token
                || meta.n_tokens == 0
                || meta.n_tokens as u32 > g.block_tokens
                || off + rlen > len.min(committed)
            {
                break 'read;
            }
            index.push(meta, &e[24..el - 4]);
            off += rlen;
            first_token += meta.n_tokens as u64;
        }
        i += n;
    }
    if let Some(last) = index.metas().last().copied() {
        // The data file must hold that very record where the sidecar says.
        let mut rh = [0u8; RECORD_HEADER];
        file.read_exact_at(&mut rh, last.offset).ok()?;
        let r = RecordHeader::decode(&rh)?;
        if r.seq != index.len() as u64 - 1
            || r.crc != last.crc
            || r.n_tokens != last.n_tokens
            || r.first_token != last.first_token
            || r.flags != last.flags
        {
            return None;
        }
    }
    Some(Loaded {
        index,
        end: off,
        first_token,
    })
}

/// A writer's handle on the sidecar: entries `0..covered` are written.
#[derive(Debug)]
pub struct Writer {
    file: File,
    entry_len: usize,
    pub covered: usize,
}

impl Writer {
    /// Open (or create) the sidecar for writing, keeping the `valid` first
    /// entries an earlier load accepted and dropping everything after.
    pub fn open(data: &Path, h: &Header, valid: usize) -> io::Result<Writer> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path_for(data))?;
        let el = entry_len(h);
        if valid == 0 {
            file.set_len(0)?;
            file.write_all_at(&encode_header(h), 0)?;
        }
        file.set_len(HEADER + (valid * el) as u64)?;
        Ok(Writer {
            file,
            entry_len: el,
            covered: valid,
        })
    }

    /// Write the entries of blocks `covered..index.len()`.
    pub fn extend(&mut self, index: &Index) -> io::Result<()> {
        let el = self.entry_len;
        let mut buf = Vec::with_capacity(el * (index.len() - self.covered).min(4096));
        let mut at = self.covered;
        for b in self.covered..index.len() {
            let m = index.meta(b);
            let start = buf.len();
            buf.extend_from_slice(&m.offset.to_le_bytes());
            buf.extend_from_slice(&m.first_token.to_le_bytes());
            buf.extend_from_slice(&m.n_tokens.to_le_bytes());
            buf.extend_from_slice(&m.flags.to_le_bytes());
            buf.extend_from_slice(&m.crc.to_le_bytes());
            buf.extend_from_slice(index.summaries(b));
            let crc = crc32c::crc32c(&buf[start..]);
            buf.extend_from_slice(&crc.to_le_bytes());
            if buf.len() >= 4096 * el || b + 1 == index.len() {
                self.file.write_all_at(&buf, HEADER + (at * el) as u64)?;
                at = b + 1;
                buf.clear();
            }
        }
        self.covered = index.len();
        Ok(())
    }

    /// Forget entries past `blocks` (after a roll-back).
    pub fn truncate(&mut self, blocks: usize) -> io::Result<()> {
        if blocks < self.covered {
            self.file
                .set_len(HEADER + (blocks * self.entry_len) as u64)?;
            self.covered = blocks;
        }
        Ok(())
    }
}
