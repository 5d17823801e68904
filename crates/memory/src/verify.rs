//! `verify` (every record, every checksum, every problem reported) and
//! `inspect` (what a file holds), both read-only and lock-free.

use crate::error::{Error, Result};
use crate::format::{
    CommitMark, Geometry, RecordHeader, COMMIT_SLOT, COMMIT_SLOT_STRIDE, PAGE, RECORD_HEADER,
    RECORD_MAGIC,
};
use crate::store::{read_header, read_mark, MemoryFile, Mode};
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// One thing wrong with a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The block concerned, when the problem is in a record.
    pub block: Option<u64>,
    pub offset: u64,
    pub what: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.block {
            Some(b) => write!(f, "block {b} at byte {}: {}", self.offset, self.what),
            None => write!(f, "byte {}: {}", self.offset, self.what),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    /// Records whose header and checksum are valid.
    pub valid_blocks: u64,
    pub tokens: u64,
    pub file_bytes: u64,
    /// The newer readable commit mark.
    pub commit: Option<CommitMark>,
    /// Damage: a non-empty list means the file is not sound.
    pub problems: Vec<Problem>,
    /// Not damage: e.g. a torn tail past the last commit, which the next
    /// writer cuts.
    pub notes: Vec<String>,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Check every record of the file at `path`: header chain (sequence
/// numbers, history indices, lengths) and checksum, the commit slots, and
/// what lies past the last record. Bad records are skipped by their
/// declared length when it is sane, else by searching for the next record
/// magic, so every damaged stretch is reported, not just the first.
pub fn verify(path: &Path) -> Result<VerifyReport> {
    let file = crate::store::open_regular(path, false)?;
    let header = read_header(path, &file)?;
    let g = header.geometry;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "reading the file size", e))?
        .len();
    let mut rep = VerifyReport {
        file_bytes: len,
        ..VerifyReport::default()
    };
    let mut page = vec![0u8; PAGE as usize];
    file.read_exact_at(&mut page, header.commit_offset())
        .map_err(|e| Error::io(path, "reading the commit page", e))?;
    rep.commit = read_mark(&page);
    for slot in 0..2u64 {
        let at = (slot * COMMIT_SLOT_STRIDE) as usize;
        let bytes = &page[at..at + COMMIT_SLOT];
        if bytes.iter().any(|&b| b != 0) && CommitMark::decode(bytes).is_none() {
            rep.problems.push(Problem {
                block: None,
                offset: header.commit_offset() + at as u64,
                what: format!(
                    "commit slot {slot} is damaged (a torn commit write or bad bytes; the other slot rules and the next commit rewrites it)"
                ),
            });
        }
    }
    // Bytes nothing reads must stay zero, so damage there shows too.
    let mut pad = vec![0u8; (header.commit_offset() - header.encoded_len() as u64) as usize];
    file.read_exact_at(&mut pad, header.encoded_len() as u64)
        .map_err(|e| Error::io(path, "reading the header padding", e))?;
    if let Some(i) = pad.iter().position(|&b| b != 0) {
        rep.problems.push(Problem {
            block: None,
            offset: header.encoded_len() as u64 + i as u64,
            what: "non-zero byte in the padding after the header".into(),
        });
    }
    let stride = COMMIT_SLOT_STRIDE as usize;
    if let Some(i) = page.iter().enumerate().position(|(i, &b)| {
        b != 0 && !(i < COMMIT_SLOT || (stride..stride + COMMIT_SLOT).contains(&i))
    }) {
        rep.problems.push(Problem {
            block: None,
            offset: header.commit_offset() + i as u64,
            what: "non-zero byte in the commit page outside its two slots".into(),
        });
    }
    if rep.commit.is_none() {
        rep.problems.push(Problem {
            block: None,
            offset: header.commit_offset(),
            what: "neither commit slot is readable".into(),
        });
    }
    let committed = rep.commit.map_or(header.data_start(), |m| m.end);

    let mut off = header.data_start();
    let mut seq = 0u64;
    let mut first_token = 0u64;
    let mut rec = Vec::new();
    let mut last_good_end = off;
    let mut metas = Vec::new();
    while off < len {
        match check_record(&file, path, &g, off, len, seq, first_token, &mut rec)? {
            Ok(h) => {
                metas.push(crate::index::BlockMeta {
                    offset: off,
                    first_token,
                    n_tokens: h.n_tokens,
                    flags: h.flags,
                    crc: h.crc,
                });
                rep.valid_blocks += 1;
                rep.tokens += h.n_tokens as u64;
                first_token += h.n_tokens as u64;
                off += g.record_len(h.n_tokens as usize);
                last_good_end = off;
                seq += 1;
            }
            Err(why) => {
                // Find the next valid record to tell damage from a tail.
                let next = find_next_record(&file, path, &g, off + 1, len, &mut rec)?;
                match next {
                    Some((at, h)) => {
                        rep.problems.push(Problem {
                            block: Some(seq),
                            offset: off,
                            what: format!(
                                "{why}; {} bytes skipped to the next valid record (block {})",
                                at - off,
                                h.seq
                            ),
                        });
                        seq = h.seq;
                        first_token = h.first_token;
                        off = at;
                    }
                    None if off >= committed => {
                        rep.notes.push(format!(
                            "torn tail of {} bytes at byte {off} past the last commit ({why}); the next writer cuts it",
                            len - off
                        ));
                        break;
                    }
                    None => {
                        rep.problems.push(Problem {
                            block: Some(seq),
                            offset: off,
                            what: format!(
                                "{why}; nothing valid follows, but the last commit covers up to byte {committed}: committed blocks are lost"
                            ),
                        });
                        break;
                    }
                }
            }
        }
    }
    if off >= len && last_good_end < committed && rep.problems.is_empty() {
        rep.problems.push(Problem {
            block: Some(seq),
            offset: len,
            what: format!(
                "the file ends at byte {len}, before its committed length {committed}: it was cut short"
            ),
        });
    }
    if let Some(m) = rep.commit {
        if m.end == last_good_end && m.blocks != seq && rep.problems.is_empty() {
            rep.problems.push(Problem {
                block: None,
                offset: header.commit_offset(),
                what: format!(
                    "the commit mark counts {} blocks where the file holds {seq}",
                    m.blocks
                ),
            });
        }
    }
    if rep.problems.is_empty() {
        check_index_file(path, &file, &header, len, committed, &metas, &mut rep);
    }
    Ok(rep)
}

