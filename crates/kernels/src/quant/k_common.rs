//! Pieces shared by the K-quant modules (Q2_K..Q6_K): ggml's scale search
//! helpers for the reference quantizers, the 6-bit scale packing of
//! Q4_K/Q5_K, and small SIMD helpers.
//!
//! The search helpers are ports of ggml's `make_qx_quants`,
//! `make_q3_quants` and `make_qkx2_quants`. Every float expression keeps
//! ggml's operation order (C evaluates `w*x*l` as `(w*x)*l`, with the int
//! converted to float at that step) so the chosen scales, and therefore the
//! quantized bytes, are identical to ggml's. Rust never contracts `a*b+c`
//! into an FMA, which matches ggml-base (built for baseline x86-64, so the C
//! compiler cannot contract either).

pub use super::q8_k::nearest_int;
use super::q8_k::BlockQ8K;
use gguf::QK_K;

/// Groups whose largest magnitude is below this are treated as all zero.
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// Bytes of packed 6-bit scales and mins in Q4_K/Q5_K (`K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// ggml's `make_qx_quants`: symmetric quantization of `x` to
/// `[-nmax, nmax-1]`, stored in `l` with offset `nmax`. Returns the scale.
///
/// `rmse_type` 0 just rounds with `-nmax/max`; otherwise the weights are
/// `qw` or (by `|rmse_type|`) 1: x², 2: 1, 3: |x|, 4: sqrt|x|, and 19 scales
/// around the first are tried for the best weighted fit. A negative
/// `rmse_type` returns after the first fit.
pub fn make_qx_quants(
    nmax: i32,
    x: &[f32],
    l: &mut [i8],
    rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
    assert_eq!(l.len(), n);
    let (amax, max) = abs_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let mut iscale = -nmax as f32 / max;
    if rmse_type == 0 {
        for (li, &xi) in l.iter_mut().zip(x) {
            let q = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
            *li = (nmax + q) as i8;
        }
        return 1.0 / iscale;
    }
    let return_early = rmse_type < 0;
    let rmse_type = rmse_type.abs();
    let weight = |i: usize| -> f32 {
        match qw {
            Some(qw) => qw[i],
            None => match rmse_type {
                1 => x[i] * x[i],
                2 => 1.0,
                3 => x[i].abs(),
                _ => x[i].abs().sqrt(),
            },
        }
    };
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (q + nmax) as i8;
        let w = weight(i);
        sumlx += w * x[i] * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &xi) in x.iter().enumerate() {
            let q = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
            let w = weight(i);
            sumlx += w * xi * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &xi) in l.iter_mut().zip(x) {
                *li = (nmax + nearest_int(iscale * xi).clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants`: symmetric quantization to `[-nmax, nmax-1]`
/// (offset by `nmax` in `l`). With `do_rmse`, refines one value at a time
/// (up to 5 passes) to maximise the x²-weighted fit.
pub fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8], do_rmse: bool) -> f32 {
    assert_eq!(l.len(), x.len());
    let (amax, max) = abs_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -nmax as f32 / max;
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for (li, &xi) in l.iter_mut().zip(x) {
            let q = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
            *li = q as i8;
            let w = xi * xi;
            sumlx += w * xi * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for (li, &xi) in l.iter_mut().zip(x) {
                let w = xi * xi;
                let cur = *li as f32;
                let mut slx = sumlx - w * xi * cur;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * cur * cur;
                    let new_l = nearest_int(xi * sl2 / slx).clamp(-nmax, nmax - 1);
                    if new_l != *li as i32 {
                        slx += w * xi * new_l as f32;
                        sl2 += w * new_l as f32 * new_l as f32;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            *li = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for li in l.iter_mut() {
            *li += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for (li, &xi) in l.iter_mut().zip(x) {
        *li = (nearest_int(iscale * xi).clamp(-nmax, nmax - 1) + nmax) as i8;
    }
    1.0 / iscale
}

/// ggml's `make_qkx2_quants`: asymmetric quantization `x ≈ scale*l - min`
/// with `l` in `[0, nmax]`, minimising the `weights`-weighted error (absolute
/// with `use_mad`, squared otherwise) over `nstep+1` candidate scales.
/// Returns `(scale, min)` with `min >= 0` the amount subtracted.
#[allow(clippy::too_many_arguments)]
pub fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    assert!(n > 0 && weights.len() == n && l.len() == n && laux.len() == n);
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        best_error += weights[i] * err(scale * q as f32 + min - x[i]);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let w = weights[i];
            let qf = q as f32;
            sum_l += w * qf;
            sum_l2 += w * qf * qf;
            sum_xl += w * qf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `(max |x|, the x with that magnitude)`; the first wins ties.
fn abs_max(x: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j`
/// (0..8) from the 12 packed bytes of Q4_K/Q5_K. Sub-blocks 0..3 sit in the
/// low 6 bits of bytes 0..3 (scales) and 4..7 (mins); 4..7 keep their low
/// nibbles in bytes 8..11 and their top 2 bits in the spare top bits of
/// bytes 0..7.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The inverse of [`get_scale_min_k4`] as ggml's quantizers write it (the
/// values are first clamped to 63 after truncation to u8).
pub fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; K_SCALE_SIZE] {
    let mut s = [0u8; K_SCALE_SIZE];
    for j in 0..8 {
        let (ls, lm) = (ls[j], lm[j]);
        if j < 4 {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            s[j - 4] |= (ls >> 4) << 6;
            s[j] |= (lm >> 4) << 6;
        }
    }
    s
}

/// All eight scales and mins of a Q4_K/Q5_K block at once: bytes 0..8 are
/// the scales, 8..16 the mins. Same values as [`get_scale_min_k4`] for
/// each `j`, computed on 32-bit words for the dot kernels.
#[inline]
pub fn unpack_scales_mins_k4(q: &[u8; K_SCALE_SIZE]) -> [u8; 16] {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let scales_lo = w0 & LOW6;
    let scales_hi = (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4);
    let mins_lo = w1 & LOW6;
    let mins_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4);
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&scales_lo.to_le_bytes());
    out[4..8].copy_from_slice(&scales_hi.to_le_bytes());
    out[8..12].copy_from_slice(&mins_lo.to_le_bytes());
    out[12..16].copy_from_slice(&mins_hi.to_le_bytes());
    out
}

