//! Q8_K: the activation type of the K-quants and ternary types. 256 int8
//! values with one f32 scale and the sum of each group of 16 (so dots with
//! types that carry a minimum can subtract it without touching the values).

use crate::traits::TypeTraits;
use bytemuck::{Pod, Zeroable};
use gguf::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 4 + QK_K + QK_K / 8);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q8_K,
    vec_dot_type: GgmlType::Q8_K,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockQ8K, BlockQ8K; vec_dot_ref),
    multi: None,
};

/// ggml's `nearest_int`: adding 1.5·2^23 makes the FPU round to nearest
/// (ties to even) and leaves the integer in the low mantissa bits. Valid for |x| <= 2^22, which every caller guarantees by
/// scaling into a small integer range; larger inputs give garbage, not UB.
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `quantize_row_q8_K_ref`.
pub fn quantize_row(x: &[f32], y: &mut [BlockQ8K]) {
    assert_eq!(x.len(), y.len() * QK_K);
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *yb = BlockQ8K::zeroed();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, g) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i16).sum();
        }
        yb.d = 1.0 / iscale;
    }
}

pub fn dequantize_row(x: &[BlockQ8K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (o, &q) in yb.iter_mut().zip(&xb.qs) {
            *o = xb.d * q as f32;
        }
    }
}

pub fn vec_dot_ref(x: &[BlockQ8K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let s: i32 =
            a.qs.iter()
                .zip(&b.qs)
                .map(|(&p, &q)| p as i32 * q as i32)
                .sum();
        sum += a.d * b.d * s as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::*;

    #[test]
    fn nearest_int_matches_round_half_even() {
        for (x, r) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (126.7, 127),
            (-127.0, -127),
        ] {
            assert_eq!(nearest_int(x), r, "{x}");
        }
    }

    #[test]
    fn round_trip_and_bsums() {
        let mut r = rng(1);
        for nb in BLOCK_COUNTS {
            let x = weights(&mut r, nb * QK_K);
            let mut q = vec![BlockQ8K::zeroed(); nb];
            quantize_row(&x, &mut q);
            for b in &q {
                for (j, s) in b.bsums.iter().enumerate() {
                    let want: i16 = b.qs[j * 16..j * 16 + 16].iter().map(|&v| v as i16).sum();
                    assert_eq!(*s, want);
                }
            }
            let mut y = vec![0.0; x.len()];
            dequantize_row(&q, &mut y);
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(rmse(&x, &y) <= amax / 127.0, "nb={nb}");
        }
        for x in extreme_rows(QK_K) {
            let mut q = vec![BlockQ8K::zeroed(); 1];
            quantize_row(&x, &mut q);
            let mut y = vec![0.0; QK_K];
            dequantize_row(&q, &mut y);
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(rmse(&x, &y) <= amax / 127.0 + 1e-9);
        }
    }
}
