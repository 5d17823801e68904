//! A persistent thread pool for the kernels.
//!
//! `ThreadPool::new(n)` starts `n - 1` worker threads once; the thread that
//! calls [`ThreadPool::run`] is thread 0 and works too. A run publishes the
//! closure, wakes the workers, runs its own share and waits until every
//! worker has signalled done, so one run costs a few cache-line transfers,
//! not a thread spawn. Between runs workers spin for a short while (decode
//! issues runs microseconds apart) and then park, so an idle pool burns no
//! core. With one thread there are no workers and no synchronisation at all:
//! the closure runs inline.
//!
//! Work is split with [`WorkCtx::chunks`]: chunk indices are divided into one
//! contiguous range per thread, each with its own atomic counter; a thread
//! takes its own chunks in order and then steals from the others' counters.
//! That keeps the same rows on the same core from one run to the next (a
//! matrix that fits in L2 stays in that core's L2) while still balancing a
//! thread that was descheduled on a busy machine.
//!
//! Panics: a panic in the closure on any thread is caught, the run still
//! waits for every thread to finish, and the first payload is re-raised on
//! the caller (`std::panic::resume_unwind`). The pool stays usable.
//!
//! One caller at a time: the pool is `Send` but not `Sync`, and calling
//! `run` again from inside a run on the same thread panics (it would
//! deadlock otherwise).

use std::any::Any;
use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long a waiting thread spins before it parks, unless set with
/// [`ThreadPool::with_spin`]. Long enough to bridge the gap between the
/// matvecs of one decode step, short enough not to matter when idle.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// What a thread knows about the run it takes part in.
pub struct WorkCtx<'a> {
    /// 0 for the calling thread, `1..n_threads` for the workers.
    pub thread_index: usize,
    pub n_threads: usize,
    counters: Counters<'a>,
}

enum Counters<'a> {
    /// Single-threaded pool: a plain counter, no atomics.
    Local(Cell<usize>),
    /// One counter per thread, reset to 0 by the caller before each run.
    Shared(&'a [Padded<AtomicUsize>]),
}

impl<'a> WorkCtx<'a> {
    /// The chunks of `0..n_items` (of `chunk_size` items, the last one
    /// shorter) that this thread should process. Across all threads of a
    /// run, every chunk is yielded exactly once, provided every thread asks
    /// with the same `n_items` and `chunk_size`.
    ///
    /// The counters behind it are per run: use it for one loop per run.
    /// A second call in the same run yields only what the first left.
    pub fn chunks(&self, n_items: usize, chunk_size: usize) -> Chunks<'_> {
        assert!(chunk_size > 0, "chunk_size must be positive");
        Chunks {
            ctx: self,
            n_items,
            chunk_size,
            n_chunks: n_items.div_ceil(chunk_size),
            victim: 0,
        }
    }

    /// This thread's share of `0..n_items` when split evenly, for work that
    /// needs no balancing.
    pub fn static_range(&self, n_items: usize) -> Range<usize> {
        split_range(n_items, self.n_threads, self.thread_index)
    }
}

/// `part`-th of `parts` nearly equal contiguous pieces of `0..n`.
fn split_range(n: usize, parts: usize, part: usize) -> Range<usize> {
    let (q, r) = (n / parts, n % parts);
    let start = q * part + part.min(r);
    start..start + q + usize::from(part < r)
}

/// Iterator returned by [`WorkCtx::chunks`].
pub struct Chunks<'c> {
    ctx: &'c WorkCtx<'c>,
    n_items: usize,
    chunk_size: usize,
    n_chunks: usize,
    /// Offset from our own thread index of the range we take from now.
    victim: usize,
}

impl Chunks<'_> {
    fn next_index(&mut self) -> Option<usize> {
        match &self.ctx.counters {
            Counters::Local(next) => {
                let i = next.get();
                (i < self.n_chunks).then(|| {
                    next.set(i + 1);
                    i
                })
            }
            Counters::Shared(counters) => {
                let n = self.ctx.n_threads;
                while self.victim < n {
                    let v = (self.ctx.thread_index + self.victim) % n;
                    let own = split_range(self.n_chunks, n, v);
                    // Relaxed: the counters only hand out indices; the data
                    // is published by the run's start and done signals.
                    let k = counters[v].0.fetch_add(1, Ordering::Relaxed);
                    if k < own.len() {
                        return Some(own.start + k);
                    }
                    self.victim += 1;
                }
                None
            }
        }
    }
}