/// A K-quant block decoded to integers: element `i` is
/// `d * scales[i / sub] * q[i] - dmin * mins[i / sub]`.
pub struct Decoded {
    pub d: f32,
    pub dmin: f32,
    /// Elements per sub-block: 16 or 32.
    pub sub: usize,
    pub q: [i8; QK_K],
    pub scales: [i32; 16],
    pub mins: [i32; 16],
}

/// Blocks the generic reference dot can read.
pub trait KBlock {
    fn decode(&self) -> Decoded;
}

/// The scalar reference dot of a K-quant row with a Q8_K row: exact integer
/// sums per sub-block, scaled per super-block. The minimum term comes from
/// the Q8_K group sums (`bsums`), as in ggml.
pub fn vec_dot_decoded<B: KBlock>(x: &[B], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let b = xb.decode();
        let mut isum = 0i32;
        for (j, (q, q8)) in
            b.q.chunks_exact(b.sub)
                .zip(yb.qs.chunks_exact(b.sub))
                .enumerate()
        {
            let s: i32 = q.iter().zip(q8).map(|(&a, &c)| a as i32 * c as i32).sum();
            isum += b.scales[j] * s;
        }
        let mut summs = 0i32;
        for (j, &bs) in yb.bsums.iter().enumerate() {
            summs += bs as i32 * b.mins[j * 16 / b.sub];
        }
        sum += (b.d * yb.d) * isum as f32 - (b.dmin * yb.d) * summs as f32;
    }
    sum
}

