//! Q4_K × Q8_K dots for AVX2 and AVX-512 (VNNI). Per super-block: nibbles
//! times int8 activations with `maddubs` (u8 × i8 pairs into i16; at most
//! 2·15·128, no saturation), times the sub-block scale into i32 lanes, then
//! one FMA of `d` into an f32 accumulator. The mins only meet the
//! activation group sums (`bsums`), never the values.
//!
//! Every load reads a fixed-size field of a block at an offset bounded by
//! constant loop ranges, so the only safety conditions are the CPU feature
//! set, which the kernel tables guarantee ([`crate::isa`]), and equal block
//! counts, which [`crate::quant::vec_dots`] checks.

use super::{BlockQ4K, BlockQ8K};
use crate::quant::k_common::unpack_scales_mins_k4;
use crate::quant::k_common::x86::*;
use std::arch::x86_64::*;

/// `Σ_j mins[j] · (bsums[2j] + bsums[2j+1])` as four i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mins_dot_bsums(sm: &[u8; 16], y: &BlockQ8K) -> __m128i {
    // SAFETY: the loads read bytes 8..16 of the 16-byte `sm` and the 32
    // bytes of `y.bsums`.
    unsafe {
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(sm.as_ptr().add(8).cast()));
        let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        let pairs = _mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        );
        _mm_madd_epi16(mins, pairs)
    }
}

/// # Safety
/// The CPU must support avx2, fma and f16c, and `x.len() == y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn vec_dot_avx2(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    // SAFETY: the caller guarantees the CPU features (`# Safety`); every
    // load below reads a fixed-size field of one block of `x` or `y` (or the
    // 16 unpacked scales) at an offset bounded by a constant loop range.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for (xb, yb) in x.iter().zip(y) {
            let d = yb.d * f16_to_f32(xb.d);
            let dmin = -yb.d * f16_to_f32(xb.dmin);
            let sm = unpack_scales_mins_k4(&xb.scales);

            let prod = mins_dot_bsums(&sm, yb);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);

            // The 8 scales as i16, in both 128-bit lanes.
            let sc = _mm_cvtepu8_epi16(_mm_loadl_epi64(sm.as_ptr().cast()));
            let scales = _mm256_set_m128i(sc, sc);

            let mut sumi = _mm256_setzero_si256();
            for c in 0..4 {
                let bits = _mm256_loadu_si256(xb.qs.as_ptr().add(32 * c).cast());
                let lo = _mm256_and_si256(bits, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                let q8l = _mm256_loadu_si256(yb.qs.as_ptr().add(64 * c).cast());
                let q8h = _mm256_loadu_si256(yb.qs.as_ptr().add(64 * c + 32).cast());
                let sl = _mm256_shuffle_epi8(scales, splat_i16_ctrl(2 * c));
                let sh = _mm256_shuffle_epi8(scales, splat_i16_ctrl(2 * c + 1));
                let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, q8l));
                let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, q8h));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps_256(acc) + hsum_ps_128(acc_m)
    }
}

/// 64 weights per step: one 32-byte chunk of nibbles broadcast to both
/// halves, low nibbles kept in the lower half and high nibbles shifted down
/// in the upper, so the matching activations are one contiguous 64-byte
/// load. VNNI's `dpwssd` fuses the scale multiply with the accumulate.
///
/// # Safety
/// The CPU must support the [`crate::Isa::Avx512`] set, and
/// `x.len() == y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn vec_dot_avx512(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    // SAFETY: the caller guarantees the CPU features (`# Safety`); every
    // load below reads a fixed-size field of one block of `x` or `y` (or the
    // 16 unpacked scales) at an offset bounded by a constant loop range.
    unsafe {
        let m4 = _mm512_set1_epi8(0xF);
        // Lane i16 k of chunk c takes scale 2c + k/16.
        let idx: [__m512i; 4] = std::array::from_fn(|c| spread_idx(2 * c, 2));
        let mut acc = _mm512_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for (xb, yb) in x.iter().zip(y) {
            let d = yb.d * f16_to_f32(xb.d);
            let dmin = -yb.d * f16_to_f32(xb.dmin);
            let sm = unpack_scales_mins_k4(&xb.scales);

            let prod = mins_dot_bsums(&sm, yb);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);

            let sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(sm.as_ptr().cast())));

            let mut sumi = _mm512_setzero_si512();
            for (c, idx) in idx.iter().enumerate() {
                let bits =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(xb.qs.as_ptr().add(32 * c).cast()));
                let q = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(bits, 0xFFFF_0000, bits), m4);
                let q8 = _mm512_loadu_si512(yb.qs.as_ptr().add(64 * c).cast());
                let scale = _mm512_permutexvar_epi16(*idx, sc);
                sumi = _mm512_dpwssd_epi32(sumi, scale, _mm512_maddubs_epi16(q, q8));
            }
            acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
        }
        hsum_ps_512(acc) + hsum_ps_128(acc_m)
    }
}
