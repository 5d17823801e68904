//! Q2_K × Q8_K dots for AVX2 and AVX-512 (VNNI): 2-bit values times int8
//! activations with `maddubs`, times the 4-bit sub-block scale into i32
//! lanes, one FMA of `d` per block. The mins only meet the activation
//! group sums (`bsums`).
//!
//! Every load reads a fixed-size field of a block at an offset bounded by
//! constant loop ranges, so the only safety conditions are the CPU feature
//! set, which the kernel tables guarantee ([`crate::isa`]), and equal block
//! counts, which [`crate::quant::vec_dots`] checks.

use super::{BlockQ2K, BlockQ8K};
use crate::quant::k_common::x86::*;
use std::arch::x86_64::*;

/// `(scales, Σ_j min_j·bsums_j)`: the 16 4-bit scales as bytes and the
/// min term in eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales_and_mins(x: &BlockQ2K, y: &BlockQ8K) -> (__m128i, __m256i) {
    // SAFETY: `x.scales` holds 16 bytes and `y.bsums` 32: the loads read
    // exactly them.
    unsafe {
        let m4 = _mm_set1_epi8(0xF);
        let packed = _mm_loadu_si128(x.scales.as_ptr().cast());
        let scales = _mm_and_si128(packed, m4);
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), m4));
        let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        (scales, _mm256_madd_epi16(mins, bs))
    }
}

/// # Safety
/// The CPU must support avx2, fma and f16c, and `x.len() == y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn vec_dot_avx2(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    // SAFETY: the caller guarantees the CPU features (`# Safety`); every
    // load below reads a fixed-size field of one block of `x` or `y` (or the
    // 16 unpacked scales) at an offset bounded by a constant loop range.
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm256_setzero_ps();
        for (xb, yb) in x.iter().zip(y) {
            let d = yb.d * f16_to_f32(xb.d);
            let dmin = -yb.d * f16_to_f32(xb.dmin);
            let (sc8, prod) = scales_and_mins(xb, yb);
            acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc_m);

            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                // Shifted right by 2 per step: bits 0..2 are then quarter s's.
                let mut bits = _mm256_loadu_si256(xb.qs.as_ptr().add(32 * h).cast());
                for s in 0..4 {
                    let q = _mm256_and_si256(bits, m3);
                    bits = _mm256_srli_epi16::<2>(bits);
                    let q8 = _mm256_loadu_si256(yb.qs.as_ptr().add(128 * h + 32 * s).cast());
                    // Sub-blocks 8h+2s (low 128 bits) and 8h+2s+1 (high).
                    let scale = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sc8, pair_ctrl(4 * h + s)));
                    sumi = _mm256_add_epi32(
                        sumi,
                        _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q, q8)),
                    );
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps_256(acc) + hsum_ps_256(acc_m)
    }
}

/// 64 weights per step: a half's 32 bytes broadcast to both 256-bit
/// halves, the upper shifted 2 bits further, so quarters 2t and 2t+1 sit
/// next to each other and meet one contiguous 64-byte activation load.
///
/// # Safety
/// The CPU must support the [`crate::Isa::Avx512`] set, and
/// `x.len() == y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn vec_dot_avx512(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    // SAFETY: the caller guarantees the CPU features (`# Safety`); every
    // load below reads a fixed-size field of one block of `x` or `y` (or the
    // 16 unpacked scales) at an offset bounded by a constant loop range.
    unsafe {
        let m3 = _mm512_set1_epi8(3);
        const UPPER: __mmask32 = 0xFFFF_0000;
        // Step (h, t) covers sub-blocks 8h + 4t .. 8h + 4t + 4.
        let idx: [__m512i; 4] = std::array::from_fn(|k| spread_idx(4 * k, 4));
        let mut acc = _mm512_setzero_ps();
        let mut acc_m = _mm256_setzero_ps();
        for (xb, yb) in x.iter().zip(y) {
            let d = yb.d * f16_to_f32(xb.d);
            let dmin = -yb.d * f16_to_f32(xb.dmin);
            let (sc8, prod) = scales_and_mins(xb, yb);
            acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc_m);
            let sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sc8));

            let mut sumi = _mm512_setzero_si512();
            for h in 0..2 {
                let v =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(xb.qs.as_ptr().add(32 * h).cast()));
                for (t, base) in [v, _mm512_srli_epi16::<4>(v)].into_iter().enumerate() {
                    let q = _mm512_and_si512(_mm512_mask_srli_epi16::<2>(base, UPPER, base), m3);
                    let q8 = _mm512_loadu_si512(yb.qs.as_ptr().add(128 * h + 64 * t).cast());
                    let scale = _mm512_permutexvar_epi16(idx[2 * h + t], sc);
                    sumi = _mm512_dpwssd_epi32(sumi, scale, _mm512_maddubs_epi16(q, q8));
                }
            }
            acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
        }
        hsum_ps_512(acc) + hsum_ps_256(acc_m)
    }
}
