//! x86-64 kernels for int8 rows × an int8 vector, and the activation
//! quantizers. See the parent module for the arithmetic; everything here
//! must equal the scalar twin bit for bit.

use core::arch::x86_64::*;

// --- quantizers --------------------------------------------------------------

/// `round(v)` with halves away from zero, as `f32::round`, for values far
/// below 2²³: `t = trunc(v)`, then one more step away from zero when the
/// (exactly computed) fraction is at least one half.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn round_away_512(v: __m512) -> __m512 {
    let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
    let frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
    let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5));
    let sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(i32::MIN));
    let one = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x3f80_0000)));
    _mm512_mask_add_ps(t, away, t, one)
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ; `x` and `q` have equal lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub(super) unsafe fn quantize_avx512(x: &[f32], q: &mut [i8]) -> f32 {
    debug_assert_eq!(x.len(), q.len());
    let n = x.len();
    let mask = |i: usize| -> __mmask16 {
        let left = n - i;
        if left >= 16 {
            !0
        } else {
            (1u16 << left) - 1
        }
    };
    let mut m = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        // SAFETY: lanes past `n` are masked off (not read); `i < n`.
        let v = unsafe { _mm512_maskz_loadu_ps(mask(i), x.as_ptr().add(i)) };
        m = _mm512_max_ps(m, _mm512_abs_ps(v));
        i += 16;
    }
    let scale = _mm512_reduce_max_ps(m) / 127.0;
    if scale == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let (vs, lo, hi) = (
        _mm512_set1_ps(scale),
        _mm512_set1_ps(-127.0),
        _mm512_set1_ps(127.0),
    );
    let mut i = 0;
    while i < n {
        let k = mask(i);
        // SAFETY: as above; the store writes only the unmasked lanes, all
        // below `n = q.len()`.
        unsafe {
            let v = _mm512_maskz_loadu_ps(k, x.as_ptr().add(i));
            let r = _mm512_min_ps(_mm512_max_ps(round_away_512(_mm512_div_ps(v, vs)), lo), hi);
            _mm512_mask_cvtepi32_storeu_epi8(
                q.as_mut_ptr().add(i).cast(),
                k,
                _mm512_cvtps_epi32(r),
            );
        }
        i += 16;
    }
    scale
}

/// # Safety
/// The CPU must support AVX2 and FMA; `x` and `q` have equal lengths.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_avx2(x: &[f32], q: &mut [i8]) -> f32 {
    debug_assert_eq!(x.len(), q.len());
    let n = x.len();
    let full = n / 8 * 8;
    let abs_bits = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let mut m = _mm256_setzero_ps();
    for i in (0..full).step_by(8) {
        // SAFETY: `i + 8 <= full <= n`.
        let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) };
        m = _mm256_max_ps(m, _mm256_and_ps(v, abs_bits));
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let amax = x[full..]
        .iter()
        .chain(&lanes)
        .fold(0.0f32, |m, &v| m.max(v.abs()));
    let scale = amax / 127.0;
    if scale == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let (vs, lo, hi, half) = (
        _mm256_set1_ps(scale),
        _mm256_set1_ps(-127.0),
        _mm256_set1_ps(127.0),
        _mm256_set1_ps(0.5),
    );
    let sign_bit = _mm256_set1_epi32(i32::MIN);
    let one = _mm256_set1_epi32(0x3f80_0000);
    for i in (0..full).step_by(8) {
        // SAFETY: `i + 8 <= full <= n` for the load and the 8-byte store.
        unsafe {
            let v = _mm256_div_ps(_mm256_loadu_ps(x.as_ptr().add(i)), vs);
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
            let frac = _mm256_and_ps(_mm256_sub_ps(v, t), abs_bits);
            let away = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, half);
            let sign = _mm256_and_si256(_mm256_castps_si256(v), sign_bit);
            let step = _mm256_and_ps(away, _mm256_castsi256_ps(_mm256_or_si256(sign, one)));
            let r = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(t, step), lo), hi);
            let r = _mm256_cvtps_epi32(r);
            let w = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256::<1>(r));
            _mm_storel_epi64(q.as_mut_ptr().add(i).cast(), _mm_packs_epi16(w, w));
        }
    }
    for (qi, &v) in q[full..].iter_mut().zip(&x[full..]) {
        *qi = super::quantize_one(v, scale);
    }
    scale
}

// --- the regions of a quantized vector, and the residual of a pair ---------------

/// `offset = q ^ 0x80`, `abs = |q|` and `Σ q`, 64 bytes per step. The sum
/// comes from the offset bytes (`vpsadbw` adds unsigned bytes exactly):
/// `Σ q = Σ (q + 128) − 128·len`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW; the three slices have the same
/// length, a multiple of 64.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub(super) unsafe fn regions_avx512(q: &[i8], offset: &mut [u8], abs: &mut [u8]) -> i32 {
    debug_assert!(q.len().is_multiple_of(64) && offset.len() == q.len() && abs.len() == q.len());
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut sums = _mm512_setzero_si512();
    for i in (0..q.len()).step_by(64) {
        // SAFETY: i + 64 <= len of all three slices.
        unsafe {
            let v = _mm512_loadu_si512(q.as_ptr().add(i).cast());
            let u = _mm512_xor_si512(v, flip);
            _mm512_storeu_si512(offset.as_mut_ptr().add(i).cast(), u);
            _mm512_storeu_si512(abs.as_mut_ptr().add(i).cast(), _mm512_abs_epi8(v));
            sums = _mm512_add_epi64(sums, _mm512_sad_epu8(u, _mm512_setzero_si512()));
        }
    }
    // At most 255·len, far inside i64; the result fits i32 (|Σ q| ≤ 127·len).
    (_mm512_reduce_add_epi64(sums) - 128 * q.len() as i64) as i32
}

