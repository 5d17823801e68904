//! AVX2 and AVX-512 F32 dots, plus the horizontal sums the F16/BF16 dots
//! share.

use std::arch::x86_64::*;

/// Sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum_256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_avx2(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr(), y.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: (all loads) every index read is below `n`, checked by the loop
    // bounds; unaligned loads accept any address.
    unsafe {
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let o = i + 8 * k;
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(px.add(o)), _mm256_loadu_ps(py.add(o)), *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(px.add(i)),
                _mm256_loadu_ps(py.add(i)),
                acc[0],
            );
            i += 8;
        }
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut sum = hsum_256(v) as f64;
    for j in i..n {
        sum += (x[j] * y[j]) as f64;
    }
    sum as f32
}

/// # Safety
/// The CPU must support AVX-512 F.
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn dot_avx512(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr(), y.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: (all loads) full loads stay below `n` by the loop bounds; the
    // tail load is masked to the remaining `n - i` lanes, and masked-off lanes
    // are neither read nor faulted on.
    unsafe {
        while i + 64 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let o = i + 16 * k;
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(px.add(o)), _mm512_loadu_ps(py.add(o)), *a);
            }
            i += 64;
        }
        while i + 16 <= n {
            acc[0] = _mm512_fmadd_ps(
                _mm512_loadu_ps(px.add(i)),
                _mm512_loadu_ps(py.add(i)),
                acc[0],
            );
            i += 16;
        }
        if i < n {
            let m = ((1u32 << (n - i)) - 1) as __mmask16;
            let a = _mm512_maskz_loadu_ps(m, px.add(i));
            let b = _mm512_maskz_loadu_ps(m, py.add(i));
            acc[1] = _mm512_fmadd_ps(a, b, acc[1]);
        }
    }
    let v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(v)
}
