//! Q4_0: 32 weights as 4-bit quants q ∈ [0, 15] with value d·(q - 8) and one
//! f16 scale. Byte j holds element j in its low nibble and element j + 16 in
//! its high nibble. Dots against Q8_0 activations.

use crate::quant::q8_0::BlockQ8_0;
use crate::traits::{MultiDot, TypeTraits};
use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use half::f16;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

pub const QK4_0: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 2 + QK4_0 / 2);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q4_0,
    vec_dot_type: GgmlType::Q8_0,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockQ4_0, BlockQ8_0; vec_dot_ref,
        avx512: x86::vec_dot_avx512,
        avx2: x86::vec_dot_avx2,
        neon: neon::vec_dot,
    ),
    multi: Some(&MULTI),
};

/// Batched decode: one row against several activations in Q8 pairs.
pub const MULTI: MultiDot = crate::quant::multi::multi_dot::<BlockQ4_0>();

/// `quantize_row_q4_0_ref`: the signed value of largest magnitude maps to
/// -8 exactly; its opposite would be +8 and is clipped to 7.
pub fn quantize_row(x: &[f32], y: &mut [BlockQ4_0]) {
    assert_eq!(x.len(), y.len() * QK4_0);
    for (xb, yb) in x.chunks_exact(QK4_0).zip(y.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        // Truncation after +8.5 rounds to nearest (ties up) for the
        // non-negative sums this produces.
        let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        let (lo, hi) = xb.split_at(QK4_0 / 2);
        for ((o, &a), &b) in yb.qs.iter_mut().zip(lo).zip(hi) {
            *o = q(a) | q(b) << 4;
        }
    }
}

pub fn dequantize_row(x: &[BlockQ4_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK4_0);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_0)) {
        let d = xb.d.to_f32();
        let (lo, hi) = yb.split_at_mut(QK4_0 / 2);
        for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&xb.qs) {
            *l = ((q & 0x0f) as i32 - 8) as f32 * d;
            *h = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// Integer dot of one block with one Q8_0 block's quants.
#[inline]
pub fn block_dot(x: &BlockQ4_0, y: &[i8; 32]) -> i32 {
    let (lo, hi) = y.split_at(QK4_0 / 2);
    let mut s = 0;
    for ((&q, &a), &b) in x.qs.iter().zip(lo).zip(hi) {
        s += ((q & 0x0f) as i32 - 8) * a as i32 + ((q >> 4) as i32 - 8) * b as i32;
    }
    s
}

/// ggml's `ggml_vec_dot_q4_0_q8_0_generic`.
pub fn vec_dot_ref(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        sum += block_dot(a, &b.qs) as f32 * a.d.to_f32() * b.d.to_f32();
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8_0::legacy_tests::*;

    /// Half a step, except the clipped +8 (a full step), plus the f16
    /// rounding of d times the largest quant magnitude.
    fn max_err(xb: &[f32]) -> f32 {
        let d = amax(xb) / 8.0;
        d + 8.0 * f16_err(d)
    }

    #[test]
    fn round_trip_within_a_step() {
        check_round_trip(&TRAITS, max_err);
    }

    #[test]
    fn known_block() {
        // max = -8 -> d = 1: q = x + 8, and +8 clips to 15 (value 7).
        let mut x = [0.0f32; 32];
        x[0] = -8.0;
        x[1] = 8.0;
        x[2] = 0.5; // 8.5 + 0.5 = 9.0 -> 9
        x[3] = -0.5; // 8.0 -> 8
        x[16] = 3.49; // 11.99 -> 11
        x[17] = -2.5; // 6.0 -> 6
        let mut q = [BlockQ4_0::zeroed()];
        quantize_row(&x, &mut q);
        assert_eq!(q[0].d, f16::ONE);
        assert_eq!(&q[0].qs[..4], &[0xb0, 0x6f, 0x89, 0x88]);
        let mut y = [0.0f32; 32];
        dequantize_row(&q, &mut y);
        assert_eq!(&y[..4], &[-8.0, 7.0, 1.0, 0.0]);
        assert_eq!(&y[16..18], &[3.0, -2.0]);
    }

    #[test]
    fn ggml_bounds() {
        check_ggml_bounds(&TRAITS);
    }

    #[test]
    fn dot_ref_matches_dequantized() {
        check_dot_ref_matches_dequantized(&TRAITS, false);
    }

    #[test]
    fn simd_matches_ref() {
        check_simd_matches_ref(&TRAITS, false);
    }

    #[test]
    fn multi_dot_matches_alone_and_ref() {
        check_multi_dot(&TRAITS, false);
    }

    #[test]
    fn exact_with_minus_128_activations() {
        check_full_range_activations(&TRAITS, false, false);
    }

    #[test]
    fn deterministic() {
        check_deterministic(&TRAITS);
    }
}