/// [`regions_avx512`] with 32-byte steps.
///
/// # Safety
/// The CPU must support AVX2; the three slices have the same length, a
/// multiple of 64.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn regions_avx2(q: &[i8], offset: &mut [u8], abs: &mut [u8]) -> i32 {
    debug_assert!(q.len().is_multiple_of(64) && offset.len() == q.len() && abs.len() == q.len());
    let flip = _mm256_set1_epi8(i8::MIN);
    let mut sums = _mm256_setzero_si256();
    for i in (0..q.len()).step_by(32) {
        // SAFETY: i + 32 <= len of all three slices (a multiple of 64).
        unsafe {
            let v = _mm256_loadu_si256(q.as_ptr().add(i).cast());
            let u = _mm256_xor_si256(v, flip);
            _mm256_storeu_si256(offset.as_mut_ptr().add(i).cast(), u);
            _mm256_storeu_si256(abs.as_mut_ptr().add(i).cast(), _mm256_abs_epi8(v));
            sums = _mm256_add_epi64(sums, _mm256_sad_epu8(u, _mm256_setzero_si256()));
        }
    }
    let mut lanes = [0i64; 4];
    // SAFETY: `lanes` holds four i64.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sums) };
    (lanes.iter().sum::<i64>() - 128 * q.len() as i64) as i32
}

/// `rest = x − scale·q`, sixteen at a time: the product and the difference
/// rounded separately, as the scalar twin does them.
///
/// # Safety
/// The CPU must support AVX-512 F/BW; `x`, `q` and `rest` have equal
/// lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub(super) unsafe fn residual_avx512(x: &[f32], q: &[i8], scale: f32, rest: &mut [f32]) {
    debug_assert!(q.len() == x.len() && rest.len() == x.len());
    let n = x.len();
    let s = _mm512_set1_ps(scale);
    let mut i = 0;
    while i < n {
        let left = n - i;
        let k: __mmask16 = if left >= 16 { !0 } else { (1u16 << left) - 1 };
        // SAFETY: lanes past `n` are masked off (not read or written).
        unsafe {
            let qv = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, q.as_ptr().add(i)));
            let xv = _mm512_maskz_loadu_ps(k, x.as_ptr().add(i));
            let r = _mm512_sub_ps(xv, _mm512_mul_ps(s, _mm512_cvtepi32_ps(qv)));
            _mm512_mask_storeu_ps(rest.as_mut_ptr().add(i), k, r);
        }
        i += 16;
    }
}

/// [`residual_avx512`] eight at a time, the tail by the scalar formula.
///
/// # Safety
/// The CPU must support AVX2; `x`, `q` and `rest` have equal lengths.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn residual_avx2(x: &[f32], q: &[i8], scale: f32, rest: &mut [f32]) {
    debug_assert!(q.len() == x.len() && rest.len() == x.len());
    let n = x.len();
    let full = n / 8 * 8;
    let s = _mm256_set1_ps(scale);
    for i in (0..full).step_by(8) {
        // SAFETY: i + 8 <= full <= n for the 8-byte, and the two 8-float,
        // accesses.
        unsafe {
            let qv = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().add(i).cast()));
            let xv = _mm256_loadu_ps(x.as_ptr().add(i));
            let r = _mm256_sub_ps(xv, _mm256_mul_ps(s, _mm256_cvtepi32_ps(qv)));
            _mm256_storeu_ps(rest.as_mut_ptr().add(i), r);
        }
    }
    for ((r, &xv), &qv) in rest[full..].iter_mut().zip(&x[full..]).zip(&q[full..]) {
        *r = xv - scale * qv as f32;
    }
}

/// [`quantize_avx512`] of `x` into `hi`, and of what it leaves over
/// (`rest = x − s_hi·hi`, kept in `rest`) into `lo`, in three passes
/// instead of five: the residual and its maximum come out of the pass
/// that rounds `hi`. Returns `(s_hi, s_lo)`. The same bits as the
/// quantizer, residual and quantizer run one after the other.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ; `x`, `hi`, `lo` and `rest`
/// have equal lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub(super) unsafe fn quantize_pair_avx512(
    x: &[f32],
    hi: &mut [i8],
    lo: &mut [i8],
    rest: &mut [f32],
) -> (f32, f32) {
    debug_assert!(hi.len() == x.len() && lo.len() == x.len() && rest.len() == x.len());
    let n = x.len();
    let mask = |i: usize| -> __mmask16 {
        let left = n - i;
        if left >= 16 {
            !0
        } else {
            (1u16 << left) - 1
        }
    };
    let (lim_lo, lim_hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    // round(v / s) clamped to ±127, as `quantize_avx512` computes it.
    let quantize = |v: __m512, s: __m512| {
        _mm512_cvtps_epi32(_mm512_min_ps(
            _mm512_max_ps(round_away_512(_mm512_div_ps(v, s)), lim_lo),
            lim_hi,
        ))
    };
    let mut m = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        // SAFETY: lanes past `n` are masked off (not read); `i < n`.
        let v = unsafe { _mm512_maskz_loadu_ps(mask(i), x.as_ptr().add(i)) };
        m = _mm512_max_ps(m, _mm512_abs_ps(v));
        i += 16;
    }
    let s_hi = _mm512_reduce_max_ps(m) / 127.0;
    let vs = _mm512_set1_ps(s_hi);
    let mut mr = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        let k = mask(i);
        // SAFETY: as above; the stores write only unmasked lanes, all
        // below `n`, the length of every slice.
        unsafe {
            let v = _mm512_maskz_loadu_ps(k, x.as_ptr().add(i));
            let q = if s_hi == 0.0 {
                _mm512_setzero_si512()
            } else {
                quantize(v, vs)
            };
            _mm512_mask_cvtepi32_storeu_epi8(hi.as_mut_ptr().add(i).cast(), k, q);
            let r = _mm512_sub_ps(v, _mm512_mul_ps(vs, _mm512_cvtepi32_ps(q)));
            _mm512_mask_storeu_ps(rest.as_mut_ptr().add(i), k, r);
            // Masked-off lanes of `r` are 0 − 0·0 = 0: no effect on the max.
            mr = _mm512_max_ps(mr, _mm512_abs_ps(r));
        }
        i += 16;
    }
    let s_lo = _mm512_reduce_max_ps(mr) / 127.0;
    if s_lo == 0.0 {
        lo.fill(0);
        return (s_hi, 0.0);
    }
    let vs = _mm512_set1_ps(s_lo);
    let mut i = 0;
    while i < n {
        let k = mask(i);
        // SAFETY: as above.
        unsafe {
            let r = _mm512_maskz_loadu_ps(k, rest.as_ptr().add(i));
            _mm512_mask_cvtepi32_storeu_epi8(lo.as_mut_ptr().add(i).cast(), k, quantize(r, vs));
        }
        i += 16;
    }
    (s_hi, s_lo)
}

