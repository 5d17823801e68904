//! Survive a memory-mapped file that changes under us.
//!
//! A model file is mapped, not read: its pages come from the file on
//! demand. If another process truncates the file (or an operator copies a
//! new model over it in place), touching a page past the new end raises
//! SIGBUS, whose default action kills the process. This crate turns that
//! into an error the program can report: "model file X changed on disk
//! while in use".
//!
//! # Design
//!
//! [`register`] records a mapped range in a fixed table of atomics and, the
//! first time, installs a SIGBUS handler (`SA_SIGINFO | SA_ONSTACK`,
//! keeping the previous action). On a fault the handler:
//!
//! 1. looks the faulting address (`si_addr`) up in the table, for a fault
//!    past the end of the file (`BUS_ADRERR`; a hardware memory error is
//!    passed on);
//! 2. if it lies in a registered range, maps anonymous zero pages over the
//!    range from the faulting page to its end (`mmap(MAP_FIXED)`), records
//!    which range faulted, writes one byte to a pipe, and returns. The
//!    faulting load runs again and reads zeros;
//! 3. otherwise (or if the `mmap` fails) hands the signal to the previous
//!    action (Rust's stack-overflow handler, which resets SIGBUS to its
//!    default and lets the fault kill the process as before).
//!
//! The program learns of the fault without any check on its hot path: a
//! watcher thread ([`set_fault_handler`]) blocks reading the pipe and runs
//! the program's reaction (print and exit, or fail requests and stop a
//! server); [`faulted`] is there for code that prefers to poll. Between the
//! fault and that reaction the computation in flight keeps running on
//! zeros, so its results are garbage and must not be trusted: every
//! reaction ends the work that used the file.
//!
//! # Soundness
//!
//! The handler only does what is async-signal-safe: relaxed/acquire loads
//! of lock-free atomics, a compare-exchange, and the `mmap`, `write` and
//! `sigaction` system calls; it saves and restores `errno`. It never
//! allocates, locks or unwinds. Replacing the pages with zeros keeps the
//! Rust-level contract of the mapping's slices: the memory stays mapped,
//! readable and the same length for as long as the owner keeps it; its
//! contents change, which a file map whose file is rewritten already
//! allows (the map's owner accepted that when it mapped a file it does not
//! lock). Unregistering clears a slot before the owner unmaps, so a fault
//! on an address the table no longer names goes to the previous action.
//! The table has [`MAX_REGIONS`] slots; registering more is an error, not
//! a silently unprotected map.
//!
//! Outside Linux, [`register`] records nothing and faults behave as before.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// How many ranges can be registered at once.
pub const MAX_REGIONS: usize = 256;

/// A range of a mapped file whose faults [`register`] turned into zeros.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The label given to [`register`] (the file's path).
    pub path: PathBuf,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: the file changed on disk while in use (it was truncated or overwritten); \
             what was computed from it since is discarded",
            self.path.display()
        )
    }
}

/// While alive, faults inside the range it was made for become zeros and
/// a [`Fault`]. Drop it before unmapping the range.
#[derive(Debug)]
pub struct Registration {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    slot: usize,
}

/// Labels of the registered ranges, by slot; `None` is a free slot. Only
/// touched outside the signal handler.
static LABELS: Mutex<Vec<Option<PathBuf>>> = Mutex::new(Vec::new());

/// Protect `len` bytes at `start` (a read-only map of the file at `path`).
pub fn register(start: *const u8, len: usize, path: &Path) -> io::Result<Registration> {
    let mut labels = LABELS.lock().unwrap_or_else(|e| e.into_inner());
    if labels.is_empty() {
        labels.resize(MAX_REGIONS, None);
    }
    let slot = labels.iter().position(Option::is_none).ok_or_else(|| {
        io::Error::other(format!(
            "more than {MAX_REGIONS} mapped files open at once; cannot guard {}",
            path.display()
        ))
    })?;
    imp::install()?;
    labels[slot] = Some(path.to_path_buf());
    imp::set(slot, start as usize, len);
    Ok(Registration { slot })
}

impl Drop for Registration {
    fn drop(&mut self) {
        imp::clear(self.slot);
        // The label stays until the slot is reused, so a fault reported
        // just before this still names its file.
        let mut labels = LABELS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = labels.get_mut(self.slot) {
            *l = None;
        }
    }
}

/// The first fault seen in a registered range, if any.
pub fn faulted() -> Option<Fault> {
    let slot = imp::faulted_slot()?;
    let labels = LABELS.lock().unwrap_or_else(|e| e.into_inner());
    let path = labels
        .get(slot)
        .cloned()
        .flatten()
        .unwrap_or_else(|| PathBuf::from("a mapped file"));
    Some(Fault { path })
}

