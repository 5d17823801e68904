//! TQ2_0: ternary weights at 2.0625 bits per weight. A block of 256 values
//! in {-1, 0, 1} times one f16 scale (the block's absolute maximum), each
//! stored as the 2-bit `value + 1`: byte `qs[32c + m]` holds values
//! `128c + 32k + m` in bits `2k..2k+2`, k = 0..4. Simpler to decode than
//! TQ1_0 at 0.375 more bits per weight. Dotted against Q8_K.

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

use super::q8_k::BlockQ8K;
use super::tq1_0::{ternary_scale, trit};
use crate::traits::TypeTraits;
use bytemuck::{Pod, Zeroable};
use gguf::{GgmlType, QK_K};
use half::f16;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct BlockTQ2_0 {
    /// Four 2-bit `value + 1` per byte.
    pub qs: [u8; QK_K / 4],
    /// Scale: the block's absolute maximum.
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockTQ2_0>() == 2 + QK_K / 4);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::TQ2_0,
    vec_dot_type: GgmlType::Q8_K,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockTQ2_0, BlockQ8K; vec_dot_ref,
        avx512: x86::dot_avx512,
        avx2: x86::dot_avx2,
        neon: neon::dot,
    ),
    multi: None,
};

/// `quantize_row_tq2_0_ref`.
pub fn quantize_row(x: &[f32], y: &mut [BlockTQ2_0]) {
    assert_eq!(x.len(), y.len() * QK_K);
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let (d, id) = ternary_scale(xb);
        yb.d = f16::from_f32(d);
        for (qs, xc) in yb.qs.chunks_exact_mut(32).zip(xb.chunks_exact(128)) {
            for (m, q) in qs.iter_mut().enumerate() {
                *q = (0..4).fold(0u8, |q, k| q | (trit(xc[32 * k + m], id) & 3) << (2 * k));
            }
        }
    }
}

/// The 256 2-bit fields of a block in value order (0..=3; the quantizer
/// writes 0..=2).
fn fields(b: &BlockTQ2_0) -> [u8; QK_K] {
    let mut f = [0u8; QK_K];
    for (fc, qc) in f.chunks_exact_mut(128).zip(b.qs.chunks_exact(32)) {
        for (k, fk) in fc.chunks_exact_mut(32).enumerate() {
            for (o, &q) in fk.iter_mut().zip(qc) {
                *o = (q >> (2 * k)) & 3;
            }
        }
    }
    f
}

/// `dequantize_row_tq2_0`.
pub fn dequantize_row(x: &[BlockTQ2_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = xb.d.to_f32();
        for (o, f) in yb.iter_mut().zip(fields(xb)) {
            *o = (f as i32 - 1) as f32 * d;
        }
    }
}

/// `ggml_vec_dot_tq2_0_q8_K_generic`: an exact integer sum per block, scaled
/// once.
pub fn vec_dot_ref(x: &[BlockTQ2_0], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let s: i32 = fields(xb)
            .iter()
            .zip(&yb.qs)
            .map(|(&f, &q)| (f as i32 - 1) * q as i32)
            .sum();
        sum += s as f32 * (yb.d * xb.d.to_f32());
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::*;
    use crate::quant::tq1_0::tests::*;

    #[test]
    fn round_trip() {
        check_round_trip(&TRAITS);
        check_exact_ternary(&TRAITS);
    }

    #[test]
    fn ggml_bounds() {
        check_ggml_bounds(&TRAITS);
    }

    #[test]
    fn ref_dot() {
        check_ref_dot(&TRAITS);
    }

    #[test]
    fn kernels_match_ref_exactly() {
        check_kernels(&TRAITS);
    }

    #[test]
    fn dispatch() {
        check_dispatch(&TRAITS);
    }

    #[test]
    fn known_block() {
        // All zeros: every field is 1, so every byte is 0b01_01_01_01.
        let mut q = [BlockTQ2_0::zeroed()];
        quantize_row(&[0.0; QK_K], &mut q);
        assert_eq!(q[0].qs, [0x55; 64]);
        // Value 0 = -1 (field 0 of qs[0]), value 32 = +1 (field 1 of qs[0]),
        // value 255 = +1 (field 3 of qs[63]).
        let mut x = [0.0f32; QK_K];
        x[0] = -0.5;
        x[32] = 0.5;
        x[255] = 0.5;
        quantize_row(&x, &mut q);
        assert_eq!(q[0].qs[0], 0b01_01_10_00);
        assert_eq!(q[0].qs[63], 0b10_01_01_01);
        assert!(q[0].qs[1..63].iter().all(|&b| b == 0x55));
        assert_eq!(q[0].d.to_f32(), 0.5);
        let mut y = [0.0f32; QK_K];
        dequantize_row(&q, &mut y);
        assert_eq!(y, x);
    }

    #[test]
    fn field_three_decodes_as_two() {
        // Not written by the quantizer, but every kernel must agree on it.
        let mut b = BlockTQ2_0::zeroed();
        b.qs = [0xff; 64];
        b.d = f16::ONE;
        let mut y = [0.0f32; QK_K];
        dequantize_row(&[b], &mut y);
        assert!(y.iter().all(|&v| v == 2.0));
    }

    #[test]
    fn quantizer_is_deterministic() {
        let x = weights(&mut rng(37), 5 * QK_K);
        assert_eq!(quantize(&TRAITS, &x), quantize(&TRAITS, &x));
    }
}
