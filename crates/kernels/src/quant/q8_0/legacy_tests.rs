//! Checks shared by the legacy block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! IQ4_NL): all have 32-element blocks starting with an f16 scale `d`
//! (followed by an f16 minimum `m` for Q4_1/Q5_1) and dot against Q8_0.

use super::{BlockQ8_0, QK8_0};
use crate::isa::Isa;
use crate::quant::testing::*;
use crate::traits::TypeTraits;
use bytemuck::Zeroable;
use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

pub fn quantize(t: &TypeTraits, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; t.row_bytes(x.len())];
    (t.from_float)(x, &mut q);
    q
}

pub fn dequantize(t: &TypeTraits, q: &[u8]) -> Vec<f32> {
    let mut y = vec![0.0; q.len() / t.type_size() * t.block_size()];
    (t.to_float)(q, &mut y);
    y
}

fn act(x: &[f32]) -> Vec<u8> {
    quantize(&super::TRAITS, x)
}

/// Largest error of storing `v` as f16: half an ulp (relative 2^-11), or
/// half the smallest subnormal (2^-25) where tiny scales underflow.
pub fn f16_err(v: f32) -> f32 {
    v.abs() / 2048.0 + 1.0 / (1u32 << 25) as f32
}

pub fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// ggml test-quantize-fns' synthetic data.
pub fn ggml_data(offset: f32, n: usize, amplitude: f32) -> Vec<f32> {
    (0..n)
        .map(|i| 0.1 + amplitude * (i as f32 + offset).cos())
        .collect()
}

/// ggml test-quantize-fns' "rmse": sqrt(Σ diff²) / n.
fn ggml_error(a: &[f32], b: &[f32]) -> f32 {
    let s: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    s.sqrt() as f32 / a.len() as f32
}

fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Round trip on random weights (every block count) and extreme rows: every
/// element within `max_err(block)` of its input, nothing non-finite.
pub fn check_round_trip(t: &TypeTraits, max_err: fn(&[f32]) -> f32) {
    let mut r = rng(7);
    let mut rows: Vec<Vec<f32>> = BLOCK_COUNTS
        .iter()
        .map(|&nb| weights(&mut r, nb * QK8_0))
        .collect();
    rows.extend(extreme_rows(QK8_0));
    rows.extend(extreme_rows(3 * QK8_0));
    for x in rows {
        let y = dequantize(t, &quantize(t, &x));
        for (b, (xb, yb)) in x.chunks(QK8_0).zip(y.chunks(QK8_0)).enumerate() {
            let bound = max_err(xb);
            for (j, (a, o)) in xb.iter().zip(yb).enumerate() {
                assert!(
                    o.is_finite(),
                    "{:?}: non-finite output at block {b} elem {j}",
                    t.ty
                );
                assert!(
                    (a - o).abs() <= bound,
                    "{:?}: block {b} elem {j}: {a} -> {o} (bound {bound})",
                    t.ty
                );
            }
        }
    }
}

/// ggml's own bounds on its own data: total error < 0.002 and dot error
/// < 0.02 (MAX_QUANTIZATION_TOTAL_ERROR, MAX_DOT_PRODUCT_ERROR), for every
/// kernel set.
pub fn check_ggml_bounds(t: &TypeTraits) {
    let n = 32 * 128;
    let x = ggml_data(0.0, n, 2.0);
    let a = ggml_data(1.0, n, 2.0);
    let q = quantize(t, &x);
    let err = ggml_error(&x, &dequantize(t, &q));
    assert!(err < 0.002, "{:?}: total quantization error {err}", t.ty);
    let qa = act(&a);
    let want = dot_f64(&x, &a) as f32;
    for isa in Isa::supported() {
        let got = vec_dot(isa, t.ty)(&q, &qa);
        let e = dot_err(got, want, n);
        assert!(e < 0.02, "{:?} {isa:?}: dot error {e}", t.ty);
    }
}

/// Σ |terms| of a dot: what float rounding error is relative to.
fn magnitude(t: &TypeTraits, w: &[u8], a: &[u8], has_min: bool) -> f64 {
    let (wf, af) = (dequantize(t, w), dequantize(&super::TRAITS, a));
    let mut m = 0.0f64;
    for (b, (wb, ab)) in wf.chunks(QK8_0).zip(af.chunks(QK8_0)).enumerate() {
        let asum: f64 = ab.iter().map(|v| v.abs() as f64).sum();
        m += wb
            .iter()
            .zip(ab)
            .map(|(&x, &y)| (x as f64 * y as f64).abs())
            .sum::<f64>();
        if has_min {
            let o = b * t.type_size() + 2;
            m += f16::from_le_bytes([w[o], w[o + 1]]).to_f32().abs() as f64 * asum;
        }
    }
    m
}

