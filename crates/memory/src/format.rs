//! Byte layout of a memory file: the file header, the two commit slots and
//! the record header, with their encoders and validating decoders. Every
//! integer is little-endian. See the crate doc for the picture.

use crate::error::{Error, Result};
use std::path::Path;

pub const MAGIC: &[u8; 8] = b"CFMEMORY";
pub const VERSION: u32 = 1;
/// Fixed part of the file header, before the params blob.
pub const HEADER_FIXED: usize = 96;
/// The caller's params blob (slot list, rotation seed, centring means) is
/// "a few KiB"; the cap keeps a hostile header from asking for gigabytes.
pub const MAX_PARAMS: usize = 64 << 10;
/// Largest record the geometry may describe: bounds every allocation a
/// reader makes from header fields.
pub const MAX_RECORD: u64 = 64 << 20;
pub const PAGE: u64 = 4096;

pub const RECORD_MAGIC: &[u8; 4] = b"CFMR";
pub const RECORD_HEADER: usize = 32;

pub const COMMIT_MAGIC: &[u8; 4] = b"CFMC";
pub const COMMIT_SLOT: usize = 32;
/// The two commit slots sit in different 512-byte sectors of the commit
/// page, so a torn write of one never touches the other.
pub const COMMIT_SLOT_STRIDE: u64 = 512;

/// Record flag: a document starts in this block.
pub const FLAG_DOC_START: u16 = 1;

/// Shape of every record in a file, fixed at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// B: tokens in a full block (the last block of a turn may hold fewer).
    pub block_tokens: u32,
    /// S: search slots (e.g. one per retrieving (layer, KV head)).
    pub slots: u32,
    /// Bytes of one token's search code in one slot; D = 8 · code_bytes.
    pub code_bytes: u32,
    /// Opaque bytes per token the store keeps but never reads.
    pub extra_bytes: u32,
    /// 2 (u16 token ids) or 4 (u32).
    pub id_bytes: u32,
}

impl Geometry {
    /// SmolLM2-135M's layout from the design: 64-token blocks, 36 slots of
    /// 64 sign bits, u16 ids, no extra bytes.
    pub fn smollm2() -> Geometry {
        Geometry {
            block_tokens: 64,
            slots: 36,
            code_bytes: 8,
            extra_bytes: 0,
            id_bytes: 2,
        }
    }

    /// D: dimensions of a query or summary vector (one per code bit).
    pub fn dims(&self) -> usize {
        self.code_bytes as usize * 8
    }

    /// Bytes of one slot's summary: D int4 values and an f16 scale.
    pub fn summary_bytes(&self) -> usize {
        self.dims() / 2 + 2
    }

    /// Bytes of every slot's summary in one record.
    pub fn summaries_len(&self) -> usize {
        self.slots as usize * self.summary_bytes()
    }

    /// Payload bytes of a record of `n` tokens.
    pub fn payload_len(&self, n: usize) -> usize {
        self.summaries_len()
            + n * (self.id_bytes as usize
                + self.slots as usize * self.code_bytes as usize
                + self.extra_bytes as usize)
    }

    /// Bytes on disk of a record of `n` tokens, header included.
    pub fn record_len(&self, n: usize) -> u64 {
        (RECORD_HEADER + self.payload_len(n)) as u64
    }

    /// Where each part of a record's payload starts, for `n` tokens:
    /// summaries, ids, codes (`[slot][token][code_bytes]`), extra.
    pub fn payload_parts(&self, n: usize) -> PayloadParts {
        let ids = self.summaries_len();
        let codes = ids + n * self.id_bytes as usize;
        let extra = codes + n * self.slots as usize * self.code_bytes as usize;
        PayloadParts {
            ids,
            codes,
            extra,
            end: extra + n * self.extra_bytes as usize,
        }
    }

