//! Q3_K: 256 weights in 16 sub-blocks of 16, `x = d*sc*q` with 3-bit `q`
//! in -4..3, a 6-bit `sc` (stored +32) per sub-block and an f16 `d` per
//! block. Dotted against Q8_K.

use super::k_common::{make_q3_quants, nearest_int, vec_dot_decoded, Decoded, KBlock};
use super::q2_k::pack_2bit;
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
pub struct BlockQ3K {
    /// Bit `k` of byte `l` is set when element `32k + l` is >= 0 (its
    /// 2-bit part is then not offset by -4).
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits, in Q2_K's order: byte `32h + l` holds element
    /// `128h + 32s + l` at bits `2s`.
    pub qs: [u8; QK_K / 4],
    /// 16 6-bit scales (+32): low nibbles in bytes 0..8 (sub-blocks 0..8
    /// low half, 8..16 high half), top 2 bits of sub-block j in byte
    /// `8 + j%4` at bits `2*(j/4)`.
    pub scales: [u8; 12],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 2 + QK_K / 4 + QK_K / 8 + 12);

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q3_K,
    vec_dot_type: GgmlType::Q8_K,
    to_float: |src, dst| dequantize_row(bytemuck::cast_slice(src), dst),
    from_float: |src, dst| quantize_row(src, bytemuck::cast_slice_mut(dst)),
    vec_dot_ref: |w, a| vec_dot_ref(bytemuck::cast_slice(w), bytemuck::cast_slice(a)),
    dots: crate::quant::vec_dots!(BlockQ3K, BlockQ8K; vec_dot_ref,
        avx512: x86::vec_dot_avx512,
        avx2: x86::vec_dot_avx2,
        neon: neon::vec_dot_neon,
    ),
    multi: None,
};

/// The 16 signed scales (stored value - 32), worked out on 32-bit words.
#[inline]
pub(crate) fn unpack_scales(s: &[u8; 12]) -> [i8; 16] {
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, hi) = (w(0), w(1), w(2));
    let words = [
        (a0 & LOW4) | ((hi & LOW2) << 4),
        (a1 & LOW4) | (((hi >> 2) & LOW2) << 4),
        ((a0 >> 4) & LOW4) | (((hi >> 4) & LOW2) << 4),
        ((a1 >> 4) & LOW4) | (((hi >> 6) & LOW2) << 4),
    ];
    let mut out = [0i8; 16];
    for (o, b) in out.chunks_exact_mut(4).zip(words) {
        for (o, v) in o.iter_mut().zip(b.to_le_bytes()) {
            *o = v as i8 - 32;
        }
    }
    out
}

/// `quantize_row_q3_K_ref`.
pub fn quantize_row(x: &[f32], y: &mut [BlockQ3K]) {
    assert_eq!(x.len(), y.len() * QK_K);
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (x, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for ((s, x), l) in scales
            .iter_mut()
            .zip(x.chunks_exact(16))
            .zip(l.chunks_exact_mut(16))
        {
            *s = make_q3_quants(4, x, l, true);
            if s.abs() > amax {
                amax = s.abs();
                max_scale = *s;
            }
        }
        yb.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                // ggml stores nearest_int into an int8 (wrapping) first.
                let v = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    yb.scales[j] = v & 0xF;
                } else {
                    yb.scales[j - 8] |= (v & 0xF) << 4;
                }
                yb.scales[j % 4 + 8] |= (v >> 4) << (2 * (j / 4));
            }
            yb.d = f16::from_f32(1.0 / iscale);
        } else {
            yb.d = f16::ZERO;
        }
        // Requantize against the rounded scales actually stored.
        let sc = unpack_scales(&yb.scales);
        for j in 0..QK_K / 16 {
            let d = yb.d.to_f32() * sc[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        yb.hmask = [0; QK_K / 8];
        let mut low = [0u8; QK_K];
        for (j, (&v, lo)) in l.iter().zip(low.iter_mut()).enumerate() {
            let mut v = v;
            if v > 3 {
                yb.hmask[j % 32] |= 1 << (j / 32);
                v -= 4;
            }
            *lo = v as u8;
        }
        pack_2bit(&low, &mut yb.qs);
    }
}

