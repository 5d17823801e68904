//! Q4_1: 32 weights as 4-bit quants q ∈ [0, 15] with value d·q + m, one f16
//! scale `d` and one f16 minimum `m`. Nibble order as in Q4_0.
//!
//! ggml dots Q4_1 against Q8_1, whose blocks carry d·Σq; we dot against
//! Q8_0 like the other legacy types and compute Σq of the activation block
//! in the kernel: Σ (d·q + m)·(dy·y) = d·dy·Σ q·y + m·dy·Σ y.

use crate::quant::q8_0::BlockQ8_0;
use crate::traits::{MultiDot, TypeTraits};
use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use half::f16;

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub const QK4_1: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK4_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 2 * 2 + QK4_1 / 2);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q4_1,
    vec_dot_type: GgmlType::Q8_0,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockQ4_1, BlockQ8_0; vec_dot_ref,
        avx512: x86::vec_dot_avx512,
        avx2: x86::vec_dot_avx2,
    ),
    multi: Some(&MULTI),
};

/// Batched decode: one row against several activations in Q8 pairs.
pub const MULTI: MultiDot = crate::quant::multi::multi_dot::<BlockQ4_1>();

/// Block minimum and maximum the way ggml scans them (min from +FLT_MAX,
/// max from -FLT_MAX).
pub(crate) fn min_max(xb: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in xb {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `quantize_row_q4_1_ref`: [min, max] split into 15 steps.
pub fn quantize_row(x: &[f32], y: &mut [BlockQ4_1]) {
    assert_eq!(x.len(), y.len() * QK4_1);
    for (xb, yb) in x.chunks_exact(QK4_1).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        yb.m = f16::from_f32(min);
        // Truncation after +0.5 rounds to nearest for these non-negative values.
        let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
        let (lo, hi) = xb.split_at(QK4_1 / 2);
        for ((o, &a), &b) in yb.qs.iter_mut().zip(lo).zip(hi) {
            *o = q(a) | q(b) << 4;
        }
    }
}

pub fn dequantize_row(x: &[BlockQ4_1], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK4_1);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_1)) {
        let (d, m) = (xb.d.to_f32(), xb.m.to_f32());
        let (lo, hi) = yb.split_at_mut(QK4_1 / 2);
        for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&xb.qs) {
            *l = (q & 0x0f) as f32 * d + m;
            *h = (q >> 4) as f32 * d + m;
        }
    }
}

/// (Σ q·y, Σ y) of one block with one Q8_0 block's quants.
#[inline]
pub fn block_dot(x: &BlockQ4_1, y: &[i8; 32]) -> (i32, i32) {
    let (lo, hi) = y.split_at(QK4_1 / 2);
    let mut s = 0;
    for ((&q, &a), &b) in x.qs.iter().zip(lo).zip(hi) {
        s += (q & 0x0f) as i32 * a as i32 + (q >> 4) as i32 * b as i32;
    }
    (s, y.iter().map(|&v| v as i32).sum())
}

/// ggml's `ggml_vec_dot_q4_1_q8_1_generic` with the activation sum taken
/// from the Q8_0 quants instead of Q8_1's f16 `s`.
pub fn vec_dot_ref(x: &[BlockQ4_1], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let (sumi, sumy) = block_dot(a, &b.qs);
        let dy = b.d.to_f32();
        sum += a.d.to_f32() * dy * sumi as f32 + a.m.to_f32() * dy * sumy as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8_0::legacy_tests::*;

    /// Half a step, plus the f16 rounding of d (times 15) and of m.
    fn max_err(xb: &[f32]) -> f32 {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        0.5 * d + 15.0 * f16_err(d) + f16_err(min)
    }

    #[test]
    fn round_trip_within_half_a_step() {
        check_round_trip(&TRAITS, max_err);
    }

    #[test]
    fn known_block() {
        // min -1, max 14 -> d = 1, m = -1: q = x + 1 rounded half up.
        let mut x = [0.0f32; 32];
        x[0] = -1.0;
        x[1] = 14.0;
        x[2] = 0.5; // 1.5 + 0.5 -> 2
        x[16] = 2.49; // 3.49 + 0.5 -> 3
        let mut q = [BlockQ4_1::zeroed()];
        quantize_row(&x, &mut q);
        assert_eq!((q[0].d, q[0].m), (f16::ONE, f16::from_f32(-1.0)));
        assert_eq!(&q[0].qs[..3], &[0x30, 0x1f, 0x12]);
        let mut y = [0.0f32; 32];
        dequantize_row(&q, &mut y);
        assert_eq!(&y[..3], &[-1.0, 14.0, 1.0]);
        assert_eq!(y[16], 2.0);
    }

    #[test]
    fn ggml_bounds() {
        check_ggml_bounds(&TRAITS);
    }

    #[test]
    fn dot_ref_matches_dequantized() {
        check_dot_ref_matches_dequantized(&TRAITS, true);
    }

    #[test]
    fn simd_matches_ref() {
        check_simd_matches_ref(&TRAITS, true);
    }

    #[test]
    fn exact_with_minus_128_activations() {
        check_full_range_activations(&TRAITS, true, false);
    }

    #[test]
    fn multi_dot_matches_alone_and_ref() {
        check_multi_dot(&TRAITS, true);
    }

    #[test]
    fn deterministic() {
        check_deterministic(&TRAITS);
    }
}