    pub(crate) fn validate(&self, path: &Path) -> Result<()> {
        let bad = |field, value: u32, why: &str| Error::BadField {
            path: path.to_path_buf(),
            field,
            value: value as u64,
            why: why.to_string(),
        };
        if !(1..=u16::MAX as u32).contains(&self.block_tokens) {
            return Err(bad("block_tokens", self.block_tokens, "must be 1..=65535"));
        }
        if !(1..=4096).contains(&self.slots) {
            return Err(bad("slots", self.slots, "must be 1..=4096"));
        }
        if !(1..=512).contains(&self.code_bytes) {
            return Err(bad("code_bytes", self.code_bytes, "must be 1..=512"));
        }
        if self.extra_bytes > 1 << 16 {
            return Err(bad(
                "extra_bytes",
                self.extra_bytes,
                "must be at most 65536",
            ));
        }
        if self.id_bytes != 2 && self.id_bytes != 4 {
            return Err(bad("id_bytes", self.id_bytes, "must be 2 or 4"));
        }
        let max = self.record_len(self.block_tokens as usize);
        if max > MAX_RECORD {
            return Err(Error::BadField {
                path: path.to_path_buf(),
                field: "block_tokens",
                value: self.block_tokens as u64,
                why: format!(
                    "the geometry gives records of {max} bytes, more than the {MAX_RECORD}-byte limit"
                ),
            });
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadParts {
    pub ids: usize,
    pub codes: usize,
    pub extra: usize,
    pub end: usize,
}

/// The file header, written once at creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    /// Random at creation: ties a derived index to this very file.
    pub file_id: [u8; 16],
    /// The caller's model fingerprint (tensors and tokenizer).
    pub fingerprint: [u8; 32],
    pub geometry: Geometry,
    /// Opaque to the store: the caller's slot list, rotation seed, means.
    pub params: Vec<u8>,
}

impl Header {
    pub fn encoded_len(&self) -> usize {
        HEADER_FIXED + self.params.len() + 4
    }

    /// The commit page follows the header on its own page.
    pub fn commit_offset(&self) -> u64 {
        (self.encoded_len() as u64).div_ceil(PAGE) * PAGE
    }

    /// Where the first record starts.
    pub fn data_start(&self) -> u64 {
        self.commit_offset() + PAGE
    }

    pub fn encode(&self) -> Vec<u8> {
        let g = &self.geometry;
        let mut b = Vec::with_capacity(self.encoded_len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.encoded_len() as u32).to_le_bytes());
        b.extend_from_slice(&self.file_id);
        b.extend_from_slice(&self.fingerprint);
        for v in [
            g.block_tokens,
            g.slots,
            g.dims_u32(),
            g.code_bytes,
            g.extra_bytes,
            g.id_bytes,
            self.params.len() as u32,
            0,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        debug_assert_eq!(b.len(), HEADER_FIXED);
        b.extend_from_slice(&self.params);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Bytes the decoder needs before it can tell the header's full length.
    pub const PREFIX: usize = HEADER_FIXED;

    /// Decode and check a header from the start of a file of `file_len`
    /// bytes; `bytes` holds at least `min(file_len, PREFIX)` bytes, and
    /// the whole header if it is longer (ask [`Header::needed_len`]).
    pub fn decode(path: &Path, bytes: &[u8], file_len: u64) -> Result<Header> {
        if bytes.len() < 8 || &bytes[..8] != MAGIC {
            let found = String::from_utf8_lossy(&bytes[..bytes.len().min(8)]).into_owned();
            return Err(Error::NotMemoryFile {
                path: path.to_path_buf(),
                found,
            });
        }
        let needed = Header::needed_len(bytes).unwrap_or(HEADER_FIXED as u64);
        if (bytes.len() as u64) < needed.max(HEADER_FIXED as u64) {
            return Err(Error::HeaderTruncated {
                path: path.to_path_buf(),
                len: file_len,
                needed: needed.max(HEADER_FIXED as u64),
            });
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let version = u32_at(8);
        if version > VERSION {
            return Err(Error::NewerVersion {
                path: path.to_path_buf(),
                found: version,
                supported: VERSION,
            });
        }
        if version != VERSION {
            return Err(Error::BadVersion {
                path: path.to_path_buf(),
                found: version,
                supported: VERSION,
            });
        }
        let header_len = u32_at(12) as usize;
        let params_len = u32_at(88) as usize;
        if params_len > MAX_PARAMS {
            return Err(Error::BadField {
                path: path.to_path_buf(),
                field: "params_len",
                value: params_len as u64,
                why: format!("more than the {MAX_PARAMS}-byte limit"),
            });
        }
        if header_len != HEADER_FIXED + params_len + 4 {
            return Err(Error::BadField {
                path: path.to_path_buf(),
                field: "header_len",
                value: header_len as u64,
                why: format!(
                    "must be {} for {params_len} bytes of params",
                    HEADER_FIXED + params_len + 4
                ),
            });
        }
        let stored = u32_at(header_len - 4);
        let computed = crc32c::crc32c(&bytes[..header_len - 4]);
        if stored != computed {
            return Err(Error::HeaderChecksum {
                path: path.to_path_buf(),
                stored,
                computed,
            });
        }
        let geometry = Geometry {
            block_tokens: u32_at(64),
            slots: u32_at(68),
            code_bytes: u32_at(76),
            extra_bytes: u32_at(80),
            id_bytes: u32_at(84),
        };
        let dims = u32_at(72);
        if dims as u64 != geometry.code_bytes as u64 * 8 {
            return Err(Error::BadField {
                path: path.to_path_buf(),
                field: "dims",
                value: dims as u64,
                why: format!(
                    "must be 8 × code_bytes = {} (one dimension per code bit)",
                    geometry.code_bytes as u64 * 8
                ),
            });
        }
        geometry.validate(path)?;
        let h = Header {
            version,
            file_id: bytes[16..32].try_into().unwrap(),
            fingerprint: bytes[32..64].try_into().unwrap(),
            geometry,
            params: bytes[HEADER_FIXED..HEADER_FIXED + params_len].to_vec(),
        };
        if file_len < h.data_start() {
            return Err(Error::HeaderTruncated {
                path: path.to_path_buf(),
                len: file_len,
                needed: h.data_start(),
            });
        }
        Ok(h)
    }

    /// The header's full length as its fixed part declares it (capped so a
    /// hostile value cannot ask for a large read), once `PREFIX` bytes are
    /// in hand.
    pub fn needed_len(prefix: &[u8]) -> Option<u64> {
        if prefix.len() < HEADER_FIXED {
            return None;
        }
        let len = u32::from_le_bytes(prefix[12..16].try_into().unwrap()) as u64;
        Some(len.min((HEADER_FIXED + MAX_PARAMS + 4) as u64))
    }
}

impl Geometry {
    fn dims_u32(&self) -> u32 {
        self.code_bytes * 8
    }
}

/// One of the two commit slots: the file length and block count that an
/// `fdatasync` has made durable. Written after the sync, alternating slots,
/// so the newer valid one is a lower bound of what is on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitMark {
    pub generation: u64,
    pub end: u64,
    pub blocks: u64,
}

impl CommitMark {
    pub fn encode(&self) -> [u8; COMMIT_SLOT] {
        let mut b = [0u8; COMMIT_SLOT];
        b[0..4].copy_from_slice(COMMIT_MAGIC);
        b[8..16].copy_from_slice(&self.generation.to_le_bytes());
        b[16..24].copy_from_slice(&self.end.to_le_bytes());
        b[24..32].copy_from_slice(&self.blocks.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&b[0..4]), &b[8..32]);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<CommitMark> {
        if b.len() < COMMIT_SLOT || &b[0..4] != COMMIT_MAGIC {
            return None;
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&b[0..4]), &b[8..32]);
        if crc != u32::from_le_bytes(b[4..8].try_into().unwrap()) {
            return None;
        }
        let u = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        Some(CommitMark {
            generation: u(8),
            end: u(16),
            blocks: u(24),
        })
    }

    /// Offset of the slot this generation is written to.
    pub fn slot_offset(commit_page: u64, generation: u64) -> u64 {
        commit_page + (generation % 2) * COMMIT_SLOT_STRIDE
    }
}

/// A record's fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub n_tokens: u16,
    pub flags: u16,
    pub seq: u64,
    pub first_token: u64,
    pub payload_len: u32,
    pub crc: u32,
}

impl RecordHeader {
    /// The header bytes with the crc field zeroed, as the checksum sees
    /// them; the checksum runs over these 28 bytes and then the payload.
    pub fn encode_without_crc(&self) -> [u8; RECORD_HEADER] {
        let mut b = [0u8; RECORD_HEADER];
        b[0..4].copy_from_slice(RECORD_MAGIC);
        b[4..6].copy_from_slice(&self.n_tokens.to_le_bytes());
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_token.to_le_bytes());
        b[24..28].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    pub fn checksum(head: &[u8; RECORD_HEADER], payload: &[u8]) -> u32 {
        crc32c::crc32c_append(crc32c::crc32c(&head[..28]), payload)
    }

