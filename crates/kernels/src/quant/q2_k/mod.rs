//! Q2_K: 256 weights in 16 sub-blocks of 16, `x = d*sc*q - dmin*m` with
//! 2-bit `q`, 4-bit `sc`/`m` per sub-block and f16 `d`/`dmin` per block.
//! Dotted against Q8_K.

use super::k_common::{make_qkx2_quants, nearest_int, vec_dot_decoded, Decoded, KBlock};
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
pub struct BlockQ2K {
    /// Per sub-block: scale in the low nibble, min in the high nibble.
    pub scales: [u8; QK_K / 16],
    /// Within each half of 128 elements (bytes 32h..32h+32), element
    /// `32*s + l` is bits `2s..2s+2` of byte `l`.
    pub qs: [u8; QK_K / 4],
    /// Scale of the sub-block scales.
    pub d: f16,
    /// Scale of the sub-block mins.
    pub dmin: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 2 * 2 + QK_K / 16 + QK_K / 4);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q2_K,
    vec_dot_type: GgmlType::Q8_K,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockQ2K, BlockQ8K; vec_dot_ref,
        avx512: x86::vec_dot_avx512,
        avx2: x86::vec_dot_avx2,
        neon: neon::vec_dot_neon,
    ),
    multi: None,
};

/// Pack 256 2-bit values in the K-quant order shared with Q3_K: byte
/// `32h + l` holds elements `128h + l + 32s` at bits `2s`.
pub(crate) fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for h in 0..2 {
        for i in 0..32 {
            let e = 128 * h + i;
            qs[32 * h + i] = l[e] | (l[e + 32] << 2) | (l[e + 64] << 4) | (l[e + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_ref`.
pub fn quantize_row(x: &[f32], y: &mut [BlockQ2K]) {
    assert_eq!(x.len(), y.len() * QK_K);
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    for (x, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..QK_K / 16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let lj = &mut l[16 * j..16 * j + 16];
            (scales[j], mins[j]) =
                make_qkx2_quants(3, xs, &weights, lj, &mut laux, -0.5, 0.1, 15, true);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        // ggml stores nearest_int into the u8 (wrapping) before packing.
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (s, &v) in yb.scales.iter_mut().zip(&scales) {
                *s = nearest_int(iscale * v) as u8;
            }
            yb.d = f16::from_f32(max_scale / Q4SCALE);
        } else {
            yb.scales = [0; QK_K / 16];
            yb.d = f16::ZERO;
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (s, &v) in yb.scales.iter_mut().zip(&mins) {
                *s |= (nearest_int(iscale * v) << 4) as u8;
            }
            yb.dmin = f16::from_f32(max_min / Q4SCALE);
        } else {
            yb.dmin = f16::ZERO;
        }
        // Requantize against the rounded scales actually stored.
        for j in 0..QK_K / 16 {
            let d = yb.d.to_f32() * (yb.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = yb.dmin.to_f32() * (yb.scales[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut yb.qs);
    }
}

/// `dequantize_row_q2_K`.
pub fn dequantize_row(x: &[BlockQ2K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let min = b.dmin.to_f32();
        // Sub-block j = 8h + 2s + k covers elements 16j.. = 128h + 32s + 16k..
        for (j, y) in y.chunks_exact_mut(16).enumerate() {
            let (h, s, k) = (j / 8, (j / 2) % 4, j % 2);
            let sc = b.scales[j];
            let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
            let q = &b.qs[32 * h + 16 * k..32 * h + 16 * k + 16];
            for (o, &q) in y.iter_mut().zip(q) {
                *o = dl * ((q >> (2 * s)) & 3) as f32 - ml;
            }
        }
    }
}

impl KBlock for BlockQ2K {
    fn decode(&self) -> Decoded {
        let mut q = [0i8; QK_K];
        for (e, v) in q.iter_mut().enumerate() {
            let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
            *v = ((self.qs[32 * h + l] >> (2 * s)) & 3) as i8;
        }
        Decoded {
            d: self.d.to_f32(),
            dmin: self.dmin.to_f32(),
            sub: 16,
            q,
            scales: self.scales.map(|s| (s & 0xF) as i32),
            mins: self.scales.map(|s| (s >> 4) as i32),
        }
    }
}

/// Scalar dot with a Q8_K row (ggml's generic `vec_dot_q2_K_q8_K`).
pub fn vec_dot_ref(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
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
    // test-quantize-fns's bounds for a 2-bit K-quant, on its own data.
    const SPEC: Spec = Spec {
        traits: &TRAITS,
        rmse_rel: 0.45,
        extreme_rel: 0.001,
        ggml_rmse: 0.0075,
        dot_err: 0.04,
    };

    #[test]
    fn bytes_match_ggml() {
        ktest::golden_bytes::<BlockQ2K>(&SPEC, 0x4cc5_ed2f_6188_8e09);
    }

    #[test]
    fn ggml_test_data() {
        ktest::ggml_test_data::<BlockQ2K>(&SPEC);
    }

    fn fix(b: &mut BlockQ2K, d: f32, dmin: f32) {
        b.d = f16::from_f32(d);
        b.dmin = f16::from_f32(dmin);
    }

    #[test]
    fn round_trip() {
        ktest::round_trip::<BlockQ2K>(&SPEC);
    }

    #[test]
    fn deterministic_and_decode() {
        ktest::deterministic_and_decode::<BlockQ2K>(&SPEC, fix);
    }

    #[test]
    fn ref_dot() {
        ktest::ref_dot::<BlockQ2K>(&SPEC);
    }

    #[test]
    fn kernels_match_ref() {
        ktest::kernels_match_ref::<BlockQ2K>(&SPEC, fix);
    }
}
