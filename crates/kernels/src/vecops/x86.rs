//! AVX-512 attention: the same arithmetic as the plain body in the parent
//! module, operation for operation (the same fused multiply-adds, the
//! same lanes, the same reduction trees), so it gives the same bits, with
//! the accumulators of a block of heads held in registers.

use super::{
    check, Attention, KvElement, Shape, EXP_HI, EXP_LO, EXP_POLY, KEY_BLOCK, LN2_HI, LN2_LO, LOG2E,
    SHIFT, SHIFT_BITS,
};
use core::arch::x86_64::*;

/// [`super::exp`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn exp16(x: __m512) -> __m512 {
    let x = _mm512_min_ps(x, _mm512_set1_ps(EXP_HI));
    let x = _mm512_max_ps(x, _mm512_set1_ps(EXP_LO));
    let shift = _mm512_set1_ps(SHIFT);
    let t = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), shift);
    let n = _mm512_sub_ps(t, shift);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(
        _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
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

/// [`tree_sum`] of 16 vectors at once: lane `k` of the result is
/// `tree_sum(v[k])`, bit for bit. Each level adds the same pairs of lanes
/// as [`tree_sum`] (halves of 256, 128, 64 and 32 bits), two vectors'
/// worth per add, so 16 sums take 15 adds and 30 shuffles instead of 16
/// reductions of 4 adds and 5 extracts each: at a decode step's depth the
/// value pass's reductions cost about what its multiply-adds did.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn tree_sum16(v: &[__m512; 16]) -> __m512 {
    // Level 4 leaves lane 4g + e holding the sum of input 4e + g; take the
    // inputs in that (self-inverse) order so lane k sums v[k].
    let v: [__m512; 16] = std::array::from_fn(|i| v[(i % 4) * 4 + i / 4]);
    // 512 → 256 bits: [a.lo, b.lo] + [a.hi, b.hi].
    let l1: [__m512; 8] = std::array::from_fn(|m| {
        let (a, b) = (v[2 * m], v[2 * m + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        )
    });
    // 256 → 128: each 256-bit half's two 128-bit quarters.
    let l2: [__m512; 4] = std::array::from_fn(|m| {
        let (a, b) = (l1[2 * m], l1[2 * m + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
        )
    });
    // 128 → 64 (`movehl`): lanes 0, 1 plus lanes 2, 3 of each quarter.
    let l3: [__m512; 2] = std::array::from_fn(|m| {
        let (a, b) = (l2[2 * m], l2[2 * m + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(a, b),
            _mm512_shuffle_ps::<0xEE>(a, b),
        )
    });
    // 64 → 32 (`movehdup`): lane 0 plus lane 1 of each pair.
    _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(l3[0], l3[1]),
        _mm512_shuffle_ps::<0xDD>(l3[0], l3[1]),
    )
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

/// Scores of query heads `h0..h0 + H` (rows of `qs`, `(nh, hd)`, already
/// scaled) over every chunk of 16 positions, `C` chunks at a time: one
/// key load feeds the H heads, and the H·C accumulators are independent
/// chains. Chunk
/// `c` is block `c` of the keys, `hd` rows of 16 lanes in a row, so the
/// pass reads the keys as one sequential stream.
///
/// # Safety
/// As in [`attend_avx512`]: `check` passed, `qs` holds `nh·hd` floats
/// (`h0 + H ≤ nh`), row `h0 + j` of `sc` holds `chunks·16` floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn score_block<T: KvElement, const H: usize, const C: usize>(
    kp: *const T,
    qs: &[f32],
    sc: *mut f32,
    h0: usize,
    shape: Shape,
) {
    let (hd, sp, chunks) = (shape.hd, shape.sp, shape.chunks);
    let block = KEY_BLOCK * hd;
    // `qs` is (nh, hd): element i of head h0 + j is at (h0 + j)·hd + i,
    // and each FMA takes it as an embedded broadcast.
    let nh = qs.len() / hd;
    assert!(h0 + H <= nh && qs.len() == nh * hd);
    let qt = qs[h0 * hd..].as_ptr();
    let mut c0 = 0;
    while c0 < chunks {
        // C chunks from c0, or the single chunks left at the end.
        if c0 + C <= chunks {
            let masks: [__mmask16; C] = std::array::from_fn(|k| shape.mask(c0 + k));
            let mut acc = [[_mm512_setzero_ps(); C]; H];
            for i in 0..hd {
                // SAFETY: the caller's contract; masked-off lanes are not
                // read.
                let k: [__m512; C] = std::array::from_fn(|k| unsafe {
                    load_kv(kp, (c0 + k) * block + i * KEY_BLOCK, masks[k])
                });
                for (j, accj) in acc.iter_mut().enumerate() {
                    // SAFETY: (h0 + j)·hd + i < nh·hd (asserted above).
                    let q = _mm512_set1_ps(unsafe { *qt.add(j * hd + i) });
                    for (a, kk) in accj.iter_mut().zip(&k) {
                        *a = _mm512_fmadd_ps(q, *kk, *a);
                    }
                }
            }
            for (j, accj) in acc.iter().enumerate() {
                for (k, a) in accj.iter().enumerate() {
                    // SAFETY: row h0 + j of scores holds sp ≥ (c0+k+1)·16
                    // floats.
                    unsafe { _mm512_storeu_ps(sc.add((h0 + j) * sp + (c0 + k) * 16), *a) };
                }
            }
            c0 += C;
        } else {
            // SAFETY: as above, with one chunk.
            unsafe { score_block_tail::<T, H>(kp, qt, sc, h0, c0, shape) };
            c0 += 1;
        }
    }
}

/// [`score_block`] for the single chunk `c`.
///
/// # Safety
/// As [`score_block`]; `qt` points at element 0 of head `h0` in its
/// `(nh, hd)` queries.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn score_block_tail<T: KvElement, const H: usize>(
    kp: *const T,
    qt: *const f32,
    sc: *mut f32,
    h0: usize,
    c: usize,
    shape: Shape,
) {
    let (hd, sp) = (shape.hd, shape.sp);
    let m = shape.mask(c);
    let mut acc = [_mm512_setzero_ps(); H];
    for i in 0..hd {
        // SAFETY: the caller's contract; masked-off lanes are not read.
        let k = unsafe { load_kv(kp, c * KEY_BLOCK * hd + i * KEY_BLOCK, m) };
        for (j, accj) in acc.iter_mut().enumerate() {
            // SAFETY: as in `score_block`: (h0 + j)·hd + i < nh·hd.
            let q = _mm512_set1_ps(unsafe { *qt.add(j * hd + i) });
            *accj = _mm512_fmadd_ps(q, k, *accj);
        }
    }
    for (j, accj) in acc.iter().enumerate() {
        // SAFETY: row h0 + j of scores holds sp ≥ (c+1)·16 floats.
        unsafe { _mm512_storeu_ps(sc.add((h0 + j) * sp + c * 16), *accj) };
    }
}

/// Outputs of query heads `h0..h0 + H`, dimensions `d0..d0 + D` (the last
/// block of dimensions may repeat dimension `hd - 1`, recomputing it): H·D
/// accumulators in registers across every chunk of positions.
///
/// # Safety
/// As in [`attend_avx512`]: `check` passed, rows `h0..h0 + H` of `sc` hold
/// the softmaxed scores (exact zeros past `n`), `out` is `(n_heads, hd)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn value_block<T: KvElement, const H: usize, const D: usize>(
    vp: *const T,
    sc: *const f32,
    out: &mut [f32],
    h0: usize,
    shape: Shape,
) {
    let (hd, stride, sp, chunks) = (shape.hd, shape.stride, shape.sp, shape.chunks);
    let mut d0 = 0;
    while d0 < hd {
        let dims: [usize; D] = std::array::from_fn(|k| (d0 + k).min(hd - 1));
        let mut acc = [[_mm512_setzero_ps(); D]; H];
        for c in 0..chunks {
            let m = shape.mask(c);
            // SAFETY: rows of scores are sp floats; value loads are masked
            // to the attended positions.
            let w: [__m512; H] =
                std::array::from_fn(|j| unsafe { _mm512_loadu_ps(sc.add((h0 + j) * sp + c * 16)) });
            for (k, &d) in dims.iter().enumerate() {
                // SAFETY: as above.
                let v = unsafe { load_kv(vp, d * stride + c * 16, m) };
                for (accj, wj) in acc.iter_mut().zip(&w) {
                    accj[k] = _mm512_fmadd_ps(*wj, v, accj[k]);
                }
            }
        }
        // The H·D sums, 16 reductions at a time (a last partial group
        // padded with zeros, whose sums are dropped).
        for g0 in (0..H * D).step_by(16) {
            let k = (H * D - g0).min(16);
            let sums: [__m512; 16] = std::array::from_fn(|i| {
                let i = g0 + i;
                if i < H * D {
                    acc[i / D][i % D]
                } else {
                    _mm512_setzero_ps()
                }
            });
            let mut lanes = [0.0f32; 16];
            // SAFETY: `lanes` holds 16 floats.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), tree_sum16(&sums)) };
            for (i, &x) in (g0..g0 + k).zip(&lanes) {
                out[(h0 + i / D) * hd + dims[i % D]] = x;
            }
        }
        d0 += D;
    }
}

