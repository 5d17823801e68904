//! F16: IEEE half floats, dotted against F16 activations (ggml's
//! `vec_dot_type` for F16), so activations are rounded to f16 first with
//! round-to-nearest-even like `GGML_FP32_TO_FP16`.
//!
//! Also home of the bulk f32 ↔ f16 row conversions other code (the KV cache)
//! uses: [`f32_to_f16_row`] and [`f16_to_f32_row`], bit-identical to the
//! scalar [`quantize_row`] / [`dequantize_row`] but F16C-accelerated.

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use crate::isa::PerIsa;
use crate::traits::TypeTraits;
use gguf::GgmlType;
pub use half::f16;

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::F16,
    vec_dot_type: GgmlType::F16,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    // AVX-512 runs the AVX2 kernel: on Zen 4 the 512-bit `vcvtph2ps` is
    // slower per element than two 256-bit ones (a 512-bit kernel took
    // 222 ns per 4096-element dot against 143 ns here).
    dots: crate::quant::vec_dots!(f16, f16; vec_dot_ref,
        avx2: x86::dot_avx2,
        neon: neon::dot,
    ),
    multi: None,
};

/// Round each value to the nearest f16 (ties to even; overflow to ±inf).
pub fn quantize_row(x: &[f32], y: &mut [f16]) {
    assert_eq!(x.len(), y.len());
    for (o, &v) in y.iter_mut().zip(x) {
        *o = f16::from_f32(v);
    }
}

pub fn dequantize_row(x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    for (o, &v) in y.iter_mut().zip(x) {
        *o = v.to_f32();
    }
}

/// ggml's scalar `ggml_vec_dot_f16`: each product in f32 (exact, since two
/// 11-bit significands fit in 24), summed in f64.
pub fn vec_dot_ref(x: &[f16], y: &[f16]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f64;
    for (&a, &b) in x.iter().zip(y) {
        sum += (a.to_f32() * b.to_f32()) as f64;
    }
    sum as f32
}

/// [`quantize_row`] with the selected kernels (F16C where the CPU has it).
pub fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
    (crate::selected().f16.to_half)(src, dst)
}

/// [`dequantize_row`] with the selected kernels.
pub fn f16_to_f32_row(src: &[f16], dst: &mut [f32]) {
    (crate::selected().f16.to_single)(src, dst)
}

/// The row conversions of one instruction set, each bit-identical to the
/// scalar one.
#[derive(Clone, Copy)]
pub struct F16Kernels {
    /// [`f32_to_f16_row`].
    pub to_half: fn(&[f32], &mut [f16]),
    /// [`f16_to_f32_row`].
    pub to_single: fn(&[f16], &mut [f32]),
}

/// F16C for both x86 sets, scalar elsewhere.
pub(crate) const KERNELS: PerIsa<F16Kernels> = {
    let k = PerIsa::new(F16Kernels {
        to_half: quantize_row,
        to_single: dequantize_row,
    });
    #[cfg(target_arch = "x86_64")]
    let k = k.avx2(F16Kernels {
        to_half: to_half_avx2,
        to_single: to_single_avx2,
    });
    k
};

#[cfg(target_arch = "x86_64")]
fn to_half_avx2(src: &[f32], dst: &mut [f16]) {
    // SAFETY: reachable only through `PerIsa::get` for an x86 set, whose
    // caller guarantees AVX2 and F16C; the kernel asserts equal lengths.
    unsafe { x86::f32_to_f16_row(src, dst) }
}