    /// Parse the fixed fields; `None` if the magic is wrong.
    pub fn decode(b: &[u8]) -> Option<RecordHeader> {
        if b.len() < RECORD_HEADER || &b[0..4] != RECORD_MAGIC {
            return None;
        }
        Some(RecordHeader {
            n_tokens: u16::from_le_bytes([b[4], b[5]]),
            flags: u16::from_le_bytes([b[6], b[7]]),
            seq: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            first_token: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            payload_len: u32::from_le_bytes(b[24..28].try_into().unwrap()),
            crc: u32::from_le_bytes(b[28..32].try_into().unwrap()),
        })
    }

    /// What is wrong with this header for the record expected at `seq`
    /// starting at history index `first_token`, if anything.
    pub fn check(&self, g: &Geometry, seq: u64, first_token: u64) -> Option<String> {
        if self.seq != seq {
            return Some(format!(
                "sequence number {} where {seq} was expected",
                self.seq
            ));
        }
        if self.n_tokens == 0 || self.n_tokens as u32 > g.block_tokens {
            return Some(format!(
                "{} tokens (a block holds 1..={})",
                self.n_tokens, g.block_tokens
            ));
        }
        if self.payload_len as usize != g.payload_len(self.n_tokens as usize) {
            return Some(format!(
                "payload length {} where {} tokens need {}",
                self.payload_len,
                self.n_tokens,
                g.payload_len(self.n_tokens as usize)
            ));
        }
        if self.first_token != first_token {
            return Some(format!(
                "first token {} where the history is at {first_token}",
                self.first_token
            ));
        }
        None
    }
}

/// Int4 summaries: D values as nibbles (value + 8, two per byte, even dims
/// in the low nibble) after one f16 scale, `x ≈ scale · (nibble − 8)`.
pub mod summary {
    use half::f16;

