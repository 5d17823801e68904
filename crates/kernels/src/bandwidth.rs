//! Memory bandwidth probes: how fast this machine reads (and copies) a
//! buffer of a given size with a given pool, so a matvec's weight stream can
//! be put next to what the memory level holding those weights delivers.
//!
//! A pass reads the whole buffer once, split evenly over the pool's threads
//! (each thread always gets the same part, so a buffer that fits the
//! threads' caches stays there, as a matrix's rows do in matvec). Small
//! buffers are read several times per pass so timer and wake-up costs stay
//! small. After a warm-up pass, passes repeat until `min_time` has passed
//! (at least [`MIN_PASSES`]); the best pass is reported, as STREAM does,
//! because on a shared machine the noise only ever makes passes slower.

use crate::isa::PerIsa;
use crate::pages::HugeBuf;
use crate::pool::ThreadPool;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Passes timed at least, however long they take.
pub const MIN_PASSES: usize = 3;
/// A pass reads at least this many bytes (repeating small buffers).
const MIN_PASS_BYTES: usize = 8 << 20;

/// The result of a probe: bytes moved per second, best and median pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bandwidth {
    pub best_gbps: f64,
    pub median_gbps: f64,
    pub passes: usize,
}

/// Read bandwidth in GB/s (1e9 bytes/s, best pass) for a `bytes`-byte
/// buffer read by all threads of `pool`.
pub fn read_bandwidth(pool: &ThreadPool, bytes: usize, min_time: Duration) -> f64 {
    measure_read(pool, bytes, min_time).best_gbps
}

/// Copy bandwidth in GB/s (best pass) between two `bytes`-byte buffers,
/// counting bytes read plus bytes written (`2 × bytes` per copy, as STREAM).
pub fn copy_bandwidth(pool: &ThreadPool, bytes: usize, min_time: Duration) -> f64 {
    measure_copy(pool, bytes, min_time).best_gbps
}

/// A buffer of `bytes` bytes (rounded up to whole words) to read from, in
/// huge pages where the OS gives them ([`HugeBuf`]): the probes measure
/// what the memory delivers, not the TLB, as the models' weights are held.
/// Filled with non-zero data: a zeroed allocation may map every page to the
/// kernel's single zero page, which would make any size look cache-resident.
/// Panics if the OS refuses the map.
pub fn read_buffer(bytes: usize) -> HugeBuf<u64> {
    let mut buf = HugeBuf::zeroed(bytes.div_ceil(8))
        .unwrap_or_else(|e| panic!("cannot map a {bytes}-byte probe buffer: {e}"));
    for (i, w) in buf.iter_mut().enumerate() {
        *w = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    }
    buf
}

/// One read of all of `buf`, split over `pool` (`static_range` per thread);
/// returns a checksum so the reads cannot be optimised away. This is the
/// unit the probes time, exposed for benchmarks.
pub fn read_pass(pool: &ThreadPool, buf: &[u64]) -> u64 {
    read_pass_reps(pool, buf, 1, crate::selected().read_sum)
}

fn read_pass_reps(pool: &ThreadPool, buf: &[u64], reps: usize, reduce: fn(&[u64]) -> u64) -> u64 {
    let total = std::sync::atomic::AtomicU64::new(0);
    pool.run(|ctx| {
        let part = &buf[ctx.static_range(buf.len())];
        let mut s = 0u64;
        for _ in 0..reps {
            s = s.wrapping_add(reduce(black_box(part)));
        }
        total.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
    });
    total.into_inner()
}

/// Time `pass` (which moves `bytes_per_pass` bytes) after one warm-up
/// pass, for at least `min_time` and [`MIN_PASSES`] passes. Benchmarks use
/// it to time other streams (a matvec) the same way as the probes.
pub fn time_passes(bytes_per_pass: usize, min_time: Duration, mut pass: impl FnMut()) -> Bandwidth {
    pass();
    let mut secs = Vec::new();
    let start = Instant::now();
    while secs.len() < MIN_PASSES || start.elapsed() < min_time {
        let t = Instant::now();
        pass();
        secs.push(t.elapsed().as_secs_f64().max(1e-9));
    }
    secs.sort_by(f64::total_cmp);
    let gbps = |s: f64| bytes_per_pass as f64 / s / 1e9;
    Bandwidth {
        best_gbps: gbps(secs[0]),
        median_gbps: gbps(secs[secs.len() / 2]),
        passes: secs.len(),
    }
}

/// Repetitions per pass for a buffer of `bytes`.
fn reps_for(bytes: usize) -> usize {
    MIN_PASS_BYTES.div_ceil(bytes.max(1))
}

