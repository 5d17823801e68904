//! IQ4_NL: 32 weights as 4-bit indices into a fixed non-linear table of 16
//! int8 values ([`KVALUES`]), times one f16 scale. Nibble order as in Q4_0.
//! Dots against Q8_0 activations.
//!
//! ggml has two quantizers for it. [`quantize_row`] (our `from_float`) is
//! `quantize_iq4_nl`, which `ggml_quantize_chunk` and so llama-quantize use
//! for model files: 15 candidate scales, then a re-rounding with the best;
//! [`quantize_row_weighted`] is the same with importance weights.
//! [`quantize_row_ref`] is `quantize_row_iq4_nl_ref`, which despite its name
//! skips the search (one least-squares refit of the scale).

use crate::quant::q8_0::BlockQ8_0;
use crate::traits::TypeTraits;
use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use half::f16;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

pub const QK4_NL: usize = 32;

/// ggml's `kvalues_iq4nl`: the 16 values an index stands for.
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// ggml's `GROUP_MAX_EPS`: blocks whose largest magnitude is below this are
/// stored as zero.
const GROUP_MAX_EPS: f32 = 1e-15;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct BlockIq4Nl {
    pub d: f16,
    pub qs: [u8; QK4_NL / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 2 + QK4_NL / 2);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::IQ4_NL,
    vec_dot_type: GgmlType::Q8_0,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockIq4Nl, BlockQ8_0; vec_dot_ref,
        avx512: x86::vec_dot_avx512,
        avx2: x86::vec_dot_avx2,
        neon: neon::vec_dot,
    ),
    multi: None,
};

/// ggml's `best_index_int8`: index of the table value nearest `x` (ties to
/// the upper one), by binary search over the sorted table.
pub fn best_index(values: &[i8; 16], x: f32) -> usize {
    let v = |i: usize| values[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0, 15);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        mu - 1
    } else {
        mu
    }
}

/// Σ w·q·x and Σ w·q² for the indices `x·id` rounds to (ggml's float order).
fn fit(
    xb: &[f32],
    weight: &[f32; QK4_NL],
    id: f32,
    mut indices: Option<&mut [u8; QK4_NL]>,
) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (j, (&x, &w)) in xb.iter().zip(weight).enumerate() {
        let l = best_index(&KVALUES, id * x);
        if let Some(ind) = indices.as_deref_mut() {
            ind[j] = l as u8;
        }
        let q = KVALUES[l] as f32;
        sumqx += w * q * x;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// ggml's `quantize_row_iq4_nl_impl` for one block (super-block = block =
/// 32): returns the scale and the 32 indices. `ntry > 0` searches scales
/// (-max/127 as start, 2·ntry+1 candidates) and re-rounds with the winner;
/// `ntry <= 0` starts from max/-127 and only refits the scale.
pub fn quantize_block(xb: &[f32], quant_weights: Option<&[f32]>, ntry: i32) -> (f32, [u8; QK4_NL]) {
    assert_eq!(xb.len(), QK4_NL);
    let mut weight = [0.0f32; QK4_NL];
    match quant_weights {
        Some(qw) => {
            assert_eq!(qw.len(), QK4_NL);
            let mut sigma2 = 0.0f32;
            for &x in xb {
                sigma2 += x * x;
            }
            sigma2 *= 2.0 / QK4_NL as f32;
            for ((w, &q), &x) in weight.iter_mut().zip(qw).zip(xb) {
                *w = q * (sigma2 + x * x).sqrt();
            }
        }
        None => {
            for (w, &x) in weight.iter_mut().zip(xb) {
                *w = x * x;
            }
        }
    }
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &x in xb {
        if x.abs() > amax {
            amax = x.abs();
            max = x;
        }
    }
    // Zero block: the searching path stores the index of the value nearest
    // zero; ggml's `_ref` path leaves the indices untouched (stale or
    // uninitialised memory). With d = 0 they do not matter; we store the
    // former in both.
    let zero_block = (0.0, [best_index(&KVALUES, 0.0) as u8; QK4_NL]);
    if amax < GROUP_MAX_EPS {
        return zero_block;
    }
    let v0 = KVALUES[0] as f32;
    let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
    let mut indices = [0u8; QK4_NL];
    let (sumqx, sumq2) = fit(xb, &weight, 1.0 / d, Some(&mut indices));
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        let id = (itry + KVALUES[0] as i32) as f32 / max;
        let (sumqx, sumq2) = fit(xb, &weight, id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    if ntry > 0 {
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (l, &x) in indices.iter_mut().zip(xb) {
            *l = best_index(&KVALUES, id * x) as u8;
        }
    }
    (d, indices)
}

fn pack(d: f32, l: &[u8; QK4_NL], y: &mut BlockIq4Nl) {
    y.d = f16::from_f32(d);
    for (j, q) in y.qs.iter_mut().enumerate() {
        *q = l[j] | l[j + 16] << 4;
    }
}

/// `quantize_iq4_nl` for one row without importance weights: what
/// `ggml_quantize_chunk` stores in model files.
pub fn quantize_row(x: &[f32], y: &mut [BlockIq4Nl]) {
    quantize_row_weighted(x, y, None);
}

/// `quantize_iq4_nl` for one row, with optional importance weights (one
/// per element of the row).
pub fn quantize_row_weighted(x: &[f32], y: &mut [BlockIq4Nl], quant_weights: Option<&[f32]>) {
    assert_eq!(x.len(), y.len() * QK4_NL);
    if let Some(qw) = quant_weights {
        assert_eq!(qw.len(), x.len());
    }
    for (i, (xb, yb)) in x.chunks_exact(QK4_NL).zip(y.iter_mut()).enumerate() {
        let qw = quant_weights.map(|qw| &qw[i * QK4_NL..(i + 1) * QK4_NL]);
        let (d, l) = quantize_block(xb, qw, 7);
        pack(d, &l, yb);
    }
}

/// `quantize_row_iq4_nl_ref` (no scale search).
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockIq4Nl]) {
    assert_eq!(x.len(), y.len() * QK4_NL);
    for (xb, yb) in x.chunks_exact(QK4_NL).zip(y.iter_mut()) {
        let (d, l) = quantize_block(xb, None, -1);
        pack(d, &l, yb);
    }
}

