//! AVX2 and AVX-512 (VNNI) TQ2_0 × Q8_K dots. The 2-bit fields are used as
//! stored (`value + 1`, unsigned) in `u8 × i8` multiplies and the block's
//! sum of activations (the Q8_K `bsums`) is subtracted at the end. Every sum
//! is exact, so the result is bit-identical to the reference.

use super::BlockTQ2_0;
use crate::quant::f16::x86::to_f32;
use crate::quant::q8_k::BlockQ8K;
use crate::quant::tq1_0::x86::hsum_i32;
use std::arch::x86_64::*;

/// # Safety
/// The CPU must support AVX2. Activation blocks must come from the Q8_K
/// quantizer (their `bsums` must be the sums of their `qs`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_avx2(x: &[BlockTQ2_0], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let ones = _mm256_set1_epi16(1);
    let mask = _mm256_set1_epi8(3);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        // SAFETY: every load reads 32 bytes inside `xb.qs` (64 bytes),
        // `yb.qs` (256) or `yb.bsums` (32).
        let (qs, ys, bsums) = unsafe {
            let yq = yb.qs.as_ptr();
            (
                std::array::from_fn::<_, 2, _>(|c| {
                    _mm256_loadu_si256(xb.qs.as_ptr().add(32 * c).cast())
                }),
                std::array::from_fn::<_, 8, _>(|k| _mm256_loadu_si256(yq.add(32 * k).cast())),
                _mm256_loadu_si256(yb.bsums.as_ptr().cast()),
            )
        };
        // i16 lanes: at most 8 pairs of 3 * 128 each, far from overflow.
        let mut acc = _mm256_setzero_si256();
        for (c, q) in qs.into_iter().enumerate() {
            let fields = [
                q,
                _mm256_srli_epi16::<2>(q),
                _mm256_srli_epi16::<4>(q),
                _mm256_srli_epi16::<6>(q),
            ];
            for (k, f) in fields.into_iter().enumerate() {
                let f = _mm256_and_si256(f, mask);
                acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(f, ys[4 * c + k]));
            }
        }
        let s = _mm256_sub_epi32(_mm256_madd_epi16(acc, ones), _mm256_madd_epi16(bsums, ones));
        sum += hsum_i32(s) as f32 * (yb.d * to_f32(xb.d));
    }
    sum
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI. Activation blocks must come
/// from the Q8_K quantizer (their `bsums` must be the sums of their `qs`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_avx512(x: &[BlockTQ2_0], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let ones = _mm256_set1_epi16(1);
    let mask = _mm512_set1_epi8(3);
    // Per 16-bit lane shift counts: 0 then 2 (fields 0, 1), 4 then 6
    // (fields 2, 3) across the two 256-bit halves, so each register of
    // fields lines up with 64 consecutive activations.
    let shift_01 = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
    let shift_23 = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(6));
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        // SAFETY: every load reads inside `xb.qs` (two 32-byte halves),
        // `yb.qs` (four 64-byte quarters) or `yb.bsums` (32 bytes).
        let (qs, ys, bsums) = unsafe {
            let yq = yb.qs.as_ptr();
            (
                std::array::from_fn::<_, 2, _>(|c| {
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(xb.qs.as_ptr().add(32 * c).cast()))
                }),
                std::array::from_fn::<_, 4, _>(|k| _mm512_loadu_si512(yq.add(64 * k).cast())),
                _mm256_loadu_si256(yb.bsums.as_ptr().cast()),
            )
        };
        let mut acc = _mm512_zextsi256_si512(_mm256_sub_epi32(
            _mm256_setzero_si256(),
            _mm256_madd_epi16(bsums, ones),
        ));
        for (c, q) in qs.into_iter().enumerate() {
            let f01 = _mm512_and_si512(_mm512_srlv_epi16(q, shift_01), mask);
            let f23 = _mm512_and_si512(_mm512_srlv_epi16(q, shift_23), mask);
            acc = _mm512_dpbusd_epi32(acc, f01, ys[2 * c]);
            acc = _mm512_dpbusd_epi32(acc, f23, ys[2 * c + 1]);
        }
        sum += _mm512_reduce_add_epi32(acc) as f32 * (yb.d * to_f32(xb.d));
    }
    sum
}