impl Iterator for Chunks<'_> {
    type Item = Range<usize>;
    fn next(&mut self) -> Option<Range<usize>> {
        let i = self.next_index()?;
        let start = i * self.chunk_size;
        Some(start..(start + self.chunk_size).min(self.n_items))
    }
}

/// Keeps counters that different threads write on their own cache lines
/// (128 bytes: adjacent-line prefetchers pair 64-byte lines).
#[repr(align(128))]
struct Padded<T>(T);

/// A run's closure as the workers see it, behind a thin pointer.
type JobFn<'f> = &'f (dyn Fn(&WorkCtx<'_>) + Sync + 'f);

struct Shared {
    n_threads: usize,
    spin: Duration,
    /// Bumped once per run (and once at shutdown); workers wait for a change.
    epoch: Padded<AtomicUsize>,
    /// Points at a `JobFn` on the caller's stack while a run is in progress.
    job: AtomicPtr<()>,
    shutdown: AtomicBool,
    /// Workers that are (about to be) parked, waiting for a run.
    sleepers: Padded<AtomicUsize>,
    /// Workers that have not finished the current run.
    remaining: Padded<AtomicUsize>,
    counters: Box<[Padded<AtomicUsize>]>,
    caller_waiting: AtomicBool,
    done_lock: Mutex<()>,
    done_cv: Condvar,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// Longest a parked thread sleeps before re-checking its condition.
const PARK_BACKSTOP: Duration = Duration::from_millis(2);

/// Spin with `spin_loop` until `ready` returns something or `budget` has
/// passed.
fn spin_until<T>(budget: Duration, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    if let Some(v) = ready() {
        return Some(v);
    }
    if budget.is_zero() {
        return None;
    }
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            std::hint::spin_loop();
            if let Some(v) = ready() {
                return Some(v);
            }
        }
        if start.elapsed() >= budget {
            return None;
        }
    }
}

impl Shared {
    /// Worker side: wait until the epoch differs from `seen`; return it.
    fn wait_for_run(&self, seen: usize) -> usize {
        let changed = || {
            let e = self.epoch.0.load(Ordering::Acquire);
            (e != seen).then_some(e)
        };
        if let Some(e) = spin_until(self.spin, changed) {
            return e;
        }
        // Announce we may park, then re-check. SeqCst on both sides: either
        // the caller's `sleepers` load sees us (and unparks us), or our epoch
        // load below sees its new epoch. A stale unpark token only causes one
        // spurious wake-up, which the loop absorbs.
        self.sleepers.0.fetch_add(1, Ordering::SeqCst);
        let e = loop {
            let e = self.epoch.0.load(Ordering::SeqCst);
            if e != seen {
                break e;
            }
            // The SeqCst handshake above rules out a lost wake-up in the
            // Rust memory model; the timeout is a backstop for platforms and
            // emulators that get it wrong (qemu-user lost one in ~25 stress
            // runs of `many_tiny_runs`). It costs nothing when unpark works.
            thread::park_timeout(PARK_BACKSTOP);
        };
        self.sleepers.0.fetch_sub(1, Ordering::SeqCst);
        e
    }

    /// Worker side: signal that this worker is done with the run. The
    /// worker must not touch the job after this.
    fn finish_one(&self) {
        if self.remaining.0.fetch_sub(1, Ordering::SeqCst) == 1
            && self.caller_waiting.load(Ordering::SeqCst)
        {
            // The caller sets `caller_waiting` under `done_lock` and keeps
            // the lock until it waits, so this notify cannot be lost.
            let _g = self
                .done_lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.done_cv.notify_one();
        }
    }

