//! Q3_K × Q8_K dot for baseline AArch64 NEON: the 3-bit values rebuilt as
//! signed bytes (2-bit part | high bit << 2, minus 4), widening i8
//! multiplies summed per 16-element sub-block in i32, then scaled like the
//! scalar twin.
//!
//! Every load reads a fixed-size field of a block at an offset bounded by
//! constant loop ranges, so the only safety conditions are the CPU feature
//! set, which the kernel tables guarantee ([`crate::isa`]), and equal block
//! counts, which [`crate::quant::vec_dots`] checks.

use super::{unpack_scales, BlockQ3K, BlockQ8K};
use crate::quant::k_common::neon::dot16;
use std::arch::aarch64::*;

/// # Safety
/// The CPU must support NEON, and `x.len() == y.len()`.
#[target_feature(enable = "neon")]
pub(super) unsafe fn vec_dot_neon(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    // SAFETY: the caller guarantees NEON (`# Safety`); every load below,
    // and every pointer handed to `dot16`/`dot32`, stays inside a fixed-size
    // field of one block of `x` or `y` at an offset bounded by a constant loop
    // range.
    unsafe {
        let m3 = vdupq_n_u8(3);
        let m4 = vdupq_n_u8(4);
        let four = vdupq_n_s8(4);
        let mut sum = 0.0f32;
        for (xb, yb) in x.iter().zip(y) {
            let d = yb.d * xb.d.to_f32();
            let sc = unpack_scales(&xb.scales);
            let mut isum = 0i32;
            for k in 0..2 {
                // Shifted right by 1 per quarter: bit 0 is then quarter 4h+s's.
                let mut hbits = vld1q_u8(xb.hmask.as_ptr().add(16 * k));
                for h in 0..2 {
                    // Shifted right by 2 per quarter: bits 0..2 are quarter s's.
                    let mut bits = vld1q_u8(xb.qs.as_ptr().add(32 * h + 16 * k));
                    for s in 0..4 {
                        let u = vorrq_u8(vandq_u8(bits, m3), vandq_u8(vshlq_n_u8::<2>(hbits), m4));
                        bits = vshrq_n_u8::<2>(bits);
                        hbits = vshrq_n_u8::<1>(hbits);
                        let q = vsubq_s8(vreinterpretq_s8_u8(u), four);
                        let q8 = yb.qs.as_ptr().add(128 * h + 32 * s + 16 * k);
                        isum += sc[8 * h + 2 * s + k] as i32 * dot16(q, q8);
                    }
                }
            }
            sum += d * isum as f32;
        }
        sum
    }
}
