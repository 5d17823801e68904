//! Q8_0: 32 int8 values with one f16 scale. Both a weight type and the
//! activation type (`vec_dot_type`) of every legacy block type (Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0, IQ4_NL), so this module also hosts the x86 helpers
//! those kernels share.
//!
//! The SIMD dots assume activation quants lie in [-127, 127], which is all
//! [`quantize_row`] produces (it scales the block maximum to exactly 127).
//! The x86 kernels are exact for -128 too; only the AVX2 sign trick is not.

use crate::isa::PerIsa;
use crate::traits::{MultiDot, TypeTraits};
use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use half::f16;

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

#[cfg(test)]
pub(crate) mod legacy_tests;

pub const QK8_0: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK8_0],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 2 + QK8_0);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q8_0,
    vec_dot_type: GgmlType::Q8_0,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockQ8_0, BlockQ8_0; vec_dot_ref,
        avx512: x86::vec_dot_avx512,
        avx2: x86::vec_dot_avx2,
        neon: neon::vec_dot,
    ),
    multi: Some(&MULTI),
};

/// Batched decode: one row against several activations in Q8 pairs.
pub const MULTI: MultiDot = crate::quant::multi::multi_dot::<BlockQ8_0>();

/// `quantize_row_q8_0_ref`: scale so the largest magnitude maps to 127,
/// round half away from zero.
pub fn quantize_row(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK8_0);
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let amax = xb
            .iter()
            .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
}

/// `v.round_ties_even()` for |v| < 2²² (up to the sign of a zero): adding
/// 1.5·2²³ pushes the fraction out of the mantissa, rounding to nearest even
/// like the FPU does. Baseline x86-64 has no rounding instruction, so
/// `round_ties_even` is a libm call per element (9% of a batched decode
/// pass); this is two adds.
#[inline]
pub fn round_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    (v + MAGIC) - MAGIC
}

/// Quantize an activation row the way ggml-cpu does at run time on x86
/// (its AVX `quantize_row_q8_0`), which differs from the reference above in
/// two last-bit details: the multiplier is `127 / amax` rather than `1 / d`,
/// and halves round to even. Matching it keeps our logits on the same side
/// of each rounding as llama.cpp's, so small differences do not flip
/// quants and grow layer by layer. Weights still use [`quantize_row`], as
/// llama-quantize does.
///
/// With the selected kernels (AVX2 where the CPU has it, bit-identical to
/// [`quantize_row_activation_ref`]).
pub fn quantize_row_activation(x: &[f32], y: &mut [BlockQ8_0]) {
    (crate::selected().q8_0_activation)(x, y)
}

/// [`quantize_row_activation`] of one kernel set.
pub type ActivationFn = fn(&[f32], &mut [BlockQ8_0]);

/// [`quantize_row_activation`] of every set: AVX2 on both x86 sets.
pub(crate) const ACTIVATION: PerIsa<ActivationFn> = {
    let k = PerIsa::new(quantize_row_activation_ref as ActivationFn);
    #[cfg(target_arch = "x86_64")]
    let k = k.avx2(quantize_row_activation_avx2 as ActivationFn);
    k
};

#[cfg(target_arch = "x86_64")]
fn quantize_row_activation_avx2(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK8_0);
    // SAFETY: reachable only through `PerIsa::get` for an x86 set, whose
    // caller guarantees AVX2, FMA and F16C; whole blocks (asserted).
    unsafe { x86::quantize_row_activation_avx2(x, y) }
}

/// Scalar twin of [`quantize_row_activation`].
pub fn quantize_row_activation_ref(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK8_0);
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        yb.d = f16::from_f32(amax / 127.0);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = round_small(v * id) as i8;
        }
    }
}

