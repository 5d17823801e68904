//! NEON TQ2_0 × Q8_K dot: fields made signed (field - 1) and multiplied into
//! i16 lanes (at most 32 products of 2 * 128 per lane), summed exactly per
//! block.

use super::BlockTQ2_0;
use crate::quant::q8_k::BlockQ8K;
use std::arch::aarch64::*;

#[inline]
#[target_feature(enable = "neon")]
fn mac(acc: int16x8_t, w: int8x16_t, a: int8x16_t) -> int16x8_t {
    vmlal_high_s8(vmlal_s8(acc, vget_low_s8(w), vget_low_s8(a)), w, a)
}

/// # Safety
/// The CPU must support NEON (every AArch64 CPU does).
#[target_feature(enable = "neon")]
pub unsafe fn dot(x: &[BlockTQ2_0], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mask = vdupq_n_u8(3);
    let one = vdupq_n_s8(1);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut acc = vdupq_n_s16(0);
        // Bytes 32c + h*16 .. +16 hold values 128c + 32k + 16h + (0..16).
        for c in 0..2 {
            for h in 0..2 {
                // SAFETY: 16 bytes at offset 32c + 16h <= 48 of the 64 in qs.
                let q = unsafe { vld1q_u8(xb.qs.as_ptr().add(32 * c + 16 * h)) };
                let fields = [
                    q,
                    vshrq_n_u8::<2>(q),
                    vshrq_n_u8::<4>(q),
                    vshrq_n_u8::<6>(q),
                ];
                for (k, f) in fields.into_iter().enumerate() {
                    let w = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(f, mask)), one);
                    // SAFETY: offset 128c + 32k + 16h <= 240 of the 256 in qs.
                    let a = unsafe { vld1q_s8(yb.qs.as_ptr().add(128 * c + 32 * k + 16 * h)) };
                    acc = mac(acc, w, a);
                }
            }
        }
        sum += vaddlvq_s16(acc) as f32 * (yb.d * xb.d.to_f32());
    }
    sum
}
