//! NEON TQ1_0 × Q8_K dot: the same byte multiplies as the scalar decoder,
//! trits made signed (-1, 0, 1) and multiplied into i16 lanes (at most 32
//! products of 128 per lane), then summed exactly per block.

use super::BlockTQ1_0;
use crate::quant::q8_k::BlockQ8K;
use std::arch::aarch64::*;

/// Signed value (trit - 1) of the top trit of each byte: 1 from 86, 2 from 171.
#[inline]
#[target_feature(enable = "neon")]
fn top_value(v: uint8x16_t) -> int8x16_t {
    let ge86 = vreinterpretq_s8_u8(vcgeq_u8(v, vdupq_n_u8(86)));
    let ge171 = vreinterpretq_s8_u8(vcgeq_u8(v, vdupq_n_u8(171)));
    // Each compare is -1 where true.
    vsubq_s8(vsubq_s8(vdupq_n_s8(-1), ge86), ge171)
}

#[inline]
#[target_feature(enable = "neon")]
fn mac(acc: int16x8_t, w: int8x16_t, a: int8x16_t) -> int16x8_t {
    vmlal_high_s8(vmlal_s8(acc, vget_low_s8(w), vget_low_s8(a)), w, a)
}

/// # Safety
/// The CPU must support NEON (every AArch64 CPU does).
#[target_feature(enable = "neon")]
pub unsafe fn dot(x: &[BlockTQ1_0], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    const QH_POW: [u8; 16] = [1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27];
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let yq = yb.qs.as_ptr();
        // SAFETY: each load reads 16 bytes inside `xb.qs` (48 bytes) or the
        // 16-byte table.
        let (q0, q1, q2, pow) = unsafe {
            (
                vld1q_u8(xb.qs.as_ptr()),
                vld1q_u8(xb.qs.as_ptr().add(16)),
                vld1q_u8(xb.qs.as_ptr().add(32)),
                vld1q_u8(QH_POW.as_ptr()),
            )
        };
        // SAFETY: callers pass offsets up to 240, so 16 bytes stay in `yb.qs`.
        let ly = |o: usize| unsafe { vld1q_s8(yq.add(o)) };
        let mut acc = vdupq_n_s16(0);
        let mut p = 1u8;
        for k in 0..5 {
            let m = vdupq_n_u8(p);
            acc = mac(acc, top_value(vmulq_u8(q0, m)), ly(32 * k));
            acc = mac(acc, top_value(vmulq_u8(q1, m)), ly(32 * k + 16));
            acc = mac(acc, top_value(vmulq_u8(q2, m)), ly(160 + 16 * k));
            p = p.wrapping_mul(3);
        }
        let qh = vmulq_u8(
            vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(xb.qh))),
            pow,
        );
        acc = mac(acc, top_value(qh), ly(240));
        sum += vaddlvq_s16(acc) as f32 * (xb.d.to_f32() * yb.d);
    }
    sum
}