/// Shared x86 helpers for the K-quant dot kernels.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// Sum of the 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn hsum_ps_256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Sum of the 4 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn hsum_ps_128(s: __m128) -> f32 {
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Sum of the 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub fn hsum_ps_512(v: __m512) -> f32 {
        let s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
        hsum_ps_256(s)
    }

    /// An f16 (as raw bits) to f32 with the F16C instruction; exact.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn f16_to_f32(h: half::f16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
    }

    /// Shuffle control for `_mm256_shuffle_epi8` that broadcasts 16-bit
    /// element `k` (0..8) of each 128-bit lane to the whole lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn splat_i16_ctrl(k: usize) -> __m256i {
        let b = (2 * k) as i16;
        _mm256_set1_epi16(b | ((b + 1) << 8))
    }

    /// Shuffle control for `_mm_shuffle_epi8` that puts byte `2k` in bytes
    /// 0..8 and byte `2k+1` in bytes 8..16 (k in 0..8): widened to 16 bits,
    /// one scale per 128-bit lane for a pair of 16-element sub-blocks.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn pair_ctrl(k: usize) -> __m128i {
        let lo = (2 * k) as i64 * 0x0101_0101_0101_0101;
        let hi = (2 * k + 1) as i64 * 0x0101_0101_0101_0101;
        _mm_set_epi64x(hi, lo)
    }

    /// `_mm512_permutexvar_epi16` index that spreads i16 elements
    /// `first..first+n` (each repeated `32/n` times) over the 32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub fn spread_idx(first: usize, n: usize) -> __m512i {
        let per = 32 / n;
        let mut idx = [0i16; 32];
        for (i, v) in idx.iter_mut().enumerate() {
            *v = (first + i / per) as i16;
        }
        // SAFETY: `idx` is 64 readable bytes; loadu has no alignment need.
        unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }
    }
}

/// Shared NEON helpers for the K-quant dot kernels.
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon {
    use std::arch::aarch64::*;

    /// `Σ q[i]·q8[i]` over 16 elements; products are exact in i16 and
    /// summed in i32.
    ///
    /// # Safety
    /// NEON must be available and `q8` must point at 16 readable bytes.
    #[inline]
    #[target_feature(enable = "neon")]
    pub unsafe fn dot16(q: int8x16_t, q8: *const i8) -> i32 {
        // SAFETY: `q8` points at 16 readable bytes (the caller's contract).
        let y = unsafe { vld1q_s8(q8) };
        let p = vpaddlq_s16(vmull_s8(vget_low_s8(q), vget_low_s8(y)));
        vaddvq_s32(vpadalq_s16(p, vmull_high_s8(q, y)))
    }

    /// `Σ q[i]·q8[i]` over 32 elements.
    ///
    /// # Safety
    /// NEON must be available and `q8` must point at 32 readable bytes.
    #[inline]
    #[target_feature(enable = "neon")]
    pub unsafe fn dot32(q: [int8x16_t; 2], q8: *const i8) -> i32 {
        // SAFETY: `q8` points at 32 readable bytes (the caller's contract).
        let (y0, y1) = unsafe { (vld1q_s8(q8), vld1q_s8(q8.add(16))) };
        let mut p = vpaddlq_s16(vmull_s8(vget_low_s8(q[0]), vget_low_s8(y0)));
        p = vpadalq_s16(p, vmull_high_s8(q[0], y0));
        p = vpadalq_s16(p, vmull_s8(vget_low_s8(q[1]), vget_low_s8(y1)));
        p = vpadalq_s16(p, vmull_high_s8(q[1], y1));
        vaddvq_s32(p)
    }
}

