//! F32: plain floats, dotted against F32 activations.
//!
//! The reference dot accumulates each f32 product in f64 like ggml's scalar
//! `ggml_vec_dot_f32`; the SIMD dots keep several f32 FMA accumulators, so
//! they agree with it to float rounding, not bit for bit.

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use crate::traits::TypeTraits;
use gguf::GgmlType;

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::F32,
    vec_dot_type: GgmlType::F32,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(f32, f32; vec_dot_ref,
        avx512: x86::dot_avx512,
        avx2: x86::dot_avx2,
        neon: neon::dot,
    ),
    multi: None,
};

pub fn quantize_row(x: &[f32], y: &mut [f32]) {
    y.copy_from_slice(x);
}

pub fn dequantize_row(x: &[f32], y: &mut [f32]) {
    y.copy_from_slice(x);
}

pub fn vec_dot_ref(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f64;
    for (&a, &b) in x.iter().zip(y) {
        sum += (a * b) as f64;
    }
    sum as f32
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::quant::testing::*;
    use rand::Rng;

    /// Lengths that hit every SIMD main loop and tail (block size is 1).
    pub(crate) const LENGTHS: [usize; 12] = [1, 2, 7, 8, 15, 16, 31, 33, 64, 127, 257, 1023];

    /// |a - b| bounded by `tol` times the sum of |x_i * y_i|: the scale of the
    /// rounding error of any summation order, so it holds even when the dot
    /// cancels to near zero.
    pub(crate) fn assert_close(got: f32, want: f32, abs_sum: f64, tol: f64, what: &str) {
        let err = (got as f64 - want as f64).abs();
        assert!(
            err <= tol * abs_sum + f32::MIN_POSITIVE as f64,
            "{what}: got {got}, want {want}, err {err}, scale {abs_sum}"
        );
    }

    #[test]
    fn traits_round_trip_bytes() {
        let x = weights(&mut rng(3), 37);
        let mut bytes = vec![0u8; x.len() * 4];
        (TRAITS.from_float)(&x, &mut bytes);
        let mut y = vec![0.0; x.len()];
        (TRAITS.to_float)(&bytes, &mut y);
        assert_eq!(x, y);
        assert_eq!(&bytes[..4], &x[0].to_le_bytes());
    }

    #[test]
    fn ref_dot_known_values() {
        assert_eq!(vec_dot_ref(&[1.0, 2.0, 3.0], &[4.0, -5.0, 6.0]), 12.0);
        // f64 accumulation keeps the small term that f32 would lose.
        assert_eq!(vec_dot_ref(&[1e8, 1.0, -1e8], &[1.0, 1.0, 1.0]), 1.0);
        assert_eq!(vec_dot_ref(&[], &[]), 0.0);
    }

    #[test]
    fn simd_matches_ref() {
        let mut r = rng(7);
        for isa in Isa::supported() {
            let dot = vec_dot(isa, GgmlType::F32);
            for n in LENGTHS {
                let mut rows = vec![weights(&mut r, n), weights(&mut r, n)];
                rows.extend(extreme_rows(n));
                for x in &rows {
                    let y: Vec<f32> = (0..n).map(|_| r.gen_range(-2.0f32..2.0)).collect();
                    let want = vec_dot_ref(x, &y);
                    let got = dot(bytemuck::cast_slice(x), bytemuck::cast_slice(&y));
                    let abs: f64 = x.iter().zip(&y).map(|(a, b)| (a * b).abs() as f64).sum();
                    assert_close(got, want, abs, 1e-6, &format!("{isa:?} n={n}"));
                }
            }
        }
    }

    #[test]
    fn simd_handles_every_tail_exactly_on_integers() {
        // Small integers make every partial sum exact, so any summation order
        // must give the same value: a dropped or doubled tail element shows.
        for isa in Isa::supported() {
            let dot = vec_dot(isa, GgmlType::F32);
            for n in 0..300 {
                let x: Vec<f32> = (0..n).map(|i| (i % 13) as f32 - 6.0).collect();
                let y: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + 1.0).collect();
                let want = vec_dot_ref(&x, &y);
                assert_eq!(
                    dot(bytemuck::cast_slice(&x), bytemuck::cast_slice(&y)),
                    want,
                    "{isa:?} n={n}"
                );
            }
        }
    }
}