/// [`super::attend`] for AVX-512 (callable only where the features are
/// enabled). Heads are taken in blocks of 8, 4, 3, 2 or 1 for the scores
/// (one key load per block) and 4, 3, 2 or 1 for the values, so a group of
/// any size computes only its own heads.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub(super) fn attend_avx512<T: KvElement>(
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
    // ((hd-1)·stride + end); scores (nh·sp). Every access below stays
    // inside those: key loads of chunk c read block c, value loads read
    // positions c·16.. masked to first..end, score rows are sp = chunks·16
    // long.
    let (kp, vp, sc) = (a.keys.as_ptr(), a.values.as_ptr(), scores.as_mut_ptr());

    // q·scale, kept in `out` (nh, hd) until the value pass overwrites it:
    // one contiguous multiply (a transposed copy here was 5.6% of a
    // prompt's attention, its stores scattered).
    for (o, &q) in out.iter_mut().zip(a.q) {
        *o = q * a.scale;
    }
    let mut h = 0;
    while h < nh {
        // SAFETY: (all blocks) `check` passed; heads h..h + H < nh.
        h += unsafe {
            match nh - h {
                8.. => score_block::<T, 8, 2>(kp, out, sc, h, shape),
                4..=7 => score_block::<T, 4, 4>(kp, out, sc, h, shape),
                3 => score_block::<T, 3, 4>(kp, out, sc, h, shape),
                2 => score_block::<T, 2, 4>(kp, out, sc, h, shape),
                _ => score_block::<T, 1, 8>(kp, out, sc, h, shape),
            }
            match nh - h {
                8.. => 8,
                4..=7 => 4,
                k => k,
            }
        };
    }

    // Gemma 2's soft cap, as the scalar body applies it.
    if a.softcap > 0.0 {
        for h in 0..nh {
            let n = super::head_end(a, h) - a.first;
            // SAFETY: row h of scores is sp ≥ first + n floats inside
            // `scores` (`check`), and no other reference to it is live.
            let row = unsafe { std::slice::from_raw_parts_mut(sc.add(h * sp + a.first), n) };
            super::softcap_body(row, a.softcap);
        }
    }

    // Softmax per row, over the head's own positions: lanes outside
    // first..end_h count as −∞, end as exact zeros, and so do the chunks
    // past the head's last (the value pass reads them as weights).
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    for h in 0..nh {
        // SAFETY: row h of scores is sp floats, c·16 + 16 ≤ sp.
        let row = |c: usize| unsafe { sc.add(h * sp + c * 16) };
        let end = super::head_end(a, h);
        let head = Shape {
            chunks: end.div_ceil(16),
            last: Shape::last_lanes(end),
            ..shape
        };
        let mask = |c: usize| head.mask(c);
        for c in head.chunks..chunks {
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(row(c), _mm512_setzero_ps()) };
        }
        let chunks = head.chunks;
        let mut m = neg_inf;
        for c in 0..chunks {
            // SAFETY: as above.
            let v = unsafe { _mm512_mask_loadu_ps(neg_inf, mask(c), row(c)) };
            m = _mm512_max_ps(v, m);
        }
        let max = tree_max(m);
        let m = _mm512_set1_ps(max);
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
        let sum = tree_sum(sum);
        stats[2 * h] = max;
        stats[2 * h + 1] = sum;
        let inv = _mm512_set1_ps(1.0 / sum);
        for c in 0..chunks {
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(row(c), _mm512_mul_ps(_mm512_loadu_ps(row(c)), inv)) };
        }
    }

    let mut h = 0;
    while h < nh {
        // SAFETY: (all blocks) `check` passed; heads h..h + H < nh, and
        // their rows of scores are softmaxed above.
        h += unsafe {
            match nh - h {
                4.. => value_block::<T, 4, 6>(vp, sc, out, h, shape),
                3 => value_block::<T, 3, 8>(vp, sc, out, h, shape),
                2 => value_block::<T, 2, 8>(vp, sc, out, h, shape),
                _ => value_block::<T, 1, 16>(vp, sc, out, h, shape),
            }
            (nh - h).min(4)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_sum16_sums_each_vector_as_tree_sum_does() {
        use std::arch::is_x86_feature_detected as has;
        let all = has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq");
        if !(all && has!("avx2") && has!("fma")) {
            return;
        }
        // Magnitudes spread over 2^±20, so a different pairing of the
        // lanes would round differently.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let m = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            m * 2f32.powi((state % 41) as i32 - 20)
        };
        for _ in 0..100 {
            let lanes: Vec<[f32; 16]> = (0..16).map(|_| std::array::from_fn(|_| next())).collect();
            // SAFETY: the features the functions enable were detected
            // above; each load reads one [f32; 16].
            let (got, want) = unsafe {
                let v: [__m512; 16] = std::array::from_fn(|k| _mm512_loadu_ps(lanes[k].as_ptr()));
                let mut got = [0.0f32; 16];
                _mm512_storeu_ps(got.as_mut_ptr(), tree_sum16(&v));
                let want: [f32; 16] = std::array::from_fn(|k| tree_sum(v[k]));
                (got, want)
            };
            for k in 0..16 {
                assert_eq!(got[k].to_bits(), want[k].to_bits(), "lane {k}");
                assert_eq!(
                    want[k].to_bits(),
                    super::super::tree_sum(lanes[k]).to_bits()
                );
            }
        }
    }
}
