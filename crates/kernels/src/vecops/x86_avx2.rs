//! AVX2 attention: the same arithmetic as the plain body in the parent
//! module, operation for operation, on 16 lanes held as two 8-lane halves
//! (the same fused multiply-adds per lane, the same reduction trees), so
//! it gives the same bits. Before it, AVX2 machines ran the plain body as
//! compiled for AVX2, widening each f16 through the `half` crate: 31% of a
//! SmolLM2 decode step on a Zen 3 host.

use super::{
    check, head_end, softcap_body, Attention, KvElement, Shape, EXP_HI, EXP_LO, EXP_POLY,
    KEY_BLOCK, LN2_HI, LN2_LO, LOG2E, SHIFT, SHIFT_BITS,
};
use core::arch::x86_64::*;

/// Lanes 0..8 and 8..16 of a 16-lane vector of the plain body.
#[derive(Clone, Copy)]
struct V16 {
    lo: __m256,
    hi: __m256,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn zero() -> V16 {
    V16 {
        lo: _mm256_setzero_ps(),
        hi: _mm256_setzero_ps(),
    }
}

/// `a·b + c` per lane, one rounding (`f32::mul_add`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fmadd(a: __m256, b: V16, c: V16) -> V16 {
    V16 {
        lo: _mm256_fmadd_ps(a, b.lo, c.lo),
        hi: _mm256_fmadd_ps(a, b.hi, c.hi),
    }
}

/// The lanes of `m` as all-ones, the others as zero bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane_mask(m: u16) -> V16 {
    let bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let half = |b: i32| {
        let v = _mm256_and_si256(_mm256_set1_epi32(b), bits);
        _mm256_castsi256_ps(_mm256_cmpeq_epi32(v, bits))
    };
    V16 {
        lo: half(i32::from(m & 0xFF)),
        hi: half(i32::from(m >> 8)),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn and(v: V16, m: V16) -> V16 {
    V16 {
        lo: _mm256_and_ps(v.lo, m.lo),
        hi: _mm256_and_ps(v.hi, m.hi),
    }
}

/// [`super::exp`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(x, _mm256_set1_ps(EXP_HI));
    let x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LO));
    let shift = _mm256_set1_ps(SHIFT);
    let t = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), shift);
    let n = _mm256_sub_ps(t, shift);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    let n_int = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(SHIFT_BITS));
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(n_int, _mm256_set1_epi32(127)));
    _mm256_mul_ps(y, _mm256_castsi256_ps(scale))
}

/// [`super::tree_sum`]: lanes 0..8 + 8..16, then 128, 64, 32 bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tree_sum(v: V16) -> f32 {
    let v = _mm256_add_ps(v.lo, v.hi);
    let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
}

/// [`super::tree_max`] (`max_ps(high, low)` keeps the low lane on ties,
/// as the scalar `if high > low`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tree_max(v: V16) -> f32 {
    let v = _mm256_max_ps(v.hi, v.lo);
    let v = _mm_max_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let v = _mm_max_ps(_mm_movehl_ps(v, v), v);
    _mm_cvtss_f32(_mm_max_ss(_mm_movehdup_ps(v), v))
}

/// 16 keys or values at `p + idx` as f32: f32 loaded as is, f16 widened
/// by `vcvtph2ps` (exact).
///
/// # Safety
/// `p + idx .. p + idx + 16` are readable `T`s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_kv<T: KvElement>(p: *const T, idx: usize) -> V16 {
    // SAFETY: the caller's contract; the casts only reinterpret the
    // element type, which `T::HALF` names.
    unsafe {
        if T::HALF {
            let h = _mm256_loadu_si256(p.cast::<i16>().add(idx).cast());
            V16 {
                lo: _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
                hi: _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
            }
        } else {
            let f = p.cast::<f32>().add(idx);
            V16 {
                lo: _mm256_loadu_ps(f),
                hi: _mm256_loadu_ps(f.add(8)),
            }
        }
    }
}

