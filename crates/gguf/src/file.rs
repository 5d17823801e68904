//! An open GGUF file: the parsed header plus the bytes, memory-mapped by
//! default so tensor views cost nothing and pages are shared with the OS
//! cache.

use crate::error::{Error, ErrorKind, Result};
use crate::read::{parse_header, Header, Limits, TensorInfo};
use crate::split::{split_info, split_path, split_prefix, SplitInfo, SPLIT_COUNT};
use crate::split::{SPLIT_NO, SPLIT_TENSORS_COUNT};
use crate::value::Metadata;
use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// How to bring the file into memory.
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions {
    /// Memory-map (default) or read the whole file into memory.
    pub mmap: bool,
    /// Lock the pages in RAM (`mlock`), failing clearly if the OS refuses.
    pub mlock: bool,
    pub limits: Limits,
}

impl Default for OpenOptions {
    fn default() -> OpenOptions {
        OpenOptions {
            mmap: true,
            mlock: false,
            limits: Limits::default(),
        }
    }
}

/// Ask for transparent huge pages on an anonymous map before it is
/// filled: decode streams every weight once per token, and with 4 KiB
/// pages that is a TLB miss every 4 KiB. Advice only: where the kernel
/// has THP off (or it is not Linux) nothing changes.
fn advise_huge_pages(map: &memmap2::MmapMut) {
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}

/// How bound weights read a part of a file map once loading is done
/// ([`GgufFile::release_unused`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapUse {
    /// All of it, every token (a matrix without row tiles): its pages stay,
    /// huge pages welcome.
    EveryToken,
    /// A row now and then (an embedding table): its pages come back from
    /// the file a few at a time, as rows are read.
    ByRow,
}

/// The OS page size (4 KiB if it cannot be asked).
fn page_size() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            return p as usize;
        }
    }
    4096
}

/// The whole pages of `map` that `bytes` touches, as offsets from the
/// map's start (`None` if `bytes` is not inside it).
fn pages_of(map: &memmap2::Mmap, bytes: &[u8], page: usize) -> Option<(usize, usize)> {
    let base = map.as_ptr() as usize;
    let start = (bytes.as_ptr() as usize).checked_sub(base)?;
    let end = start + bytes.len();
    if end > map.len() || bytes.is_empty() {
        return None;
    }
    Some((start / page * page, end.div_ceil(page) * page))
}

/// Sorted, disjoint ranges covering `ranges`.
fn merged(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Open for reading without blocking on a FIFO (whose plain open waits
/// for a writer): the caller checks the type and refuses anything but a
/// regular file.
fn open_no_wait(path: &Path) -> std::io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NONBLOCK);
    }
    o.open(path)
}

/// One file of a model: the whole model, or one shard of a split model.
pub struct Shard {
    /// Declared before `map` so it is dropped (unregistered) before the
    /// map is unmapped.
    _guard: Option<mapguard::Registration>,
    path: PathBuf,
    /// File-backed map, or (with `mmap: false`) an anonymous map the file
    /// was read into: one type either way, and both can be `mlock`ed.
    map: memmap2::Mmap,
    /// Offset of this file's data section.
    data_offset: u64,
    /// Tensors whose data this file holds.
    n_tensors: usize,
}

impl Shard {
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Size of this file in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }
    /// Never true: empty files are refused.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// Offset of this file's data section from its start.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }
    /// How many tensors this file holds.
    pub fn n_tensors(&self) -> usize {
        self.n_tensors
    }

    fn err(&self, kind: ErrorKind) -> Error {
        Error::new(&self.path, kind)
    }

    fn mlock(&self) -> Result<()> {
        self.map.lock().map_err(|source| {
            self.err(ErrorKind::Mlock {
                bytes: self.map.len() as u64,
                source,
            })
        })
    }
}

/// An open model: one GGUF file, or every file of a split model (opened
/// through its first file, see [`crate::split`]) seen as one.
pub struct GgufFile {
    /// The file opened first; then, for a split model, the other shards in
    /// order.
    shards: Vec<Shard>,
    /// Whether the maps map the files themselves (not copies), so their
    /// pages can be dropped and read back ([`GgufFile::release`]).
    file_backed: bool,
    /// The first file's header, with every shard's tensors (each knowing
    /// its [`TensorInfo::shard`]).
    header: Header,
    /// Buffers derived from the tensors ([`GgufFile::keep_derived`]),
    /// carved from arenas that are only ever pushed and freed with the
    /// file.
    derived: Mutex<Vec<Arena>>,
}

