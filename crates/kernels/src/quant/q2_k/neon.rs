//! Q2_K × Q8_K dot for baseline AArch64 NEON: 2-bit values as bytes,
//! widening i8 multiplies summed per 16-element sub-block in i32, then
//! scaled like the scalar twin; the mins meet the Q8_K group sums.
//!
//! Every load reads a fixed-size field of a block at an offset bounded by
//! constant loop ranges, so the only safety conditions are the CPU feature
//! set, which the kernel tables guarantee ([`crate::isa`]), and equal block
//! counts, which [`crate::quant::vec_dots`] checks.

use super::{BlockQ2K, BlockQ8K};
use crate::quant::k_common::neon::dot16;
use std::arch::aarch64::*;

/// # Safety
/// The CPU must support NEON, and `x.len() == y.len()`.
#[target_feature(enable = "neon")]
pub(super) unsafe fn vec_dot_neon(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    // SAFETY: the caller guarantees NEON (`# Safety`); every load below,
    // and every pointer handed to `dot16`/`dot32`, stays inside a fixed-size
    // field of one block of `x` or `y` at an offset bounded by a constant loop
    // range.
    unsafe {
        let m3 = vdupq_n_u8(3);
        let mut sum = 0.0f32;
        for (xb, yb) in x.iter().zip(y) {
            let d = yb.d * xb.d.to_f32();
            let dmin = yb.d * xb.dmin.to_f32();
            let mut summs = 0i32;
            for (j, &bs) in yb.bsums.iter().enumerate() {
                summs += (xb.scales[j] >> 4) as i32 * bs as i32;
            }
            let mut isum = 0i32;
            for h in 0..2 {
                for k in 0..2 {
                    // Shifted right by 2 per quarter s.
                    let mut bits = vld1q_u8(xb.qs.as_ptr().add(32 * h + 16 * k));
                    for s in 0..4 {
                        let q = vreinterpretq_s8_u8(vandq_u8(bits, m3));
                        bits = vshrq_n_u8::<2>(bits);
                        let sc = (xb.scales[8 * h + 2 * s + k] & 0xF) as i32;
                        isum += sc * dot16(q, yb.qs.as_ptr().add(128 * h + 32 * s + 16 * k));
                    }
                }
            }
            sum += d * isum as f32 - dmin * summs as f32;
        }
        sum
    }
}
