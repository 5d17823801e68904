//! Q6_K: 256 weights in 16 sub-blocks of 16, `x = d*sc*(q - 32)` with
//! 6-bit `q`, an int8 `sc` per sub-block and an f16 `d` per block. Dotted
//! against Q8_K. Q4_K_M files keep some tensors (output, parts of the FFN)
//! in Q6_K, so its dot is on the decode path too.

use super::k_common::{
    make_qx_quants, nearest_int, vec_dot_decoded, Decoded, KBlock, GROUP_MAX_EPS,
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

/// Within each half of 128 elements (`ql` bytes 64h.., `qh` bytes 32h..),
/// element `32*s + l` (s in 0..4, l in 0..32) has its low 4 bits in
/// `ql[l + 32*(s&1)]` (low nibble for s < 2, high for s >= 2) and its top 2
/// bits in `qh[l]` bits `2s..2s+2`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 2 + QK_K / 16 + 3 * QK_K / 4);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q6_K,
    vec_dot_type: GgmlType::Q8_K,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockQ6K, BlockQ8K; vec_dot_ref,
        avx512: x86::vec_dot_avx512,
        avx2: x86::vec_dot_avx2,
        neon: neon::vec_dot_neon,
    ),
    multi: None,
};

/// `quantize_row_q6_K_ref`.
pub fn quantize_row(x: &[f32], y: &mut [BlockQ6K]) {
    assert_eq!(x.len(), y.len() * QK_K);
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (x, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ((s, x), l) in scales
            .iter_mut()
            .zip(x.chunks_exact(16))
            .zip(l.chunks_exact_mut(16))
        {
            let scale = make_qx_quants(32, x, l, 1, None);
            *s = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *yb = BlockQ6K::zeroed();
            continue;
        }
        let iscale = -128.0 / max_scale;
        yb.d = f16::from_f32(1.0 / iscale);
        for (s, &v) in yb.scales.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * v).min(127) as i8;
        }
        // Requantize against the rounded scales actually stored.
        for j in 0..QK_K / 16 {
            let d = yb.d.to_f32() * yb.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for h in 0..2 {
            let (ql, qh, l) = (
                &mut yb.ql[64 * h..64 * h + 64],
                &mut yb.qh[32 * h..32 * h + 32],
                &l[128 * h..],
            );
            for i in 0..32 {
                let q = [
                    l[i] as u8,
                    l[i + 32] as u8,
                    l[i + 64] as u8,
                    l[i + 96] as u8,
                ];
                ql[i] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
                ql[i + 32] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
                qh[i] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
            }
        }
    }
}

/// `dequantize_row_q6_K`.
pub fn dequantize_row(x: &[BlockQ6K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        for h in 0..2 {
            let (ql, qh, sc) = (&b.ql[64 * h..], &b.qh[32 * h..], &b.scales[8 * h..]);
            let y = &mut y[128 * h..128 * h + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                y[l] = d * sc[is] as f32 * q1 as f32;
                y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
                y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
                y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
            }
        }
    }
}

impl KBlock for BlockQ6K {
    fn decode(&self) -> Decoded {
        let mut q = [0i8; QK_K];
        for h in 0..2 {
            let (ql, qh) = (&self.ql[64 * h..], &self.qh[32 * h..]);
            for l in 0..32 {
                let e = 128 * h + l;
                q[e] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                q[e + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                q[e + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                q[e + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        Decoded {
            d: self.d.to_f32(),
            dmin: 0.0,
            sub: 16,
            q,
            scales: self.scales.map(|s| s as i32),
            mins: [0; 16],
        }
    }
}

/// Scalar dot with a Q8_K row (ggml's generic `vec_dot_q6_K_q8_K`).
pub fn vec_dot_ref(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
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
    // test-quantize-fns's bounds for a 6-bit K-quant, on its own data.
    const SPEC: Spec = Spec {
        traits: &TRAITS,
        rmse_rel: 0.04,
        extreme_rel: 0.001,
        ggml_rmse: 0.002,
        dot_err: 0.02,
    };

    #[test]
    fn bytes_match_ggml() {
        ktest::golden_bytes::<BlockQ6K>(&SPEC, 0x523e_7d4d_508e_255a);
    }

    #[test]
    fn ggml_test_data() {
        ktest::ggml_test_data::<BlockQ6K>(&SPEC);
    }

    fn fix(b: &mut BlockQ6K, d: f32, _dmin: f32) {
        b.d = f16::from_f32(d);
    }

    #[test]
    fn round_trip() {
        ktest::round_trip::<BlockQ6K>(&SPEC);
    }

    #[test]
    fn deterministic_and_decode() {
        ktest::deterministic_and_decode::<BlockQ6K>(&SPEC, fix);
    }

    #[test]
    fn ref_dot() {
        ktest::ref_dot::<BlockQ6K>(&SPEC);
    }

    #[test]
    fn kernels_match_ref() {
        ktest::kernels_match_ref::<BlockQ6K>(&SPEC, fix);
    }
}