// --- shared parts of the row kernels -------------------------------------------

/// Rows per step.
const GROUP: usize = 8;

/// The rows of the next step: eight, the last repeated when fewer are left
/// (computed and dropped), so partial groups need no other code path.
#[inline]
fn group(row0: usize, i: usize, take: usize) -> [usize; GROUP] {
    std::array::from_fn(|j| row0 + i + j.min(take - 1))
}

/// `v[rows[j]]` for the eight rows (one load when they are consecutive).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn gather8<T: Copy + Default>(v: &[T], rows: [usize; GROUP]) -> [T; GROUP] {
    if rows[GROUP - 1] == rows[0] + GROUP - 1 {
        let mut out = [T::default(); GROUP];
        out.copy_from_slice(&v[rows[0]..rows[0] + GROUP]);
        out
    } else {
        rows.map(|r| v[r])
    }
}

/// Per 128-bit lane, the sums of four accumulators' lanes: lane `k` of the
/// result holds accumulator `k`'s part (the unpack transpose; every step is
/// a one-µop shuffle or add, unlike `vphaddd`).
macro_rules! transpose_add4 {
    ($unlo32:ident, $unhi32:ident, $unlo64:ident, $unhi64:ident, $add:ident, $a:expr) => {{
        let a = $a;
        // Per lane: [x0+x2, y0+y2, x1+x3, y1+y3].
        let pair = |x, y| $add($unlo32(x, y), $unhi32(x, y));
        let (t01, t23) = (pair(a[0], a[1]), pair(a[2], a[3]));
        $add($unlo64(t01, t23), $unhi64(t01, t23))
    }};
}

/// Eight 8-lane i32 accumulators → their eight sums, in order.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum8_256(a: [__m256i; GROUP]) -> __m256i {
    let lo = transpose_add4!(
        _mm256_unpacklo_epi32,
        _mm256_unpackhi_epi32,
        _mm256_unpacklo_epi64,
        _mm256_unpackhi_epi64,
        _mm256_add_epi32,
        [a[0], a[1], a[2], a[3]]
    );
    let hi = transpose_add4!(
        _mm256_unpacklo_epi32,
        _mm256_unpackhi_epi32,
        _mm256_unpacklo_epi64,
        _mm256_unpackhi_epi64,
        _mm256_add_epi32,
        [a[4], a[5], a[6], a[7]]
    );
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(lo, hi),
        _mm256_permute2x128_si256::<0x31>(lo, hi),
    )
}

/// Eight 16-lane i32 accumulators → their eight sums, in order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn hsum8_512(a: [__m512i; GROUP]) -> __m256i {
    let lo = transpose_add4!(
        _mm512_unpacklo_epi32,
        _mm512_unpackhi_epi32,
        _mm512_unpacklo_epi64,
        _mm512_unpackhi_epi64,
        _mm512_add_epi32,
        [a[0], a[1], a[2], a[3]]
    );
    let hi = transpose_add4!(
        _mm512_unpacklo_epi32,
        _mm512_unpackhi_epi32,
        _mm512_unpacklo_epi64,
        _mm512_unpackhi_epi64,
        _mm512_add_epi32,
        [a[4], a[5], a[6], a[7]]
    );
    // Lanes [lo0+lo1, lo2+lo3, hi0+hi1, hi2+hi3], then pairs of those.
    let w = _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0b10_00_10_00>(lo, hi),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(lo, hi),
    );
    let r = _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0b00_00_10_00>(w, w),
        _mm512_shuffle_i32x4::<0b00_00_11_01>(w, w),
    );
    _mm512_castsi512_si256(r)
}

/// Eight rows' results, `(sum - corr) as f32 · (scale · sx)`, written to
/// `y[..take]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn finish8(
    sums: __m256i,
    corr: __m256i,
    scales: [f32; GROUP],
    sx: f32,
    y: &mut [f32],
    take: usize,
) {
    let s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sums, corr));
    // SAFETY: `scales` holds 8 floats.
    let sc = unsafe { _mm256_loadu_ps(scales.as_ptr()) };
    let v = _mm256_mul_ps(s, _mm256_mul_ps(sc, _mm256_set1_ps(sx)));
    if take == GROUP && y.len() >= GROUP {
        // SAFETY: `y` holds at least 8 floats (checked).
        unsafe { _mm256_storeu_ps(y.as_mut_ptr(), v) };
    } else {
        let mut t = [0.0f32; GROUP];
        // SAFETY: `t` holds 8 floats.
        unsafe { _mm256_storeu_ps(t.as_mut_ptr(), v) };
        y[..take].copy_from_slice(&t[..take]);
    }
}