/// [`load_kv`] of the lanes of `m` (`mask` is `m` as a [`lane_mask`]),
/// the others zero; lanes at or past `len` are not read.
///
/// # Safety
/// The lanes of `m` at `p + idx + l` are readable `T`s, and so is every
/// lane below `len - idx`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_kv_masked<T: KvElement>(
    p: *const T,
    idx: usize,
    len: usize,
    m: u16,
    mask: V16,
) -> V16 {
    if idx + 16 <= len {
        // SAFETY: all 16 lanes are below `len`.
        let v = unsafe { load_kv(p, idx) };
        return if m == !0 { v } else { and(v, mask) };
    }
    // The end of the slice: copy what exists (16 elements at most, at a
    // decode step the last chunk of the last row only).
    let n = len.saturating_sub(idx).min(16);
    // SAFETY: lanes below len - idx are readable, and n of them are
    // copied into a buffer of 16 `T`s, which `load_kv` then reads whole.
    unsafe {
        if T::HALF {
            let mut buf = [0u16; 16];
            std::ptr::copy_nonoverlapping(p.add(idx).cast::<u16>(), buf.as_mut_ptr(), n);
            and(load_kv(buf.as_ptr().cast::<T>(), 0), mask)
        } else {
            let mut buf = [0.0f32; 16];
            std::ptr::copy_nonoverlapping(p.add(idx).cast::<f32>(), buf.as_mut_ptr(), n);
            and(load_kv(buf.as_ptr().cast::<T>(), 0), mask)
        }
    }
}

/// Scores of query heads `h0..h0 + H` (rows of `qs`, `(nh, hd)`, already
/// scaled) over every chunk of 16 positions, `C` chunks at a time: one
/// key load feeds the H heads. Key lanes outside the attended positions
/// are read (whole blocks are in bounds) and their scores replaced by the
/// softmax.
///
/// # Safety
/// `check` passed for the call `kp` and `sc` come from, `qs` holds `nh·hd`
/// floats (`h0 + H ≤ nh`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_block<T: KvElement, const H: usize, const C: usize>(
    kp: *const T,
    qs: &[f32],
    sc: *mut f32,
    h0: usize,
    shape: Shape,
) {
    let (hd, sp, chunks) = (shape.hd, shape.sp, shape.chunks);
    let block = KEY_BLOCK * hd;
    let nh = qs.len() / hd;
    assert!(h0 + H <= nh && qs.len() == nh * hd);
    let qt = qs[h0 * hd..].as_ptr();
    let mut c0 = 0;
    while c0 < chunks {
        let n = if c0 + C <= chunks { C } else { 1 };
        let mut acc = [[zero(); C]; H];
        for i in 0..hd {
            // SAFETY: chunk c0 + k < chunks is block c0 + k of the keys,
            // inside `keys` (`check`: sp·hd elements).
            let k: [V16; C] = std::array::from_fn(|k| unsafe {
                load_kv(kp, (c0 + k.min(n - 1)) * block + i * KEY_BLOCK)
            });
            for (j, accj) in acc.iter_mut().enumerate() {
                // SAFETY: (h0 + j)·hd + i < nh·hd (asserted above).
                let q = _mm256_set1_ps(unsafe { *qt.add(j * hd + i) });
                for (a, kk) in accj.iter_mut().zip(&k).take(n) {
                    *a = fmadd(q, *kk, *a);
                }
            }
        }
        for (j, accj) in acc.iter().enumerate() {
            for (k, a) in accj.iter().enumerate().take(n) {
                // SAFETY: row h0 + j of scores holds sp ≥ (c0+k+1)·16
                // floats.
                unsafe {
                    let s = sc.add((h0 + j) * sp + (c0 + k) * 16);
                    _mm256_storeu_ps(s, a.lo);
                    _mm256_storeu_ps(s.add(8), a.hi);
                }
            }
        }
        c0 += n;
    }
}