/// `dequantize_row_q3_K`.
pub fn dequantize_row(x: &[BlockQ3K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d_all = b.d.to_f32();
        let sc = unpack_scales(&b.scales);
        // Sub-block j = 8h + 2s + k covers elements 16j.. = 128h + 32s + 16k..
        for (j, y) in y.chunks_exact_mut(16).enumerate() {
            let (h, s, k) = (j / 8, (j / 2) % 4, j % 2);
            let dl = d_all * sc[j] as f32;
            for (i, o) in y.iter_mut().enumerate() {
                let l = 16 * k + i;
                let lo = ((b.qs[32 * h + l] >> (2 * s)) & 3) as i8;
                let neg = if b.hmask[l] & (1 << (4 * h + s)) != 0 {
                    0
                } else {
                    4
                };
                *o = dl * (lo - neg) as f32;
            }
        }
    }
}

impl KBlock for BlockQ3K {
    fn decode(&self) -> Decoded {
        let mut q = [0i8; QK_K];
        for (e, v) in q.iter_mut().enumerate() {
            let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
            let lo = ((self.qs[32 * h + l] >> (2 * s)) & 3) as i8;
            *v = lo
                - if self.hmask[l] & (1 << (e / 32)) != 0 {
                    0
                } else {
                    4
                };
        }
        Decoded {
            d: self.d.to_f32(),
            dmin: 0.0,
            sub: 16,
            q,
            scales: unpack_scales(&self.scales).map(|s| s as i32),
            mins: [0; 16],
        }
    }
}

/// Scalar dot with a Q8_K row (ggml's generic `vec_dot_q3_K_q8_K`).
pub fn vec_dot_ref(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
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
    // test-quantize-fns's bounds for a 3-bit K-quant, on its own data.
    const SPEC: Spec = Spec {
        traits: &TRAITS,
        rmse_rel: 0.27,
        // ±A alternating rows sit badly on the asymmetric -4..3 grid: the
        // best fit still misses by about A/7 (ggml does the same).
        extreme_rel: 0.15,
        ggml_rmse: 0.004,
        dot_err: 0.02,
    };

    #[test]
    fn bytes_match_ggml() {
        ktest::golden_bytes::<BlockQ3K>(&SPEC, 0xffc3_ec94_4cd6_ae9d);
    }

    #[test]
    fn ggml_test_data() {
        ktest::ggml_test_data::<BlockQ3K>(&SPEC);
    }

    fn fix(b: &mut BlockQ3K, d: f32, _dmin: f32) {
        b.d = f16::from_f32(d);
    }

    #[test]
    fn unpack_scales_matches_the_bit_layout() {
        let mut r = crate::quant::testing::rng(21);
        for _ in 0..1000 {
            let s: [u8; 12] = std::array::from_fn(|_| rand::Rng::gen(&mut r));
            let u = unpack_scales(&s);
            for (j, &v) in u.iter().enumerate() {
                let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
                let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
                assert_eq!(v as i32, (low | (high << 4)) as i32 - 32, "j={j}");
            }
        }
    }

    #[test]
    fn round_trip() {
        ktest::round_trip::<BlockQ3K>(&SPEC);
    }

    #[test]
    fn deterministic_and_decode() {
        ktest::deterministic_and_decode::<BlockQ3K>(&SPEC, fix);
    }

    #[test]
    fn ref_dot() {
        ktest::ref_dot::<BlockQ3K>(&SPEC);
    }

    #[test]
    fn kernels_match_ref() {
        ktest::kernels_match_ref::<BlockQ3K>(&SPEC, fix);
    }
}