/// Smallest arena [`GgufFile::keep_derived`] carves buffers from.
const ARENA_BYTES: usize = 32 << 20;

/// A transparent huge page on x86-64 (and the 4 KiB-page arm64 kernels).
const HUGE_PAGE: usize = 2 << 20;

/// Anonymous memory that derived buffers are carved from, in order. It
/// starts on a huge-page boundary with huge pages advised: a model's
/// repacked matrices are a few hundred KiB each, and a map of its own per
/// matrix never held a whole huge page, so decode took a TLB miss every
/// 4 KiB of weights. Pages past `used` stay untouched (not resident).
struct Arena {
    /// Owns the mapping. Never dereferenced after `base` was taken from
    /// it: every access goes through ranges of `base` handed out once.
    _map: memmap2::MmapMut,
    base: *mut u8,
    len: usize,
    /// Bytes handed out from `base` (page-rounded); only grows.
    used: usize,
}

// SAFETY: an `Arena` is a mapping and the bookkeeping of which of its
// ranges were handed out; the pointer is not tied to a thread (the map it
// points into is `Send`), and it is only read or advanced under the
// file's `derived` lock.
unsafe impl Send for Arena {}

/// Open and parse one file, with every check a single file gets.
fn open_shard(path: &Path, opts: OpenOptions) -> Result<(Shard, Header)> {
    let path = path.to_path_buf();
    let err = |kind: ErrorKind| Error::new(&path, kind);
    let file = open_no_wait(&path).map_err(|e| err(e.into()))?;
    let meta = file.metadata().map_err(|e| err(e.into()))?;
    if meta.is_dir() {
        return Err(err(ErrorKind::IsDirectory));
    }
    if !meta.is_file() {
        return Err(err(ErrorKind::NotRegular));
    }
    if meta.len() == 0 {
        return Err(err(ErrorKind::Empty));
    }
    let map = if opts.mmap {
        // SAFETY: the map is read-only. Another process rewriting the
        // file while we run changes what we read, as for every
        // mmap-based loader; truncating it would raise SIGBUS on the
        // pages past the new end, which `mapguard` (registered below)
        // turns into zero pages and a reported fault instead of death.
        // `--no-mmap` avoids both.
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(|e| err(e.into()))?;
        // No huge pages while loading: the page cache may hold the file in
        // 2 MiB folios, and one read of a small tensor would then map a
        // whole folio of its neighbours. The parts read in place every
        // token get them back once bound ([`GgufFile::release_unused`]).
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::NoHugePage);
        map
    } else {
        let len = usize::try_from(meta.len()).map_err(|_| {
            err(ErrorKind::TooLarge {
                what: "file size".into(),
                count: meta.len(),
                limit: usize::MAX as u64,
            })
        })?;
        let mut anon = memmap2::MmapMut::map_anon(len).map_err(|e| err(e.into()))?;
        advise_huge_pages(&anon);
        use std::io::Read;
        (&file).read_exact(&mut anon).map_err(|e| err(e.into()))?;
        anon.make_read_only().map_err(|e| err(e.into()))?
    };
    let guard = if opts.mmap {
        Some(mapguard::register(map.as_ptr(), map.len(), &path).map_err(|e| err(e.into()))?)
    } else {
        None
    };
    let header = parse_header(&map, opts.limits).map_err(err)?;
    let shard = Shard {
        _guard: guard,
        path,
        map,
        data_offset: header.data_offset,
        n_tensors: header.tensors.len(),
    };
    Ok((shard, header))
}

