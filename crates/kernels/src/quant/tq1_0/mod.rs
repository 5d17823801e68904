//! TQ1_0: ternary weights (BitNet b1.58, TriLMs) at 1.6875 bits per weight.
//! A block of 256 values in {-1, 0, 1} times one f16 scale (the block's
//! absolute maximum). Trits are stored as `t = value + 1` in base 3, five per
//! byte (3^5 = 243 <= 256) for the first 240 values and four per byte for the
//! last 16, as the fixed-point fraction `ceil(n * 256 / 243)` so that trit
//! `k` of a byte `q` is the top two bits of `(q * 3^k mod 256) * 3`: decoding
//! needs only byte multiplies. Dotted against Q8_K.
//!
//! Value order within a block (`v(i)` is the i-th value, `3^k` the trit
//! position, most significant first in the encoding):
//! - `qs[m]`, m < 32: `v(32k + m)` for k = 0..5;
//! - `qs[32 + m]`, m < 16: `v(160 + 16k + m)` for k = 0..5;
//! - `qh[j]`, j < 4: `v(240 + 4k + j)` for k = 0..4.

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use super::q8_k::BlockQ8K;
use crate::traits::TypeTraits;
use bytemuck::{Pod, Zeroable};
use gguf::{GgmlType, QK_K};
use half::f16;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct BlockTQ1_0 {
    /// Five trits per byte: values 0..160 (32 bytes) and 160..240 (16 bytes).
    pub qs: [u8; 48],
    /// Four trits per byte: values 240..256.
    pub qh: [u8; QK_K / 64],
    /// Scale: the block's absolute maximum.
    pub d: f16,
}
const _: () =
    assert!(std::mem::size_of::<BlockTQ1_0>() == 2 + QK_K / 64 + (QK_K - 4 * QK_K / 64) / 5);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::TQ1_0,
    vec_dot_type: GgmlType::Q8_K,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockTQ1_0, BlockQ8K; vec_dot_ref,
        avx512: x86::dot_avx512,
        avx2: x86::dot_avx2,
        neon: neon::dot,
    ),
    multi: None,
};

const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];

/// The scale and its inverse shared by both ternary quantizers: the absolute
/// maximum, found with C's `MAX(a, b)` (`a > b ? a : b`) so even NaN inputs
/// give ggml's bytes.
pub(crate) fn ternary_scale(x: &[f32]) -> (f32, f32) {
    let amax = x
        .iter()
        .fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() });
    (amax, if amax != 0.0 { 1.0 / amax } else { 0.0 })
}

/// `lroundf(v * id) + 1`: the trit of a value, 0, 1 or 2. `v * id` is within
/// [-1, 1] unless the scale underflowed (id = inf) or the input is not
/// finite; those give the trit of 0, as ggml does on x86 (lroundf's
/// out-of-range result plus one truncates to 1 in an int).
#[inline]
pub(crate) fn trit(v: f32, id: f32) -> u8 {
    let r = (v * id).round();
    if r == -1.0 {
        0
    } else if r == 1.0 {
        2
    } else {
        1
    }
}

/// Pack trits (most significant first) into the byte's fixed-point fraction.
fn pack(trits: impl Iterator<Item = u8>) -> u8 {
    let n = trits.fold(0u16, |q, t| q * 3 + t as u16);
    // Rounding up gives the smallest byte whose top trits decode to `n`.
    (n * 256).div_ceil(243) as u8
}

/// Trit `k` (0 = most significant) of byte `q`, as 0, 1 or 2.
#[inline]
pub(crate) fn unpack(q: u8, k: usize) -> u8 {
    ((q.wrapping_mul(POW3[k]) as u16 * 3) >> 8) as u8
}

/// `quantize_row_tq1_0_ref`.
pub fn quantize_row(x: &[f32], y: &mut [BlockTQ1_0]) {
    assert_eq!(x.len(), y.len() * QK_K);
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let (d, id) = ternary_scale(xb);
        yb.d = f16::from_f32(d);
        for m in 0..32 {
            yb.qs[m] = pack((0..5).map(|k| trit(xb[32 * k + m], id)));
        }
        for m in 0..16 {
            yb.qs[32 + m] = pack((0..5).map(|k| trit(xb[160 + 16 * k + m], id)));
        }
        for j in 0..4 {
            // Four trits, shifted up so the first is the most significant of
            // five (the fifth is a zero).
            yb.qh[j] = pack((0..4).map(|k| trit(xb[240 + 4 * k + j], id)).chain([0]));
        }
    }
}

/// The 256 trits of a block in value order.
pub(crate) fn trits(b: &BlockTQ1_0) -> [u8; QK_K] {
    let mut t = [0u8; QK_K];
    for k in 0..5 {
        for m in 0..32 {
            t[32 * k + m] = unpack(b.qs[m], k);
        }
        for m in 0..16 {
            t[160 + 16 * k + m] = unpack(b.qs[32 + m], k);
        }
    }
    for k in 0..4 {
        for j in 0..4 {
            t[240 + 4 * k + j] = unpack(b.qh[j], k);
        }
    }
    t
}

/// `dequantize_row_tq1_0`.
pub fn dequantize_row(x: &[BlockTQ1_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = xb.d.to_f32();
        for (o, t) in yb.iter_mut().zip(trits(xb)) {
            *o = (t as i32 - 1) as f32 * d;
        }
    }
}

/// `ggml_vec_dot_tq1_0_q8_K_generic`: an exact integer sum per block, scaled
/// once.
pub fn vec_dot_ref(x: &[BlockTQ1_0], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let s: i32 = trits(xb)
            .iter()
            .zip(&yb.qs)
            .map(|(&t, &q)| (t as i32 - 1) * q as i32)
            .sum();
        sum += s as f32 * (xb.d.to_f32() * yb.d);
    }
    sum
}

#[cfg(test)]
pub(crate) mod tests;
