//! Opening, creating and appending to a memory file: the lock, the scan that
//! rebuilds the index and finds a torn tail, commits, and the roll-back on a
//! failed write. Reads use `pread` only (no mmap: a file cut short under a
//! reader must give an error, not SIGBUS).

use crate::error::{Error, Result};
use crate::format::{
    CommitMark, Geometry, Header, RecordHeader, MAX_PARAMS, PAGE, RECORD_HEADER, VERSION,
};
use crate::index::{BlockMeta, Index};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Shares the file with other readers and one writer; never changes it.
    Read,
    /// Holds the exclusive lock; cuts a torn tail; appends.
    Write,
}

/// What opening found besides the records it indexed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Bytes past the last valid record: a torn tail (a writer cut them; a
    /// reader ignored them).
    pub tail_bytes: u64,
    /// Why the first byte past the last valid record is not a record.
    pub tail_reason: Option<String>,
    /// `(file length, committed length)` when the file ends before what its
    /// last commit recorded: it was cut short from outside (or power was
    /// lost on a disk that does not honour flushes).
    pub truncated_below_commit: Option<(u64, u64)>,
    /// Neither commit slot was readable; every record was checked as if
    /// uncommitted.
    pub commit_area_damaged: bool,
    /// Blocks whose index entries came from the index file `NAME.idx`
    /// rather than from reading their records.
    pub from_index_file: u64,
}

/// One block read back from the file (checksum verified).
#[derive(Clone, Debug)]
pub struct Block {
    pub index: u64,
    pub first_token: u64,
    pub flags: u16,
    geometry: Geometry,
    n: usize,
    payload: Vec<u8>,
}

impl Block {
    pub fn n_tokens(&self) -> usize {
        self.n
    }

    pub fn ids(&self) -> Vec<u32> {
        let p = self.geometry.payload_parts(self.n);
        let raw = &self.payload[p.ids..p.codes];
        match self.geometry.id_bytes {
            2 => raw
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
                .collect(),
            _ => raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        }
    }

    /// Slot `slot`'s codes, `[token][code_bytes]`.
    pub fn codes(&self, slot: usize) -> &[u8] {
        let p = self.geometry.payload_parts(self.n);
        let len = self.n * self.geometry.code_bytes as usize;
        &self.payload[p.codes + slot * len..p.codes + (slot + 1) * len]
    }

    /// Every slot's codes, `[slot][token][code_bytes]`.
    pub fn all_codes(&self) -> &[u8] {
        let p = self.geometry.payload_parts(self.n);
        &self.payload[p.codes..p.extra]
    }

    pub fn extra(&self) -> &[u8] {
        let p = self.geometry.payload_parts(self.n);
        &self.payload[p.extra..p.end]
    }

    /// Slot `slot`'s summary (f16 scale, then nibbles).
    pub fn summary(&self, slot: usize) -> &[u8] {
        let sb = self.geometry.summary_bytes();
        &self.payload[slot * sb..(slot + 1) * sb]
    }
}

/// A block to append. Codes are `[slot][token][code_bytes]`, extra bytes
/// `[token][extra_bytes]`, summaries `[slot][summary bytes]` (see
/// [`crate::format::summary::quantize`]).
#[derive(Clone, Copy, Debug)]
pub struct BlockIn<'a> {
    pub ids: &'a [u32],
    pub codes: &'a [u8],
    pub extra: &'a [u8],
    pub summaries: &'a [u8],
    pub flags: u16,
}

/// An open memory file and its index.
#[derive(Debug)]
pub struct MemoryFile {
    path: PathBuf,
    file: File,
    header: Header,
    mode: Mode,
    index: Index,
    /// End of the last record.
    end: u64,
    mark: CommitMark,
    committed_end: u64,
    committed_blocks: u64,
    report: OpenReport,
    /// The derived index file, kept by writers (see [`crate::sidecar`]).
    sidecar: Option<crate::sidecar::Writer>,
    #[cfg(test)]
    pub(crate) fail_writes_after: Option<u64>,
}

