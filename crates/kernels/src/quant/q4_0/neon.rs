//! AArch64 NEON dot for Q4_0 · Q8_0 (baseline NEON only). Integer sums are
//! exact and the float accumulation mirrors [`super::vec_dot_ref`], so the
//! result is identical to it.

use super::BlockQ4_0;
use crate::quant::q8_0::neon::{dot16_i8, load_i8x16};
use crate::quant::q8_0::BlockQ8_0;
use core::arch::aarch64::*;

/// # Safety
/// The CPU must support NEON (every AArch64 CPU does).
#[target_feature(enable = "neon")]
pub unsafe fn vec_dot(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let (mask, eight) = (vdupq_n_u8(0x0f), vdupq_n_s8(8));
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        // SAFETY: `a.qs` is 16 readable bytes; NEON loads need no alignment.
        let q = unsafe { vld1q_u8(a.qs.as_ptr()) };
        let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, mask)), eight);
        let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(q)), eight);
        let acc = dot16_i8(vdupq_n_s32(0), lo, load_i8x16(&b.qs[..16]));
        let acc = dot16_i8(acc, hi, load_i8x16(&b.qs[16..]));
        sum += vaddvq_s32(acc) as f32 * a.d.to_f32() * b.d.to_f32();
    }
    sum
}
