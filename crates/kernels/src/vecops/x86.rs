//! AVX-512 attention: the same arithmetic as the plain body in the parent
//! module, operation for operation (separate multiplies and adds, the
//! same lanes, the same reduction trees), so it gives the same bits, with
//! the accumulators of a block of heads held in registers.

use super::{
    check, Attention, KvElement, EXP_HI, EXP_LO, EXP_POLY, LN2_HI, LN2_LO, LOG2E, SHIFT, SHIFT_BITS,
};
use core::arch::x86_64::*;

/// [`super::exp`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn exp16(x: __m512) -> __m512 {
    let x = _mm512_min_ps(x, _mm512_set1_ps(EXP_HI));
    let x = _mm512_max_ps(x, _mm512_set1_ps(EXP_LO));
    let shift = _mm512_set1_ps(SHIFT);
    let t = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)), shift);
    let n = _mm512_sub_ps(t, shift);
    let r = _mm512_sub_ps(
        _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI))),
        _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)),
    );
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(
        _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r),
        _mm512_set1_ps(1.0),
    );
    let n_int = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(SHIFT_BITS));
    let scale = _mm512_slli_epi32::<23>(_mm512_add_epi32(n_int, _mm512_set1_epi32(127)));
    _mm512_mul_ps(y, _mm512_castsi512_ps(scale))
}

/// [`super::tree_sum`]: halves added low + high, 256, 128, 64, 32 bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn tree_sum(v: __m512) -> f32 {
    let v = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
    let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
}

/// [`super::tree_max`] (`max_ps(high, low)` keeps the low lane on ties,
/// as the scalar `if high > low`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn tree_max(v: __m512) -> f32 {
    let v = _mm256_max_ps(_mm512_extractf32x8_ps::<1>(v), _mm512_castps512_ps256(v));
    let v = _mm_max_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let v = _mm_max_ps(_mm_movehl_ps(v, v), v);
    _mm_cvtss_f32(_mm_max_ss(_mm_movehdup_ps(v), v))
}

/// 16 keys or values at `p + idx` as f32, lanes outside `m` zero (and not
/// read): f32 loaded as is, f16 widened by `vcvtph2ps` (exact).
///
/// # Safety
/// The unmasked lanes `p + idx + l` are readable `T`s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn load_kv<T: KvElement>(p: *const T, idx: usize, m: __mmask16) -> __m512 {
    // SAFETY: the caller's contract; the casts only reinterpret the
    // element type, which `T::HALF` names.
    unsafe {
        if T::HALF {
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast::<i16>().add(idx)))
        } else {
            _mm512_maskz_loadu_ps(m, p.cast::<f32>().add(idx))
        }
    }
}

/// `N` indices from `start`, the last real one (below `end`) repeated to
/// fill the block, and how many are real.
#[inline]
fn block<const N: usize>(start: usize, end: usize) -> ([usize; N], usize) {
    let take = (end - start).min(N);
    (std::array::from_fn(|j| start + j.min(take - 1)), take)
}

/// Query heads per block of the score pass.
const SCORE_HEADS: usize = 8;
/// Query heads × dimensions per block of the value pass: 24 accumulators.
const VALUE_HEADS: usize = 4;
const VALUE_DIMS: usize = 6;