fn random_id() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 16];
    for (i, half) in out.chunks_exact_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// Write `bytes` to a new file, sync it, and only then give it the name
/// `path` (failing if the name exists): an `O_TMPFILE` file linked into
/// place, so a crash at any point leaves no file and no stray temporary;
/// on file systems without `O_TMPFILE`, a named temporary hard-linked into
/// place (a crash can then leave `NAME.creating-PID` behind, never a torn
/// file under `NAME`).
fn create_unnamed(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use rustix::fs::{linkat, openat, AtFlags, Mode, OFlags, CWD};
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(fd) = openat(
        CWD,
        dir,
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    ) {
        let f = File::from(fd);
        f.write_all_at(bytes, 0)?;
        f.sync_all()?;
        let proc_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f));
        if linkat(CWD, proc_path.as_str(), CWD, path, AtFlags::SYMLINK_FOLLOW).is_ok() {
            return Ok(());
        }
        if path.exists() {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".creating-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = (|| -> io::Result<()> {
        let f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all_at(bytes, 0)?;
        f.sync_all()
    })();
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    linked
}

fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

impl MemoryFile {
    /// Create a new memory file and open it for writing. The header is
    /// written to a temporary file, synced, then linked into place (which
    /// fails if `path` exists) and the directory synced, so a crash leaves
    /// either no file or a whole header.
    pub fn create(
        path: &Path,
        fingerprint: [u8; 32],
        geometry: Geometry,
        params: &[u8],
    ) -> Result<MemoryFile> {
        geometry.validate(path)?;
        if params.len() > MAX_PARAMS {
            return Err(Error::BadField {
                path: path.to_path_buf(),
                field: "params_len",
                value: params.len() as u64,
                why: format!("more than the {MAX_PARAMS}-byte limit"),
            });
        }
        let header = Header {
            version: VERSION,
            file_id: random_id(),
            fingerprint,
            geometry,
            params: params.to_vec(),
        };
        let mut bytes = header.encode();
        bytes.resize(header.data_start() as usize, 0);
        let mark = CommitMark {
            generation: 0,
            end: header.data_start(),
            blocks: 0,
        };
        let at = CommitMark::slot_offset(header.commit_offset(), 0) as usize;
        bytes[at..at + mark.encode().len()].copy_from_slice(&mark.encode());

        match create_unnamed(path, &bytes) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(Error::Exists {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => return Err(Error::io(path, "creating", e)),
        }
        sync_dir(path).map_err(|e| Error::io(path, "syncing the directory", e))?;
        MemoryFile::open(path, Some(&fingerprint), Mode::Write)
    }

    /// Open a memory file. With `fingerprint`, a file built for another
    /// model is refused. A writer takes the exclusive lock (another writer
    /// gets [`Error::Locked`]) and cuts a torn tail; a reader takes no lock
    /// and ignores one.
    pub fn open(path: &Path, fingerprint: Option<&[u8; 32]>, mode: Mode) -> Result<MemoryFile> {
        let file = open_regular(path, mode == Mode::Write)?;
        if mode == Mode::Write {
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(Error::Locked {
                        path: path.to_path_buf(),
                    })
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(path, "locking", e)),
            }
        }
        let header = read_header(path, &file)?;
        if let Some(fp) = fingerprint {
            if *fp != header.fingerprint {
                return Err(Error::FingerprintMismatch {
                    path: path.to_path_buf(),
                    file: header.fingerprint,
                    expected: *fp,
                });
            }
        }
        // The commit mark before the length: a writer moves the mark only
        // after the records it covers are on disk, so a length read later
        // is never below a mark read earlier unless the file was cut.
        let mut page = vec![0u8; PAGE as usize];
        file.read_exact_at(&mut page, header.commit_offset())
            .map_err(|e| Error::io(path, "reading the commit page", e))?;
        let mark = read_mark(&page);
        let len = file
            .metadata()
            .map_err(|e| Error::io(path, "reading the file size", e))?
            .len();
        let mut report = OpenReport {
            commit_area_damaged: mark.is_none(),
            from_index_file: 0,
            ..OpenReport::default()
        };
        let mark = mark.unwrap_or(CommitMark {
            generation: 0,
            end: header.data_start(),
            blocks: 0,
        });

