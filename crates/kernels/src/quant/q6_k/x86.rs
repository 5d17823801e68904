//! Q6_K × Q8_K dots for AVX2 and AVX-512 (VNNI). The 6-bit values are used
//! unsigned (0..63) with `maddubs` against the int8 activations (at most
//! 2·63·128 per i16, no saturation); the `-32` offset is taken out once per
//! block as `32·Σ sc·bsums`, so the integer result equals the scalar
//! twin's exactly.
//!
//! Every load reads a fixed-size field of a block at an offset bounded by
//! constant loop ranges, so the only safety conditions are the CPU feature
//! set, which the kernel tables guarantee ([`crate::isa`]), and equal block
//! counts, which [`crate::quant::vec_dots`] checks.

use super::{BlockQ6K, BlockQ8K};
use crate::quant::k_common::x86::*;
use std::arch::x86_64::*;

/// `32 · Σ_j sc[j]·bsums[j]` spread over eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn offset_term(sc8: __m128i, y: &BlockQ8K) -> __m256i {
    // SAFETY: `y.bsums` holds the 32 bytes the load reads.
    unsafe {
        let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, _mm256_cvtepi8_epi16(sc8)))
    }
}

/// # Safety
/// The CPU must support avx2, fma and f16c, and `x.len() == y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn vec_dot_avx2(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    // SAFETY: the caller guarantees the CPU features (`# Safety`); every
    // load below reads a fixed-size field of one block of `x` or `y` (or the
    // 16 unpacked scales) at an offset bounded by a constant loop range.
    unsafe {
        let m15 = _mm256_set1_epi8(0xF);
        let mut acc = _mm256_setzero_ps();
        for (xb, yb) in x.iter().zip(y) {
            let d = yb.d * f16_to_f32(xb.d);
            let sc8 = _mm_loadu_si128(xb.scales.as_ptr().cast());
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                let ql1 = _mm256_loadu_si256(xb.ql.as_ptr().add(64 * h).cast());
                let ql2 = _mm256_loadu_si256(xb.ql.as_ptr().add(64 * h + 32).cast());
                let qh = _mm256_loadu_si256(xb.qh.as_ptr().add(32 * h).cast());
                // Element 32s + l of this half, s = 0..4; the masks keep the
                // 16-bit shifts from leaking bits across bytes.
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m15),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03))),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql2, m15),
                        _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C))),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m15),
                        _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql2), m15),
                        _mm256_srli_epi16::<2>(_mm256_and_si256(
                            qh,
                            _mm256_set1_epi8(0xC0u8 as i8),
                        )),
                    ),
                ];
                for (s, q) in q.into_iter().enumerate() {
                    let q8 = _mm256_loadu_si256(yb.qs.as_ptr().add(128 * h + 32 * s).cast());
                    // Sub-blocks 8h+2s (low 128 bits) and 8h+2s+1 (high).
                    let scale = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pair_ctrl(4 * h + s)));
                    sumi = _mm256_add_epi32(
                        sumi,
                        _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q, q8)),
                    );
                }
            }
            sumi = _mm256_sub_epi32(sumi, offset_term(sc8, yb));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps_256(acc)
    }
}

/// 64 weights per step: for `t` = 0 the low nibbles of all 64 `ql` bytes of
/// a half (elements 0..64 of it), for `t` = 1 the high nibbles (64..128);
/// the matching 2-bit pairs come from `qh` broadcast to both 256-bit halves
/// and shifted 2 further in the upper one.
///
/// # Safety
/// The CPU must support the [`crate::Isa::Avx512`] set, and
/// `x.len() == y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn vec_dot_avx512(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    // SAFETY: the caller guarantees the CPU features (`# Safety`); every
    // load below reads a fixed-size field of one block of `x` or `y` (or the
    // 16 unpacked scales) at an offset bounded by a constant loop range.
    unsafe {
        let m15 = _mm512_set1_epi8(0xF);
        let m3 = _mm512_set1_epi8(0x3);
        const UPPER: __mmask32 = 0xFFFF_0000;
        // Step (h, t) covers sub-blocks 8h + 4t .. 8h + 4t + 4.
        let idx: [__m512i; 4] = std::array::from_fn(|k| spread_idx(4 * k, 4));
        let mut acc = _mm512_setzero_ps();
        for (xb, yb) in x.iter().zip(y) {
            let d = yb.d * f16_to_f32(xb.d);
            let sc8 = _mm_loadu_si128(xb.scales.as_ptr().cast());
            let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
            let mut sumi = _mm512_setzero_si512();
            for h in 0..2 {
                let ql = _mm512_loadu_si512(xb.ql.as_ptr().add(64 * h).cast());
                let qh =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(xb.qh.as_ptr().add(32 * h).cast()));
                let qh_hi = _mm512_srli_epi16::<4>(qh);
                let steps = [
                    (
                        _mm512_and_si512(ql, m15),
                        _mm512_mask_srli_epi16::<2>(qh, UPPER, qh),
                    ),
                    (
                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m15),
                        _mm512_mask_srli_epi16::<2>(qh_hi, UPPER, qh_hi),
                    ),
                ];
                for (t, (lo, hb)) in steps.into_iter().enumerate() {
                    let q = _mm512_or_si512(lo, _mm512_slli_epi16::<4>(_mm512_and_si512(hb, m3)));
                    let q8 = _mm512_loadu_si512(yb.qs.as_ptr().add(128 * h + 64 * t).cast());
                    let scale = _mm512_permutexvar_epi16(idx[2 * h + t], sc);
                    sumi = _mm512_dpwssd_epi32(sumi, scale, _mm512_maddubs_epi16(q, q8));
                }
            }
            sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(offset_term(sc8, yb)));
            acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
        }
        hsum_ps_512(acc)
    }
}
