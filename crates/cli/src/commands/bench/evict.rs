//! `--evict read|write`: one more thread sweeps a buffer of at least four
//! times the last-level cache, continuously, while a test runs, so nothing
//! the model left in a cache survives from one use to the next. A read
//! sweep only displaces lines; a read-modify-write sweep also makes every
//! displaced line dirty, so the caches spend write-back bandwidth too.
//!
//! The sweeper also takes DRAM bandwidth from the benchmark: for a model
//! that lives in DRAM anyway, the evicted/clean ratio measures that
//! contention more than lost residency.
//!
//! With `--pin` the sweeper is pinned to the CPU after the benchmark's
//! threads; otherwise the OS places it. When the benchmark's threads plus
//! the sweeper outnumber the CPUs this process may use, they share a core
//! and the report says so.

use super::super::inspect::human_bytes;
use anyhow::{Context, Result};
use kernels::bandwidth::{read_buffer, read_pass};
use kernels::pool::ThreadPool;
use machine::Machine;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// The sweep buffer is at least this big, whatever the caches say (the
/// same floor as `info`'s DRAM probe).
const MIN_EVICT_BYTES: u64 = 256 << 20;
/// Words swept between looks at the stop flag (1 MiB).
const CHUNK_WORDS: usize = 1 << 17;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EvictMode {
    /// Sum the buffer's words.
    Read,
    /// Add one to every word of the buffer.
    Write,
}

impl EvictMode {
    pub fn name(self) -> &'static str {
        match self {
            EvictMode::Read => "read",
            EvictMode::Write => "write",
        }
    }
}

/// How the sweeper runs on this machine.
#[derive(Clone, Debug)]
pub struct Plan {
    pub mode: EvictMode,
    pub bytes: u64,
    /// The last-level cache it is sized against, if known.
    pub llc_bytes: Option<u64>,
    /// CPUs this process may keep busy (affinity, capped by the quota).
    pub cpus: f64,
    /// `--pin`: the sweeper runs on the CPU after the benchmark's threads.
    pub pinned: bool,
}

impl Plan {
    pub fn new(mode: EvictMode, machine: &Machine, pinned: bool) -> Plan {
        let caches = &machine.caches;
        let llc = caches
            .l3
            .as_ref()
            .or(caches.l2.as_ref())
            .map(|c| c.size_bytes);
        let mut bytes = llc.map_or(0, |b| b.saturating_mul(4)).max(MIN_EVICT_BYTES);
        if let Some(avail) = model::mem_available() {
            // Never the sweep that pushes a small machine into swap.
            bytes = bytes.min(avail / 4);
        }
        let mut cpus = machine.cores.allowed.len().max(1) as f64;
        if let Some(q) = &machine.cores.quota {
            cpus = cpus.min(q.cpus);
        }
        Plan {
            mode,
            bytes,
            llc_bytes: llc,
            cpus,
            pinned,
        }
    }

    /// Whether `n_threads` benchmark threads and the sweeper must share a
    /// core.
    pub fn shares_core(&self, n_threads: usize) -> bool {
        (n_threads + 1) as f64 > self.cpus
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        let llc = match self.llc_bytes {
            Some(b) => format!(
                "{:.0}× the {} last-level cache",
                self.bytes as f64 / b as f64,
                human_bytes(b)
            ),
            None => "last-level cache size unknown".to_string(),
        };
        format!(
            "{} sweep of {} ({llc}) by one more thread, {}",
            self.mode.name(),
            human_bytes(self.bytes),
            if self.pinned {
                "pinned to the CPU after the benchmark's"
            } else {
                "not pinned"
            }
        )
    }
}

/// The running sweeper; stops on [`Evictor::stop`] or drop.
pub struct Evictor {
    stop: Arc<AtomicBool>,
    passes: Arc<AtomicU64>,
    handle: Option<JoinHandle<()>>,
}

impl Evictor {
    /// Start sweeping and return once the first full pass is done (so the
    /// caches already hold the sweeper's lines, not the model's).
    pub fn start(plan: &Plan, pin: Option<usize>) -> Result<Evictor> {
        let stop = Arc::new(AtomicBool::new(false));
        let passes = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = mpsc::channel();
        let bytes = usize::try_from(plan.bytes).unwrap_or(usize::MAX);
        let (mode, s, p) = (plan.mode, Arc::clone(&stop), Arc::clone(&passes));
        let handle = std::thread::Builder::new()
            .name("cachefit-evict".into())
            .spawn(move || {
                if let Some(cpu) = pin {
                    // Best effort: an unpinned sweeper still evicts.
                    let _ = machine::pin_current_thread(cpu);
                }
                sweep(mode, bytes, &s, &p, ready_tx)
            })
            .context("starting the --evict thread")?;
        let e = Evictor {
            stop,
            passes,
            handle: Some(handle),
        };
        // An Err means the thread ended without a pass: it panicked, and
        // join in drop reports nothing more useful than this.
        ready_rx
            .recv()
            .context("the --evict thread stopped before its first pass")?;
        Ok(e)
    }

    /// Stop and return the passes made.
    pub fn stop(mut self) -> u64 {
        self.halt();
        self.passes.load(Ordering::Relaxed)
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Evictor {
    fn drop(&mut self) {
        self.halt();
    }
}

fn sweep(
    mode: EvictMode,
    bytes: usize,
    stop: &AtomicBool,
    passes: &AtomicU64,
    ready: mpsc::Sender<()>,
) {
    // Non-zero words: a zeroed allocation could map every page to the
    // kernel's one zero page and never leave the cache.
    let mut buf = read_buffer(bytes);
    // A one-thread pool runs inline: `read_pass` with the wide loads the
    // kernels use, on this thread.
    let pool = ThreadPool::new(1);
    let mut sum = 0u64;
    let mut ready = Some(ready);
    while !stop.load(Ordering::Relaxed) {
        for chunk in buf.chunks_mut(CHUNK_WORDS) {
            match mode {
                EvictMode::Read => sum = sum.wrapping_add(read_pass(&pool, chunk)),
                EvictMode::Write => {
                    for w in chunk.iter_mut() {
                        *w = w.wrapping_add(1);
                    }
                    black_box(chunk);
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        passes.fetch_add(1, Ordering::Relaxed);
        if let Some(tx) = ready.take() {
            let _ = tx.send(());
        }
    }
    black_box(sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_until_stopped_in_both_modes() {
        for mode in [EvictMode::Read, EvictMode::Write] {
            let plan = Plan {
                mode,
                bytes: 3 << 20,
                llc_bytes: Some(1 << 20),
                cpus: 2.0,
                pinned: false,
            };
            let e = Evictor::start(&plan, None).unwrap();
            assert!(e.stop() >= 1);
        }
    }

    #[test]
    fn shares_a_core_only_when_out_of_cpus() {
        let plan = Plan {
            mode: EvictMode::Read,
            bytes: 1,
            llc_bytes: None,
            cpus: 2.0,
            pinned: false,
        };
        assert!(!plan.shares_core(1));
        assert!(plan.shares_core(2));
    }
}