#[cfg(target_arch = "x86_64")]
fn to_single_avx2(src: &[f16], dst: &mut [f32]) {
    // SAFETY: as for `to_half_avx2`.
    unsafe { x86::f16_to_f32_row(src, dst) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::quant::f32::tests::{assert_close, LENGTHS};
    use crate::quant::testing::*;
    use rand::Rng;

    fn to_f16(x: &[f32]) -> Vec<f16> {
        let mut y = vec![f16::ZERO; x.len()];
        quantize_row(x, &mut y);
        y
    }

    #[test]
    fn rounding_known_values() {
        let cases: [(f32, u16); 12] = [
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65519.0, 0x7bff),
            (65520.0, 0x7c00),            // tie between max and 2^16: even is inf
            (1.0 + 1.0 / 2048.0, 0x3c00), // tie: rounds to even
            (1.0 + 3.0 / 2048.0, 0x3c02), // tie: rounds up to even
            (5.960_464_5e-8, 0x0001),     // 2^-24, smallest subnormal
            (2.980_232_2e-8, 0x0000),     // 2^-25: tie with zero, even is zero
            (4.470_348_4e-8, 0x0001),     // 1.5 * 2^-25
            (f32::INFINITY, 0x7c00),
            (-0.0, 0x8000),
        ];
        for (x, bits) in cases {
            assert_eq!(to_f16(&[x])[0].to_bits(), bits, "{x}");
        }
        assert!(to_f16(&[f32::NAN])[0].is_nan());
    }

    #[test]
    fn round_trip_is_within_half_an_ulp() {
        let mut r = rng(11);
        let mut rows: Vec<Vec<f32>> = LENGTHS.iter().map(|&n| weights(&mut r, n)).collect();
        rows.extend(extreme_rows(257));
        for x in rows {
            let mut y = vec![0.0; x.len()];
            dequantize_row(&to_f16(&x), &mut y);
            for (&a, &b) in x.iter().zip(&y) {
                assert!(b.is_finite());
                // f16 keeps 11 significant bits: relative error <= 2^-11,
                // and half the subnormal step (2^-25) near zero.
                assert!(
                    (a - b).abs() <= a.abs() / 2048.0 + 2.0f32.powi(-25),
                    "{a} -> {b}"
                );
            }
        }
    }

    /// f32 bit patterns that cover every exponent, ties, subnormal edges,
    /// infinities and NaNs.
    fn f32_probe() -> Vec<f32> {
        let mut v: Vec<f32> = (0..=u32::MAX).step_by(65_521).map(f32::from_bits).collect();
        for e in 100u32..150 {
            for m in [
                0u32, 0x1000, 0x2000, 0x3000, 0x7f_e000, 0x7f_f000, 0x7f_ffff, 1,
            ] {
                for s in [0u32, 1 << 31] {
                    v.push(f32::from_bits(s | e << 23 | m));
                }
            }
        }
        v.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            65520.0,
            65519.99,
        ]);
        v
    }

    #[test]
    fn row_conversions_match_scalar_bit_for_bit() {
        let singles = f32_probe();
        let halves: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        for isa in Isa::supported() {
            let k = crate::table(isa).unwrap().f16;
            let (to_half, to_single) = (k.to_half, k.to_single);
            for n in [singles.len(), 1, 7, 9, 31] {
                let src = &singles[singles.len() - n..];
                let mut got = vec![f16::ZERO; n];
                to_half(src, &mut got);
                // `from_f32_const` is half's software rounding: independent of
                // the F16C instruction both other paths may use.
                for (x, g) in src.iter().zip(&got) {
                    let w = f16::from_f32_const(*x);
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{isa:?} {x:e} ({:#x})",
                        x.to_bits()
                    );
                }
                let scalar: Vec<u16> = to_f16(src).iter().map(|h| h.to_bits()).collect();
                assert!(got.iter().map(|h| h.to_bits()).eq(scalar), "{isa:?}");
            }
            let mut got = vec![0.0; halves.len()];
            to_single(&halves, &mut got);
            let mut scalar = vec![0.0; halves.len()];
            dequantize_row(&halves, &mut scalar);
            for ((h, g), s) in halves.iter().zip(&got).zip(&scalar) {
                let w = h.to_f32_const();
                assert_eq!(g.to_bits(), w.to_bits(), "{isa:?} {:#x}", h.to_bits());
                assert_eq!(s.to_bits(), w.to_bits(), "{:#x}", h.to_bits());
            }
        }
        // The public helpers use the selected set; same bits either way.
        let mut a = vec![f16::ZERO; 100];
        f32_to_f16_row(&singles[..100], &mut a);
        let mut b = vec![0.0; 100];
        f16_to_f32_row(&a, &mut b);
        assert!(a
            .iter()
            .zip(to_f16(&singles[..100]))
            .all(|(p, q)| p.to_bits() == q.to_bits()));
        assert!(b
            .iter()
            .zip(&a)
            .all(|(p, q)| p.to_bits() == q.to_f32().to_bits()));
    }

    #[test]
    fn widening_trick_is_exact() {
        // The NEON widening, one lane at a time, against every f16.
        for h in 0..=u16::MAX {
            let h32 = h as u32;
            let sign = (h32 & 0x8000) << 16;
            let em = (h32 & 0x7fff) << 13;
            let scaled = (f32::from_bits(em) * f32::from_bits(0x7780_0000)).to_bits();
            let inf_nan = if em >= 0x0f80_0000 { 0x7f80_0000 } else { 0 };
            let got = f32::from_bits(scaled | inf_nan | sign);
            let want = f16::from_bits(h).to_f32_const();
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#x}");
            }
        }
    }

    #[test]
    fn ref_dot_matches_float_dot_of_dequantized() {
        let mut r = rng(12);
        for n in LENGTHS {
            let (x, y) = (to_f16(&weights(&mut r, n)), to_f16(&weights(&mut r, n)));
            let (mut fx, mut fy) = (vec![0.0; n], vec![0.0; n]);
            dequantize_row(&x, &mut fx);
            dequantize_row(&y, &mut fy);
            let want: f64 = fx.iter().zip(&fy).map(|(a, b)| *a as f64 * *b as f64).sum();
            // Products are exact and summed in f64: only the final rounding.
            assert_eq!(vec_dot_ref(&x, &y), want as f32, "n={n}");
        }
    }

    #[test]
    fn ggml_dot_error_bound() {
        // test-quantize-fns: |dot(q(a), q(b)) - dot(a, b)| / n < 0.02 on its
        // cosine data.
        let n = 4096;
        let a: Vec<f32> = (0..n).map(|i| 0.1 + 2.0 * (i as f32).cos()).collect();
        let b: Vec<f32> = (0..n).map(|i| 0.1 + 2.0 * (i as f32 + 1.0).cos()).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| (x * y) as f64).sum();
        for isa in Isa::supported() {
            let got = vec_dot(isa, GgmlType::F16)(
                bytemuck::cast_slice(&to_f16(&a)),
                bytemuck::cast_slice(&to_f16(&b)),
            );
            assert!(dot_err(got, exact as f32, n) < 0.02, "{isa:?}");
        }
    }

    #[test]
    fn simd_matches_ref() {
        let mut r = rng(13);
        for isa in Isa::supported() {
            let dot = vec_dot(isa, GgmlType::F16);
            for n in LENGTHS {
                let mut rows = vec![weights(&mut r, n), weights(&mut r, n)];
                rows.extend(extreme_rows(n));
                for x in rows {
                    let y: Vec<f32> = (0..n).map(|_| r.gen_range(-2.0f32..2.0)).collect();
                    let (x, y) = (to_f16(&x), to_f16(&y));
                    let want = vec_dot_ref(&x, &y);
                    let got = dot(bytemuck::cast_slice(&x), bytemuck::cast_slice(&y));
                    let abs: f64 = x
                        .iter()
                        .zip(&y)
                        .map(|(a, b)| (a.to_f32() * b.to_f32()).abs() as f64)
                        .sum();
                    assert!(got.is_finite());
                    assert_close(got, want, abs, 1e-6, &format!("{isa:?} n={n}"));
                }
            }
        }
    }

    #[test]
    fn simd_handles_every_tail_exactly_on_integers() {
        for isa in Isa::supported() {
            let dot = vec_dot(isa, GgmlType::F16);
            for n in 0..300 {
                let x = to_f16(&(0..n).map(|i| (i % 13) as f32 - 6.0).collect::<Vec<_>>());
                let y = to_f16(&(0..n).map(|i| (i % 7) as f32 + 1.0).collect::<Vec<_>>());
                let got = dot(bytemuck::cast_slice(&x), bytemuck::cast_slice(&y));
                assert_eq!(got, vec_dot_ref(&x, &y), "{isa:?} n={n}");
            }
        }
    }
}