// --- AVX2 ----------------------------------------------------------------------

/// `y[i] = Σ_c w[row0+i][c]·xq[c]` scaled, for AVX2.
///
/// # Safety
/// The CPU must support AVX2 and FMA. `cols >= 32`; `w` holds at least
/// `(row0 + y.len()) · cols` weights, all in −127..=127; `scales` at least
/// `row0 + y.len()` entries; `xq` and `xa` (= |xq|) at least `cols` bytes,
/// `xq` in −127..=127.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_avx2(
    w: &[i8],
    cols: usize,
    scales: &[f32],
    xq: &[i8],
    xa: &[u8],
    sx: f32,
    row0: usize,
    y: &mut [f32],
) {
    debug_assert!(cols >= 32 && xq.len() >= cols && xa.len() >= cols);
    debug_assert!(w.len() >= (row0 + y.len()) * cols && scales.len() >= row0 + y.len());
    let main = cols / 32 * 32;
    let rem = cols - main;
    // The tail re-reads a row's last 32 bytes; zero the activation lanes
    // that `main` already covered (lane j < 32 - rem).
    let tail = cols - 32;
    let keep = _mm256_cmpgt_epi8(
        _mm256_setr_epi8(
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
            24, 25, 26, 27, 28, 29, 30, 31,
        ),
        _mm256_set1_epi8(31 - rem as i8),
    );
    // SAFETY: `tail + 32 = cols` bytes of `xq`/`xa` are readable.
    let (tail_s, tail_a) = unsafe {
        (
            _mm256_and_si256(_mm256_loadu_si256(xq.as_ptr().add(tail).cast()), keep),
            _mm256_and_si256(_mm256_loadu_si256(xa.as_ptr().add(tail).cast()), keep),
        )
    };
    let ones = _mm256_set1_epi16(1);
    // |x| · sign(w, x) = x · w, pairs exact in i16 (see the module docs).
    let step = |acc: __m256i, xa: __m256i, xs: __m256i, wv: __m256i| {
        let p = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(wv, xs));
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones))
    };
    let n = y.len();
    let mut i = 0;
    while i < n {
        let take = (n - i).min(GROUP);
        let rows = group(row0, i, take);
        // SAFETY: every row index is below `row0 + n`, so its `cols`
        // weights are inside `w`.
        let p = rows.map(|r| unsafe { w.as_ptr().add(r * cols) });
        let mut acc = [_mm256_setzero_si256(); GROUP];
        let mut c = 0;
        while c < main {
            // SAFETY: `c + 32 <= main <= cols`: inside the activation and
            // inside each row.
            unsafe {
                let xa = _mm256_loadu_si256(xa.as_ptr().add(c).cast());
                let xs = _mm256_loadu_si256(xq.as_ptr().add(c).cast());
                for j in 0..GROUP {
                    let wv = _mm256_loadu_si256(p[j].add(c).cast());
                    acc[j] = step(acc[j], xa, xs, wv);
                }
            }
            c += 32;
        }
        if rem != 0 {
            for j in 0..GROUP {
                // SAFETY: bytes `tail..cols` of the row.
                let wv = unsafe { _mm256_loadu_si256(p[j].add(tail).cast()) };
                acc[j] = step(acc[j], tail_a, tail_s, wv);
            }
        }
        finish8(
            hsum8_256(acc),
            _mm256_setzero_si256(),
            gather8(scales, rows),
            sx,
            &mut y[i..],
            take,
        );
        i += GROUP;
    }
}

// --- AVX-512 VNNI ----------------------------------------------------------------

/// `y[i] = Σ_c w[row0+i][c]·(xu[c] - 128)` scaled, for AVX-512 VNNI.
///
/// # Safety
/// The CPU must support the AVX-512 set with VNNI. `w` holds at least
/// `(row0 + y.len()) · cols` weights; `scales` and `row_sums` (Σ of each
/// row's weights) at least `row0 + y.len()` entries; `xu` (= xq + 128) is
/// at least `cols` rounded up to a multiple of 64 bytes long.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_vnni(
    w: &[i8],
    cols: usize,
    scales: &[f32],
    row_sums: &[i32],
    xu: &[u8],
    sx: f32,
    row0: usize,
    y: &mut [f32],
) {
    debug_assert!(xu.len() >= cols.div_ceil(64) * 64);
    debug_assert!(w.len() >= (row0 + y.len()) * cols);
    debug_assert!(scales.len() >= row0 + y.len() && row_sums.len() >= row0 + y.len());
    let main = cols / 64 * 64;
    let rem = cols - main;
    let tail_mask: __mmask64 = if rem == 0 { 0 } else { (1u64 << rem) - 1 };
    let n = y.len();
    let mut i = 0;
    while i < n {
        let take = (n - i).min(GROUP);
        let rows = group(row0, i, take);
        // SAFETY: every row index is below `row0 + n`, so its `cols`
        // weights are inside `w`.
        let p = rows.map(|r| unsafe { w.as_ptr().add(r * cols) });
        let mut acc = [_mm512_setzero_si512(); GROUP];
        let mut c = 0;
        while c < main {
            // SAFETY: `c + 64 <= main <= cols`: inside the activation and
            // inside each row.
            unsafe {
                let xv = _mm512_loadu_si512(xu.as_ptr().add(c).cast());
                for j in 0..GROUP {
                    let wv = _mm512_loadu_si512(p[j].add(c).cast());
                    acc[j] = _mm512_dpbusd_epi32(acc[j], xv, wv);
                }
            }
            c += 64;
        }
        if rem != 0 {
            // SAFETY: the activation is padded to whole 64-byte lines; the
            // weight loads read only the `rem` unmasked bytes, inside the
            // row (masked-off bytes are not accessed and read as 0).
            unsafe {
                let xv = _mm512_loadu_si512(xu.as_ptr().add(main).cast());
                for j in 0..GROUP {
                    let wv = _mm512_maskz_loadu_epi8(tail_mask, p[j].add(main));
                    acc[j] = _mm512_dpbusd_epi32(acc[j], xv, wv);
                }
            }
        }
        let sums = gather8(row_sums, rows);
        // SAFETY: `sums` holds 8 i32.
        let corr = _mm256_slli_epi32::<7>(unsafe { _mm256_loadu_si256(sums.as_ptr().cast()) });
        finish8(
            hsum8_512(acc),
            corr,
            gather8(scales, rows),
            sx,
            &mut y[i..],
            take,
        );
        i += GROUP;
    }
}

