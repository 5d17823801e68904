//! NEON BF16 dot: widen by a 16-bit left shift, FMA in f32.

use super::bf16;
use std::arch::aarch64::*;

/// # Safety
/// The CPU must support NEON (every AArch64 CPU does).
#[target_feature(enable = "neon")]
pub unsafe fn dot(x: &[bf16], y: &[bf16]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr().cast::<u16>(), y.as_ptr().cast::<u16>());
    // SAFETY: callers keep `i + 4 <= n`, so the 8-byte load stays in bounds.
    let load = |p: *const u16, i: usize| unsafe {
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p.add(i))))
    };
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = i + 4 * k;
            *a = vfmaq_f32(*a, load(px, o), load(py, o));
        }
        i += 16;
    }
    while i + 4 <= n {
        acc[0] = vfmaq_f32(acc[0], load(px, i), load(py, i));
        i += 4;
    }
    let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    let mut sum = vaddvq_f32(v) as f64;
    for j in i..n {
        sum += (x[j].to_f32() * y[j].to_f32()) as f64;
    }
    sum as f32
}
