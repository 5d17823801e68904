//! Q4_K × Q8_K dot for baseline AArch64 NEON: widening i8 multiplies
//! (`vmull_s8`, exact in i16) pairwise-accumulated into i32 per sub-block,
//! then the integer sub-block sums are scaled like the scalar twin.
//!
//! Every load reads a fixed-size field of a block at an offset bounded by
//! constant loop ranges, so the only safety conditions are the CPU feature
//! set, which the kernel tables guarantee ([`crate::isa`]), and equal block
//! counts, which [`crate::quant::vec_dots`] checks.

use super::{BlockQ4K, BlockQ8K};
use crate::quant::k_common::neon::dot32;
use crate::quant::k_common::unpack_scales_mins_k4;
use std::arch::aarch64::*;

/// # Safety
/// The CPU must support NEON, and `x.len() == y.len()`.
#[target_feature(enable = "neon")]
pub(super) unsafe fn vec_dot_neon(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    // SAFETY: the caller guarantees NEON (`# Safety`); every load below,
    // and every pointer handed to `dot16`/`dot32`, stays inside a fixed-size
    // field of one block of `x` or `y` at an offset bounded by a constant loop
    // range.
    unsafe {
        let m4 = vdupq_n_u8(0xF);
        let mut sum = 0.0f32;
        for (xb, yb) in x.iter().zip(y) {
            let d = yb.d * xb.d.to_f32();
            let dmin = yb.d * xb.dmin.to_f32();
            let sm = unpack_scales_mins_k4(&xb.scales);

            let mut summs = 0i32;
            for j in 0..8 {
                summs += sm[8 + j] as i32 * (yb.bsums[2 * j] as i32 + yb.bsums[2 * j + 1] as i32);
            }

            let mut isum = 0i32;
            for c in 0..4 {
                let q = xb.qs.as_ptr().add(32 * c);
                let (b0, b1) = (vld1q_u8(q), vld1q_u8(q.add(16)));
                let lo = [
                    vreinterpretq_s8_u8(vandq_u8(b0, m4)),
                    vreinterpretq_s8_u8(vandq_u8(b1, m4)),
                ];
                let hi = [
                    vreinterpretq_s8_u8(vshrq_n_u8::<4>(b0)),
                    vreinterpretq_s8_u8(vshrq_n_u8::<4>(b1)),
                ];
                let q8 = yb.qs.as_ptr().add(64 * c);
                isum += sm[2 * c] as i32 * dot32(lo, q8);
                isum += sm[2 * c + 1] as i32 * dot32(hi, q8.add(32));
            }
            sum += d * isum as f32 - dmin * summs as f32;
        }
        sum
    }
}