/// Row blocks of 16 that share each activation broadcast.
const PACKED_GROUP: usize = 4;

/// Σ over all column groups of `NB` packed blocks against the broadcast
/// activation, one i32 lane per row. Two accumulators per block (even and
/// odd column groups) keep 2·NB independent `vpdpbusd` chains in flight;
/// the sums are integers, so the split changes nothing.
///
/// # Safety
/// The CPU must support the AVX-512 set with VNNI; each `p[j]` points at
/// `groups·64` readable bytes and `xq` holds at least `groups·4` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
unsafe fn dot_blocks<const NB: usize>(
    p: [*const u8; NB],
    xq: &[i8],
    groups: usize,
) -> [__m512i; NB] {
    let (mut even, mut odd) = ([_mm512_setzero_si512(); NB], [_mm512_setzero_si512(); NB]);
    // SAFETY: (all loads) 4 bytes at 4g < groups·4; 64 bytes at g·64 of
    // each block, g < groups.
    let step = |acc: &mut [__m512i; NB], g: usize| unsafe {
        let xb = _mm512_set1_epi32(xq.as_ptr().add(4 * g).cast::<i32>().read_unaligned());
        for j in 0..NB {
            let wv = _mm512_loadu_si512(p[j].add(g * 64).cast());
            acc[j] = _mm512_dpbusd_epi32(acc[j], wv, xb);
        }
    };
    let mut g = 0;
    while g + 1 < groups {
        step(&mut even, g);
        step(&mut odd, g + 1);
        g += 2;
    }
    if g < groups {
        step(&mut even, g);
    }
    std::array::from_fn(|j| _mm512_add_epi32(even[j], odd[j]))
}

/// `NB` block sums padded with zeros to a whole group.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
fn pad<const NB: usize>(a: [__m512i; NB]) -> [__m512i; PACKED_GROUP] {
    std::array::from_fn(|j| if j < NB { a[j] } else { _mm512_setzero_si512() })
}

/// `y[i] = Σ_c w[row0+i][c]·xq[c]` scaled, from the packed layout (see the
/// parent module): block `b` holds rows `16b..16b+16`, bytes
/// `b·bb + g·64 + lane·4 + k` = `w[16b + lane][4g + k] + 128`.
///
/// # Safety
/// The CPU must support the AVX-512 set with VNNI. `packed` holds
/// `ceil(rows/16)` blocks of `bb = ceil(cols/4)·64` bytes for every row up
/// to `row0 + y.len()`; `scales` at least `row0 + y.len()` entries; `xq`
/// at least `cols` rounded up to 4 bytes, zero past `cols`; `xsum` = Σ xq.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_vnni_packed(
    packed: &[u8],
    cols: usize,
    scales: &[f32],
    xq: &[i8],
    xsum: i32,
    sx: f32,
    row0: usize,
    y: &mut [f32],
) {
    let n = y.len();
    if n == 0 {
        return;
    }
    let groups = cols.div_ceil(4);
    let bb = groups * 64;
    debug_assert!(xq.len() >= groups * 4);
    debug_assert!(packed.len() >= (row0 + n).div_ceil(16) * bb);
    debug_assert!(scales.len() >= row0 + n);
    let corr = _mm512_set1_epi32(xsum.wrapping_mul(128));
    let vsx = _mm512_set1_ps(sx);
    let (first, end) = (row0 / 16, (row0 + n).div_ceil(16)); // blocks
                                                             // Groups of at most PACKED_GROUP blocks, as even as possible (a lone
                                                             // last block would run one dependent chain).
    let n_groups = (end - first).div_ceil(PACKED_GROUP);
    let mut b = first;
    for gi in 0..n_groups {
        let nb = (end - b).div_ceil(n_groups - gi);
        // SAFETY: blocks b..b+nb are inside `packed` (b + nb <= end), each
        // `bb = groups·64` bytes; `xq` holds at least groups·4 bytes.
        let acc: [__m512i; PACKED_GROUP] = unsafe {
            let at = |j: usize| packed.as_ptr().add((b + j) * bb);
            match nb {
                1 => pad(dot_blocks([at(0)], xq, groups)),
                2 => pad(dot_blocks([at(0), at(1)], xq, groups)),
                3 => pad(dot_blocks([at(0), at(1), at(2)], xq, groups)),
                _ => dot_blocks([at(0), at(1), at(2), at(3)], xq, groups),
            }
        };
        for (j, &a) in acc.iter().enumerate().take(nb) {
            // Rows r0..r0+16 of this block; those in row0..row0+n are kept.
            let r0 = 16 * (b + j);
            let (lo, hi) = (r0.max(row0), (r0 + 16).min(row0 + n));
            let s = _mm512_cvtepi32_ps(_mm512_sub_epi32(a, corr));
            if lo == r0 && hi == r0 + 16 {
                // SAFETY: rows r0..r0+16 are all in row0..row0+n: inside
                // `scales`, and at r0 - row0.. inside `y`.
                unsafe {
                    let sc = _mm512_loadu_ps(scales.as_ptr().add(r0));
                    let v = _mm512_mul_ps(s, _mm512_mul_ps(sc, vsx));
                    _mm512_storeu_ps(y.as_mut_ptr().add(r0 - row0), v);
                }
            } else {
                let mut sc = [0.0f32; 16];
                sc[lo - r0..hi - r0].copy_from_slice(&scales[lo..hi]);
                let mut t = [0.0f32; 16];
                // SAFETY: both arrays hold 16 floats.
                unsafe {
                    let v = _mm512_mul_ps(s, _mm512_mul_ps(_mm512_loadu_ps(sc.as_ptr()), vsx));
                    _mm512_storeu_ps(t.as_mut_ptr(), v);
                }
                y[lo - row0..hi - row0].copy_from_slice(&t[lo - r0..hi - r0]);
            }
        }
        b += nb;
    }
}

