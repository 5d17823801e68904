//! Q6_K × Q8_K dot for baseline AArch64 NEON: the 6-bit values are rebuilt
//! as signed bytes (`q - 32`), multiplied with widening `vmull_s8` (exact
//! in i16) and summed per 16-element sub-block in i32, then scaled like
//! the scalar twin.
//!
//! Every load reads a fixed-size field of a block at an offset bounded by
//! constant loop ranges, so the only safety conditions are the CPU feature
//! set, which the kernel tables guarantee ([`crate::isa`]), and equal block
//! counts, which [`crate::quant::vec_dots`] checks.

use super::{BlockQ6K, BlockQ8K};
use crate::quant::k_common::neon::dot16;
use std::arch::aarch64::*;

/// # Safety
/// The CPU must support NEON, and `x.len() == y.len()`.
#[target_feature(enable = "neon")]
pub(super) unsafe fn vec_dot_neon(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    // SAFETY: the caller guarantees NEON (`# Safety`); every load below,
    // and every pointer handed to `dot16`/`dot32`, stays inside a fixed-size
    // field of one block of `x` or `y` at an offset bounded by a constant loop
    // range.
    unsafe {
        let m15 = vdupq_n_u8(0xF);
        let m3 = vdupq_n_u8(0x3);
        let off = vdupq_n_s8(32);
        let mut sum = 0.0f32;
        for (xb, yb) in x.iter().zip(y) {
            let d = yb.d * xb.d.to_f32();
            let mut isum = 0i32;
            for h in 0..2 {
                let ql = xb.ql.as_ptr().add(64 * h);
                let qh = xb.qh.as_ptr().add(32 * h);
                let q8 = yb.qs.as_ptr().add(128 * h);
                // 16 elements at a time: l in 16k..16k+16 of each quarter s.
                for k in 0..2 {
                    let (a, b, hb) = (
                        vld1q_u8(ql.add(16 * k)),
                        vld1q_u8(ql.add(32 + 16 * k)),
                        vld1q_u8(qh.add(16 * k)),
                    );
                    let q = [
                        vorrq_u8(vandq_u8(a, m15), vshlq_n_u8::<4>(vandq_u8(hb, m3))),
                        vorrq_u8(
                            vandq_u8(b, m15),
                            vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(hb), m3)),
                        ),
                        vorrq_u8(
                            vshrq_n_u8::<4>(a),
                            vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(hb), m3)),
                        ),
                        vorrq_u8(vshrq_n_u8::<4>(b), vshlq_n_u8::<4>(vshrq_n_u8::<6>(hb))),
                    ];
                    for (s, q) in q.into_iter().enumerate() {
                        let q = vsubq_s8(vreinterpretq_s8_u8(q), off);
                        let sc = xb.scales[8 * h + 2 * s + k] as i32;
                        isum += sc * dot16(q, q8.add(32 * s + 16 * k));
                    }
                }
            }
            sum += d * isum as f32;
        }
        sum
    }
}
