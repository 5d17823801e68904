//! Tests for TQ1_0, and the checks both ternary types share (they go through
//! the byte-level traits, so TQ2_0 runs the same ones).

use super::*;
use crate::isa::Isa;
use crate::quant::q8_k;
use crate::quant::testing::*;
use rand::Rng;

pub(crate) fn quantize(t: &TypeTraits, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; t.row_bytes(x.len())];
    (t.from_float)(x, &mut q);
    q
}

pub(crate) fn dequantize(t: &TypeTraits, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0.0; n];
    (t.to_float)(q, &mut y);
    y
}

pub(crate) fn q8k(x: &[f32]) -> Vec<u8> {
    let mut q = vec![BlockQ8K::zeroed(); x.len() / QK_K];
    q8_k::quantize_row(x, &mut q);
    bytemuck::cast_slice(&q).to_vec()
}

/// ggml's test-quantize-fns data: `0.1 + a*cos(i + offset)`.
fn cos_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
        .collect()
}

/// Every dequantized value is the nearest of {-d, 0, d} to `x / amax`
/// scaled by the stored f16 `d`, bit for bit.
pub(crate) fn check_round_trip(t: &TypeTraits) {
    let mut r = rng(31);
    let mut rows: Vec<Vec<f32>> = BLOCK_COUNTS
        .iter()
        .map(|&nb| weights(&mut r, nb * QK_K))
        .collect();
    rows.extend(extreme_rows(QK_K));
    // A scale so small its inverse overflows: every trit is 0, as in ggml.
    rows.push((0..QK_K).map(|i| (i % 3) as f32 * 1e-40).collect());
    for x in rows {
        let y = dequantize(t, &quantize(t, &x), x.len());
        for (xb, yb) in x.chunks(QK_K).zip(y.chunks(QK_K)) {
            let (d, id) = ternary_scale(xb);
            let d = f16::from_f32(d).to_f32();
            for (&a, &b) in xb.iter().zip(yb) {
                assert!(b.is_finite());
                assert_eq!(
                    b.to_bits(),
                    (((a * id).round() as i32) as f32 * d).to_bits(),
                    "{:?}: {a} -> {b}",
                    t.ty
                );
            }
        }
    }
}

/// Ternary data on an f16-exact scale comes back unchanged.
pub(crate) fn check_exact_ternary(t: &TypeTraits) {
    let mut r = rng(32);
    for nb in BLOCK_COUNTS {
        let mut x: Vec<f32> = (0..nb * QK_K)
            .map(|_| 0.375 * (r.gen_range(0..3) - 1) as f32)
            .collect();
        for b in x.chunks_mut(QK_K) {
            b[r.gen_range(0..QK_K)] = -0.375; // the scale is always reached
        }
        assert_eq!(dequantize(t, &quantize(t, &x), x.len()), x, "{:?}", t.ty);
    }
}

/// The bounds of ggml's test-quantize-fns for ternary types on its cosine
/// data: total error (its `sqrt(sum d^2) / n`) < 0.01, dot error < 0.15.
pub(crate) fn check_ggml_bounds(t: &TypeTraits) {
    let n = 4096;
    let (a, b) = (cos_data(0.0, n), cos_data(1.0, n));
    let qa = quantize(t, &a);
    let y = dequantize(t, &qa, n);
    let sq: f64 = a
        .iter()
        .zip(&y)
        .map(|(p, q)| ((p - q) as f64).powi(2))
        .sum();
    assert!((sq.sqrt() as f32) / (n as f32) < 0.01, "{:?}", t.ty);
    let exact: f64 = a.iter().zip(&b).map(|(p, q)| (p * q) as f64).sum();
    for isa in Isa::supported() {
        let got = vec_dot(isa, t.ty)(&qa, &q8k(&b));
        assert!(dot_err(got, exact as f32, n) < 0.15, "{:?} {isa:?}", t.ty);
    }
}

/// The reference dot equals the float dot of the dequantized operands up to
/// float rounding.
pub(crate) fn check_ref_dot(t: &TypeTraits) {
    let mut r = rng(33);
    for nb in BLOCK_COUNTS {
        let n = nb * QK_K;
        let (qx, qy) = (quantize(t, &weights(&mut r, n)), q8k(&weights(&mut r, n)));
        let (fx, fy) = (dequantize(t, &qx, n), dequantize(&q8_k::TRAITS, &qy, n));
        let want: f64 = fx.iter().zip(&fy).map(|(a, b)| *a as f64 * *b as f64).sum();
        let scale: f64 = fx
            .iter()
            .zip(&fy)
            .map(|(a, b)| (*a as f64 * *b as f64).abs())
            .sum();
        let got = (t.vec_dot_ref)(&qx, &qy) as f64;
        assert!(
            (got - want).abs() <= 1e-6 * scale,
            "{:?} nb={nb}: {got} vs {want}",
            t.ty
        );
    }
}

