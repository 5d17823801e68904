//! AArch64 NEON dot for Q8_0 · Q8_0, using only baseline NEON (widening
//! multiply + pairwise accumulate) so it needs no "dotprod" detection.
//! Integer sums are exact and the float accumulation follows
//! [`super::vec_dot_ref`] operation for operation, so results are identical.

use super::{BlockQ8_0, QK8_0};
use core::arch::aarch64::*;

/// Σ x·y of 16 signed bytes each, accumulated into 4 i32 lanes.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn dot16_i8(acc: int32x4_t, x: int8x16_t, y: int8x16_t) -> int32x4_t {
    let acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(x), vget_low_s8(y)));
    vpadalq_s16(acc, vmull_high_s8(x, y))
}

#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn load_i8x16(q: &[i8]) -> int8x16_t {
    assert!(q.len() >= 16);
    // SAFETY: 16 readable bytes checked above; NEON loads need no alignment.
    unsafe { vld1q_s8(q.as_ptr()) }
}

/// # Safety
/// The CPU must support NEON (every AArch64 CPU does).
#[target_feature(enable = "neon")]
pub unsafe fn vec_dot(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let mut acc = vdupq_n_s32(0);
        for h in [0, QK8_0 / 2] {
            acc = dot16_i8(acc, load_i8x16(&a.qs[h..]), load_i8x16(&b.qs[h..]));
        }
        sum += vaddvq_s32(acc) as f32 * (a.d.to_f32() * b.d.to_f32());
    }
    sum
}