    /// Caller side: wait until every worker has called `finish_one`.
    fn wait_done(&self) {
        let done = || (self.remaining.0.load(Ordering::Acquire) == 0).then_some(());
        if spin_until(self.spin, done).is_some() {
            return;
        }
        let mut g = self
            .done_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.caller_waiting.store(true, Ordering::SeqCst);
        while self.remaining.0.load(Ordering::SeqCst) != 0 {
            // Timed for the same reason as the park in `wait_for_run`.
            g = self
                .done_cv
                .wait_timeout(g, PARK_BACKSTOP)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        self.caller_waiting.store(false, Ordering::SeqCst);
    }

    fn record_panic(&self, payload: Box<dyn Any + Send>) {
        let mut slot = self.panic.lock().unwrap_or_else(PoisonError::into_inner);
        slot.get_or_insert(payload);
    }

    fn take_panic(&self) -> Option<Box<dyn Any + Send>> {
        self.panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

fn worker_main(shared: Arc<Shared>, thread_index: usize) {
    let mut seen = 0;
    loop {
        seen = shared.wait_for_run(seen);
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        let ctx = WorkCtx {
            thread_index,
            n_threads: shared.n_threads,
            counters: Counters::Shared(&shared.counters),
        };
        let job = shared.job.load(Ordering::Acquire);
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `run` stored a pointer to a `JobFn` living on its stack
            // before bumping the epoch we just observed (Acquire), and it does
            // not return (or unwind) until `remaining` reaches 0, i.e. until
            // this worker's `finish_one` below. So the pointee and the
            // closure it borrows outlive this use, and they are only read.
            let f: &JobFn<'_> = unsafe { &*(job as *const JobFn<'_>) };
            f(&ctx)
        }));
        if let Err(payload) = result {
            shared.record_panic(payload);
        }
        shared.finish_one();
    }
}

