//! NEON F32 dot: the AVX2 kernel's shape with 4-lane vectors.

use std::arch::aarch64::*;

/// # Safety
/// The CPU must support NEON (every AArch64 CPU does).
#[target_feature(enable = "neon")]
pub unsafe fn dot(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr(), y.as_ptr());
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    // SAFETY: (all loads) every index read is below `n` by the loop bounds.
    unsafe {
        while i + 16 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let o = i + 4 * k;
                *a = vfmaq_f32(*a, vld1q_f32(px.add(o)), vld1q_f32(py.add(o)));
            }
            i += 16;
        }
        while i + 4 <= n {
            acc[0] = vfmaq_f32(acc[0], vld1q_f32(px.add(i)), vld1q_f32(py.add(i)));
            i += 4;
        }
    }
    let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    let mut sum = vaddvq_f32(v) as f64;
    for j in i..n {
        sum += (x[j] * y[j]) as f64;
    }
    sum as f32
}
