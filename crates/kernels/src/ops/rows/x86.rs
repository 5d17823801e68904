//! AVX2 attention row kernels: the eight lanes of a `ymm` are the one-row
//! reference's eight accumulators, and every step is the reference's
//! multiply then add (no FMA), so results are bit-identical.

use core::arch::x86_64::*;

/// Rows whose dots run at once: four independent chains of additions.
const ROWS: usize = 4;

/// `acc.iter().sum()` of the eight lanes, then `+= q[i]·k[i]` over the
/// tail, as the reference finishes.
#[inline]
#[target_feature(enable = "avx2")]
fn finish(acc: __m256, q_tail: &[f32], k_tail: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    let mut s = lanes.iter().sum::<f32>();
    for (x, y) in q_tail.iter().zip(k_tail) {
        s += x * y;
    }
    s
}

/// # Safety
/// The CPU must support AVX2. Row `p < out.len()` of `rows` (`q.len()`
/// values from `p·stride`) lies inside `rows`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_rows_avx2(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    let len = q.len();
    let main = len / 8 * 8;
    let n = out.len();
    let base = rows.as_ptr();
    let mut p = 0;
    while p + ROWS <= n {
        let mut acc = [_mm256_setzero_ps(); ROWS];
        let mut i = 0;
        while i < main {
            // SAFETY: i + 8 <= main <= len; rows p..p+ROWS hold `len`
            // values from (p+j)·stride (caller).
            unsafe {
                let qv = _mm256_loadu_ps(q.as_ptr().add(i));
                for (j, a) in acc.iter_mut().enumerate() {
                    let kv = _mm256_loadu_ps(base.add((p + j) * stride + i));
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(qv, kv));
                }
            }
            i += 8;
        }
        for (j, &a) in acc.iter().enumerate() {
            let row = &rows[(p + j) * stride..(p + j) * stride + len];
            out[p + j] = finish(a, &q[main..], &row[main..]);
        }
        p += ROWS;
    }
    while p < n {
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < main {
            // SAFETY: as above, for row p.
            unsafe {
                let qv = _mm256_loadu_ps(q.as_ptr().add(i));
                let kv = _mm256_loadu_ps(base.add(p * stride + i));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(qv, kv));
            }
            i += 8;
        }
        let row = &rows[p * stride..p * stride + len];
        out[p] = finish(acc, &q[main..], &row[main..]);
        p += 1;
    }
}

/// # Safety
/// The CPU must support AVX2. Row `p < w.len()` of `rows` (`acc.len()`
/// values from `p·stride`) lies inside `rows`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn axpy_rows_avx2(acc: &mut [f32], w: &[f32], rows: &[f32], stride: usize) {
    let len = acc.len();
    let base = rows.as_ptr();
    // 32 columns at a time in four registers across every row, then 8,
    // then the scalar tail: each element sees the rows in order.
    let mut c = 0;
    while c + 32 <= len {
        // SAFETY: c + 32 <= len: inside `acc` and inside every row.
        unsafe {
            let a = acc.as_mut_ptr().add(c);
            let mut r = [
                _mm256_loadu_ps(a),
                _mm256_loadu_ps(a.add(8)),
                _mm256_loadu_ps(a.add(16)),
                _mm256_loadu_ps(a.add(24)),
            ];
            for (p, &wp) in w.iter().enumerate() {
                let wv = _mm256_set1_ps(wp);
                let v = base.add(p * stride + c);
                for (k, rk) in r.iter_mut().enumerate() {
                    *rk = _mm256_add_ps(*rk, _mm256_mul_ps(wv, _mm256_loadu_ps(v.add(8 * k))));
                }
            }
            for (k, rk) in r.iter().enumerate() {
                _mm256_storeu_ps(a.add(8 * k), *rk);
            }
        }
        c += 32;
    }
    while c + 8 <= len {
        // SAFETY: c + 8 <= len, as above.
        unsafe {
            let a = acc.as_mut_ptr().add(c);
            let mut r = _mm256_loadu_ps(a);
            for (p, &wp) in w.iter().enumerate() {
                let v = _mm256_loadu_ps(base.add(p * stride + c));
                r = _mm256_add_ps(r, _mm256_mul_ps(_mm256_set1_ps(wp), v));
            }
            _mm256_storeu_ps(a, r);
        }
        c += 8;
    }
    for (i, a) in acc.iter_mut().enumerate().skip(c) {
        for (p, &wp) in w.iter().enumerate() {
            *a += wp * rows[p * stride + i];
        }
    }
}