/// Outputs of query heads `h0..h0 + H`, dimensions `d0..d0 + D` (the last
/// block of dimensions may repeat dimension `hd - 1`, recomputing it): H·D
/// sums of 2 registers each. The caller takes 2 heads × 2 dimensions: 8
/// sums, each head's scores loaded once per chunk for both dimensions
/// (2·2·2 + 4 + 2 registers), where 4 × 1 with the scores read into the
/// FMAs was load-bound (0.8× at 1024 positions on Zen 3). Only the first
/// and last chunk have lanes outside the attended positions: the chunks
/// between load their values unmasked.
///
/// # Safety
/// `check` passed for the call `vp` (`vlen` values) and `sc` come from;
/// rows `h0..h0 + H` of `sc` hold the softmaxed scores (exact zeros past
/// each head's end); `out` is `(n_heads, hd)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn value_block<T: KvElement, const H: usize, const D: usize>(
    vp: *const T,
    vlen: usize,
    sc: *const f32,
    out: &mut [f32],
    h0: usize,
    shape: Shape,
) {
    let (hd, stride, sp, chunks) = (shape.hd, shape.stride, shape.sp, shape.chunks);
    /// acc[j][k] += scores of head h0 + j, chunk c · v (dimension k's).
    ///
    /// # Safety
    /// On AVX2 with FMA; rows `h0..h0 + H` of `sc` are `sp` floats each
    /// and `(c + 1)·16 ≤ sp` (so the chunk's 16 scores of each are in
    /// bounds): [`value_block`]'s contract, for its chunks `c < chunks`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk<const H: usize, const D: usize>(
        acc: &mut [[V16; D]; H],
        sc: *const f32,
        c: usize,
        sp: usize,
        h0: usize,
        v: impl Fn(usize) -> V16,
    ) {
        for k in 0..D {
            let v = v(k);
            for (j, accj) in acc.iter_mut().enumerate() {
                // SAFETY: this fn's contract: row h0 + j's scores of chunk
                // c, 16 floats inside the row.
                let w = unsafe { sc.add((h0 + j) * sp + c * 16) };
                // SAFETY: as above; the features are this fn's contract.
                accj[k] = unsafe {
                    V16 {
                        lo: _mm256_fmadd_ps(_mm256_loadu_ps(w), v.lo, accj[k].lo),
                        hi: _mm256_fmadd_ps(_mm256_loadu_ps(w.add(8)), v.hi, accj[k].hi),
                    }
                };
            }
        }
    }
    let mut d0 = 0;
    while d0 < hd {
        let dims: [usize; D] = std::array::from_fn(|k| (d0 + k).min(hd - 1));
        let mut acc = [[zero(); D]; H];
        // The edge chunks through the mask, in their place in the order.
        let edge = |acc: &mut [[V16; D]; H], c: usize| {
            let m = shape.mask(c);
            let mask = lane_mask(m);
            // SAFETY: the attended lanes d·stride + first..end are in
            // `values` (`check`), and nothing past `vlen` is read.
            let v =
                |k: usize| unsafe { load_kv_masked(vp, dims[k] * stride + c * 16, vlen, m, mask) };
            // SAFETY: this fn's features; c < chunks, and the rows of
            // scores are the caller's (`# Safety`).
            unsafe { chunk(acc, sc, c, sp, h0, v) };
        };
        edge(&mut acc, 0);
        for c in 1..chunks.saturating_sub(1) {
            // SAFETY: chunk c < chunks − 1 ends at 16(c + 1) ≤ 16(chunks − 1)
            // < end: every lane is inside the values (`check`).
            let v = |k: usize| unsafe { load_kv(vp, dims[k] * stride + c * 16) };
            // SAFETY: as the edge chunks'.
            unsafe { chunk(&mut acc, sc, c, sp, h0, v) };
        }
        if chunks > 1 {
            edge(&mut acc, chunks - 1);
        }
        for (j, accj) in acc.iter().enumerate() {
            for (k, a) in accj.iter().enumerate() {
                out[(h0 + j) * hd + dims[k]] = tree_sum(*a);
            }
        }
        d0 += D;
    }
}