        // Without an index file, opening reads ~1.3 KB at the start of
        // every ~20 KB record: measured on this project's VM disk, one
        // sequential stream (large readahead) beat reading just those pages
        // (random 4 KB reads) by about 3×.
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Sequential);
        let loaded = crate::sidecar::load(path, &file, &header, len, mark.end);
        let from_index_file = loaded.as_ref().map_or(0, |l| l.index.len() as u64);
        let scan = scan_records(path, &file, &header, len, mark.end, loaded);
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Normal);
        let scan = scan?;
        let end = scan.end;
        if let Some((offset, why)) = &scan.bad {
            if *offset < mark.end && len >= mark.end {
                return Err(Error::Damaged {
                    path: path.to_path_buf(),
                    block: scan.index.len() as u64,
                    offset: *offset,
                    why: why.clone(),
                });
            }
            report.tail_reason = Some(why.clone());
        }
        if end < mark.end {
            report.truncated_below_commit = Some((len, mark.end));
        }
        report.tail_bytes = len - end;
        report.from_index_file = from_index_file;

        let mut mf = MemoryFile {
            path: path.to_path_buf(),
            file,
            header,
            mode,
            committed_blocks: scan.index.len() as u64,
            index: scan.index,
            end,
            mark,
            committed_end: end,
            report,
            sidecar: None,
            #[cfg(test)]
            fail_writes_after: None,
        };
        if mode == Mode::Write && (len > end || mark.end > end) {
            mf.file
                .set_len(end)
                .map_err(|e| Error::io(path, "cutting the torn tail", e))?;
            mf.file
                .sync_data()
                .map_err(|e| Error::io(path, "syncing after cutting the torn tail", e))?;
            if mark.end > end {
                mf.write_mark()?;
            }
        } else if mode == Mode::Write && mark.end < end {
            // Records past the mark survived (written, not yet committed,
            // when the last writer stopped): make them committed so damage
            // to them later is reported, not cut.
            mf.commit()?;
        }
        if mode == Mode::Write {
            // Derived data: failing to keep it only costs the next open time.
            let valid = (from_index_file as usize).min(mf.index.len());
            mf.sidecar = crate::sidecar::Writer::open(path, &mf.header, valid)
                .and_then(|mut w| w.extend(&mf.index).map(|()| w))
                .ok();
        }
        Ok(mf)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn geometry(&self) -> &Geometry {
        &self.header.geometry
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    /// Blocks in the file, committed or not.
    pub fn len_blocks(&self) -> u64 {
        self.index.len() as u64
    }

    pub fn len_tokens(&self) -> u64 {
        self.index.tokens()
    }

    /// Blocks an `fdatasync` has made durable.
    pub fn committed_blocks(&self) -> u64 {
        self.committed_blocks
    }

    /// Bytes of the file up to the last record.
    pub fn file_bytes(&self) -> u64 {
        self.end
    }

    /// Append one block after the last; returns its index. The record is
    /// written at once (so reads see it) but is durable only after
    /// [`MemoryFile::commit`]. On a write error (disk full included) every
    /// uncommitted block is dropped, the file is cut back to its last
    /// commit, and the error says so.
    pub fn append(&mut self, b: &BlockIn) -> Result<u64> {
        if self.mode != Mode::Write {
            return Err(Error::ReadOnly {
                path: self.path.clone(),
            });
        }
        let g = self.header.geometry;
        let n = b.ids.len();
        if n == 0 || n > g.block_tokens as usize {
            return Err(Error::BadBlock(format!(
                "{n} tokens (a block holds 1..={})",
                g.block_tokens
            )));
        }
        let want = |what: &str, got: usize, need: usize| {
            if got == need {
                Ok(())
            } else {
                Err(Error::BadBlock(format!(
                    "{what}: {got} bytes where {n} tokens need {need}"
                )))
            }
        };
        want(
            "codes",
            b.codes.len(),
            g.slots as usize * n * g.code_bytes as usize,
        )?;
        want("extra", b.extra.len(), n * g.extra_bytes as usize)?;
        want("summaries", b.summaries.len(), g.summaries_len())?;
        let seq = self.index.len() as u64;
        let first_token = self.index.tokens();
        let mut rec = Vec::with_capacity(g.record_len(n) as usize);
        rec.resize(RECORD_HEADER, 0);
        rec.extend_from_slice(b.summaries);
        for (t, &id) in b.ids.iter().enumerate() {
            if g.id_bytes == 2 {
                let id = u16::try_from(id).map_err(|_| {
                    Error::BadBlock(format!(
                        "token {t} has id {id}, which does not fit the file's 2-byte ids"
                    ))
                })?;
                rec.extend_from_slice(&id.to_le_bytes());
            } else {
                rec.extend_from_slice(&id.to_le_bytes());
            }
        }
        rec.extend_from_slice(b.codes);
        rec.extend_from_slice(b.extra);
        let mut h = RecordHeader {
            n_tokens: n as u16,
            flags: b.flags,
            seq,
            first_token,
            payload_len: g.payload_len(n) as u32,
            crc: 0,
        };
        let head = h.encode_without_crc();
        h.crc = RecordHeader::checksum(&head, &rec[RECORD_HEADER..]);
        rec[..RECORD_HEADER].copy_from_slice(&head);
        rec[28..32].copy_from_slice(&h.crc.to_le_bytes());
        debug_assert_eq!(rec.len() as u64, g.record_len(n));

        if let Err(e) = self.write_at(&rec, self.end) {
            return Err(self.roll_back(e));
        }
        self.index.push(
            BlockMeta {
                offset: self.end,
                first_token,
                n_tokens: n as u16,
                flags: b.flags,
                crc: h.crc,
            },
            b.summaries,
        );
        self.end += rec.len() as u64;
        Ok(seq)
    }

    /// Make every appended block durable: `fdatasync`, then record the new
    /// committed length in the commit slot (itself made durable by the next
    /// sync; until then the older slot is the lower bound).
    pub fn commit(&mut self) -> Result<()> {
        if self.mode != Mode::Write {
            return Err(Error::ReadOnly {
                path: self.path.clone(),
            });
        }
        if self.end == self.committed_end && self.mark.end == self.end {
            return Ok(());
        }
        if let Err(e) = self.file.sync_data() {
            return Err(self.roll_back(e));
        }
        self.committed_end = self.end;
        self.committed_blocks = self.index.len() as u64;
        self.write_mark()?;
        if let Some(s) = &mut self.sidecar {
            if s.extend(&self.index).is_err() {
                self.sidecar = None;
            }
        }
        Ok(())
    }

    fn write_mark(&mut self) -> Result<()> {
        let mark = CommitMark {
            generation: self.mark.generation + 1,
            end: self.end,
            blocks: self.index.len() as u64,
        };
        let at = CommitMark::slot_offset(self.header.commit_offset(), mark.generation);
        self.file
            .write_all_at(&mark.encode(), at)
            .map_err(|e| Error::io(&self.path, "writing the commit mark", e))?;
        self.mark = mark;
        Ok(())
    }

    fn write_at(&mut self, buf: &[u8], at: u64) -> io::Result<()> {
        #[cfg(test)]
        if let Some(budget) = self.fail_writes_after {
            // Simulated disk full: write what fits, then fail as ENOSPC.
            let fits = (budget as usize).min(buf.len());
            self.file.write_all_at(&buf[..fits], at)?;
            self.fail_writes_after = Some(budget - fits as u64);
            if fits < buf.len() {
                return Err(io::Error::from_raw_os_error(28));
            }
            return Ok(());
        }
        self.file.write_all_at(buf, at)
    }

    fn roll_back(&mut self, source: io::Error) -> Error {
        match self.file.set_len(self.committed_end) {
            Ok(()) => {
                self.index.truncate(self.committed_blocks as usize);
                self.end = self.committed_end;
                Error::Write {
                    path: self.path.clone(),
                    committed_blocks: self.committed_blocks,
                    source,
                }
            }
            Err(cut) => {
                self.index.truncate(self.committed_blocks as usize);
                self.end = self.committed_end;
                Error::WriteUnrecovered {
                    path: self.path.clone(),
                    source,
                    cut,
                }
            }
        }
    }

    /// Hint that block `block` will be read soon (`POSIX_FADV_WILLNEED`:
    /// the kernel starts reading it without waiting).
    pub fn prefetch(&self, block: u64) {
        if let Some(m) = self.index.metas().get(block as usize) {
            let len = self.header.geometry.record_len(m.n_tokens as usize);
            let _ = rustix::fs::fadvise(
                &self.file,
                m.offset,
                std::num::NonZeroU64::new(len),
                rustix::fs::Advice::WillNeed,
            );
        }
    }

    /// Read block `block` back (checksum verified).
    pub fn read_block(&self, block: u64) -> Result<Block> {
        let mut buf = Vec::new();
        self.read_record(block, &mut buf)?;
        let m = *self.index.meta(block as usize);
        buf.drain(..RECORD_HEADER);
        Ok(Block {
            index: block,
            first_token: m.first_token,
            flags: m.flags,
            geometry: self.header.geometry,
            n: m.n_tokens as usize,
            payload: buf,
        })
    }

    /// Read record `block` (header and payload) into `buf`, checking its
    /// checksum against the one the index holds.
    pub(crate) fn read_record(&self, block: u64, buf: &mut Vec<u8>) -> Result<()> {
        if block >= self.len_blocks() {
            return Err(Error::NoSuchBlock {
                block,
                len: self.len_blocks(),
            });
        }
        let m = *self.index.meta(block as usize);
        let len = self.header.geometry.record_len(m.n_tokens as usize) as usize;
        buf.resize(len, 0);
        self.file
            .read_exact_at(buf, m.offset)
            .map_err(|e| Error::io(&self.path, "reading a block", e))?;
        let head: [u8; RECORD_HEADER] = buf[..RECORD_HEADER].try_into().unwrap();
        let computed = RecordHeader::checksum(&head, &buf[RECORD_HEADER..]);
        let stored = u32::from_le_bytes(head[28..32].try_into().unwrap());
        if computed != stored || stored != m.crc {
            return Err(Error::RecordChecksum {
                path: self.path.clone(),
                block,
                offset: m.offset,
                stored,
                computed,
            });
        }
        Ok(())
    }
}