/// Every SIMD kernel equals the reference bit for bit (the integer sums are
/// exact and the float scaling is done in the same order), on quantized
/// rows, extreme rows, and arbitrary block bytes.
pub(crate) fn check_kernels(t: &TypeTraits) {
    let mut r = rng(34);
    let bs = t.type_size();
    for isa in Isa::supported() {
        let dot = vec_dot(isa, t.ty);
        for nb in BLOCK_COUNTS {
            let n = nb * QK_K;
            let mut cases = vec![
                (quantize(t, &weights(&mut r, n)), q8k(&weights(&mut r, n))),
                (quantize(t, &weights(&mut r, n)), q8k(&vec![1.0; n])),
            ];
            // Random bytes everywhere but the scale, which is kept finite.
            let mut raw: Vec<u8> = (0..nb * bs).map(|_| r.gen()).collect();
            for b in raw.chunks_mut(bs) {
                let d = f16::from_f32(r.gen_range(-2.0f32..2.0)).to_le_bytes();
                b[bs - 2..].copy_from_slice(&d);
            }
            cases.push((raw, q8k(&weights(&mut r, n))));
            for x in extreme_rows(QK_K) {
                let x: Vec<f32> = x.iter().cycle().take(n).copied().collect();
                cases.push((quantize(t, &x), q8k(&weights(&mut r, n))));
                cases.push((quantize(t, &weights(&mut r, n)), q8k(&x)));
            }
            for (i, (w, a)) in cases.iter().enumerate() {
                let want = (t.vec_dot_ref)(w, a);
                assert_eq!(
                    dot(w, a).to_bits(),
                    want.to_bits(),
                    "{:?} {isa:?} nb={nb} case {i}",
                    t.ty
                );
            }
        }
    }
}

/// Every set's kernel gives the reference's value exactly on a quantized
/// row (the sets this CPU lacks have no table: `crate::dispatch`'s tests).
pub(crate) fn check_dispatch(t: &TypeTraits) {
    let mut r = rng(35);
    let (w, a) = (
        quantize(t, &weights(&mut r, QK_K)),
        q8k(&weights(&mut r, QK_K)),
    );
    for isa in Isa::supported() {
        let got = vec_dot(isa, t.ty)(&w, &a);
        assert_eq!(got, (t.vec_dot_ref)(&w, &a), "{:?} {isa:?}", t.ty);
    }
}

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
fn pack_unpack_every_trit_combination() {
    for n in 0..243u16 {
        let digits = [n / 81, n / 27 % 3, n / 9 % 3, n / 3 % 3, n % 3].map(|d| d as u8);
        let q = pack(digits.into_iter());
        for (k, &d) in digits.iter().enumerate() {
            assert_eq!(unpack(q, k), d, "n={n} k={k}");
        }
    }
}

#[test]
fn known_block() {
    // All zeros: every trit is 1 ("0"); 11111 in base 3 is 121, stored as
    // ceil(121 * 256 / 243) = 128, and 1111(0) = 120 as ceil(120 * 256 / 243) = 127.
    let mut q = [BlockTQ1_0::zeroed()];
    quantize_row(&[0.0; QK_K], &mut q);
    assert_eq!(q[0].qs, [128; 48]);
    assert_eq!(q[0].qh, [127; 4]);
    assert_eq!(q[0].d.to_f32(), 0.0);

    // Value 0 = -1, value 32 (trit 1 of qs[0]) = +1, value 255 (last trit
    // of qh[3]) = +1, the rest 0: qs[0] = 0,2,1,1,1 = 67 -> ceil(67*256/243)
    // = 71; qh[3] = 1,1,1,2,(0) = 123 -> 130.
    let mut x = [0.0f32; QK_K];
    x[0] = -2.0;
    x[32] = 2.0;
    x[255] = 2.0;
    quantize_row(&x, &mut q);
    assert_eq!(q[0].qs[0], 71);
    assert_eq!(q[0].qs[1..], [128; 47]);
    assert_eq!(q[0].qh, [127, 127, 127, 130]);
    assert_eq!(q[0].d.to_f32(), 2.0);
    let mut y = [0.0f32; QK_K];
    dequantize_row(&q, &mut y);
    assert_eq!(y, x);
}

#[test]
fn quantizer_is_deterministic() {
    let x = weights(&mut rng(36), 5 * QK_K);
    assert_eq!(quantize(&TRAITS, &x), quantize(&TRAITS, &x));
}