/// [`read_bandwidth`] with the median and pass count.
pub fn measure_read(pool: &ThreadPool, bytes: usize, min_time: Duration) -> Bandwidth {
    let buf = read_buffer(bytes);
    let reps = reps_for(bytes);
    let reduce = crate::selected().read_sum;
    time_passes(buf.len() * 8 * reps, min_time, || {
        black_box(read_pass_reps(pool, &buf, reps, reduce));
    })
}

/// [`copy_bandwidth`] with the median and pass count.
pub fn measure_copy(pool: &ThreadPool, bytes: usize, min_time: Duration) -> Bandwidth {
    let src = read_buffer(bytes);
    // The destination in huge pages too (written once here, so that every
    // page exists before the timing).
    let mut dst = read_buffer(bytes);
    let reps = reps_for(bytes);
    let chunk = src.len().div_ceil(pool.n_threads()).max(1);
    time_passes(src.len() * 16 * reps, min_time, || {
        for _ in 0..reps {
            pool.for_each_chunk_mut(&mut dst, chunk, |start, d, _| {
                d.copy_from_slice(&src[start..start + d.len()]);
            });
        }
        black_box(&mut dst);
    })
}

/// Sum of words. A plain wrapping-add fold: LLVM vectorises it with
/// several vector accumulators (the target-feature wrappers below give it
/// 256/512-bit loads).
#[inline(always)]
fn sum_words(words: &[u64]) -> u64 {
    words.iter().fold(0u64, |a, &w| a.wrapping_add(w))
}

fn sum_baseline(words: &[u64]) -> u64 {
    sum_words(words)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_avx2(words: &[u64]) -> u64 {
    sum_words(words)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum_avx512(words: &[u64]) -> u64 {
    sum_words(words)
}

/// The reduction of every set, with the same wide loads as its kernels.
pub(crate) const READ_SUM: PerIsa<fn(&[u64]) -> u64> = {
    let k = PerIsa::new(sum_baseline as fn(&[u64]) -> u64);
    #[cfg(target_arch = "x86_64")]
    let k = k
        // SAFETY: reachable only through `PerIsa::get(Isa::Avx2)` (or
        // AVX-512, which implies it), whose caller guarantees AVX2.
        .avx2(|w| unsafe { sum_avx2(w) })
        // SAFETY: reachable only through `PerIsa::get(Isa::Avx512)`, whose
        // caller guarantees AVX-512F.
        .avx512(|w| unsafe { sum_avx512(w) });
    k
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reduction_sums_every_word() {
        for n in [0, 1, 31, 32, 33, 1000, 4099] {
            let buf = read_buffer(n * 8);
            assert_eq!(buf.len(), n);
            assert!(buf.iter().all(|&w| w != 0));
            let want = buf.iter().fold(0u64, |a, &w| a.wrapping_add(w));
            for isa in crate::isa::Isa::supported() {
                let sum = crate::table(isa).unwrap().read_sum;
                assert_eq!(sum(&buf), want, "{} n={n}", isa.name());
            }
            for t in 1..=3 {
                let pool = ThreadPool::new(t);
                assert_eq!(read_pass(&pool, &buf), want);
                assert_eq!(
                    read_pass_reps(&pool, &buf, 3, sum_baseline),
                    want.wrapping_mul(3)
                );
            }
        }
    }

    #[test]
    fn probes_report_sane_numbers() {
        for t in [1, 2] {
            let pool = ThreadPool::new(t);
            let r = measure_read(&pool, 64 << 10, Duration::from_millis(5));
            assert!(r.passes >= MIN_PASSES);
            assert!(r.best_gbps.is_finite() && r.best_gbps > 0.1, "{r:?}");
            assert!(r.best_gbps >= r.median_gbps);
            let c = copy_bandwidth(&pool, 64 << 10, Duration::from_millis(5));
            assert!(c.is_finite() && c > 0.1, "{c}");
        }
        // Odd sizes round up to whole words and still work.
        assert!(read_bandwidth(&ThreadPool::new(2), 1001, Duration::ZERO) > 0.0);
    }

    #[test]
    fn copy_copies() {
        // The copy pass itself, through the same pool helper.
        let src = read_buffer(10_000);
        let mut dst = vec![0u64; src.len()];
        let pool = ThreadPool::new(3);
        pool.for_each_chunk_mut(&mut dst, src.len().div_ceil(3), |start, d, _| {
            d.copy_from_slice(&src[start..start + d.len()]);
        });
        assert_eq!(dst, *src);
    }
}