    /// Quantize `x` (D values) into `out` (D/2 + 2 bytes): scale =
    /// max|x| / 7 so the symmetric range −7..=7 holds every value.
    pub fn quantize(x: &[f32], out: &mut [u8]) {
        assert_eq!(x.len() % 2, 0);
        assert_eq!(out.len(), x.len() / 2 + 2);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = f16::from_f32(amax / 7.0);
        let s = scale.to_f32();
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        out[..2].copy_from_slice(&scale.to_le_bytes());
        for (i, pair) in x.chunks_exact(2).enumerate() {
            let q = |v: f32| ((v * inv).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
            out[2 + i] = q(pair[0]) | (q(pair[1]) << 4);
        }
    }

    pub fn scale(s: &[u8]) -> f32 {
        f16::from_le_bytes([s[0], s[1]]).to_f32()
    }

    /// The int4 values of a summary, −8..=7.
    pub fn values(s: &[u8]) -> impl Iterator<Item = i8> + '_ {
        s[2..]
            .iter()
            .flat_map(|&b| [(b & 15) as i8 - 8, (b >> 4) as i8 - 8])
    }

    pub fn dequantize(s: &[u8], out: &mut [f32]) {
        let sc = scale(s);
        for (o, v) in out.iter_mut().zip(values(s)) {
            *o = sc * v as f32;
        }
    }
}