/// The reference dot equals the f64 dot of the dequantized vectors up to
/// f32 rounding (it is the same sum, grouped by block).
pub fn check_dot_ref_matches_dequantized(t: &TypeTraits, has_min: bool) {
    let mut r = rng(11);
    for nb in BLOCK_COUNTS {
        let n = nb * QK8_0;
        let (w, a) = (quantize(t, &weights(&mut r, n)), act(&weights(&mut r, n)));
        let got = (t.vec_dot_ref)(&w, &a) as f64;
        let want = dot_f64(&dequantize(t, &w), &dequantize(&super::TRAITS, &a));
        let tol = 1e-5 * magnitude(t, &w, &a, has_min) + 1e-30;
        assert!(
            (got - want).abs() <= tol,
            "{:?} nb={nb}: {got} vs {want}",
            t.ty
        );
    }
}

fn random_f16(r: &mut StdRng, lo: f32, hi: f32) -> [u8; 2] {
    let v = r.gen_range(lo..hi) * if r.gen_bool(0.5) { -1.0 } else { 1.0 };
    f16::from_f32(v).to_le_bytes()
}

/// Weight blocks with random quant bytes (every bit pattern is valid) and
/// `d` (and `m`) set by `scale`.
fn random_weights(t: &TypeTraits, r: &mut StdRng, nb: usize, has_min: bool, unit: bool) -> Vec<u8> {
    let mut w: Vec<u8> = (0..nb * t.type_size()).map(|_| r.gen()).collect();
    for b in w.chunks_exact_mut(t.type_size()) {
        let d = if unit {
            f16::ONE.to_le_bytes()
        } else {
            random_f16(r, 1e-3, 1.0)
        };
        b[..2].copy_from_slice(&d);
        if has_min {
            let m = if unit {
                f16::from_f32(r.gen_range(-3i32..=3) as f32).to_le_bytes()
            } else {
                random_f16(r, 0.0, 2.0)
            };
            b[2..4].copy_from_slice(&m);
        }
    }
    w
}

/// Activation blocks with random quants in [-127, 127].
fn random_act(r: &mut StdRng, nb: usize, unit: bool) -> Vec<u8> {
    let blocks: Vec<BlockQ8_0> = (0..nb)
        .map(|_| {
            let mut b = BlockQ8_0::zeroed();
            b.d = if unit {
                f16::ONE
            } else {
                f16::from_le_bytes(random_f16(r, 1e-3, 1.0))
            };
            b.qs.iter_mut().for_each(|q| *q = r.gen_range(-127..=127));
            b
        })
        .collect();
    bytemuck::cast_slice(&blocks).to_vec()
}

/// Every kernel set the CPU supports against the reference: random blocks,
/// quantized weights and extreme rows for every block count, within f32
/// reordering error; and bit-for-bit with unit scales, where every partial
/// sum is an integer below 2^24 and so exact in any order.
pub fn check_simd_matches_ref(t: &TypeTraits, has_min: bool) {
    let mut r = rng(5);
    let mut cases: Vec<(Vec<u8>, Vec<u8>, bool)> = Vec::new();
    for nb in BLOCK_COUNTS {
        let n = nb * QK8_0;
        cases.push((
            random_weights(t, &mut r, nb, has_min, true),
            random_act(&mut r, nb, true),
            true,
        ));
        cases.push((
            random_weights(t, &mut r, nb, has_min, false),
            random_act(&mut r, nb, false),
            false,
        ));
        cases.push((
            quantize(t, &weights(&mut r, n)),
            act(&weights(&mut r, n)),
            false,
        ));
        for x in extreme_rows(n) {
            cases.push((quantize(t, &x), act(&weights(&mut r, n)), false));
            cases.push((quantize(t, &weights(&mut r, n)), act(&x), false));
        }
    }
    let isas = Isa::supported();
    for (w, a, exact) in &cases {
        let want = (t.vec_dot_ref)(w, a);
        let tol = 1e-5 * magnitude(t, w, a, has_min) as f32 + 1e-30;
        for &isa in &isas {
            let got = vec_dot(isa, t.ty)(w, a);
            let nb = w.len() / t.type_size();
            if *exact {
                assert_eq!(got, want, "{:?} {isa:?} nb={nb} unit scales", t.ty);
            } else {
                assert!(
                    (got - want).abs() <= tol,
                    "{:?} {isa:?} nb={nb}: {got} vs {want} (tol {tol})",
                    t.ty
                );
            }
        }
    }
}

