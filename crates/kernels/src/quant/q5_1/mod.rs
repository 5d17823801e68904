//! Q5_1: 32 weights as 5-bit quants q ∈ [0, 31] with value d·q + m, an f16
//! scale and an f16 minimum; bits packed as in Q5_0.
//!
//! Dotted against Q8_0 (ggml uses Q8_1): the activation sum Σy for the
//! minimum term is computed in the kernel, as for Q4_1.

use crate::quant::q4_1::min_max;
use crate::quant::q5_0::{pack5, unpack5};
use crate::quant::q8_0::BlockQ8_0;
use crate::traits::{MultiDot, TypeTraits};
use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use half::f16;

#[cfg(target_arch = "x86_64")]
mod x86;

pub const QK5_1: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 2 * 2 + 4 + QK5_1 / 2);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q5_1,
    vec_dot_type: GgmlType::Q8_0,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockQ5_1, BlockQ8_0; vec_dot_ref,
        avx512: x86::vec_dot_avx512,
        avx2: x86::vec_dot_avx2,
    ),
    multi: Some(&MULTI),
};

/// Batched decode and prefill: one row against several activations in Q8
/// quads.
pub const MULTI: MultiDot = crate::quant::multi::multi_dot::<BlockQ5_1>();

/// `quantize_row_q5_1_ref`: [min, max] split into 31 steps.
pub fn quantize_row(x: &[f32], y: &mut [BlockQ5_1]) {
    assert_eq!(x.len(), y.len() * QK5_1);
    for (xb, yb) in x.chunks_exact(QK5_1).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        yb.m = f16::from_f32(min);
        let mut q = [0u8; 32];
        for (o, &v) in q.iter_mut().zip(xb) {
            // ggml does not clamp here: (max - min)·id rounds to 31 at most.
            *o = ((v - min) * id + 0.5) as u8;
        }
        pack5(&q, &mut yb.qs, &mut yb.qh);
    }
}

pub fn dequantize_row(x: &[BlockQ5_1], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK5_1);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK5_1)) {
        let (d, m) = (xb.d.to_f32(), xb.m.to_f32());
        for (o, q) in yb.iter_mut().zip(unpack5(&xb.qs, &xb.qh)) {
            *o = q as f32 * d + m;
        }
    }
}

/// (Σ q·y, Σ y) of one block with one Q8_0 block's quants.
#[inline]
pub fn block_dot(x: &BlockQ5_1, y: &[i8; 32]) -> (i32, i32) {
    let q = unpack5(&x.qs, &x.qh);
    let s = q.iter().zip(y).map(|(&q, &v)| q as i32 * v as i32).sum();
    (s, y.iter().map(|&v| v as i32).sum())
}

/// ggml's `ggml_vec_dot_q5_1_q8_1_generic` with the activation sum taken
/// from the Q8_0 quants.
pub fn vec_dot_ref(x: &[BlockQ5_1], y: &[BlockQ8_0]) -> f32 {
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

    /// Half a step, plus the f16 rounding of d (times 31) and of m.
    fn max_err(xb: &[f32]) -> f32 {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        0.5 * d + 31.0 * f16_err(d) + f16_err(min)
    }

    #[test]
    fn round_trip_within_half_a_step() {
        check_round_trip(&TRAITS, max_err);
    }

    #[test]
    fn known_block() {
        // min -1, max 30 -> d = 1, m = -1: q = x + 1 rounded half up.
        let mut x = [0.0f32; 32];
        x[0] = -1.0;
        x[1] = 30.0;
        x[2] = 15.5; // 16.5 + 0.5 -> 17: high bit set
        x[16] = 2.49; // 3.49 + 0.5 -> 3
        let mut q = [BlockQ5_1::zeroed()];
        quantize_row(&x, &mut q);
        assert_eq!((q[0].d, q[0].m), (f16::ONE, f16::from_f32(-1.0)));
        assert_eq!(u32::from_le_bytes(q[0].qh), 0b110);
        assert_eq!(&q[0].qs[..3], &[0x30, 0x1f, 0x11]);
        let mut y = [0.0f32; 32];
        dequantize_row(&q, &mut y);
        assert_eq!(
            (y[0], y[1], y[2], y[16], y[17]),
            (-1.0, 30.0, 16.0, 2.0, 0.0)
        );
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
    fn deterministic() {
        check_deterministic(&TRAITS);
    }
}