pub fn dequantize_row(x: &[BlockQ8_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK8_0);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = xb.d.to_f32();
        for (o, &q) in yb.iter_mut().zip(&xb.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Integer dot of one block's quants.
#[inline]
pub fn block_dot(x: &[i8; QK8_0], y: &[i8; QK8_0]) -> i32 {
    x.iter().zip(y).map(|(&a, &b)| a as i32 * b as i32).sum()
}

/// ggml's `ggml_vec_dot_q8_0_q8_0_generic`.
pub fn vec_dot_ref(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        sum += block_dot(&a.qs, &b.qs) as f32 * (a.d.to_f32() * b.d.to_f32());
    }
    sum
}

#[cfg(test)]
mod tests {
    /// The AVX2 activation quantizer gives the scalar one's bytes, on
    /// random rows, rows of ties (x.5 after scaling), zeros and extremes.
    #[test]
    fn activation_quantizer_simd_matches_scalar() {
        for isa in crate::isa::Isa::supported() {
            let quantize = crate::table(isa).unwrap().q8_0_activation;
            let mut r = crate::quant::testing::rng(9);
            let mut rows = crate::quant::testing::extreme_rows(32 * 5);
            rows.push(crate::quant::testing::weights(&mut r, 32 * 7));
            // amax 127 makes the multiplier 1: every x.5 is a tie.
            rows.push(
                (0..64)
                    .map(|i| {
                        if i % 32 == 0 {
                            127.0
                        } else {
                            (i as f32 - 40.0) + 0.5
                        }
                    })
                    .collect(),
            );
            rows.push(vec![0.0; 64]);
            for x in rows {
                let nb = x.len() / 32;
                let (mut a, mut b) = (vec![BlockQ8_0::zeroed(); nb], vec![BlockQ8_0::zeroed(); nb]);
                super::quantize_row_activation_ref(&x, &mut a);
                quantize(&x, &mut b);
                assert_eq!(a, b, "{isa:?}");
            }
        }
    }

    #[test]
    fn round_small_is_round_ties_even() {
        let mut v = -200.0f32;
        while v <= 200.0 {
            for x in [v, v + 0.5, v - 0.5, f32::from_bits(v.to_bits() + 1)] {
                assert_eq!(super::round_small(x), x.round_ties_even(), "{x}");
            }
            v += 0.25;
        }
        let mut r = crate::quant::testing::rng(3);
        for x in crate::quant::testing::weights(&mut r, 10_000) {
            let x = x * 127.0;
            assert_eq!(super::round_small(x), x.round_ties_even(), "{x}");
        }
    }

    use super::legacy_tests::*;
    use super::*;

    /// Largest |x - dequant(x)| in a block: half a step, plus the f16
    /// rounding of the scale times the largest quant.
    fn max_err(xb: &[f32]) -> f32 {
        let d = amax(xb) / 127.0;
        0.5 * d + 127.0 * f16_err(d)
    }

    #[test]
    fn round_trip_within_half_a_step() {
        check_round_trip(&TRAITS, max_err);
    }

    #[test]
    fn known_block() {
        // max 127 -> d = 1 exactly; 2.5 rounds away from zero to 3, -0.5 to -1.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -0.5;
        x[3] = -127.0;
        x[4] = 0.49;
        let mut q = [BlockQ8_0::zeroed()];
        quantize_row(&x, &mut q);
        assert_eq!(q[0].d, f16::ONE);
        assert_eq!(&q[0].qs[..6], &[127, 3, -1, -127, 0, 0]);
        // All zeros: scale 0, quants 0, no NaN.
        quantize_row(&[0.0; 32], &mut q);
        assert_eq!(q[0], BlockQ8_0::zeroed());
    }

    #[test]
    fn ggml_bounds() {
        check_ggml_bounds(&TRAITS);
    }

    /// The run-time activation quantizer: halves round to even, and on
    /// random rows it stays within one quant of the reference and within
    /// half a step of the input.
    #[test]
    fn activation_quantizer_rounds_halves_to_even() {
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -0.5;
        x[3] = 3.5;
        let mut q = [BlockQ8_0::zeroed()];
        quantize_row_activation(&x, &mut q);
        assert_eq!(&q[0].qs[..4], &[127, 2, 0, 4]);
        quantize_row_activation(&[0.0; 32], &mut q);
        assert_eq!(q[0], BlockQ8_0::zeroed());

        let mut r = crate::quant::testing::rng(5);
        for n in [32, 96, 320] {
            let x = crate::quant::testing::weights(&mut r, n);
            let mut a = vec![BlockQ8_0::zeroed(); n / 32];
            let mut b = a.clone();
            quantize_row_activation(&x, &mut a);
            quantize_row(&x, &mut b);
            for ((ba, bb), xs) in a.iter().zip(&b).zip(x.chunks_exact(32)) {
                assert_eq!(ba.d, bb.d);
                let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                for ((&qa, &qb), &v) in ba.qs.iter().zip(&bb.qs).zip(xs) {
                    assert!((qa as i32 - qb as i32).abs() <= 1);
                    assert!((qa as f32 - v * 127.0 / amax).abs() <= 0.5 + 1e-4);
                }
            }
        }
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
        check_full_range_activations(&TRAITS, false, true);
    }

    #[test]
    fn deterministic() {
        check_deterministic(&TRAITS);
    }
}