/// The test suite every K-quant module runs, parameterised by its block
/// type and error bounds.
#[cfg(test)]
pub(crate) mod ktest {
    use super::*;
    use crate::isa::Isa;
    use crate::quant::q8_k;
    use crate::quant::testing::*;
    use crate::traits::TypeTraits;
    use bytemuck::{Pod, Zeroable};
    use rand::rngs::StdRng;
    use rand::Rng;

    pub struct Spec {
        pub traits: &'static TypeTraits,
        /// Bound on round-trip RMSE of `weights()` data divided by its RMS.
        pub rmse_rel: f32,
        /// Bound on the round-trip RMSE of an extreme row divided by its
        /// max |x| (on top of [`UNDERFLOW_FLOOR`]).
        pub extreme_rel: f32,
        /// ggml's bound for this type on its own test data (its metric,
        /// `sqrt(Σ err²) / n`, is RMSE/√n, so this is not `rmse_rel`).
        pub ggml_rmse: f32,
        /// ggml's dot bound, |dot - exact| / n, on both data sets.
        pub dot_err: f32,
    }

    /// Absolute slack for extreme rows: rows of values below about 1e-4 make
    /// the f16 super-block scale subnormal or zero (smallest step 2^-24 · 63
    /// · qmax), so ggml reconstructs them coarsely or as zeros.
    pub const UNDERFLOW_FLOOR: f32 = 1e-4;

    pub fn quantize<B: Pod + Zeroable>(t: &TypeTraits, x: &[f32]) -> Vec<B> {
        let mut q = vec![B::zeroed(); x.len() / QK_K];
        (t.from_float)(x, bytemuck::cast_slice_mut(&mut q));
        q
    }

    pub fn dequantize<B: Pod>(t: &TypeTraits, q: &[B]) -> Vec<f32> {
        let mut y = vec![0.0; q.len() * QK_K];
        (t.to_float)(bytemuck::cast_slice(q), &mut y);
        y
    }

    pub fn q8k(x: &[f32]) -> Vec<BlockQ8K> {
        let mut q = vec![BlockQ8K::zeroed(); x.len() / QK_K];
        q8_k::quantize_row(x, &mut q);
        q
    }

    /// Blocks of random bytes with `d`/`dmin` set to moderate values by
    /// `fix`: every bit pattern of scales and quants, including the ones
    /// the quantizer never writes.
    pub fn random_blocks<B: Pod + Zeroable>(
        r: &mut StdRng,
        nb: usize,
        fix: fn(&mut B, f32, f32),
    ) -> Vec<B> {
        (0..nb)
            .map(|_| {
                let mut b = B::zeroed();
                r.fill(bytemuck::bytes_of_mut(&mut b));
                fix(&mut b, r.gen_range(-0.01..0.01), r.gen_range(-0.01..0.01));
                b
            })
            .collect()
    }