/// What the packed multi kernel needs of one activation: `q` zero-padded
/// to whole 4-byte groups, Σ q, and the scale.
#[derive(Clone, Copy)]
pub(super) struct PackedAct<'a> {
    pub q: &'a [i8],
    pub sum: i32,
    pub scale: f32,
}

/// Activations per step of [`rows_vnni_packed_multi`]: four blocks × four
/// activations = 16 accumulators, plus four broadcasts and a weight, fit
/// the 32 zmm registers.
pub(super) const MULTI_ACTS: usize = 4;

/// Σ over all column groups of `NB` packed blocks against each of `NA`
/// broadcast activations: one 64-byte weight load feeds `NA` `vpdpbusd`,
/// the point of running several activations at once. Integer sums, so the
/// result equals `NA` runs of [`dot_blocks`].
///
/// # Safety
/// As [`dot_blocks`], for every activation: each `p[j]` points at
/// `groups·64` readable bytes and each `xs[a]` at `groups·4`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
unsafe fn dot_blocks_multi<const NB: usize, const NA: usize>(
    p: [*const u8; NB],
    xs: [*const i8; NA],
    groups: usize,
) -> [[__m512i; NB]; NA] {
    let mut acc = [[_mm512_setzero_si512(); NB]; NA];
    for g in 0..groups {
        let mut xb = [_mm512_setzero_si512(); NA];
        for a in 0..NA {
            // SAFETY: 4 bytes at 4g < groups·4 of activation a.
            xb[a] = _mm512_set1_epi32(unsafe { xs[a].add(4 * g).cast::<i32>().read_unaligned() });
        }
        for j in 0..NB {
            // SAFETY: 64 bytes at g·64 < groups·64 of block j.
            let wv = unsafe { _mm512_loadu_si512(p[j].add(g * 64).cast()) };
            for a in 0..NA {
                acc[a][j] = _mm512_dpbusd_epi32(acc[a][j], wv, xb[a]);
            }
        }
    }
    acc
}

/// `NA` activations' `NB` block sums padded with zeros to whole groups.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
fn pad_multi<const NB: usize, const NA: usize>(
    a: [[__m512i; NB]; NA],
) -> [[__m512i; PACKED_GROUP]; MULTI_ACTS] {
    let mut out = [[_mm512_setzero_si512(); PACKED_GROUP]; MULTI_ACTS];
    for (o, r) in out.iter_mut().zip(a) {
        o[..NB].copy_from_slice(&r);
    }
    out
}

/// A `match` over the activation count `$na` (1..=4) running
/// [`dot_blocks_multi`] on the block pointers `$p` and the first `$na`
/// activation pointers of `$x`.
macro_rules! dot_acts {
    ($p:expr, $na:expr, $x:expr, $groups:expr) => {{
        let (p, x, g) = ($p, $x, $groups);
        match $na {
            1 => pad_multi(dot_blocks_multi(p, [x[0]], g)),
            2 => pad_multi(dot_blocks_multi(p, [x[0], x[1]], g)),
            3 => pad_multi(dot_blocks_multi(p, [x[0], x[1], x[2]], g)),
            _ => pad_multi(dot_blocks_multi(p, [x[0], x[1], x[2], x[3]], g)),
        }
    }};
}