/// The derived index file must agree with the records it covers (open
/// checks only its last entry against the data file).
fn check_index_file(
    path: &Path,
    file: &File,
    header: &crate::Header,
    len: u64,
    committed: u64,
    metas: &[crate::index::BlockMeta],
    rep: &mut VerifyReport,
) {
    let idx = crate::sidecar::path_for(path);
    if !idx.exists() {
        rep.notes
            .push("no index file: opening reads every record".into());
        return;
    }
    match crate::sidecar::load(path, file, header, len, committed) {
        None => rep.notes.push(format!(
            "index file {} does not match this file; the next writer rewrites it",
            idx.display()
        )),
        Some(l) => {
            if let Some(i) = (0..l.index.len()).find(|&i| metas.get(i) != Some(l.index.meta(i))) {
                rep.problems.push(Problem {
                    block: Some(i as u64),
                    offset: metas.get(i).map_or(0, |m| m.offset),
                    what: format!(
                        "the index file {} disagrees with this block; delete it (it is derived, and rebuilt)",
                        idx.display()
                    ),
                });
            } else if let Some(i) = (0..l.index.len()).find(|&i| {
                l.index.summaries(i) != read_summaries(file, header, &metas[i]).as_slice()
            }) {
                rep.problems.push(Problem {
                    block: Some(i as u64),
                    offset: metas[i].offset,
                    what: format!(
                        "the index file {} holds other summaries for this block; delete it (it is derived, and rebuilt)",
                        idx.display()
                    ),
                });
            } else {
                rep.notes.push(format!(
                    "index file covers {} of {} blocks",
                    l.index.len(),
                    metas.len()
                ));
            }
        }
    }
}

fn read_summaries(file: &File, header: &crate::Header, m: &crate::index::BlockMeta) -> Vec<u8> {
    let mut b = vec![0u8; header.geometry.summaries_len()];
    let _ = file.read_exact_at(&mut b, m.offset + RECORD_HEADER as u64);
    b
}

#[allow(clippy::too_many_arguments)]
fn check_record(
    file: &File,
    path: &Path,
    g: &Geometry,
    off: u64,
    len: u64,
    seq: u64,
    first_token: u64,
    rec: &mut Vec<u8>,
) -> Result<std::result::Result<RecordHeader, String>> {
    if len - off < RECORD_HEADER as u64 {
        return Ok(Err(format!(
            "the file ends {} bytes into a record header",
            len - off
        )));
    }
    let mut head = [0u8; RECORD_HEADER];
    file.read_exact_at(&mut head, off)
        .map_err(|e| Error::io(path, "reading a record", e))?;
    let Some(h) = RecordHeader::decode(&head) else {
        return Ok(Err("no record magic".into()));
    };
    if let Some(why) = h.check(g, seq, first_token) {
        return Ok(Err(why));
    }
    let rlen = g.record_len(h.n_tokens as usize);
    if len - off < rlen {
        return Ok(Err(format!(
            "the file ends {} bytes into the record, which needs {rlen}",
            len - off
        )));
    }
    rec.resize(rlen as usize, 0);
    file.read_exact_at(rec, off)
        .map_err(|e| Error::io(path, "reading a record", e))?;
    let computed = RecordHeader::checksum(&head, &rec[RECORD_HEADER..]);
    if computed != h.crc {
        return Ok(Err(format!(
            "checksum mismatch (stored {:#010x}, computed {computed:#010x})",
            h.crc
        )));
    }
    Ok(Ok(h))
}

