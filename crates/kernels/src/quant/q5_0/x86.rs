//! x86-64 dots for Q5_0 · Q8_0: quants rebuilt unsigned (0..31) from nibble
//! and high bit, zero point removed as 16·Σy; exact for any activation.

use super::BlockQ5_0;
use crate::quant::q8_0::x86::*;
use crate::quant::q8_0::BlockQ8_0;
use core::arch::x86_64::*;

/// The 32 unsigned quants of one block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn quants_avx2(qs: &[u8; 16], qh: &[u8; 4]) -> __m256i {
    let high = _mm256_and_si256(
        bytes_from_bits_32(u32::from_le_bytes(*qh)),
        _mm256_set1_epi8(0x10),
    );
    _mm256_or_si256(nibbles_32(qs), high)
}

/// The 32 unsigned quants of one block (AVX-512BW mask add for bit 4).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) fn quants_256(qs: &[u8; 16], qh: &[u8; 4]) -> __m256i {
    let q = nibbles_32(qs);
    _mm256_mask_add_epi8(q, u32::from_le_bytes(*qh), q, _mm256_set1_epi8(0x10))
}

/// The unsigned quants of two blocks, the first in the low half.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) fn quants_pair(a: (&[u8; 16], &[u8; 4]), b: (&[u8; 16], &[u8; 4])) -> __m512i {
    let q = nibbles_pair(a.0, b.0);
    let k = u32::from_le_bytes(*a.1) as u64 | (u32::from_le_bytes(*b.1) as u64) << 32;
    _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(0x10))
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_avx2(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let sixteen = _mm256_set1_epi8(16);
    let block = |a: &BlockQ5_0, b: &BlockQ8_0| -> __m256 {
        _mm256_cvtepi32_ps(dot_offset_u8_i8(
            quants_avx2(&a.qs, &a.qh),
            sixteen,
            load_i8x32(&b.qs),
        ))
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
pub unsafe fn vec_dot_avx512(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let sixteen = _mm512_set1_epi8(16);
    let mut acc = _mm512_setzero_ps();
    let (xp, yp) = (x.chunks_exact(2), y.chunks_exact(2));
    let (xr, yr) = (xp.remainder(), yp.remainder());
    for (a, b) in xp.zip(yp) {
        let q = quants_pair((&a[0].qs, &a[0].qh), (&a[1].qs, &a[1].qh));
        let dot = dpbusd_offset(q, sixteen, load_q8_pair(&b[0], &b[1]));
        let s = pair_scale(a[0].d, b[0].d, a[1].d, b[1].d);
        acc = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot), acc);
    }
    let mut sum = _mm512_reduce_add_ps(acc);
    if let ([a], [b]) = (xr, yr) {
        let q = quants_256(&a.qs, &a.qh);
        let dot = dpbusd_offset_256(q, _mm256_set1_epi8(16), load_i8x32(&b.qs));
        sum += hsum_i32x8(dot) as f32 * (f16_to_f32(a.d) * f16_to_f32(b.d));
    }
    sum
}