/// [`rows_vnni_packed`] for several activations at once, the weights read
/// once per [`MULTI_ACTS`] activations: `ys[a][i] = Σ_c w[row0+i][c] ·
/// xs[a].q[c]` scaled, for `i < n`. Each output is computed exactly as
/// [`rows_vnni_packed`] computes it (same integer sum, same two float
/// products). With `pairs`, activations `2p` and `2p + 1` make output
/// `p`: the two scaled products added (`ys` has one output per pair).
///
/// # Safety
/// As [`rows_vnni_packed`] for the `n` rows from `row0` and every
/// activation (`q` at least `cols` rounded up to 4 bytes, zero past
/// `cols`; `sum` = Σ q). `ys` has one output per activation (per pair
/// when `pairs`, and then `xs` holds whole pairs), each at least `n`
/// long.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
// `j` indexes the block of every activation's sums (`acc[a][j]`).
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub(super) unsafe fn rows_vnni_packed_multi(
    packed: &[u8],
    cols: usize,
    scales: &[f32],
    xs: &[PackedAct<'_>],
    row0: usize,
    n: usize,
    ys: &mut [&mut [f32]],
    pairs: bool,
) {
    let k = xs.len();
    if k == 0 || n == 0 {
        return;
    }
    let per_out = if pairs { 2 } else { 1 };
    assert!(
        k.is_multiple_of(per_out),
        "rows_vnni_packed_multi: half a pair"
    );
    assert!(ys.len() >= k / per_out && ys.iter().all(|y| y.len() >= n));
    let groups = cols.div_ceil(4);
    let bb = groups * 64;
    debug_assert!(xs.iter().all(|x| x.q.len() >= groups * 4));
    debug_assert!(packed.len() >= (row0 + n).div_ceil(16) * bb);
    debug_assert!(scales.len() >= row0 + n);
    let (first, end) = (row0 / 16, (row0 + n).div_ceil(16)); // blocks
    let n_groups = (end - first).div_ceil(PACKED_GROUP);
    let mut b = first;
    for gi in 0..n_groups {
        let nb = (end - b).div_ceil(n_groups - gi);
        for a0 in (0..k).step_by(MULTI_ACTS) {
            let na = (k - a0).min(MULTI_ACTS);
            let mut x = [xs[a0].q.as_ptr(); MULTI_ACTS];
            for (xp, act) in x.iter_mut().zip(&xs[a0..a0 + na]) {
                *xp = act.q.as_ptr();
            }
            // SAFETY: blocks b..b+nb are inside `packed` (b + nb <= end),
            // each `bb = groups·64` bytes; every activation holds at least
            // groups·4 bytes.
            let acc = unsafe {
                let at = |j: usize| packed.as_ptr().add((b + j) * bb);
                match nb {
                    1 => dot_acts!([at(0)], na, x, groups),
                    2 => dot_acts!([at(0), at(1)], na, x, groups),
                    3 => dot_acts!([at(0), at(1), at(2)], na, x, groups),
                    _ => dot_acts!([at(0), at(1), at(2), at(3)], na, x, groups),
                }
            };
            for o in 0..na / per_out {
                let y = &mut *ys[a0 / per_out + o];
                for j in 0..nb {
                    // As in `rows_vnni_packed`: rows r0..r0+16 of this
                    // block, those in row0..row0+n kept.
                    let r0 = 16 * (b + j);
                    let (lo, hi) = (r0.max(row0), (r0 + 16).min(row0 + n));
                    let whole = lo == r0 && hi == r0 + 16;
                    let mut sc_part = [0.0f32; 16];
                    let sc = if whole {
                        // SAFETY: rows r0..r0+16 are inside `scales` (all
                        // below row0 + n).
                        unsafe { _mm512_loadu_ps(scales.as_ptr().add(r0)) }
                    } else {
                        sc_part[lo - r0..hi - r0].copy_from_slice(&scales[lo..hi]);
                        // SAFETY: the array holds 16 floats.
                        unsafe { _mm512_loadu_ps(sc_part.as_ptr()) }
                    };
                    let scaled = |a: usize| {
                        let act = &xs[a0 + a];
                        let corr = _mm512_set1_epi32(act.sum.wrapping_mul(128));
                        let s = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[a][j], corr));
                        _mm512_mul_ps(s, _mm512_mul_ps(sc, _mm512_set1_ps(act.scale)))
                    };
                    let v = if pairs {
                        _mm512_add_ps(scaled(2 * o), scaled(2 * o + 1))
                    } else {
                        scaled(o)
                    };
                    if whole {
                        let y = &mut y[r0 - row0..r0 - row0 + 16];
                        // SAFETY: `y` holds those 16 floats.
                        unsafe { _mm512_storeu_ps(y.as_mut_ptr(), v) };
                    } else {
                        let mut t = [0.0f32; 16];
                        // SAFETY: the array holds 16 floats.
                        unsafe { _mm512_storeu_ps(t.as_mut_ptr(), v) };
                        y[lo - row0..hi - row0].copy_from_slice(&t[lo - r0..hi - r0]);
                    }
                }
            }
        }
        b += nb;
    }
}

/// Row blocks per group of [`rows_vnni_packed_pair`]: 8 blocks × the two
/// halves = 16 accumulators, plus two broadcasts and a weight, fit the 32
/// zmm registers.
const PAIR_GROUP: usize = 8;

/// Σ over all column groups of `NB` consecutive packed blocks (from `p`,
/// `bb` bytes each) against both halves of a pair: one weight load feeds
/// two `vpdpbusd`. Integer sums, so they equal [`dot_blocks`]' per half.
///
/// # Safety
/// The CPU must support the AVX-512 set with VNNI; `p` points at `NB·bb`
/// readable bytes, `bb = groups·64`; `hi` and `lo` at `groups·4` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
unsafe fn dot_blocks_pair<const NB: usize>(
    p: *const u8,
    bb: usize,
    hi: *const i8,
    lo: *const i8,
    groups: usize,
) -> ([__m512i; NB], [__m512i; NB]) {
    let (mut ah, mut al) = ([_mm512_setzero_si512(); NB], [_mm512_setzero_si512(); NB]);
    for g in 0..groups {
        // SAFETY: 4 bytes at 4g < groups·4 of each half; 64 bytes at
        // j·bb + g·64 < NB·bb.
        unsafe {
            let xh = _mm512_set1_epi32(hi.add(4 * g).cast::<i32>().read_unaligned());
            let xl = _mm512_set1_epi32(lo.add(4 * g).cast::<i32>().read_unaligned());
            for j in 0..NB {
                let wv = _mm512_loadu_si512(p.add(j * bb + g * 64).cast());
                ah[j] = _mm512_dpbusd_epi32(ah[j], wv, xh);
                al[j] = _mm512_dpbusd_epi32(al[j], wv, xl);
            }
        }
    }
    (ah, al)
}

