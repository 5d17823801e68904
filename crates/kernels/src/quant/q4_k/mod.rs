//! Q4_K: 256 weights in 8 sub-blocks of 32, `x = d*sc*q - dmin*m` with
//! 4-bit `q`, 6-bit `sc`/`m` per sub-block and f16 `d`/`dmin` per block.
//! Dotted against Q8_K. The weight type of the common Q4_K_M files, so its
//! dots are the decode hot path.

use super::k_common::{
    get_scale_min_k4, make_qkx2_quants, nearest_int, pack_scale_min_k4, unpack_scales_mins_k4,
    vec_dot_decoded, Decoded, KBlock, K_SCALE_SIZE,
};
use super::q8_k::BlockQ8K;
use crate::traits::TypeTraits;
use bytemuck::{Pod, Zeroable};
use gguf::{GgmlType, QK_K};
use half::f16;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct BlockQ4K {
    /// Scale of the sub-block scales.
    pub d: f16,
    /// Scale of the sub-block mins.
    pub dmin: f16,
    /// 6-bit scales and mins, packed (see [`get_scale_min_k4`]).
    pub scales: [u8; K_SCALE_SIZE],
    /// Byte `32*c + l` holds element `64*c + l` (low nibble) and
    /// `64*c + 32 + l` (high nibble).
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 2 * 2 + K_SCALE_SIZE + QK_K / 2);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q4_K,
    vec_dot_type: GgmlType::Q8_K,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockQ4K, BlockQ8K; vec_dot_ref,
        avx512: x86::vec_dot_avx512,
        avx2: x86::vec_dot_avx2,
        neon: neon::vec_dot_neon,
    ),
    multi: None,
};

/// `quantize_row_q4_K_ref`.
pub fn quantize_row(x: &[f32], y: &mut [BlockQ4K]) {
    assert_eq!(x.len(), y.len() * QK_K);
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    for (x, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..QK_K / 32 {
            let xs = &x[32 * j..32 * j + 32];
            let sum_x2: f32 = xs.iter().fold(0.0, |s, &v| s + v * v);
            let av_x = (sum_x2 / 32.0).sqrt();
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = av_x + v.abs();
            }
            let lj = &mut l[32 * j..32 * j + 32];
            (scales[j], mins[j]) =
                make_qkx2_quants(15, xs, &weights, lj, &mut laux, -1.0, 0.1, 20, false);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let inv_scale = if max_scale > 0.0 {
            63.0 / max_scale
        } else {
            0.0
        };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        // ggml stores nearest_int into a u8 (wrapping) before clamping.
        let ls: [u8; 8] =
            std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
        let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
        yb.scales = pack_scale_min_k4(&ls, &lm);
        yb.d = f16::from_f32(max_scale / 63.0);
        yb.dmin = f16::from_f32(max_min / 63.0);

        // Requantize against the rounded scales actually stored.
        for j in 0..QK_K / 32 {
            let (sc, m) = get_scale_min_k4(j, &yb.scales);
            let d = yb.d.to_f32() * sc as f32;
            if d == 0.0 {
                continue;
            }
            let dm = yb.dmin.to_f32() * m as f32;
            for ii in 0..32 {
                l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, 15) as u8;
            }
        }
        for (c, q) in yb.qs.chunks_exact_mut(32).enumerate() {
            for (i, b) in q.iter_mut().enumerate() {
                *b = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
    }
}

/// `dequantize_row_q4_K`.
pub fn dequantize_row(x: &[BlockQ4K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let min = b.dmin.to_f32();
        for (c, (q, y)) in
            b.qs.chunks_exact(32)
                .zip(y.chunks_exact_mut(64))
                .enumerate()
        {
            let (sc1, m1) = get_scale_min_k4(2 * c, &b.scales);
            let (sc2, m2) = get_scale_min_k4(2 * c + 1, &b.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            for (i, &q) in q.iter().enumerate() {
                y[i] = d1 * (q & 0xF) as f32 - m1;
                y[32 + i] = d2 * (q >> 4) as f32 - m2;
            }
        }
    }
}

impl KBlock for BlockQ4K {
    fn decode(&self) -> Decoded {
        let sm = unpack_scales_mins_k4(&self.scales);
        let mut q = [0i8; QK_K];
        for (c, qs) in self.qs.chunks_exact(32).enumerate() {
            for (i, &b) in qs.iter().enumerate() {
                q[64 * c + i] = (b & 0xF) as i8;
                q[64 * c + 32 + i] = (b >> 4) as i8;
            }
        }
        Decoded {
            d: self.d.to_f32(),
            dmin: self.dmin.to_f32(),
            sub: 32,
            q,
            scales: std::array::from_fn(|j| if j < 8 { sm[j] as i32 } else { 0 }),
            mins: std::array::from_fn(|j| if j < 8 { sm[8 + j] as i32 } else { 0 }),
        }
    }
}

/// Scalar dot with a Q8_K row (ggml's generic `vec_dot_q4_K_q8_K`).
pub fn vec_dot_ref(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    vec_dot_decoded(x, y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::k_common::ktest::{self, Spec};

    // Bounds (see ktest::Spec): `rmse_rel` is the measured worst case on
    // `weights()` (normal-ish with 8x outliers, which widen the sub-block
    // ranges) plus about 25%: each extra bit roughly halves it, Q2..Q6 =
    // 0.37, 0.22, 0.10, 0.05, 0.03. `ggml_rmse` and `dot_err` are
    // test-quantize-fns's bounds for a 4-bit K-quant, on its own data.
    const SPEC: Spec = Spec {
        traits: &TRAITS,
        rmse_rel: 0.125,
        extreme_rel: 0.001,
        ggml_rmse: 0.002,
        dot_err: 0.02,
    };

    #[test]
    fn bytes_match_ggml() {
        ktest::golden_bytes::<BlockQ4K>(&SPEC, 0x3366_ae6d_33c3_d88c);
    }

    #[test]
    fn ggml_test_data() {
        ktest::ggml_test_data::<BlockQ4K>(&SPEC);
    }

    fn fix(b: &mut BlockQ4K, d: f32, dmin: f32) {
        b.d = f16::from_f32(d);
        b.dmin = f16::from_f32(dmin);
    }

    #[test]
    fn round_trip() {
        ktest::round_trip::<BlockQ4K>(&SPEC);
    }

    #[test]
    fn deterministic_and_decode() {
        ktest::deterministic_and_decode::<BlockQ4K>(&SPEC, fix);
    }

    #[test]
    fn ref_dot() {
        ktest::ref_dot::<BlockQ4K>(&SPEC);
    }

    #[test]
    fn kernels_match_ref() {
        ktest::kernels_match_ref::<BlockQ4K>(&SPEC, fix);
    }
}