/// Open shards 1.. of the split model whose first file is `shards[0]`
/// (with `header`), check they belong together, and add their tensors to
/// `header`.
fn open_other_shards(
    shards: &mut Vec<Shard>,
    header: &mut Header,
    split: SplitInfo,
    opts: OpenOptions,
) -> Result<()> {
    let first = shards[0].path.clone();
    let bad = |path: &Path, msg: String| Error::new(path, ErrorKind::Split(msg));
    let count = split.count;
    if split.no != 0 {
        let hint = match split_prefix(&first, split.no, count) {
            Some(prefix) => format!(", {}", split_path(&prefix, 0, count).display()),
            None => String::new(),
        };
        return Err(bad(
            &first,
            format!(
                "this is file {} of {count}; open the model with its first file{hint}",
                split.no as u32 + 1
            ),
        ));
    }
    let prefix = split_prefix(&first, 0, count).ok_or_else(|| {
        bad(
            &first,
            format!(
                "`{SPLIT_COUNT}` says the model is split into {count} files, but this file is \
                 not named PREFIX{} as the first of them must be",
                split_path(Path::new(""), 0, count).display()
            ),
        )
    })?;
    let Some(expected) = split.tensors else {
        return Err(shards[0].err(ErrorKind::MissingKey {
            key: SPLIT_TENSORS_COUNT.into(),
        }));
    };
    let mut names: HashSet<String> = header.tensors.iter().map(|t| t.name.clone()).collect();
    for no in 1..count {
        let path = split_path(&prefix, no, count);
        let (shard, h) = match open_shard(&path, opts) {
            Err(Error {
                kind: ErrorKind::Io(e),
                ..
            }) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(bad(
                    &path,
                    format!(
                        "file {} of {count} of the model {} is missing",
                        no as u32 + 1,
                        first.display()
                    ),
                ))
            }
            r => r?,
        };
        let this = split_info(&h.metadata).map_err(|k| shard.err(k))?;
        let Some(this) = this.filter(|i| i.count == count && i.no == no) else {
            let says = match this {
                None => "no split keys (it is not part of a split model)".to_string(),
                Some(i) => format!("`{SPLIT_NO}` {} and `{SPLIT_COUNT}` {}", i.no, i.count),
            };
            return Err(bad(
                &path,
                format!(
                    "expected file {} of {count} (`{SPLIT_NO}` {no}, `{SPLIT_COUNT}` {count}) \
                     of the model {}, but it has {says}",
                    no as u32 + 1,
                    first.display()
                ),
            ));
        };
        if let Some(n) = this.tensors.filter(|&n| n != expected) {
            return Err(bad(
                &path,
                format!(
                    "`{SPLIT_TENSORS_COUNT}` is {n}, but the first file {} says {expected}",
                    first.display()
                ),
            ));
        }
        let total = header.tensors.len() as u64 + h.tensors.len() as u64;
        if total > opts.limits.max_tensor_count {
            return Err(shard.err(ErrorKind::TooLarge {
                what: "tensor count of all the files of the split model".into(),
                count: total,
                limit: opts.limits.max_tensor_count,
            }));
        }
        for mut t in h.tensors {
            if !names.insert(t.name.clone()) {
                return Err(bad(
                    &path,
                    format!(
                        "tensor `{}` is also in an earlier file of the model {}",
                        t.name,
                        first.display()
                    ),
                ));
            }
            t.shard = shards.len();
            header.tensors.push(t);
        }
        shards.push(shard);
    }
    let found = header.tensors.len() as u64;
    if found != expected {
        return Err(bad(
            &first,
            format!(
                "`{SPLIT_TENSORS_COUNT}` says {expected} tensors, but the {count} files hold {found}"
            ),
        ));
    }
    Ok(())
}