/// [`rows_vnni_packed_multi`] with `pairs` for exactly one pair (`hi`,
/// `lo`), the case of every decoded token: blocks in groups of up to
/// [`PAIR_GROUP`], the scale products hoisted out of the loop over
/// blocks, and a block's 16 outputs stored with one (masked) store. Each
/// output is computed as `rows_vnni_packed_multi` computes it: the same
/// integer sums, the same float products in the same order.
///
/// # Safety
/// As [`rows_vnni_packed`] for the `n` rows from `row0` and both halves;
/// `y` holds at least `n` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_vnni_packed_pair(
    packed: &[u8],
    cols: usize,
    scales: &[f32],
    hi: PackedAct<'_>,
    lo: PackedAct<'_>,
    row0: usize,
    n: usize,
    y: &mut [f32],
) {
    if n == 0 {
        return;
    }
    assert!(y.len() >= n);
    let groups = cols.div_ceil(4);
    let bb = groups * 64;
    debug_assert!(hi.q.len() >= groups * 4 && lo.q.len() >= groups * 4);
    debug_assert!(packed.len() >= (row0 + n).div_ceil(16) * bb);
    debug_assert!(scales.len() >= row0 + n);
    let (corr_h, corr_l) = (
        _mm512_set1_epi32(hi.sum.wrapping_mul(128)),
        _mm512_set1_epi32(lo.sum.wrapping_mul(128)),
    );
    let (sx_h, sx_l) = (_mm512_set1_ps(hi.scale), _mm512_set1_ps(lo.scale));
    let (first, end) = (row0 / 16, (row0 + n).div_ceil(16)); // blocks
    let n_groups = (end - first).div_ceil(PAIR_GROUP);
    let mut b = first;
    for gi in 0..n_groups {
        // Groups as even as possible (a lone last block would run two
        // dependent chains).
        let nb = (end - b).div_ceil(n_groups - gi);
        // SAFETY: blocks b..b+nb are inside `packed` (b + nb <= end), each
        // `bb` bytes; both halves hold at least groups·4 bytes.
        let (ah, al): ([__m512i; PAIR_GROUP], [__m512i; PAIR_GROUP]) = unsafe {
            let (p, h, l) = (packed.as_ptr().add(b * bb), hi.q.as_ptr(), lo.q.as_ptr());
            macro_rules! run {
                ($nb:literal) => {{
                    let (u, v) = dot_blocks_pair::<$nb>(p, bb, h, l, groups);
                    let z = _mm512_setzero_si512();
                    (
                        std::array::from_fn(|j| if j < $nb { u[j] } else { z }),
                        std::array::from_fn(|j| if j < $nb { v[j] } else { z }),
                    )
                }};
            }
            match nb {
                1 => run!(1),
                2 => run!(2),
                3 => run!(3),
                4 => run!(4),
                5 => run!(5),
                6 => run!(6),
                7 => run!(7),
                _ => run!(8),
            }
        };
        for j in 0..nb {
            // Rows r0..r0+16 of this block; those in row0..row0+n are kept.
            let r0 = 16 * (b + j);
            let (lo_r, hi_r) = (r0.max(row0), (r0 + 16).min(row0 + n));
            let finish = |sc: __m512| {
                let s_h = _mm512_cvtepi32_ps(_mm512_sub_epi32(ah[j], corr_h));
                let s_l = _mm512_cvtepi32_ps(_mm512_sub_epi32(al[j], corr_l));
                _mm512_add_ps(
                    _mm512_mul_ps(s_h, _mm512_mul_ps(sc, sx_h)),
                    _mm512_mul_ps(s_l, _mm512_mul_ps(sc, sx_l)),
                )
            };
            if lo_r == r0 {
                // Lanes 0..hi_r - r0: rows r0.. of `scales` and outputs
                // r0 - row0.. of `y`, both in bounds from their first lane.
                let m: __mmask16 = if hi_r - r0 == 16 {
                    !0
                } else {
                    (1u16 << (hi_r - r0)) - 1
                };
                // SAFETY: the unmasked lanes are rows r0..hi_r < row0 + n,
                // inside `scales`, and outputs r0 - row0..hi_r - row0 < n,
                // inside `y`; masked lanes are neither read nor written.
                unsafe {
                    let sc = _mm512_maskz_loadu_ps(m, scales.as_ptr().add(r0));
                    _mm512_mask_storeu_ps(y.as_mut_ptr().add(r0 - row0), m, finish(sc));
                }
            } else {
                // The first block of a range starting inside it.
                let mut sc = [0.0f32; 16];
                sc[lo_r - r0..hi_r - r0].copy_from_slice(&scales[lo_r..hi_r]);
                let mut t = [0.0f32; 16];
                // SAFETY: both arrays hold 16 floats.
                unsafe { _mm512_storeu_ps(t.as_mut_ptr(), finish(_mm512_loadu_ps(sc.as_ptr()))) };
                y[lo_r - row0..hi_r - row0].copy_from_slice(&t[lo_r - r0..hi_r - r0]);
            }
        }
        b += nb;
    }
}
