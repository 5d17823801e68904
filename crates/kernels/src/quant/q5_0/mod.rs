//! Q5_0: 32 weights as 5-bit quants q ∈ [0, 31] with value d·(q - 16) and
//! one f16 scale. The low four bits are packed like Q4_0; bit 4 of element
//! j is bit j of the little-endian u32 `qh`.

use crate::quant::q8_0::BlockQ8_0;
use crate::traits::{MultiDot, TypeTraits};
use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use half::f16;

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub const QK5_0: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 2 + 4 + QK5_0 / 2);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q5_0,
    vec_dot_type: GgmlType::Q8_0,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockQ5_0, BlockQ8_0; vec_dot_ref,
        avx512: x86::vec_dot_avx512,
        avx2: x86::vec_dot_avx2,
    ),
    multi: Some(&MULTI),
};

/// Batched decode and prefill: one row against several activations in Q8
/// quads.
pub const MULTI: MultiDot = crate::quant::multi::multi_dot::<BlockQ5_0>();

/// Packs 32 five-bit quants: low nibbles into `qs`, bit 4 into `qh`.
pub(crate) fn pack5(q: &[u8; 32], qs: &mut [u8; 16], qh: &mut [u8; 4]) {
    let mut h = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0f) | (q[j + 16] & 0x0f) << 4;
        h |= ((q[j] >> 4) as u32 & 1) << j | ((q[j + 16] >> 4) as u32 & 1) << (j + 16);
    }
    *qh = h.to_le_bytes();
}

/// The 32 five-bit quants of a block, in element order.
#[inline]
pub(crate) fn unpack5(qs: &[u8; 16], qh: &[u8; 4]) -> [u8; 32] {
    let h = u32::from_le_bytes(*qh);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0f) | ((h >> j) as u8 & 1) << 4;
        q[j + 16] = (qs[j] >> 4) | ((h >> (j + 16)) as u8 & 1) << 4;
    }
    q
}

/// `quantize_row_q5_0_ref`: the signed value of largest magnitude maps to
/// -16 exactly; its opposite would be +16 and is clipped to 15.
pub fn quantize_row(x: &[f32], y: &mut [BlockQ5_0]) {
    assert_eq!(x.len(), y.len() * QK5_0);
    for (xb, yb) in x.chunks_exact(QK5_0).zip(y.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        let mut q = [0u8; 32];
        for (o, &v) in q.iter_mut().zip(xb) {
            *o = ((v * id + 16.5) as i8).min(31) as u8;
        }
        pack5(&q, &mut yb.qs, &mut yb.qh);
    }
}

pub fn dequantize_row(x: &[BlockQ5_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK5_0);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK5_0)) {
        let d = xb.d.to_f32();
        for (o, q) in yb.iter_mut().zip(unpack5(&xb.qs, &xb.qh)) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

/// Integer dot of one block with one Q8_0 block's quants.
#[inline]
pub fn block_dot(x: &BlockQ5_0, y: &[i8; 32]) -> i32 {
    unpack5(&x.qs, &x.qh)
        .iter()
        .zip(y)
        .map(|(&q, &v)| (q as i32 - 16) * v as i32)
        .sum()
}

/// ggml's `ggml_vec_dot_q5_0_q8_0_generic`.
pub fn vec_dot_ref(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        sum += (a.d.to_f32() * b.d.to_f32()) * block_dot(a, &b.qs) as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8_0::legacy_tests::*;

    /// Half a step, except the clipped +16 (a full step), plus the f16
    /// rounding of d times the largest quant magnitude.
    fn max_err(xb: &[f32]) -> f32 {
        let d = amax(xb) / 16.0;
        d + 16.0 * f16_err(d)
    }

    #[test]
    fn round_trip_within_a_step() {
        check_round_trip(&TRAITS, max_err);
    }

    #[test]
    fn pack_unpack() {
        let q: [u8; 32] = std::array::from_fn(|j| (j as u8 * 7 + 3) % 32);
        let mut b = BlockQ5_0::zeroed();
        pack5(&q, &mut b.qs, &mut b.qh);
        assert_eq!(unpack5(&b.qs, &b.qh), q);
    }

    #[test]
    fn known_block() {
        // max = -16 -> d = 1: q = x + 16; +16 clips to 31 (value 15).
        let mut x = [0.0f32; 32];
        x[0] = -16.0;
        x[1] = 16.0;
        x[17] = 0.5; // 17 -> high bit set, low nibble 1
        x[31] = -0.51; // 15.99 -> 15
        let mut q = [BlockQ5_0::zeroed()];
        quantize_row(&x, &mut q);
        assert_eq!(q[0].d, f16::ONE);
        // Elements 1..=30 except 17 are 16 (bit 4 set); 0 and 31 are not.
        assert_eq!(u32::from_le_bytes(q[0].qh), 0x7fff_fffe);
        assert_eq!(&q[0].qs[..2], &[0x00, 0x1f]);
        assert_eq!(q[0].qs[15], 0xf0);
        let mut y = [0.0f32; 32];
        dequantize_row(&q, &mut y);
        assert_eq!((y[0], y[1], y[17], y[31]), (-16.0, 15.0, 1.0, -1.0));
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
    fn exact_with_minus_128_activations() {
        check_full_range_activations(&TRAITS, false, false);
    }

    #[test]
    fn deterministic() {
        check_deterministic(&TRAITS);
    }
}
