//! x86-64 dots for IQ4_NL · Q8_0: table lookup with `pshufb`.
//! AVX2 looks up the signed values and uses the sign trick (the table never
//! holds -128); AVX-512 looks up value + 128 (unsigned) and removes 128·Σy,
//! exact for any activation.

use super::{BlockIq4Nl, KVALUES};
use crate::quant::q8_0::x86::*;
use crate::quant::q8_0::BlockQ8_0;
use core::arch::x86_64::*;

/// The table in both 128-bit lanes (`pshufb` looks up within a lane).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn table_256(values: &[i8; 16]) -> __m256i {
    // SAFETY: the reference covers 16 readable bytes; unaligned load.
    let t = unsafe { _mm_loadu_si128(values.as_ptr().cast()) };
    _mm256_set_m128i(t, t)
}

/// [`KVALUES`] + 128 as unsigned bytes.
const KVALUES_U8: [i8; 16] = {
    let mut t = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = KVALUES[i] ^ -128;
        i += 1;
    }
    t
};

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_avx2(x: &[BlockIq4Nl], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let table = table_256(&KVALUES);
    let block = |a: &BlockIq4Nl, b: &BlockQ8_0| -> __m256 {
        let q = _mm256_shuffle_epi8(table, nibbles_32(&a.qs));
        _mm256_cvtepi32_ps(dot_i8_i8(q, load_i8x32(&b.qs)))
    };
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (xp, yp) = (x.chunks_exact(2), y.chunks_exact(2));
    let (xr, yr) = (xp.remainder(), yp.remainder());
    for (a, b) in xp.zip(yp) {
        let s = scales2(a[0].d, b[0].d, a[1].d, b[1].d);
        acc0 = _mm256_fmadd_ps(splat_lane(s, 0), block(&a[0], &b[0]), acc0);
        acc1 = _mm256_fmadd_ps(splat_lane(s, 2), block(&a[1], &b[1]), acc1);
    }
    if let ([a], [b]) = (xr, yr) {
        let s = scales2(a.d, b.d, a.d, b.d);
        acc0 = _mm256_fmadd_ps(splat_lane(s, 0), block(a, b), acc0);
    }
    hsum_f32x8(_mm256_add_ps(acc0, acc1))
}

/// # Safety
/// The CPU must support the [`crate::Isa::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn vec_dot_avx512(x: &[BlockIq4Nl], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let t256 = table_256(&KVALUES_U8);
    let table = pair_i(t256, t256);
    let bias = _mm512_set1_epi8(-128);
    let mut acc = _mm512_setzero_ps();
    let (xp, yp) = (x.chunks_exact(2), y.chunks_exact(2));
    let (xr, yr) = (xp.remainder(), yp.remainder());
    for (a, b) in xp.zip(yp) {
        let xu = _mm512_shuffle_epi8(table, nibbles_pair(&a[0].qs, &a[1].qs));
        let dot = dpbusd_offset(xu, bias, load_q8_pair(&b[0], &b[1]));
        let s = pair_scale(b[0].d, a[0].d, b[1].d, a[1].d);
        acc = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot), acc);
    }
    let mut sum = _mm512_reduce_add_ps(acc);
    if let ([a], [b]) = (xr, yr) {
        let xu = _mm256_shuffle_epi8(t256, nibbles_32(&a.qs));
        let dot = dpbusd_offset_256(xu, _mm256_set1_epi8(-128), load_i8x32(&b.qs));
        sum += hsum_i32x8(dot) as f32 * (f16_to_f32(b.d) * f16_to_f32(a.d));
    }
    sum
}
