//! An open GGUF file: the parsed header plus the bytes, memory-mapped by
//! default so tensor views cost nothing and pages are shared with the OS
//! cache.

use crate::error::{Error, ErrorKind, Result};
use crate::read::{parse_header, Header, Limits, TensorInfo};
use crate::value::Metadata;
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

pub struct GgufFile {
    /// Declared before `map` so it is dropped (unregistered) before the
    /// map is unmapped.
    _guard: Option<mapguard::Registration>,
    path: PathBuf,
    /// File-backed map, or (with `mmap: false`) an anonymous map the file
    /// was read into: one type either way, and both can be `mlock`ed.
    map: memmap2::Mmap,
    /// Whether `map` maps the file itself (not a copy), so its pages can
    /// be dropped and read back ([`GgufFile::release`]).
    file_backed: bool,
    header: Header,
    /// Buffers derived from the tensors ([`GgufFile::keep_derived`]): only
    /// ever pushed, freed with the file.
    derived: Mutex<Vec<memmap2::Mmap>>,
}

impl GgufFile {
    /// Open with the defaults: memory-mapped, not locked.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        GgufFile::open_with(path, OpenOptions::default())
    }

    pub fn open_with(path: impl AsRef<Path>, opts: OpenOptions) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
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
            let map =
                unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(|e| err(e.into()))?;
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
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
        let f = GgufFile {
            _guard: guard,
            path,
            map,
            file_backed: opts.mmap,
            header,
            derived: Mutex::default(),
        };
        if opts.mlock {
            f.mlock()?;
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
        Ok(GgufFile {
            _guard: None,
            path,
            map,
            file_backed: false,
            header,
            derived: Mutex::default(),
        })
    }

    fn mlock(&self) -> Result<()> {
        self.map.lock().map_err(|source| {
            Error::new(
                &self.path,
                ErrorKind::Mlock {
                    bytes: self.map.len() as u64,
                    source,
                },
            )
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn version(&self) -> u32 {
        self.header.version
    }
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of a tensor, in place (no copy). Bounds were checked when
    /// the header was parsed.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.header.data_offset + info.offset) as usize;
        &self.map[start..start + info.n_bytes as usize]
    }

    /// A tensor by name, with an error naming it if absent.
    pub fn tensor(&self, name: &str) -> Result<(&TensorInfo, &[u8])> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| Error::new(&self.path, ErrorKind::MissingTensor(name.to_string())))?;
        Ok((info, self.tensor_data(info)))
    }

    /// A buffer of `len` bytes (page-aligned, zeroed, then written by
    /// `fill`) that lives as long as the file: for data derived from its
    /// tensors, such as weights repacked at load.
    pub fn keep_derived(&self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<&[u8]> {
        let mut anon = memmap2::MmapMut::map_anon(len.max(1)).map_err(|e| self.err(e.into()))?;
        advise_huge_pages(&anon);
        fill(&mut anon[..len]);
        let map = anon.make_read_only().map_err(|e| self.err(e.into()))?;
        let ptr = map.as_ptr();
        self.derived
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(map);
        // SAFETY: the map just pushed is read-only and stays mapped until
        // `self` is dropped (entries are never removed; moving the `Mmap`
        // handle as the Vec grows does not move the mapping), so the
        // `len` bytes at `ptr` are valid and unchanging for `&self`'s
        // lifetime.
        Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
    }

    /// Tell the OS that `bytes` (a part of this file's map, e.g. a tensor
    /// now held repacked) will not be read for a while, so its pages leave
    /// the process's resident set. Reading them later is still correct:
    /// they come back from the file. A no-op for copies (`mmap: false`, a
    /// built-in model), which could not be read back.
    pub fn release(&self, bytes: &[u8]) {
        if !self.file_backed {
            return;
        }
        let base = self.map.as_ptr() as usize;
        let (start, end) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        if start < base || end > base + self.map.len() {
            return;
        }
        // Whole pages inside the range only: the neighbours stay mapped.
        const PAGE: usize = 4096;
        let (from, to) = (
            (start - base).div_ceil(PAGE) * PAGE,
            (end - base) / PAGE * PAGE,
        );
        if from >= to {
            return;
        }
        #[cfg(unix)]
        // SAFETY: the map is a read-only private map of the file, never
        // written, so it holds no private (copied-on-write) pages: dropping
        // its pages loses nothing, and any later read faults the same file
        // bytes back in. The range lies inside the map (checked above).
        // Failure (e.g. locked pages) leaves them resident, which is fine.
        let _ = unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from)
        };
    }

    /// Wrap a metadata error with this file's path.
    pub fn err(&self, kind: ErrorKind) -> Error {
        Error::new(&self.path, kind)
    }
}