pub fn dequantize_row(x: &[BlockIq4Nl], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK4_NL);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_NL)) {
        let d = xb.d.to_f32();
        let (lo, hi) = yb.split_at_mut(QK4_NL / 2);
        for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&xb.qs) {
            *l = d * KVALUES[(q & 0x0f) as usize] as f32;
            *h = d * KVALUES[(q >> 4) as usize] as f32;
        }
    }
}

/// Integer dot of one block with one Q8_0 block's quants.
#[inline]
pub fn block_dot(x: &BlockIq4Nl, y: &[i8; 32]) -> i32 {
    let (lo, hi) = y.split_at(QK4_NL / 2);
    let mut s = 0;
    for ((&q, &a), &b) in x.qs.iter().zip(lo).zip(hi) {
        s += KVALUES[(q & 0x0f) as usize] as i32 * a as i32
            + KVALUES[(q >> 4) as usize] as i32 * b as i32;
    }
    s
}

/// ggml's `ggml_vec_dot_iq4_nl_q8_0_generic`.
pub fn vec_dot_ref(x: &[BlockIq4Nl], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        sum += b.d.to_f32() * a.d.to_f32() * block_dot(a, &b.qs) as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8_0::legacy_tests::*;
    use crate::quant::testing::*;

    /// The table's widest gap is 24 (89..113), so a value inside the scaled
    /// table is at most 12·|d| away; the refit scale can leave the block's
    /// extremes outside it, by at most the distance to the nearest end.
    /// Bound both by a 20% of the block maximum (~2.4 gaps), plus the f16
    /// rounding of d times the largest table value.
    fn max_err(xb: &[f32]) -> f32 {
        let a = amax(xb);
        0.2 * a + 127.0 * f16_err(a / 100.0)
    }

    #[test]
    fn best_index_is_nearest() {
        for i in -1300..=1300 {
            let x = i as f32 * 0.1;
            let got = best_index(&KVALUES, x);
            let err = |k: usize| (KVALUES[k] as f32 - x).abs();
            let best = (0..16).map(err).fold(f32::MAX, f32::min);
            assert_eq!(err(got), best, "x={x}");
        }
        // Ties go up: halfway between -10 and 1.
        assert_eq!(best_index(&KVALUES, -4.5), 8);
        assert_eq!(best_index(&KVALUES, 0.0), 8);
    }

    #[test]
    fn round_trip_bounded() {
        check_round_trip(&TRAITS, max_err);
    }

    #[test]
    fn search_not_worse_than_ref_path() {
        // The searching quantizer minimises Σ x²·err²; on random weights
        // it beats (or ties) ggml's non-searching `_ref` path.
        let x = weights(&mut rng(9), 24 * QK4_NL);
        let (mut a, mut b) = (
            vec![BlockIq4Nl::zeroed(); 24],
            vec![BlockIq4Nl::zeroed(); 24],
        );
        quantize_row_ref(&x, &mut a);
        quantize_row(&x, &mut b);
        let (mut ya, mut yb) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        dequantize_row(&a, &mut ya);
        dequantize_row(&b, &mut yb);
        let werr = |y: &[f32]| -> f64 {
            x.iter()
                .zip(y)
                .map(|(&v, &o)| (v as f64).powi(2) * ((v - o) as f64).powi(2))
                .sum()
        };
        assert!(
            werr(&yb) <= werr(&ya) * 1.01,
            "{} vs {}",
            werr(&yb),
            werr(&ya)
        );
        // Importance weights change the result, and uniform ones give finite output.
        let mut c = vec![BlockIq4Nl::zeroed(); 24];
        quantize_row_weighted(&x, &mut c, Some(&vec![1.0; x.len()]));
        let mut yc = vec![0.0; x.len()];
        dequantize_row(&c, &mut yc);
        assert!(yc.iter().all(|v| v.is_finite()));
        assert!(rmse(&x, &yc) < 0.1);
    }

    #[test]
    fn known_block() {
        // Values on the table: max -127 -> start scale 1, refit keeps 1.
        let mut x = [0.0f32; 32];
        for (j, v) in x.iter_mut().enumerate() {
            *v = KVALUES[j % 16] as f32;
        }
        for quantize in [quantize_row, quantize_row_ref] {
            let mut q = [BlockIq4Nl::zeroed()];
            quantize(&x, &mut q);
            assert_eq!(q[0].d, f16::ONE);
            for j in 0..16 {
                assert_eq!(q[0].qs[j], (j as u8) | (j as u8) << 4);
            }
            let mut y = [0.0f32; 32];
            dequantize_row(&q, &mut y);
            assert_eq!(y, x);
            // Zero block: scale 0, every index at the value nearest zero.
            quantize(&[0.0; 32], &mut q);
            assert_eq!(q[0].d, f16::ZERO);
            assert_eq!(q[0].qs, [0x88; 16]);
        }
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
        check_full_range_activations(&TRAITS, false, true);
    }

    #[test]
    fn deterministic() {
        check_deterministic(&TRAITS);
    }
}
