//! x86-64 dots for Q4_1 · Q8_0: unsigned quants straight into the integer
//! dot, plus Σy per block for the minimum.

use super::BlockQ4_1;
use crate::quant::q8_0::x86::*;
use crate::quant::q8_0::BlockQ8_0;
use core::arch::x86_64::*;
use half::f16;

/// [d0·dy0, m0·dy0, d1·dy1, m1·dy1] for two blocks of a type with a
/// minimum (Q4_1, Q5_1), each given as (d, m, dy).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn scales_dm(b0: (f16, f16, f16), b1: (f16, f16, f16)) -> __m128 {
    _mm_mul_ps(f16x4(b0.0, b0.1, b1.0, b1.1), f16x4(b0.2, b0.2, b1.2, b1.2))
}

/// d·dy·Σq·y + m·dy·Σy of one block added to `acc`, from its integer lanes
/// and the scales in lanes `k`, `k + 1` of `s` (see [`scales_dm`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn accumulate(s: __m128, k: i32, dot: __m256i, sumy: __m256i, acc: __m256) -> __m256 {
    let acc = _mm256_fmadd_ps(splat_lane(s, k), _mm256_cvtepi32_ps(dot), acc);
    _mm256_fmadd_ps(splat_lane(s, k + 1), _mm256_cvtepi32_ps(sumy), acc)
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_avx2(x: &[BlockQ4_1], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let block = |a: &BlockQ4_1, b: &BlockQ8_0, s: __m128, k: i32, acc: __m256| -> __m256 {
        let yv = load_i8x32(&b.qs);
        accumulate(s, k, dot_u8_i8(nibbles_32(&a.qs), yv), sum_i8(yv), acc)
    };
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (xp, yp) = (x.chunks_exact(2), y.chunks_exact(2));
    let (xr, yr) = (xp.remainder(), yp.remainder());
    for (a, b) in xp.zip(yp) {
        let s = scales_dm((a[0].d, a[0].m, b[0].d), (a[1].d, a[1].m, b[1].d));
        acc0 = block(&a[0], &b[0], s, 0, acc0);
        acc1 = block(&a[1], &b[1], s, 2, acc1);
    }
    if let ([a], [b]) = (xr, yr) {
        let s = scales_dm((a.d, a.m, b.d), (a.d, a.m, b.d));
        acc0 = block(a, b, s, 0, acc0);
    }
    hsum_f32x8(_mm256_add_ps(acc0, acc1))
}

/// # Safety
/// The CPU must support the [`crate::Isa::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn vec_dot_avx512(x: &[BlockQ4_1], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let ones = _mm512_set1_epi8(1);
    let mut acc = _mm512_setzero_ps();
    let (xp, yp) = (x.chunks_exact(2), y.chunks_exact(2));
    let (xr, yr) = (xp.remainder(), yp.remainder());
    for (a, b) in xp.zip(yp) {
        let yv = load_q8_pair(&b[0], &b[1]);
        let dot = dpbusd(nibbles_pair(&a[0].qs, &a[1].qs), yv);
        let sumy = dpbusd(ones, yv);
        let s = scales_dm((a[0].d, a[0].m, b[0].d), (a[1].d, a[1].m, b[1].d));
        acc = _mm512_fmadd_ps(splat_lanes(s, 0, 2), _mm512_cvtepi32_ps(dot), acc);
        acc = _mm512_fmadd_ps(splat_lanes(s, 1, 3), _mm512_cvtepi32_ps(sumy), acc);
    }
    let mut tail = _mm256_setzero_ps();
    if let ([a], [b]) = (xr, yr) {
        let yv = load_i8x32(&b.qs);
        let dot = dpbusd_256(nibbles_32(&a.qs), yv);
        let s = scales_dm((a.d, a.m, b.d), (a.d, a.m, b.d));
        tail = accumulate(s, 0, dot, dpbusd_256(_mm256_set1_epi8(1), yv), tail);
    }
    _mm512_reduce_add_ps(acc) + hsum_f32x8(tail)
}