/// The first offset at or after `from` holding a whole record whose
/// header is sane and whose checksum holds (any sequence number).
fn find_next_record(
    file: &File,
    path: &Path,
    g: &Geometry,
    from: u64,
    len: u64,
    rec: &mut Vec<u8>,
) -> Result<Option<(u64, RecordHeader)>> {
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK as usize + 3];
    let mut at = from;
    while at + RECORD_HEADER as u64 <= len {
        let n = (CHUNK + 3).min(len - at) as usize;
        file.read_exact_at(&mut buf[..n], at)
            .map_err(|e| Error::io(path, "reading", e))?;
        for i in 0..n.saturating_sub(3) {
            if &buf[i..i + 4] != RECORD_MAGIC {
                continue;
            }
            let off = at + i as u64;
            if len - off < RECORD_HEADER as u64 {
                return Ok(None);
            }
            let mut head = [0u8; RECORD_HEADER];
            file.read_exact_at(&mut head, off)
                .map_err(|e| Error::io(path, "reading", e))?;
            let Some(h) = RecordHeader::decode(&head) else {
                continue;
            };
            if h.check(g, h.seq, h.first_token).is_some() {
                continue;
            }
            let rlen = g.record_len(h.n_tokens as usize);
            if len - off < rlen {
                continue;
            }
            rec.resize(rlen as usize, 0);
            file.read_exact_at(rec, off)
                .map_err(|e| Error::io(path, "reading", e))?;
            if RecordHeader::checksum(&head, &rec[RECORD_HEADER..]) == h.crc {
                return Ok(Some((off, h)));
            }
        }
        at += CHUNK;
    }
    Ok(None)
}

/// What a memory file holds.
#[derive(Clone, Debug)]
pub struct Inspect {
    pub fingerprint: [u8; 32],
    pub version: u32,
    pub geometry: Geometry,
    pub params_bytes: usize,
    pub blocks: u64,
    pub partial_blocks: u64,
    pub doc_starts: u64,
    pub tokens: u64,
    pub file_bytes: u64,
    pub committed_blocks: Option<u64>,
    pub index_ram_bytes: usize,
    /// Blocks the index file `NAME.idx` covered on open (`None`: no file).
    pub index_file_blocks: Option<u64>,
    /// Bytes per token by part, for full blocks of this geometry.
    pub budget: Budget,
    pub tail_bytes: u64,
}

impl Inspect {
    pub fn bytes_per_token(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.file_bytes as f64 / self.tokens as f64
        }
    }
}

/// Where a full block's bytes go, per token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    pub ids: f64,
    pub codes: f64,
    pub extra: f64,
    pub summaries: f64,
    pub header: f64,
}

impl Budget {
    pub fn of(g: &Geometry) -> Budget {
        let b = g.block_tokens as f64;
        Budget {
            ids: g.id_bytes as f64,
            codes: (g.slots * g.code_bytes) as f64,
            extra: g.extra_bytes as f64,
            summaries: g.summaries_len() as f64 / b,
            header: RECORD_HEADER as f64 / b,
        }
    }

    pub fn total(&self) -> f64 {
        self.ids + self.codes + self.extra + self.summaries + self.header
    }
}

/// Open the file read-only and describe it.
pub fn inspect(path: &Path) -> Result<Inspect> {
    let mf = MemoryFile::open(path, None, Mode::Read)?;
    let h = mf.header();
    let idx = mf.index();
    let mut page = vec![0u8; PAGE as usize];
    let file = crate::store::open_regular(path, false)?;
    file.read_exact_at(&mut page, h.commit_offset())
        .map_err(|e| Error::io(path, "reading the commit page", e))?;
    Ok(Inspect {
        fingerprint: h.fingerprint,
        version: h.version,
        geometry: h.geometry,
        params_bytes: h.params.len(),
        blocks: idx.len() as u64,
        partial_blocks: idx
            .metas()
            .iter()
            .filter(|m| (m.n_tokens as u32) < h.geometry.block_tokens)
            .count() as u64,
        doc_starts: idx
            .metas()
            .iter()
            .filter(|m| m.flags & crate::format::FLAG_DOC_START != 0)
            .count() as u64,
        tokens: idx.tokens(),
        file_bytes: mf.file_bytes(),
        committed_blocks: read_mark(&page).map(|m| m.blocks),
        index_ram_bytes: idx.memory_bytes(),
        index_file_blocks: crate::sidecar::path_for(path)
            .exists()
            .then_some(mf.open_report().from_index_file),
        budget: Budget::of(&h.geometry),
        tail_bytes: mf.open_report().tail_bytes,
    })
}