pub(crate) fn read_header(path: &Path, file: &File) -> Result<Header> {
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "reading the file size", e))?
        .len();
    let mut prefix = vec![0u8; (Header::PREFIX as u64).min(len) as usize];
    file.read_exact_at(&mut prefix, 0)
        .map_err(|e| Error::io(path, "reading the header", e))?;
    let bytes = match Header::needed_len(&prefix) {
        Some(need) if need > prefix.len() as u64 => {
            let mut b = vec![0u8; need.min(len) as usize];
            file.read_exact_at(&mut b, 0)
                .map_err(|e| Error::io(path, "reading the header", e))?;
            b
        }
        _ => prefix,
    };
    Header::decode(path, &bytes, len)
}

/// The newer readable commit slot of a commit page.
pub(crate) fn read_mark(page: &[u8]) -> Option<CommitMark> {
    let a = CommitMark::decode(page);
    let b = CommitMark::decode(&page[crate::format::COMMIT_SLOT_STRIDE as usize..]);
    match (a, b) {
        (Some(a), Some(b)) => Some(if a.generation >= b.generation { a } else { b }),
        (a, b) => a.or(b),
    }
}

pub(crate) struct Scan {
    pub index: Index,
    /// End of the last valid record.
    pub end: u64,
    /// Offset and reason of the first thing that is not a valid record.
    pub bad: Option<(u64, String)>,
}