/// [`super::attend`] for AVX-512 (callable only where the features are
/// enabled).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub(super) fn attend_avx512<T: KvElement>(
    a: &Attention<'_, T>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let (nh, sp) = check(a, scores, out);
    let (hd, n, stride) = (a.head_dim, a.n_pos, a.stride);
    let chunks = sp / 16;
    let last: __mmask16 = if n % 16 == 0 {
        !0
    } else {
        (1u16 << (n % 16)) - 1
    };
    let mask = |c: usize| if c + 1 == chunks { last } else { !0 };
    // `check` gave: q, out (nh·hd); keys, values ((hd-1)·stride + n);
    // scores (nh·sp). Every access below stays inside those: key/value
    // loads of chunk c read positions c·16.. masked to below n, score rows
    // are sp = chunks·16 long.
    let (kp, vp, sc) = (a.keys.as_ptr(), a.values.as_ptr(), scores.as_mut_ptr());

    // q·scale, kept in `out` until the value pass overwrites it.
    for (o, &q) in out.iter_mut().zip(a.q) {
        *o = q * a.scale;
    }
    let mut h = 0;
    while h < nh {
        let (heads, take) = block::<SCORE_HEADS>(h, nh);
        let qrows = heads.map(|hj| out[hj * hd..(hj + 1) * hd].as_ptr());
        for c in 0..chunks {
            let mut acc = [_mm512_setzero_ps(); SCORE_HEADS];
            for i in 0..hd {
                // SAFETY: see above; masked-off lanes are not read.
                let k = unsafe { load_kv(kp, i * stride + c * 16, mask(c)) };
                for (accj, &qrow) in acc.iter_mut().zip(&qrows) {
                    // SAFETY: `qrow` is a row of `hd` floats of `out`, i < hd.
                    let qs = _mm512_set1_ps(unsafe { *qrow.add(i) });
                    *accj = _mm512_add_ps(*accj, _mm512_mul_ps(qs, k));
                }
            }
            for (accj, &hj) in acc.iter().zip(&heads).take(take) {
                // SAFETY: row hj of scores holds sp ≥ (c+1)·16 floats.
                unsafe { _mm512_storeu_ps(sc.add(hj * sp + c * 16), *accj) };
            }
        }
        h += SCORE_HEADS;
    }

    // Softmax per row; lanes past n count as −∞, end as exact zeros.
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    for h in 0..nh {
        // SAFETY: row h of scores is sp floats, c·16 + 16 ≤ sp.
        let row = |c: usize| unsafe { sc.add(h * sp + c * 16) };
        let mut m = neg_inf;
        for c in 0..chunks {
            // SAFETY: as above.
            let v = unsafe { _mm512_mask_loadu_ps(neg_inf, mask(c), row(c)) };
            m = _mm512_max_ps(v, m);
        }
        let m = _mm512_set1_ps(tree_max(m));
        let mut sum = _mm512_setzero_ps();
        for c in 0..chunks {
            // SAFETY: as above.
            unsafe {
                let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(row(c)), m));
                let e = _mm512_maskz_mov_ps(mask(c), e);
                sum = _mm512_add_ps(sum, e);
                _mm512_storeu_ps(row(c), e);
            }
        }
        let inv = _mm512_set1_ps(1.0 / tree_sum(sum));
        for c in 0..chunks {
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(row(c), _mm512_mul_ps(_mm512_loadu_ps(row(c)), inv)) };
        }
    }

    let mut h = 0;
    while h < nh {
        let (heads, _) = block::<VALUE_HEADS>(h, nh);
        let mut i = 0;
        while i < hd {
            let (dims, _) = block::<VALUE_DIMS>(i, hd);
            let mut acc = [[_mm512_setzero_ps(); VALUE_DIMS]; VALUE_HEADS];
            for c in 0..chunks {
                // SAFETY: rows of scores are sp floats; value loads are
                // masked to positions below n.
                let w = heads.map(|hj| unsafe { _mm512_loadu_ps(sc.add(hj * sp + c * 16)) });
                let v = dims.map(|d| unsafe { load_kv(vp, d * stride + c * 16, mask(c)) });
                for (accj, wj) in acc.iter_mut().zip(&w) {
                    for (acck, vk) in accj.iter_mut().zip(&v) {
                        *acck = _mm512_add_ps(*acck, _mm512_mul_ps(*wj, *vk));
                    }
                }
            }
            for (accj, &hj) in acc.iter().zip(&heads) {
                for (acck, &d) in accj.iter().zip(&dims) {
                    out[hj * hd + d] = tree_sum(*acck);
                }
            }
            i += VALUE_DIMS;
        }
        h += VALUE_HEADS;
    }
}
