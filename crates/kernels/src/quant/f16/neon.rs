//! NEON F16 dot. Rust has no stable f16 vector type, so halves are widened
//! with integer ops and one multiply: shifting the exponent and mantissa
//! bits into f32 position and scaling by 2^112 rebiases the exponent, exact
//! for normals and subnormals alike; exponent 31 (inf/NaN) is then forced to
//! 255. `tests::widening_trick_is_exact` checks this arithmetic on every f16.

use super::f16;
use std::arch::aarch64::*;

/// Four halves (as bits) to f32.
#[inline]
#[target_feature(enable = "neon")]
fn widen(h: uint16x4_t) -> float32x4_t {
    let h = vmovl_u16(h);
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    let em = vshlq_n_u32::<13>(vandq_u32(h, vdupq_n_u32(0x7fff)));
    let scaled = vreinterpretq_u32_f32(vmulq_f32(
        vreinterpretq_f32_u32(em),
        vdupq_n_f32(f32::from_bits(0x7780_0000)),
    ));
    let inf_nan = vandq_u32(
        vcgeq_u32(em, vdupq_n_u32(0x0f80_0000)),
        vdupq_n_u32(0x7f80_0000),
    );
    vreinterpretq_f32_u32(vorrq_u32(vorrq_u32(scaled, inf_nan), sign))
}

/// # Safety
/// The CPU must support NEON (every AArch64 CPU does).
#[target_feature(enable = "neon")]
pub unsafe fn dot(x: &[f16], y: &[f16]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr().cast::<u16>(), y.as_ptr().cast::<u16>());
    // SAFETY: callers keep `i + 4 <= n`, so the 8-byte load stays in bounds.
    let load = |p: *const u16, i: usize| unsafe { widen(vld1_u16(p.add(i))) };
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