/// Same input, same bytes; and blocks are independent (quantizing a row in
/// pieces gives the bytes of quantizing it whole).
pub fn check_deterministic(t: &TypeTraits) {
    let x = weights(&mut rng(3), 13 * QK8_0);
    let q = quantize(t, &x);
    assert_eq!(q, quantize(t, &x));
    let mut pieces = quantize(t, &x[..5 * QK8_0]);
    pieces.extend(quantize(t, &x[5 * QK8_0..]));
    assert_eq!(q, pieces);
}

/// Activations holding -128 (never produced by the quantizer, but legal
/// bytes): with unit scales every kernel must still match the reference
/// exactly, except the AVX2 sign trick of signed types (`avx2_sign_trick`),
/// whose -(-128) wraps.
pub fn check_full_range_activations(t: &TypeTraits, has_min: bool, avx2_sign_trick: bool) {
    let mut r = rng(13);
    for nb in BLOCK_COUNTS {
        let w = random_weights(t, &mut r, nb, has_min, true);
        let mut a = random_act(&mut r, nb, true);
        for b in a.chunks_exact_mut(2 + QK8_0) {
            b[2..].iter_mut().step_by(3).for_each(|q| *q = 0x80);
        }
        let want = (t.vec_dot_ref)(&w, &a);
        for isa in Isa::supported() {
            if avx2_sign_trick && isa == Isa::Avx2 {
                continue;
            }
            assert_eq!(
                vec_dot(isa, t.ty)(&w, &a),
                want,
                "{:?} {isa:?} nb={nb}",
                t.ty
            );
        }
    }
}

/// The multi-activation dot ([`TypeTraits::multi`]) for every kernel set:
/// each output is bit-identical to the same kernel run on that row and
/// activation alone, and within f32 rounding of the reference `vec_dot`
/// on the Q8_0 activation; odd block counts, odd row and activation
/// counts, and strides that are not whole cache lines.
pub fn check_multi_dot(t: &TypeTraits, has_min: bool) {
    let multi = t.multi.expect("the type has a multi-activation dot");
    let mut r = rng(13);
    for nb in [1, 2, 3, 5, 18, 19] {
        let cols = nb * QK8_0;
        for (rows, n) in [(1, 1), (3, 2), (2, 5), (4, 11), (1, 16)] {
            let w = quantize(t, &weights(&mut r, rows * cols));
            let xs: Vec<Vec<f32>> = (0..n).map(|_| weights(&mut r, cols)).collect();
            let bytes = (multi.prepared_bytes)(cols);
            let stride = bytes + 4 * (n % 3); // 4-aligned, not always 64
            let mut buf = vec![0u32; (n * stride).div_ceil(4)];
            let acts: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
            for (c, x) in xs.iter().enumerate() {
                (multi.prepare)(x, &mut acts[c * stride..c * stride + bytes]);
            }
            let acts: &[u8] = acts;
            let q8: Vec<Vec<u8>> = xs
                .iter()
                .map(|x| {
                    let mut q = vec![BlockQ8_0::zeroed(); nb];
                    super::quantize_row_activation(x, &mut q);
                    bytemuck::cast_slice(&q).to_vec()
                })
                .collect();
            let rb = t.row_bytes(cols);
            for isa in Isa::supported() {
                let dot = crate::table(isa).unwrap().multi_dot(t.ty).unwrap();
                let mut out = vec![f32::NAN; rows * n];
                dot(&w, rb, acts, stride, n, &mut out);
                for (ri, row) in w.chunks_exact(rb).enumerate() {
                    for c in 0..n {
                        let got = out[ri * n + c];
                        let mut alone = [f32::NAN];
                        dot(row, rb, &acts[c * stride..], stride, 1, &mut alone);
                        assert_eq!(
                            got.to_bits(),
                            alone[0].to_bits(),
                            "{:?} {isa:?} nb {nb} rows {rows} n {n}: row {ri} act {c}",
                            t.ty
                        );
                        let want = (t.vec_dot_ref)(row, &q8[c]);
                        let tol = 1e-5 * magnitude(t, row, &q8[c], has_min) as f32 + 1e-30;
                        assert!(
                            (got - want).abs() <= tol,
                            "{:?} {isa:?} nb {nb}: {got} vs {want} (tol {tol})",
                            t.ty
                        );
                    }
                }
            }
        }
    }
}