/// A fixed set of threads that run closures together. See the module docs.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Set while a run is in progress (re-entrancy check).
    running: Cell<bool>,
    /// `!Sync`: runs must not overlap, so only one thread may call `run`.
    _not_sync: PhantomData<Cell<()>>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in total (the caller counts; 0 is
    /// taken as 1). Panics if the OS refuses to start a thread.
    pub fn new(n_threads: usize) -> ThreadPool {
        Self::with_spin(n_threads, DEFAULT_SPIN)
    }

    /// Like [`ThreadPool::new`] with the time a waiting thread spins before
    /// parking (0 parks at once).
    pub fn with_spin(n_threads: usize, spin: Duration) -> ThreadPool {
        Self::try_with_spin(n_threads, spin)
            .unwrap_or_else(|e| panic!("cannot start {n_threads} pool threads: {e}"))
    }

    /// Like [`ThreadPool::with_spin`], returning the error of a failed spawn.
    pub fn try_with_spin(n_threads: usize, spin: Duration) -> std::io::Result<ThreadPool> {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            spin,
            epoch: Padded(AtomicUsize::new(0)),
            job: AtomicPtr::new(std::ptr::null_mut()),
            shutdown: AtomicBool::new(false),
            sleepers: Padded(AtomicUsize::new(0)),
            remaining: Padded(AtomicUsize::new(0)),
            counters: (0..n_threads)
                .map(|_| Padded(AtomicUsize::new(0)))
                .collect(),
            caller_waiting: AtomicBool::new(false),
            done_lock: Mutex::new(()),
            done_cv: Condvar::new(),
            panic: Mutex::new(None),
        });
        let mut pool = ThreadPool {
            shared,
            workers: Vec::with_capacity(n_threads - 1),
            running: Cell::new(false),
            _not_sync: PhantomData,
        };
        for i in 1..n_threads {
            let shared = Arc::clone(&pool.shared);
            // On error `pool` drops here and stops the workers started so far.
            let handle = thread::Builder::new()
                .name(format!("cachefit-pool-{i}"))
                .spawn(move || worker_main(shared, i))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// A pool with one thread per core the OS lets us use.
    pub fn with_available_parallelism() -> ThreadPool {
        ThreadPool::new(thread::available_parallelism().map_or(1, |n| n.get()))
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Run `f` once on every thread of the pool (the caller is thread 0) and
    /// return when all are done. A panic in `f` on any thread is re-raised
    /// here after all threads have finished.
    pub fn run<F>(&self, f: F)
    where
        F: Fn(&WorkCtx<'_>) + Sync,
    {
        assert!(
            !self.running.replace(true),
            "ThreadPool::run called from inside a run of the same pool"
        );
        let _reset = ResetOnDrop(&self.running);

        if self.workers.is_empty() {
            f(&WorkCtx {
                thread_index: 0,
                n_threads: 1,
                counters: Counters::Local(Cell::new(0)),
            });
            return;
        }

        let sh = &*self.shared;
        for c in sh.counters.iter() {
            c.0.store(0, Ordering::Relaxed);
        }
        sh.remaining.0.store(self.workers.len(), Ordering::Relaxed);
        let job: JobFn<'_> = &f;
        sh.job
            .store(&job as *const JobFn<'_> as *mut (), Ordering::Relaxed);
        // Publishes the job, counters and `remaining` (SeqCst includes
        // Release); SeqCst also orders it before the `sleepers` load (see
        // `wait_for_run`).
        sh.epoch.0.fetch_add(1, Ordering::SeqCst);
        if sh.sleepers.0.load(Ordering::SeqCst) > 0 {
            for w in &self.workers {
                w.thread().unpark();
            }
        }

        let ctx = WorkCtx {
            thread_index: 0,
            n_threads: sh.n_threads,
            counters: Counters::Shared(&sh.counters),
        };
        let ours = panic::catch_unwind(AssertUnwindSafe(|| f(&ctx)));
        // Even if our share panicked, the workers still use `job` and `f`:
        // wait for them before unwinding past this frame.
        sh.wait_done();
        sh.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        let theirs = sh.take_panic();
        if let Err(payload) = ours {
            panic::resume_unwind(payload);
        }
        if let Some(payload) = theirs {
            panic::resume_unwind(payload);
        }
    }

    /// Split `0..n_items` into chunks of `chunk_size` and call
    /// `f(range, thread_index)` for each, spread over the pool.
    pub fn for_each_chunk<F>(&self, n_items: usize, chunk_size: usize, f: F)
    where
        F: Fn(Range<usize>, usize) + Sync,
    {
        assert!(chunk_size > 0, "chunk_size must be positive");
        self.run(|ctx| {
            for r in ctx.chunks(n_items, chunk_size) {
                f(r, ctx.thread_index);
            }
        });
    }

    /// Split `data` into chunks of `chunk_size` elements and call
    /// `f(start, chunk, thread_index)` for each, spread over the pool, where
    /// `chunk` is `data[start..start + chunk.len()]`.
    pub fn for_each_chunk_mut<T, F>(&self, data: &mut [T], chunk_size: usize, f: F)
    where
        T: Send,
        F: Fn(usize, &mut [T], usize) + Sync,
    {
        assert!(chunk_size > 0, "chunk_size must be positive");
        let len = data.len();
        let base = SharedMutPtr(data.as_mut_ptr());
        self.run(|ctx| {
            for r in ctx.chunks(len, chunk_size) {
                // SAFETY: `data` is exclusively borrowed for this whole call
                // and `run` returns only after every thread is done, so only
                // these chunks access it. Every thread iterates the same
                // (len, chunk_size) split, in which each chunk index is
                // handed out exactly once per run (the run's counters start
                // at 0, only grow, and `run` cannot nest), so the ranges are
                // disjoint and each lies within `0..len`.
                let chunk =
                    unsafe { std::slice::from_raw_parts_mut(base.get().add(r.start), r.len()) };
                f(r.start, chunk, ctx.thread_index);
            }
        });
    }
}

/// A `*mut T` that `for_each_chunk_mut` shares with the pool's threads.
struct SharedMutPtr<T>(*mut T);

impl<T> SharedMutPtr<T> {
    // A method, so closures capture the wrapper and not the raw field.
    fn get(&self) -> *mut T {
        self.0
    }
}

// SAFETY: the pointer is only turned into disjoint `&mut [T]` chunks, one per
// thread at a time (see `for_each_chunk_mut`), which is what sending `&mut T`
// to another thread needs: `T: Send`.
unsafe impl<T: Send> Sync for SharedMutPtr<T> {}

struct ResetOnDrop<'a>(&'a Cell<bool>);

impl Drop for ResetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::Release);
        sh.epoch.0.fetch_add(1, Ordering::SeqCst);
        for w in &self.workers {
            w.thread().unpark();
        }
        for w in self.workers.drain(..) {
            // Workers catch panics from jobs, so a join error would be a bug
            // in the pool itself; nothing useful to do with it in drop.
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads())
            .field("spin", &self.shared.spin)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::atomic::AtomicU64;

    /// Fewer repetitions under Miri, which runs threads very slowly.
    const fn reps(native: usize, miri: usize) -> usize {
        if cfg!(miri) {
            miri
        } else {
            native
        }
    }

    fn max_threads() -> usize {
        if cfg!(miri) {
            3
        } else {
            8
        }
    }

    #[test]
    fn split_range_covers_evenly() {
        for n in [0, 1, 5, 7, 64, 1001] {
            for parts in 1..=9 {
                let mut next = 0;
                for p in 0..parts {
                    let r = split_range(n, parts, p);
                    assert_eq!(r.start, next);
                    assert!(r.len() == n / parts || r.len() == n / parts + 1);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn results_match_single_thread() {
        let n = reps(10_007, 301);
        let input: Vec<u64> = (0..n as u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let want: Vec<u64> = input.iter().map(|v| v.rotate_left(7) ^ 3).collect();
        for t in 1..=max_threads() {
            let pool = ThreadPool::new(t);
            assert_eq!(pool.n_threads(), t);
            for chunk in [1, 3, 64, 1000, n, n + 5] {
                let mut out = vec![0u64; n];
                pool.for_each_chunk_mut(&mut out, chunk, |start, ys, _| {
                    for (i, y) in ys.iter_mut().enumerate() {
                        *y = input[start + i].rotate_left(7) ^ 3;
                    }
                });
                assert_eq!(out, want, "threads={t} chunk={chunk}");
            }
        }
    }

    #[test]
    fn every_chunk_exactly_once_uneven() {
        for t in 1..=max_threads() {
            let pool = ThreadPool::new(t);
            for (n, chunk) in [
                (0, 4),
                (1, 4),
                (10, 3),
                (17, 16),
                (100, 7),
                (5, 100),
                (64, 1),
            ] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.for_each_chunk(n, chunk, |r, ti| {
                    assert!(ti < t);
                    assert!(r.len() <= chunk && !r.is_empty());
                    assert!(r.start % chunk == 0 && r.end <= n);
                    for i in r {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "t={t} n={n} chunk={chunk}"
                );
            }
        }
    }

    #[test]
    fn many_tiny_runs() {
        for (t, spin) in [
            (2, DEFAULT_SPIN),
            (3, Duration::ZERO),
            (4, Duration::from_micros(1)),
        ] {
            let pool = ThreadPool::with_spin(t, spin);
            let runs = reps(10_000, 50);
            let per_thread: Vec<AtomicUsize> = (0..t).map(|_| AtomicUsize::new(0)).collect();
            let total = AtomicU64::new(0);
            for run in 0..runs {
                pool.run(|ctx| {
                    assert_eq!(ctx.n_threads, t);
                    per_thread[ctx.thread_index].fetch_add(1, Ordering::Relaxed);
                    total.fetch_add(run as u64, Ordering::Relaxed);
                });
                // Every thread has finished before `run` returns.
                for c in &per_thread {
                    assert_eq!(c.load(Ordering::Relaxed), run + 1);
                }
            }
            let runs = runs as u64;
            assert_eq!(
                total.load(Ordering::Relaxed),
                t as u64 * runs * (runs - 1) / 2
            );
        }
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = ThreadPool::with_spin(3, Duration::ZERO);
        for _ in 0..reps(20, 3) {
            thread::sleep(Duration::from_millis(2));
            let count = AtomicUsize::new(0);
            pool.run(|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(count.into_inner(), 3);
        }
    }

    #[test]
    fn single_thread_runs_inline() {
        let pool = ThreadPool::new(1);
        let me = thread::current().id();
        pool.run(|ctx| {
            assert_eq!((ctx.thread_index, ctx.n_threads), (0, 1));
            assert_eq!(thread::current().id(), me);
            assert_eq!(
                ctx.chunks(10, 3).collect::<Vec<_>>(),
                vec![0..3, 3..6, 6..9, 9..10]
            );
            assert_eq!(ctx.static_range(10), 0..10);
        });
        assert_eq!(ThreadPool::new(0).n_threads(), 1);
    }

    #[test]
    fn static_ranges_partition() {
        let pool = ThreadPool::new(3);
        let seen: Vec<AtomicUsize> = (0..10).map(|_| AtomicUsize::new(0)).collect();
        pool.run(|ctx| {
            for i in ctx.static_range(10) {
                seen[i].fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
    }

    fn panic_message(p: &(dyn Any + Send)) -> String {
        p.downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default()
    }

    #[test]
    fn worker_panic_propagates_and_pool_survives() {
        let pool = ThreadPool::new(3);
        let err = panic::catch_unwind(AssertUnwindSafe(|| {
            pool.run(|ctx| {
                if ctx.thread_index == 2 {
                    panic!("boom in worker");
                }
            })
        }))
        .unwrap_err();
        assert_eq!(panic_message(&*err), "boom in worker");
        // Still usable, and no stale panic left behind.
        let count = AtomicUsize::new(0);
        pool.run(|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.into_inner(), 3);
    }

    #[test]
    fn caller_panic_waits_for_workers() {
        let pool = ThreadPool::new(2);
        let finished = AtomicBool::new(false);
        let err = panic::catch_unwind(AssertUnwindSafe(|| {
            pool.run(|ctx| {
                if ctx.thread_index == 0 {
                    panic!("boom in caller");
                }
                thread::sleep(Duration::from_millis(if cfg!(miri) { 1 } else { 20 }));
                finished.store(true, Ordering::SeqCst);
            })
        }))
        .unwrap_err();
        assert_eq!(panic_message(&*err), "boom in caller");
        assert!(
            finished.load(Ordering::SeqCst),
            "run unwound before the worker finished"
        );
        // Panics on every thread: one payload comes out, the pool survives.
        assert!(panic::catch_unwind(AssertUnwindSafe(|| pool.run(|_| panic!("all")))).is_err());
        let count = AtomicUsize::new(0);
        pool.run(|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.into_inner(), 2);
    }

    thread_local! {
        static POOL: RefCell<Option<ThreadPool>> = const { RefCell::new(None) };
    }

    #[test]
    fn nested_run_panics_instead_of_deadlocking() {
        POOL.with(|p| *p.borrow_mut() = Some(ThreadPool::new(2)));
        let err = panic::catch_unwind(|| {
            POOL.with(|p| {
                p.borrow().as_ref().unwrap().run(|ctx| {
                    if ctx.thread_index == 0 {
                        POOL.with(|p| p.borrow().as_ref().unwrap().run(|_| {}));
                    }
                })
            })
        })
        .unwrap_err();
        assert!(panic_message(&*err).contains("inside a run"));
        // The pool is usable again afterwards.
        POOL.with(|p| {
            let count = AtomicUsize::new(0);
            p.borrow().as_ref().unwrap().run(|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(count.into_inner(), 2);
            p.borrow_mut().take();
        });
    }

    #[test]
    fn drop_while_idle_joins() {
        // Right after start (workers may not have reached their wait yet).
        drop(ThreadPool::new(4));
        // After a run, while spinning.
        let pool = ThreadPool::new(3);
        pool.run(|_| {});
        drop(pool);
        // After the workers have parked.
        let pool = ThreadPool::with_spin(3, Duration::from_micros(1));
        pool.run(|_| {});
        thread::sleep(Duration::from_millis(5));
        drop(pool);
    }

    #[test]
    fn pool_can_move_to_another_thread() {
        let pool = ThreadPool::new(2);
        pool.run(|_| {});
        let pool = thread::spawn(move || {
            let count = AtomicUsize::new(0);
            pool.run(|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(count.into_inner(), 2);
            pool
        })
        .join()
        .unwrap();
        pool.run(|_| {});
    }

    #[test]
    fn stealing_balances_a_slow_thread() {
        // Thread 1 is slow; the caller must take over its chunks.
        let pool = ThreadPool::new(2);
        let by_thread: Vec<AtomicUsize> = (0..2).map(|_| AtomicUsize::new(0)).collect();
        pool.for_each_chunk(reps(40, 8), 1, |_, ti| {
            if ti == 1 {
                thread::sleep(Duration::from_millis(if cfg!(miri) { 1 } else { 10 }));
            }
            by_thread[ti].fetch_add(1, Ordering::Relaxed);
        });
        let (a, b) = (
            by_thread[0].load(Ordering::Relaxed),
            by_thread[1].load(Ordering::Relaxed),
        );
        assert_eq!(a + b, reps(40, 8));
        assert!(a > b, "caller did {a} chunks, slow worker {b}");
    }
}