/// [`super::attend`] for AVX2 (callable only where the features are
/// enabled).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn attend_avx2<T: KvElement>(
    a: &Attention<'_, T>,
    scores: &mut [f32],
    out: &mut [f32],
    stats: &mut [f32],
) {
    let (nh, sp) = check(a, scores, out, stats);
    let (hd, end) = (a.head_dim, a.first + a.n_pos);
    let chunks = sp / 16;
    let shape = Shape {
        hd,
        stride: a.stride,
        sp,
        chunks,
        first: !0u16 << a.first,
        last: Shape::last_lanes(end),
    };
    // `check` gave: q, out (nh·hd); keys (sp·hd: whole blocks); values
    // ((hd-1)·stride + end); scores (nh·sp).
    let (kp, vp, sc) = (a.keys.as_ptr(), a.values.as_ptr(), scores.as_mut_ptr());

    // q·scale, kept in `out` (nh, hd) until the value pass overwrites it.
    for (o, &q) in out.iter_mut().zip(a.q) {
        *o = q * a.scale;
    }
    let mut h = 0;
    while h < nh {
        // SAFETY: (all blocks) `check` passed; heads h..h + H < nh.
        h += unsafe {
            match nh - h {
                4.. => score_block::<T, 4, 1>(kp, out, sc, h, shape),
                3 => score_block::<T, 3, 1>(kp, out, sc, h, shape),
                2 => score_block::<T, 2, 2>(kp, out, sc, h, shape),
                _ => score_block::<T, 1, 2>(kp, out, sc, h, shape),
            }
            (nh - h).min(4)
        };
    }

    if a.softcap > 0.0 {
        for h in 0..nh {
            let n = head_end(a, h) - a.first;
            // SAFETY: row h of scores is sp ≥ first + n floats inside
            // `scores` (`check`), and no other reference to it is live.
            let row = unsafe { std::slice::from_raw_parts_mut(sc.add(h * sp + a.first), n) };
            softcap_body(row, a.softcap);
        }
    }

    // Softmax per row over the head's own positions, as the AVX-512
    // kernel: lanes outside first..end_h count as −∞, end as exact zeros,
    // and so do the chunks past the head's last.
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    for h in 0..nh {
        // SAFETY: row h of scores is sp floats, c·16 + 16 ≤ sp.
        let row = |c: usize| unsafe { sc.add(h * sp + c * 16) };
        let end = head_end(a, h);
        let head = Shape {
            chunks: end.div_ceil(16),
            last: Shape::last_lanes(end),
            ..shape
        };
        let z = _mm256_setzero_ps();
        for c in head.chunks..chunks {
            // SAFETY: as above.
            unsafe {
                _mm256_storeu_ps(row(c), z);
                _mm256_storeu_ps(row(c).add(8), z);
            }
        }
        let chunks = head.chunks;
        let mut m = V16 {
            lo: neg_inf,
            hi: neg_inf,
        };
        for c in 0..chunks {
            let k = lane_mask(head.mask(c));
            // SAFETY: as above.
            let (lo, hi) = unsafe { (_mm256_loadu_ps(row(c)), _mm256_loadu_ps(row(c).add(8))) };
            let v = V16 {
                lo: _mm256_blendv_ps(neg_inf, lo, k.lo),
                hi: _mm256_blendv_ps(neg_inf, hi, k.hi),
            };
            m = V16 {
                lo: _mm256_max_ps(v.lo, m.lo),
                hi: _mm256_max_ps(v.hi, m.hi),
            };
        }
        let max = tree_max(m);
        let mv = _mm256_set1_ps(max);
        let mut sum = zero();
        for c in 0..chunks {
            let k = lane_mask(head.mask(c));
            // SAFETY: as above.
            unsafe {
                let (lo, hi) = (_mm256_loadu_ps(row(c)), _mm256_loadu_ps(row(c).add(8)));
                let e = and(
                    V16 {
                        lo: exp8(_mm256_sub_ps(lo, mv)),
                        hi: exp8(_mm256_sub_ps(hi, mv)),
                    },
                    k,
                );
                sum = V16 {
                    lo: _mm256_add_ps(sum.lo, e.lo),
                    hi: _mm256_add_ps(sum.hi, e.hi),
                };
                _mm256_storeu_ps(row(c), e.lo);
                _mm256_storeu_ps(row(c).add(8), e.hi);
            }
        }
        let sum = tree_sum(sum);
        stats[2 * h] = max;
        stats[2 * h + 1] = sum;
        let inv = _mm256_set1_ps(1.0 / sum);
        for c in 0..chunks {
            // SAFETY: as above.
            unsafe {
                let (lo, hi) = (row(c), row(c).add(8));
                _mm256_storeu_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(lo), inv));
                _mm256_storeu_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(hi), inv));
            }
        }
    }

    let vlen = a.values.len();
    let mut h = 0;
    while h < nh {
        // SAFETY: (all blocks) `check` passed; heads h..h + H < nh, and
        // their rows of scores are softmaxed above.
        h += unsafe {
            match nh - h {
                2.. => value_block::<T, 2, 2>(vp, vlen, sc, out, h, shape),
                _ => value_block::<T, 1, 4>(vp, vlen, sc, out, h, shape),
            }
            (nh - h).min(2)
        };
    }
}