type Handler = Box<dyn Fn(&Fault) + Send + Sync>;
static HANDLER: Mutex<Option<Handler>> = Mutex::new(None);

/// Run `f` (once, on a watcher thread) when a registered range faults.
/// Replaces the handler set before; the first call starts the thread.
/// `f` typically reports the fault and ends the process or the work using
/// the file: everything computed after the fault read zeros.
pub fn set_fault_handler(f: impl Fn(&Fault) + Send + Sync + 'static) -> io::Result<()> {
    *HANDLER.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(f));
    imp::start_watcher()
}

/// Called by the watcher thread after the signal handler woke it.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn notify() {
    if let Some(fault) = faulted() {
        if let Some(f) = HANDLER.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            f(&fault);
        }
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use super::MAX_REGIONS;
    use std::io;
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
    use std::sync::{Mutex, OnceLock};

    struct Region {
        start: AtomicUsize,
        /// 0: the slot is free. Written last on set, first on clear.
        len: AtomicUsize,
    }

    static REGIONS: [Region; MAX_REGIONS] = [const {
        Region {
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
        }
    }; MAX_REGIONS];
    /// Slot + 1 of the first range that faulted; 0 while none has.
    static FAULTED: AtomicUsize = AtomicUsize::new(0);
    static PIPE_READ: AtomicI32 = AtomicI32::new(-1);
    static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
    static PAGE: AtomicUsize = AtomicUsize::new(4096);
    /// The SIGBUS action before ours, set once before ours is installed.
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
    static INSTALLED: Mutex<bool> = Mutex::new(false);
    static WATCHING: AtomicBool = AtomicBool::new(false);

    pub fn set(slot: usize, start: usize, len: usize) {
        REGIONS[slot].start.store(start, Ordering::Relaxed);
        REGIONS[slot].len.store(len, Ordering::Release);
    }

    pub fn clear(slot: usize) {
        REGIONS[slot].len.store(0, Ordering::Release);
    }

    pub fn faulted_slot() -> Option<usize> {
        FAULTED.load(Ordering::Acquire).checked_sub(1)
    }

    pub fn install() -> io::Result<()> {
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        if *installed {
            return Ok(());
        }
        // SAFETY: sysconf, pipe2 and sigaction are called with valid
        // arguments (a local fd array of two, zeroed sigaction structs we
        // fill); nothing else runs the handler before `PREVIOUS` is set.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE.store(page as usize, Ordering::Relaxed);
            }
            let mut fds = [0; 2];
            if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The watcher blocks on the read end; the handler must never
            // block on the write end.
            let flags = libc::fcntl(fds[0], libc::F_GETFL);
            libc::fcntl(fds[0], libc::F_SETFL, flags & !libc::O_NONBLOCK);
            PIPE_READ.store(fds[0], Ordering::Relaxed);
            PIPE_WRITE.store(fds[1], Ordering::Relaxed);

            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                return Err(io::Error::last_os_error());
            }
            let _ = PREVIOUS.set(previous);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        *installed = true;
        Ok(())
    }

    pub fn start_watcher() -> io::Result<()> {
        install()?;
        if WATCHING.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let fd = PIPE_READ.load(Ordering::Relaxed);
        std::thread::Builder::new()
            .name("mapguard".into())
            .spawn(move || loop {
                let mut byte = 0u8;
                // SAFETY: reads one byte into a local from the pipe's read
                // end, which is never closed.
                let n = unsafe { libc::read(fd, (&mut byte as *mut u8).cast(), 1) };
                if n == 1 && FAULTED.load(Ordering::Acquire) != 0 {
                    super::notify();
                    // One report: later faults are the same event.
                    return;
                }
                if n == 0 {
                    return;
                }
            })
            .map(|_| ())
    }

    /// The slot whose range holds `addr`.
    fn find(addr: usize) -> Option<usize> {
        REGIONS.iter().position(|r| {
            let len = r.len.load(Ordering::Acquire);
            let start = r.start.load(Ordering::Relaxed);
            len != 0 && addr >= start && addr - start < len
        })
    }

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO
        // handler; errno is this thread's. Only async-signal-safe calls
        // follow (see the module doc).
        unsafe {
            let errno = libc::__errno_location();
            let saved = *errno;
            let addr = (*info).si_addr() as usize;
            // BUS_ADRERR: a page past the end of the file. Other causes
            // (a hardware memory error) are not ours to paper over.
            let past_end = (*info).si_code == libc::BUS_ADRERR;
            if let Some(slot) = find(addr).filter(|_| past_end) {
                let page = PAGE.load(Ordering::Relaxed);
                let region = &REGIONS[slot];
                let end = (region.start.load(Ordering::Relaxed)
                    + region.len.load(Ordering::Relaxed))
                .next_multiple_of(page);
                let from = addr & !(page - 1);
                let p = libc::mmap(
                    from as *mut libc::c_void,
                    end - from,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                );
                if p != libc::MAP_FAILED {
                    let _ =
                        FAULTED.compare_exchange(0, slot + 1, Ordering::AcqRel, Ordering::Acquire);
                    let fd = PIPE_WRITE.load(Ordering::Relaxed);
                    let byte = 1u8;
                    libc::write(fd, (&byte as *const u8).cast(), 1);
                    *errno = saved;
                    return;
                }
            }
            *errno = saved;
            chain(sig, info, ctx);
        }
    }

    /// Give the signal to the action that was there before ours.
    ///
    /// # Safety
    /// Only from the signal handler, with its arguments.
    unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let Some(previous) = PREVIOUS.get() else {
            return default(sig);
        };
        match previous.sa_sigaction {
            libc::SIG_DFL | libc::SIG_IGN => default(sig),
            f if previous.sa_flags & libc::SA_SIGINFO != 0 => {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(f);
                f(sig, info, ctx);
            }
            f => {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(f);
                f(sig);
            }
        }
    }

    /// Reset to the default action; returning re-runs the faulting
    /// instruction, which then kills the process as if we were not here.
    unsafe fn default(sig: libc::c_int) {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(sig, &action, std::ptr::null_mut());
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::io;
    pub fn set(_: usize, _: usize, _: usize) {}
    pub fn clear(_: usize) {}
    pub fn faulted_slot() -> Option<usize> {
        None
    }
    pub fn install() -> io::Result<()> {
        Ok(())
    }
    pub fn start_watcher() -> io::Result<()> {
        Ok(())
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;
    use std::sync::mpsc;
    use std::time::Duration;

    fn file_of(pages: usize) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![0xAB; pages * 4096]).unwrap();
        f.flush().unwrap();
        f
    }

    // Everything that faults in this process is in this one test: the
    // first fault is process-wide state.
    #[test]
    fn a_truncated_registered_map_reads_zeros_and_reports_the_file() {
        let f = file_of(4);
        let map = unsafe { memmap2::Mmap::map(f.as_file()).unwrap() };
        let (tx, rx) = mpsc::channel();
        set_fault_handler(move |fault| {
            let _ = tx.send(fault.clone());
        })
        .unwrap();
        let guard = register(map.as_ptr(), map.len(), f.path()).unwrap();
        assert_eq!(map[2 * 4096], 0xAB);
        assert!(faulted().is_none());
        f.as_file().set_len(4096).unwrap();
        // Still readable: the first page is in the file, the rest zeros.
        let read = |i: usize| unsafe { std::ptr::read_volatile(map.as_ptr().add(i)) };
        assert_eq!(read(3 * 4096 + 17), 0);
        assert_eq!(read(2 * 4096), 0);
        assert_eq!(read(100), 0xAB);
        let fault = faulted().expect("the fault was recorded");
        assert_eq!(fault.path, f.path());
        assert!(fault.to_string().contains("changed on disk while in use"));
        let told = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the handler ran");
        assert_eq!(told, fault);
        drop(guard);
        drop(map);
    }

    /// A fault in a map nobody registered still kills the process with
    /// SIGBUS (the handler passes it on); run in a child process.
    #[test]
    fn a_fault_outside_registered_maps_still_kills() {
        if std::env::var_os("MAPGUARD_CHILD").is_some() {
            let guarded = file_of(2);
            let gmap = unsafe { memmap2::Mmap::map(guarded.as_file()).unwrap() };
            let _g = register(gmap.as_ptr(), gmap.len(), guarded.path()).unwrap();
            let f = file_of(2);
            let map = unsafe { memmap2::Mmap::map(f.as_file()).unwrap() };
            f.as_file().set_len(0).unwrap();
            let v = unsafe { std::ptr::read_volatile(map.as_ptr().add(4096)) };
            println!("read {v} without dying");
            std::process::exit(0);
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::a_fault_outside_registered_maps_still_kills",
                "--nocapture",
            ])
            .env("MAPGUARD_CHILD", "1")
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGBUS),
            "child: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
    }

    #[test]
    fn slots_are_reused_after_drop() {
        let f = file_of(1);
        let map = unsafe { memmap2::Mmap::map(f.as_file()).unwrap() };
        for _ in 0..(MAX_REGIONS * 2) {
            let g = register(map.as_ptr(), map.len(), f.path()).unwrap();
            drop(g);
        }
    }
}
