//! BF16: the top 16 bits of an f32, dotted against BF16 activations (ggml's
//! `vec_dot_type` for BF16). Rounding from f32 is ggml's
//! `GGML_FP32_TO_BF16`: NaNs are forced quiet, everything else rounds to
//! nearest even (overflowing to ±inf).

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::traits::TypeTraits;
use gguf::GgmlType;
pub use half::bf16;

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::BF16,
    vec_dot_type: GgmlType::BF16,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(bf16, bf16; vec_dot_ref,
        avx512_bf16: x86::dot_avx512bf16,
        avx512: x86::dot_avx512,
        avx2: x86::dot_avx2,
        neon: neon::dot,
    ),
    multi: None,
};

/// ggml's f32 → bf16 rounding.
#[inline]
pub fn from_f32(x: f32) -> bf16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        // NaN: keep sign and top payload bits, set the quiet bit.
        return bf16::from_bits((u >> 16) as u16 | 0x40);
    }
    // Adding 0x7fff plus the lowest kept bit rounds ties to even; no overflow
    // since only NaNs come near 2^32.
    bf16::from_bits(((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16)
}

pub fn quantize_row(x: &[f32], y: &mut [bf16]) {
    assert_eq!(x.len(), y.len());
    for (o, &v) in y.iter_mut().zip(x) {
        *o = from_f32(v);
    }
}

pub fn dequantize_row(x: &[bf16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    for (o, &v) in y.iter_mut().zip(x) {
        *o = v.to_f32();
    }
}

/// ggml's scalar `ggml_vec_dot_bf16`: each product in f32 (exact, since two
/// 8-bit significands fit in 24), summed in f64.
pub fn vec_dot_ref(x: &[bf16], y: &[bf16]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f64;
    for (&a, &b) in x.iter().zip(y) {
        sum += (a.to_f32() * b.to_f32()) as f64;
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::quant::f32::tests::{assert_close, LENGTHS};
    use crate::quant::testing::*;
    use crate::traits::VecDotFn;
    use rand::Rng;

    fn to_bf16(x: &[f32]) -> Vec<bf16> {
        let mut y = vec![bf16::ZERO; x.len()];
        quantize_row(x, &mut y);
        y
    }

    /// The widening AVX-512 kernel, which the AVX-512 table skips when
    /// AVX512_BF16 is present.
    #[cfg(target_arch = "x86_64")]
    fn dot_avx512_widen(w: &[u8], a: &[u8]) -> f32 {
        assert!(Isa::Avx512.is_supported());
        let (x, y) = (bytemuck::cast_slice(w), bytemuck::cast_slice(a));
        // SAFETY: the CPU has the AVX-512 set (asserted); the kernel
        // asserts equal lengths.
        unsafe { x86::dot_avx512(x, y) }
    }

    /// Every dot this CPU can run, including the widening AVX-512 kernel
    /// where the table has the AVX512_BF16 one.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    fn kernels() -> Vec<(String, VecDotFn)> {
        let mut k: Vec<(String, VecDotFn)> = Isa::supported()
            .into_iter()
            .map(|i| (format!("{i:?}"), vec_dot(i, GgmlType::BF16)))
            .collect();
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx512.is_supported() {
            k.push(("avx512-widen".into(), dot_avx512_widen));
        }
        k
    }

    #[test]
    fn rounding_known_values() {
        let cases: [(u32, u16); 9] = [
            (0x3f80_0000, 0x3f80), // 1.0
            (0x3f80_8000, 0x3f80), // tie, even stays
            (0x3f81_8000, 0x3f82), // tie, odd rounds up
            (0x3f80_8001, 0x3f81), // above the tie
            (0x7f7f_ffff, 0x7f80), // f32::MAX rounds to inf
            (0xff80_0000, 0xff80), // -inf
            (0x7f80_0001, 0x7fc0), // signalling NaN made quiet
            (0xffc1_2345, 0xffc1), // quiet NaN keeps sign and payload
            (0x0000_8000, 0x0000), // subnormal tie to even zero
        ];
        for (bits, want) in cases {
            assert_eq!(from_f32(f32::from_bits(bits)).to_bits(), want, "{bits:#x}");
        }
    }

    #[test]
    fn rounding_matches_half_crate() {
        // An independent implementation of the same IEEE rounding.
        for u in (0..=u32::MAX).step_by(4099) {
            let x = f32::from_bits(u);
            let (a, b) = (from_f32(x), bf16::from_f32(x));
            if x.is_nan() {
                assert!(a.is_nan() && b.is_nan());
                assert_eq!(a.to_bits() & 0x8040, b.to_bits() & 0x8040, "{u:#x}");
            } else {
                assert_eq!(a.to_bits(), b.to_bits(), "{u:#x}");
            }
        }
    }

    #[test]
    fn round_trip_is_within_half_an_ulp() {
        let mut r = rng(21);
        let mut rows: Vec<Vec<f32>> = LENGTHS.iter().map(|&n| weights(&mut r, n)).collect();
        rows.extend(extreme_rows(257));
        for x in rows {
            let mut y = vec![0.0; x.len()];
            dequantize_row(&to_bf16(&x), &mut y);
            for (&a, &b) in x.iter().zip(&y) {
                assert!(b.is_finite());
                // 8 significant bits: relative error <= 2^-8.
                assert!((a - b).abs() <= a.abs() / 256.0, "{a} -> {b}");
            }
        }
    }

    #[test]
    fn ref_dot_matches_float_dot_of_dequantized() {
        let mut r = rng(22);
        for n in LENGTHS {
            let (x, y) = (to_bf16(&weights(&mut r, n)), to_bf16(&weights(&mut r, n)));
            let (mut fx, mut fy) = (vec![0.0; n], vec![0.0; n]);
            dequantize_row(&x, &mut fx);
            dequantize_row(&y, &mut fy);
            let want: f64 = fx.iter().zip(&fy).map(|(a, b)| *a as f64 * *b as f64).sum();
            assert_eq!(vec_dot_ref(&x, &y), want as f32, "n={n}");
        }
    }

    #[test]
    fn ggml_dot_error_bound() {
        let n = 4096;
        let a: Vec<f32> = (0..n).map(|i| 0.1 + 2.0 * (i as f32).cos()).collect();
        let b: Vec<f32> = (0..n).map(|i| 0.1 + 2.0 * (i as f32 + 1.0).cos()).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| (x * y) as f64).sum();
        for (name, dot) in kernels() {
            let got = dot(
                bytemuck::cast_slice(&to_bf16(&a)),
                bytemuck::cast_slice(&to_bf16(&b)),
            );
            assert!(dot_err(got, exact as f32, n) < 0.02, "{name}");
        }
    }

    #[test]
    fn simd_matches_ref() {
        let mut r = rng(23);
        for (name, dot) in kernels() {
            for n in LENGTHS.into_iter().chain([4099]) {
                let mut rows = vec![weights(&mut r, n), weights(&mut r, n)];
                rows.extend(extreme_rows(n));
                for x in rows {
                    let y: Vec<f32> = (0..n).map(|_| r.gen_range(-2.0f32..2.0)).collect();
                    let (x, y) = (to_bf16(&x), to_bf16(&y));
                    let want = vec_dot_ref(&x, &y);
                    let got = dot(bytemuck::cast_slice(&x), bytemuck::cast_slice(&y));
                    let abs: f64 = x
                        .iter()
                        .zip(&y)
                        .map(|(a, b)| (a.to_f32() * b.to_f32()).abs() as f64)
                        .sum();
                    assert!(got.is_finite());
                    assert_close(got, want, abs, 1e-6, &format!("{name} n={n}"));
                }
            }
        }
    }

    #[test]
    fn simd_handles_every_tail_exactly_on_integers() {
        for (name, dot) in kernels() {
            for n in 0..300 {
                let x = to_bf16(&(0..n).map(|i| (i % 13) as f32 - 6.0).collect::<Vec<_>>());
                let y = to_bf16(&(0..n).map(|i| (i % 7) as f32 + 1.0).collect::<Vec<_>>());
                let got = dot(bytemuck::cast_slice(&x), bytemuck::cast_slice(&y));
                assert_eq!(got, vec_dot_ref(&x, &y), "{name} n={n}");
            }
        }
    }
}