    fn rms(x: &[f32]) -> f32 {
        (x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt() as f32
    }

    pub fn round_trip<B: Pod + Zeroable>(s: &Spec) {
        let mut r = rng(11);
        for nb in BLOCK_COUNTS {
            let x = weights(&mut r, nb * QK_K);
            let q: Vec<B> = quantize(s.traits, &x);
            let y = dequantize(s.traits, &q);
            assert!(y.iter().all(|v| v.is_finite()));
            let e = rmse(&x, &y) / rms(&x);
            assert!(
                e <= s.rmse_rel,
                "{:?} nb={nb}: relative rmse {e}",
                s.traits.ty
            );
        }
        for (k, x) in extreme_rows(2 * QK_K).iter().enumerate() {
            let q: Vec<B> = quantize(s.traits, x);
            let y = dequantize(s.traits, &q);
            assert!(y.iter().all(|v| v.is_finite()), "{:?} row {k}", s.traits.ty);
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let e = rmse(x, &y);
            assert!(
                e <= s.extreme_rel * amax + UNDERFLOW_FLOOR,
                "{:?} row {k}: rmse {e} amax {amax}",
                s.traits.ty
            );
        }
    }

    /// test-quantize-fns's checks on its own data: `0.1 + 2cos(i + offset)`,
    /// 4096 values, its error metrics and bounds, for every kernel.
    pub fn ggml_test_data<B: Pod + Zeroable>(s: &Spec) {
        let n = 32 * 128;
        let gen = |offset: f32| -> Vec<f32> {
            (0..n)
                .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
                .collect()
        };
        let (x1, x2) = (gen(0.0), gen(1.0));
        let q: Vec<B> = quantize(s.traits, &x1);
        let y = dequantize(s.traits, &q);
        let total: f64 = x1
            .iter()
            .zip(&y)
            .map(|(&a, &b)| ((a - b) as f64).powi(2))
            .sum();
        let e = total.sqrt() as f32 / n as f32;
        assert!(
            e < s.ggml_rmse,
            "{:?}: ggml total quantization error {e}",
            s.traits.ty
        );
        let qa = q8k(&x2);
        let exact: f64 = x1.iter().zip(&x2).map(|(&a, &b)| a as f64 * b as f64).sum();
        for isa in Isa::supported() {
            let got =
                vec_dot(isa, s.traits.ty)(bytemuck::cast_slice(&q), bytemuck::cast_slice(&qa));
            let e = dot_err(got, exact as f32, n);
            assert!(
                e < s.dot_err,
                "{:?} {}: ggml dot error {e}",
                s.traits.ty,
                isa.name()
            );
        }
    }

    /// A fixed row of 1024 blocks (enough that a change in the last bit
    /// of a search step shows in some block), reproducible bit for bit in
    /// any language (integer arithmetic, then one correctly rounded f32
    /// division and multiply): sums of four LCG draws (roughly normal in
    /// [-2, 2]) with 8x outliers, then a block scaled by 1e-3, an all-zero,
    /// an all-positive, an all-negative and a constant block.
    pub fn golden_row() -> Vec<f32> {
        const GOLDEN_BLOCKS: usize = 1024;
        let mut s: u64 = 0x2545_f491_4f6c_dd1d;
        let mut x: Vec<f32> = (0..GOLDEN_BLOCKS * QK_K)
            .map(|i| {
                let mut t = 0i64;
                for _ in 0..4 {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    t += ((s >> 33) % 1001) as i64;
                }
                let v = (t - 2000) as f32 / 1000.0;
                if i % 61 == 0 {
                    v * 8.0
                } else {
                    v
                }
            })
            .collect();
        let mut block = |k: usize, f: &dyn Fn(f32) -> f32| {
            x[k * QK_K..(k + 1) * QK_K]
                .iter_mut()
                .for_each(|v| *v = f(*v));
        };
        let nb = GOLDEN_BLOCKS;
        block(nb - 5, &|v| v * 1e-3);
        block(nb - 4, &|_| 0.0);
        block(nb - 3, &|v| v.abs());
        block(nb - 2, &|v| -v.abs());
        block(nb - 1, &|_| 0.75);
        x
    }

    /// FNV-1a (64-bit) of the quantized [`golden_row`] must be `want`,
    /// the hash of the bytes ggml's `quantize_row_*_ref` writes for it
    /// (ggml-quants.c built as ggml-base is: baseline x86-64, so without FMA
    /// contraction).
    pub fn golden_bytes<B: Pod + Zeroable>(s: &Spec, want: u64) {
        let q: Vec<B> = quantize(s.traits, &golden_row());
        let h = bytemuck::cast_slice::<B, u8>(&q)
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
            });
        assert_eq!(
            h, want,
            "{:?}: quantized bytes differ from ggml's",
            s.traits.ty
        );
    }

    /// Same input, same bytes; and dequantize agrees bit for bit with the
    /// decoded-integers form the reference dot uses.
    pub fn deterministic_and_decode<B: Pod + Zeroable + KBlock>(
        s: &Spec,
        fix: fn(&mut B, f32, f32),
    ) {
        let mut r = rng(12);
        let x = weights(&mut r, 5 * QK_K);
        let a: Vec<B> = quantize(s.traits, &x);
        let b: Vec<B> = quantize(s.traits, &x);
        assert!(bytemuck::cast_slice::<B, u8>(&a) == bytemuck::cast_slice::<B, u8>(&b));
        let mut blocks = random_blocks::<B>(&mut r, 50, fix);
        blocks.extend(a);
        let y = dequantize(s.traits, &blocks);
        for (blk, y) in blocks.iter().zip(y.chunks_exact(QK_K)) {
            let dc = blk.decode();
            for (i, &got) in y.iter().enumerate() {
                let j = i / dc.sub;
                let want =
                    dc.d * dc.scales[j] as f32 * dc.q[i] as f32 - dc.dmin * dc.mins[j] as f32;
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{:?} element {i}",
                    s.traits.ty
                );
            }
        }
    }

    /// Σ of the magnitudes of everything a kernel adds up: any float
    /// summation order is within a few ulps of this.
    fn magnitude<B: KBlock>(x: &[B], y: &[BlockQ8K]) -> f64 {
        let mut m = 0.0f64;
        for (xb, yb) in x.iter().zip(y) {
            let b = xb.decode();
            let mut s = 0.0f64;
            for i in 0..QK_K {
                s += (b.scales[i / b.sub] as f64).abs()
                    * (b.q[i].unsigned_abs() as f64 + 32.0)
                    * (yb.qs[i] as f64).abs();
            }
            let mut t = 0.0f64;
            for (j, &bs) in yb.bsums.iter().enumerate() {
                t += (b.mins[j * 16 / b.sub] as f64 * bs as f64).abs();
            }
            m += (b.d as f64 * yb.d as f64).abs() * s + (b.dmin as f64 * yb.d as f64).abs() * t;
        }
        m
    }

    /// The reference dot against the f64 dot of the dequantized rows, and
    /// ggml's end-to-end metric against the unquantized rows.
    pub fn ref_dot<B: Pod + Zeroable + KBlock>(s: &Spec) {
        let mut r = rng(13);
        for nb in BLOCK_COUNTS {
            let n = nb * QK_K;
            let (xw, xa) = (weights(&mut r, n), weights(&mut r, n));
            let qw: Vec<B> = quantize(s.traits, &xw);
            let qa = q8k(&xa);
            let got = (s.traits.vec_dot_ref)(bytemuck::cast_slice(&qw), bytemuck::cast_slice(&qa));
            let (dw, da) = (dequantize(s.traits, &qw), dequantize(&q8_k::TRAITS, &qa));
            let want: f64 = dw.iter().zip(&da).map(|(&p, &q)| p as f64 * q as f64).sum();
            let tol = 1e-5 * magnitude(&qw, &qa) + 1e-30;
            assert!(
                (got as f64 - want).abs() <= tol,
                "{:?} nb={nb}: {got} vs {want}",
                s.traits.ty
            );
            let exact: f64 = xw.iter().zip(&xa).map(|(&p, &q)| p as f64 * q as f64).sum();
            let e = dot_err(got, exact as f32, n);
            assert!(e <= s.dot_err, "{:?} nb={nb}: dot error {e}", s.traits.ty);
        }
    }

    fn check_kernels<B: Pod + KBlock>(s: &Spec, x: &[B], y: &[BlockQ8K], what: &str) {
        let (w, a) = (bytemuck::cast_slice(x), bytemuck::cast_slice(y));
        let want = (s.traits.vec_dot_ref)(w, a);
        let tol = 1e-5 * magnitude(x, y) + 1e-30;
        // (The sets this CPU lacks have no table: `crate::dispatch`'s tests.)
        for isa in Isa::supported() {
            let got = vec_dot(isa, s.traits.ty)(w, a);
            assert!(
                got.is_finite() == want.is_finite() && (got as f64 - want as f64).abs() <= tol,
                "{:?} {} {what} nb={}: {got} vs ref {want} (tol {tol})",
                s.traits.ty,
                isa.name(),
                x.len()
            );
            // NEON sums each block's integers exactly and then does the
            // reference's float operations in the same order.
            if isa == Isa::Neon && isa.is_supported() {
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{:?} neon {what}: {got} is not bit-identical to {want}",
                    s.traits.ty
                );
            }
        }
    }

    /// Every kernel the CPU can run against the reference dot, on quantized
    /// weights, random bit patterns and extreme rows.
    pub fn kernels_match_ref<B: Pod + Zeroable + KBlock>(s: &Spec, fix: fn(&mut B, f32, f32)) {
        let mut r = rng(14);
        for nb in BLOCK_COUNTS {
            let n = nb * QK_K;
            let qa = q8k(&weights(&mut r, n));
            let qw: Vec<B> = quantize(s.traits, &weights(&mut r, n));
            check_kernels(s, &qw, &qa, "quantized");
            let rb = random_blocks::<B>(&mut r, nb, fix);
            check_kernels(s, &rb, &qa, "random bits");
        }
        let rows = extreme_rows(3 * QK_K);
        for (i, xw) in rows.iter().enumerate() {
            let qw: Vec<B> = quantize(s.traits, xw);
            for (j, xa) in rows.iter().enumerate() {
                check_kernels(s, &qw, &q8k(xa), &format!("extreme {i}x{j}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::*;
    use rand::Rng;

    #[test]
    fn unpack_matches_get_scale_min_k4() {
        let mut r = rng(7);
        for _ in 0..1000 {
            let q: [u8; 12] = std::array::from_fn(|_| r.gen());
            let u = unpack_scales_mins_k4(&q);
            for j in 0..8 {
                assert_eq!(get_scale_min_k4(j, &q), (u[j], u[8 + j]));
            }
        }
    }

    #[test]
    fn pack_round_trips_6_bit_values() {
        let mut r = rng(8);
        for _ in 0..1000 {
            let ls: [u8; 8] = std::array::from_fn(|_| r.gen_range(0..64));
            let lm: [u8; 8] = std::array::from_fn(|_| r.gen_range(0..64));
            let p = pack_scale_min_k4(&ls, &lm);
            for j in 0..8 {
                assert_eq!(get_scale_min_k4(j, &p), (ls[j], lm[j]));
            }
        }
    }

    #[test]
    fn qkx2_fits_an_affine_grid_exactly() {
        // Values on the grid 0.5*l - 1 are reproduced with that grid.
        let x: Vec<f32> = (0..32).map(|i| 0.5 * (i % 16) as f32 - 1.0).collect();
        let w = vec![1.0; 32];
        let (mut l, mut aux) = (vec![0u8; 32], vec![0u8; 32]);
        let (scale, min) = make_qkx2_quants(15, &x, &w, &mut l, &mut aux, -1.0, 0.1, 20, false);
        for (i, &q) in l.iter().enumerate() {
            assert!((scale * q as f32 - min - x[i]).abs() < 1e-6, "{i}");
        }
    }

    #[test]
    fn helpers_handle_all_zero_groups() {
        let x = [0.0f32; 16];
        let mut l = [5i8; 16];
        assert_eq!(make_qx_quants(32, &x, &mut l, 1, None), 0.0);
        assert_eq!(l, [0; 16]);
        let mut l = [5i8; 16];
        assert_eq!(make_q3_quants(4, &x, &mut l, true), 0.0);
        assert_eq!(l, [0; 16]);
        let (mut l, mut aux) = ([5u8; 16], [0u8; 16]);
        let (s, m) = make_qkx2_quants(3, &x, &[0.0; 16], &mut l, &mut aux, -0.5, 0.1, 15, true);
        assert_eq!((s, m, l), (0.0, 0.0, [0; 16]));
    }
}