impl GgufFile {
    /// Open with the defaults: memory-mapped, not locked.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        GgufFile::open_with(path, OpenOptions::default())
    }

    /// Open a GGUF file. If it is the first file of a split model
    /// (`PREFIX-00001-of-0000N.gguf` with `split.count` N > 1), the other
    /// N-1 files are opened too, each checked like a single file and
    /// against the first, and the model reads as one file.
    pub fn open_with(path: impl AsRef<Path>, opts: OpenOptions) -> Result<GgufFile> {
        let (first, mut header) = open_shard(path.as_ref(), opts)?;
        let mut shards = vec![first];
        if let Some(split) = split_info(&header.metadata).map_err(|k| shards[0].err(k))? {
            open_other_shards(&mut shards, &mut header, split, opts)?;
        }
        let f = GgufFile {
            shards,
            file_backed: opts.mmap,
            header,
            derived: Mutex::default(),
        };
        if opts.mlock {
            for s in &f.shards {
                s.mlock()?;
            }
        }
        Ok(f)
    }

    /// A GGUF image already in memory (a model built into the binary),
    /// copied into an anonymous map so tensor data gets the page
    /// alignment a file map has. `label` names it in errors.
    pub fn from_bytes(label: impl Into<PathBuf>, bytes: &[u8], limits: Limits) -> Result<GgufFile> {
        let path = label.into();
        let err = |kind: ErrorKind| Error::new(&path, kind);
        if bytes.is_empty() {
            return Err(err(ErrorKind::Empty));
        }
        let mut anon = memmap2::MmapMut::map_anon(bytes.len()).map_err(|e| err(e.into()))?;
        advise_huge_pages(&anon);
        anon.copy_from_slice(bytes);
        let map = anon.make_read_only().map_err(|e| err(e.into()))?;
        let header = parse_header(&map, limits).map_err(err)?;
        if let Some(split) = split_info(&header.metadata).map_err(err)? {
            return Err(err(ErrorKind::Split(format!(
                "this is file {} of {}; a split model opens only from its files",
                split.no as u32 + 1,
                split.count
            ))));
        }
        let shard = Shard {
            _guard: None,
            path,
            map,
            data_offset: header.data_offset,
            n_tensors: header.tensors.len(),
        };
        Ok(GgufFile {
            shards: vec![shard],
            file_backed: false,
            header,
            derived: Mutex::default(),
        })
    }

    /// The path it was opened with (for a split model, its first file).
    pub fn path(&self) -> &Path {
        &self.shards[0].path
    }
    pub fn version(&self) -> u32 {
        self.header.version
    }
    /// The metadata (for a split model, the first file's, `split.*` keys
    /// included).
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }
    /// Every tensor, in file order (for a split model, the first file's,
    /// then the second's, ...).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }
    /// Offset of the data section in the (first) file. A tensor's place in
    /// the file holding it is [`GgufFile::tensor_file_offset`].
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }
    /// The (first) file's header, with all the tensors.
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// Size of the file in bytes: for a split model, of all its files.
    pub fn file_len(&self) -> u64 {
        self.shards.iter().map(Shard::len).sum()
    }
    /// The files the model was read from: one, or each shard of a split
    /// model in order (a tensor's is `shards()[info.shard]`).
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }
    /// Whether the model is split over several files.
    pub fn is_split(&self) -> bool {
        self.shards.len() > 1
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensors.iter().find(|t| t.name == name)
    }

    /// Offset of a tensor's data from the start of the file holding it
    /// (`shards()[info.shard]`).
    pub fn tensor_file_offset(&self, info: &TensorInfo) -> u64 {
        self.shards[info.shard].data_offset + info.offset
    }

    /// The bytes of a tensor, in place (no copy), from whichever file
    /// holds it. Bounds were checked when the header was parsed.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let shard = &self.shards[info.shard];
        let start = (shard.data_offset + info.offset) as usize;
        &shard.map[start..start + info.n_bytes as usize]
    }

    /// A tensor by name, with an error naming it if absent.
    pub fn tensor(&self, name: &str) -> Result<(&TensorInfo, &[u8])> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| self.err(ErrorKind::MissingTensor(name.to_string())))?;
        Ok((info, self.tensor_data(info)))
    }

    /// A buffer of `len` bytes (page-aligned, zeroed, then written by
    /// `fill`) that lives as long as the file: for data derived from its
    /// tensors, such as weights repacked at load.
    ///
    /// Buffers are carved in order from arenas of 32 MiB or more that start
    /// on huge-page boundaries (see [`Arena`]), so consecutive buffers (a
    /// model's matrices, in the order it reads them) are consecutive in
    /// memory.
    pub fn keep_derived(&self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<&[u8]> {
        let start = {
            let mut arenas = self.derived.lock().unwrap_or_else(|e| e.into_inner());
            let need = len.max(1).next_multiple_of(page_size());
            let i = match arenas.iter().position(|a| a.len - a.used >= need) {
                Some(i) => i,
                None => {
                    let size = need.next_multiple_of(HUGE_PAGE).max(ARENA_BYTES);
                    let mut map = memmap2::MmapMut::map_anon(size + HUGE_PAGE)
                        .map_err(|e| self.err(e.into()))?;
                    advise_huge_pages(&map);
                    let raw = map.as_mut_ptr();
                    let pad = raw.align_offset(HUGE_PAGE).min(HUGE_PAGE);
                    arenas.push(Arena {
                        // SAFETY: `pad <= HUGE_PAGE`, and the map holds
                        // `size + HUGE_PAGE` bytes.
                        base: unsafe { raw.add(pad) },
                        _map: map,
                        len: size,
                        used: 0,
                    });
                    arenas.len() - 1
                }
            };
            let a = &mut arenas[i];
            let start = a.base.wrapping_add(a.used);
            a.used += need;
            start
        };
        // SAFETY: `start..start + len` lies inside one arena's map (the
        // arena had `need >= len` bytes free past `used`), which stays
        // mapped until `self` is dropped (arenas are never removed; moving
        // an `Arena` as the Vec grows does not move its mapping). No other
        // slice covers it: `used` moved past it under the lock, so this
        // range is handed out exactly once, and the map itself is never
        // dereferenced. Fresh anonymous memory reads as zeros.
        let buf = unsafe { std::slice::from_raw_parts_mut(start, len) };
        fill(buf);
        // From here on the range is only read, for `&self`'s lifetime.
        Ok(buf)
    }

    /// Tell the OS that `bytes` (a part of one of this model's file maps,
    /// e.g. a tensor now held repacked) will not be read for a while, so its
    /// pages leave the process's resident set. Reading them later is still
    /// correct: they come back from the file. A no-op for copies (`mmap:
    /// false`, a built-in model), which could not be read back.
    pub fn release(&self, bytes: &[u8]) {
        if !self.file_backed {
            return;
        }
        let (start, end) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        let Some(map) = self.shards.iter().map(|s| &s.map).find(|m| {
            let base = m.as_ptr() as usize;
            start >= base && end <= base + m.len()
        }) else {
            return;
        };
        let base = map.as_ptr() as usize;
        // Whole pages inside the range only: the neighbours stay mapped.
        let page = page_size();
        let (from, to) = (
            (start - base).div_ceil(page) * page,
            (end - base) / page * page,
        );
        if from < to {
            dont_need(map, from, to - from);
        }
    }

    /// Whether the model is mapped from its files (not read into memory
    /// with `mmap: false`, nor a built-in image): then its pages can leave
    /// the resident set and come back from the file.
    pub fn is_file_backed(&self) -> bool {
        self.file_backed
    }

    /// Bytes of the memory pages that `parts` (slices of this model's
    /// maps) touch, each page counted once; parts outside the maps count
    /// nothing.
    pub fn pages_touched(&self, parts: &[&[u8]]) -> u64 {
        let page = page_size();
        self.shards
            .iter()
            .map(|s| {
                let ranges = parts.iter().filter_map(|b| pages_of(&s.map, b, page));
                merged(ranges.collect())
                    .iter()
                    .map(|(a, b)| (b - a) as u64)
                    .sum::<u64>()
            })
            .sum()
    }

    /// Once the weights are bound: drop from the resident set every page of
    /// the file maps except those of [`MapUse::EveryToken`] parts of
    /// `used`: the header (parsed already), tensors held repacked or copied,
    /// embedding tables. Only the kept parts get the huge-page advice (the
    /// map is opened without it), so a later read of anything else (an
    /// embedding row) is never mapped as a 2 MiB huge page (the kernel may
    /// still map the whole page-cache folio around it, up to 2 MiB).
    /// Reading any of it later is still correct: it comes back from the
    /// file. A no-op for copies (`mmap: false`, a built-in model), which
    /// could not be read back.
    pub fn release_unused(&self, used: &[(&[u8], MapUse)]) {
        if !self.file_backed {
            return;
        }
        let page = page_size();
        for s in &self.shards {
            let keep = used
                .iter()
                .filter(|(_, u)| *u == MapUse::EveryToken)
                .filter_map(|(b, _)| pages_of(&s.map, b, page));
            // Split into VMAs of their own, read without readahead: a row
            // read maps fewer neighbours (measured: the header's folio no
            // longer comes in with the first rows of SmolLM2's table).
            #[cfg(target_os = "linux")]
            for (b, _) in used.iter().filter(|(_, u)| *u == MapUse::ByRow) {
                if let Some((start, end)) = pages_of(&s.map, b, page) {
                    let _ = s
                        .map
                        .advise_range(memmap2::Advice::Random, start, end - start);
                }
            }
            let mut from = 0;
            for (start, end) in merged(keep.collect())
                .into_iter()
                .chain([(s.map.len(), s.map.len())])
            {
                let end = end.min(s.map.len());
                if start > from {
                    dont_need(&s.map, from, start.min(s.map.len()) - from);
                }
                // Streamed every token: huge pages save TLB misses.
                #[cfg(target_os = "linux")]
                if end > start {
                    let _ = s
                        .map
                        .advise_range(memmap2::Advice::HugePage, start, end - start);
                }
                from = end;
            }
        }
    }

    /// Wrap a metadata error with this file's path (the first file's, for
    /// a split model).
    pub fn err(&self, kind: ErrorKind) -> Error {
        self.shards[0].err(kind)
    }
}

/// `MADV_DONTNEED` on `len` bytes of a file map from `offset` (both
/// page-aligned).
fn dont_need(map: &memmap2::Mmap, offset: usize, len: usize) {
    #[cfg(unix)]
    // SAFETY: the map is a read-only map of the file, never written, so it
    // holds no private (copied-on-write) pages: dropping its pages loses
    // nothing, and any later read faults the same file bytes back in. The
    // callers pass a range inside the map. Failure (e.g. locked pages)
    // leaves them resident, which is fine.
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
    #[cfg(not(unix))]
    let _ = (map, offset, len);
}