/// Walk the records from the first: check each header's chain (sequence,
/// history index, length) and, for records at or past `verify_from`, the
/// checksum. Records below it are committed and were checked when written;
/// [`crate::verify`] checks them all.
pub(crate) fn scan_records(
    path: &Path,
    file: &File,
    header: &Header,
    len: u64,
    verify_from: u64,
    from: Option<crate::sidecar::Loaded>,
) -> Result<Scan> {
    let g = header.geometry;
    let (mut index, mut off, mut first_token) = match from {
        Some(l) => (l.index, l.end, l.first_token),
        None => (Index::new(g), header.data_start(), 0),
    };
    // Full blocks are the common case: reserve for them, so a large
    // index is not grown by doubling (which can leave half of it unused).
    index.reserve((len.saturating_sub(off) / g.record_len(g.block_tokens as usize)) as usize);
    let mut head = vec![0u8; RECORD_HEADER + g.summaries_len()];
    let mut rec = Vec::new();
    let bad = loop {
        if off == len {
            break None;
        }
        let seq = index.len() as u64;
        if len - off < RECORD_HEADER as u64 {
            break Some((
                off,
                format!(
                    "the file ends {} bytes into block {seq}'s header",
                    len - off
                ),
            ));
        }
        let want = (head.len() as u64).min(len - off) as usize;
        file.read_exact_at(&mut head[..want], off)
            .map_err(|e| Error::io(path, "reading a record", e))?;
        let Some(h) = RecordHeader::decode(&head) else {
            break Some((off, format!("block {seq} has no record magic")));
        };
        if let Some(why) = h.check(&g, seq, first_token) {
            break Some((off, format!("block {seq}: {why}")));
        }
        let rlen = g.record_len(h.n_tokens as usize);
        if len - off < rlen {
            break Some((
                off,
                format!(
                    "the file ends {} bytes into block {seq}, which needs {rlen}",
                    len - off
                ),
            ));
        }
        if off + rlen > verify_from {
            rec.resize(rlen as usize, 0);
            file.read_exact_at(&mut rec, off)
                .map_err(|e| Error::io(path, "reading a record", e))?;
            let hb: [u8; RECORD_HEADER] = rec[..RECORD_HEADER].try_into().unwrap();
            let computed = RecordHeader::checksum(&hb, &rec[RECORD_HEADER..]);
            if computed != h.crc {
                break Some((
                    off,
                    format!(
                        "block {seq}: checksum mismatch (stored {:#010x}, computed {computed:#010x})",
                        h.crc
                    ),
                ));
            }
        }
        index.push(
            BlockMeta {
                offset: off,
                first_token,
                n_tokens: h.n_tokens,
                flags: h.flags,
                crc: h.crc,
            },
            &head[RECORD_HEADER..],
        );
        off += rlen;
        first_token += h.n_tokens as u64;
    };
    Ok(Scan {
        index,
        end: off,
        bad,
    })
}

/// Open `path` without blocking on a FIFO (a plain open waits for a
/// writer forever), and refuse anything but a regular file (issue 19).
pub(crate) fn open_regular(path: &Path, write: bool) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(|e| Error::io(path, "opening", e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, "opening", e))?;
    if !meta.is_file() {
        let e = std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, socket, device or directory)",
        );
        return Err(Error::io(path, "opening", e));
    }
    Ok(file)
}
