//! The AVX-512 and AVX2 K-quant tile kernels (layout and arithmetic in the
//! parent module).
//!
//! No closures or generic helpers inside the kernels: a closure does not
//! inherit `#[target_feature]`, so the intrinsics in it would become calls.

use super::{activation, min_pair, q4k, q5k, q6k, KTile, Q4K, Q5K, Q6K, SUBS};
use crate::prefetch;
use crate::quant::q8_0::x86::fifth_bits;
use crate::quant::q8_k::BlockQ8K;
use crate::quant::tiles::TILE_ROWS;
use core::arch::x86_64::*;

/// The driver shared by the AVX-512 kernels: activations in groups of up
/// to 8, each group one pass over the tile.
macro_rules! avx512_driver {
    ($name:ident, $group:ident, $ty:ty) => {
        /// [`crate::quant::tiles::TileDotFn`] on AVX-512.
        ///
        /// # Safety
        /// The CPU must support the [`crate::Isa::Avx512`] feature set.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
        pub unsafe fn $name(
            tile: &[u8],
            nb: usize,
            acts: &[u8],
            stride: usize,
            n: usize,
            out: &mut [f32],
        ) {
            // The bounds every unchecked load below relies on.
            super::check_dot_bounds::<$ty>(tile, nb, n, out);
            let mut c = 0;
            while c < n {
                macro_rules! run {
                    ($size:literal) => {{
                        // activation() checks each activation's length.
                        let a: [&[BlockQ8K]; $size] =
                            core::array::from_fn(|k| activation(acts, (c + k) * stride, nb / SUBS));
                        // SAFETY: the tile holds nb / 8 superblocks (asserted
                        // above) and each activation as many (activation()).
                        let acc = unsafe { $group::<$ty, $size>(tile.as_ptr(), nb / SUBS, a) };
                        for (k, v) in acc.iter().enumerate() {
                            let o = &mut out[TILE_ROWS * (c + k)..TILE_ROWS * (c + k + 1)];
                            // SAFETY: o is 16 floats long.
                            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *v) };
                        }
                        $size
                    }};
                }
                c += match n - c {
                    8.. => run!(8),
                    7 => run!(7),
                    6 => run!(6),
                    5 => run!(5),
                    4 => run!(4),
                    3 => run!(3),
                    2 => run!(2),
                    _ => run!(1),
                };
            }
        }
    };
}

avx512_driver!(dot_avx512_q4k, group_q4k, Q4K);
avx512_driver!(dot_avx512_q5k, group_q4k, Q5K);
avx512_driver!(dot_avx512_q6k, group_q6k, Q6K);

/// 4 activation bytes from byte `$off` at `$y`, in every 32-bit lane.
macro_rules! bcast512 {
    ($y:expr, $off:expr) => {
        _mm512_set1_epi32(core::ptr::read_unaligned($y.add($off).cast::<i32>()))
    };
}

/// One pass over a Q4_K tile of `ns` superblocks for `N` activations.
///
/// # Safety
/// AVX-512 as above; `tile` points at a Q4_K tile of `ns` superblocks and
/// every activation holds `ns` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn group_q4k<T: KTile, const N: usize>(
    tile: *const u8,
    ns: usize,
    acts: [&[BlockQ8K]; N],
) -> [__m512; N] {
    // SAFETY: the caller's contract: every offset below is inside
    // superblock `s < ns` of the tile, or block `s` of an activation.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); N];
        let low = _mm512_set1_epi8(0x0f);
        for s in 0..ns {
            let t = tile.add(s * T::SB);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(t.cast()));
            let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(t.add(q4k::DMIN).cast()));
            let mut isum = [_mm512_setzero_si512(); N];
            let mut summ = [_mm512_setzero_si512(); N];
            for j in 0..SUBS {
                let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(t.add(q4k::SC + 16 * j).cast()));
                let q = t.add(q4k::QS + T::PAIR * (j / 2));
                let shift = _mm_cvtsi32_si128(4 * (j % 2) as i32);
                let mut w = [_mm512_setzero_si512(); 8];
                for (k, w) in w.iter_mut().enumerate() {
                    let v = _mm512_loadu_si512(q.add(64 * k).cast());
                    *w = _mm512_and_si512(_mm512_srl_epi16(v, shift), low);
                    if T::FIFTH {
                        // Bit k of each byte of the sub-block's plane.
                        let plane = _mm512_loadu_si512(q.add(q5k::MASKS + 64 * (j % 2)).cast());
                        let mask = _mm512_test_epi8_mask(plane, _mm512_set1_epi8(1 << k));
                        *w = _mm512_mask_add_epi8(*w, mask, *w, _mm512_set1_epi8(16));
                    }
                }
                for (a, isum) in acts.iter().zip(isum.iter_mut()) {
                    let y = a.get_unchecked(s).qs.as_ptr().add(32 * j);
                    // Two chains, so the dpbusd latencies overlap.
                    let zero = _mm512_setzero_si512();
                    let mut s0 = _mm512_dpbusd_epi32(zero, w[0], bcast512!(y, 0));
                    let mut s1 = _mm512_dpbusd_epi32(zero, w[1], bcast512!(y, 4));
                    s0 = _mm512_dpbusd_epi32(s0, w[2], bcast512!(y, 8));
                    s1 = _mm512_dpbusd_epi32(s1, w[3], bcast512!(y, 12));
                    s0 = _mm512_dpbusd_epi32(s0, w[4], bcast512!(y, 16));
                    s1 = _mm512_dpbusd_epi32(s1, w[5], bcast512!(y, 20));
                    s0 = _mm512_dpbusd_epi32(s0, w[6], bcast512!(y, 24));
                    s1 = _mm512_dpbusd_epi32(s1, w[7], bcast512!(y, 28));
                    let sum = _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc);
                    *isum = _mm512_add_epi32(*isum, sum);
                }
            }
            for p in 0..4 {
                let mins =
                    _mm512_cvtepu8_epi16(_mm256_loadu_si256(t.add(q4k::MIN + 32 * p).cast()));
                for (a, summ) in acts.iter().zip(summ.iter_mut()) {
                    let pair = _mm512_set1_epi32(min_pair(a.get_unchecked(s), p));
                    *summ = _mm512_add_epi32(*summ, _mm512_madd_epi16(mins, pair));
                }
            }
            for (((a, isum), summ), acc) in acts.iter().zip(isum).zip(summ).zip(acc.iter_mut()) {
                let dy = _mm512_set1_ps(a.get_unchecked(s).d);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, dy), *acc);
                *acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ), _mm512_mul_ps(dmin, dy), *acc);
            }
        }
        acc
    }
}

/// One pass over a Q6_K tile of `ns` superblocks for `N` activations.
///
/// # Safety
/// As [`group_q4k`], for a Q6_K tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn group_q6k<T: KTile, const N: usize>(
    tile: *const u8,
    ns: usize,
    acts: [&[BlockQ8K]; N],
) -> [__m512; N] {
    // SAFETY: as in `group_q4k`.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); N];
        let low = _mm512_set1_epi8(0x0f);
        let top = _mm512_set1_epi8(0x30);
        for s in 0..ns {
            let t = tile.add(s * Q6K::SB);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(t.cast()));
            let mut isum = [_mm512_setzero_si512(); N];
            for p in 0..SUBS / 2 {
                let q = t.add(q6k::QS + q6k::PAIR * p);
                let mut v = [_mm512_setzero_si512(); 8];
                for (k, v) in v.iter_mut().enumerate() {
                    *v = _mm512_loadu_si512(q.add(64 * k).cast());
                }
                let mut h = [_mm512_setzero_si512(); 4];
                for (m, h) in h.iter_mut().enumerate() {
                    *h = _mm512_loadu_si512(q.add(q6k::HIGH + 64 * m).cast());
                }
                for odd in [false, true] {
                    let j = 2 * p + odd as usize;
                    let at = q6k::SC + 32 * j;
                    let sc0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(t.add(at).cast()));
                    let sc1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(t.add(at + 16).cast()));
                    // The nibble (low for the even block, high for the odd)
                    // or'ed (ternary 0xEC: `(a & c) | b`) with the top bits,
                    // which sit at bits 0, 2 (groups 0..4) or 4, 6 (4..8)
                    // of `h` and go to bit 4: immediate shifts per block.
                    let mut w = [_mm512_setzero_si512(); 8];
                    for m in 0..4 {
                        let (v0, v1, h0, h1) = if odd {
                            (
                                _mm512_srli_epi16::<4>(v[m]),
                                _mm512_srli_epi16::<4>(v[m + 4]),
                                _mm512_slli_epi16::<2>(h[m]),
                                _mm512_srli_epi16::<2>(h[m]),
                            )
                        } else {
                            (v[m], v[m + 4], _mm512_slli_epi16::<4>(h[m]), h[m])
                        };
                        let h0 = _mm512_and_si512(h0, top);
                        let h1 = _mm512_and_si512(h1, top);
                        w[m] = _mm512_ternarylogic_epi32::<0xEC>(v0, h0, low);
                        w[m + 4] = _mm512_ternarylogic_epi32::<0xEC>(v1, h1, low);
                    }
                    for (a, isum) in acts.iter().zip(isum.iter_mut()) {
                        let yb = a.get_unchecked(s);
                        let y = yb.qs.as_ptr().add(32 * j);
                        let mut s0 = _mm512_set1_epi32(-32 * *yb.bsums.get_unchecked(2 * j) as i32);
                        let mut s1 =
                            _mm512_set1_epi32(-32 * *yb.bsums.get_unchecked(2 * j + 1) as i32);
                        s0 = _mm512_dpbusd_epi32(s0, w[0], bcast512!(y, 0));
                        s1 = _mm512_dpbusd_epi32(s1, w[4], bcast512!(y, 16));
                        s0 = _mm512_dpbusd_epi32(s0, w[1], bcast512!(y, 4));
                        s1 = _mm512_dpbusd_epi32(s1, w[5], bcast512!(y, 20));
                        s0 = _mm512_dpbusd_epi32(s0, w[2], bcast512!(y, 8));
                        s1 = _mm512_dpbusd_epi32(s1, w[6], bcast512!(y, 24));
                        s0 = _mm512_dpbusd_epi32(s0, w[3], bcast512!(y, 12));
                        s1 = _mm512_dpbusd_epi32(s1, w[7], bcast512!(y, 28));
                        let sum = _mm512_add_epi32(
                            _mm512_mullo_epi32(s0, sc0),
                            _mm512_mullo_epi32(s1, sc1),
                        );
                        *isum = _mm512_add_epi32(*isum, sum);
                    }
                }
            }
            for ((a, isum), acc) in acts.iter().zip(isum).zip(acc.iter_mut()) {
                let dy = _mm512_set1_ps(a.get_unchecked(s).d);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, dy), *acc);
            }
        }
        acc
    }
}

/// The driver shared by the AVX2 kernels: each tile as two halves of 8
/// rows (one per 32-bit lane of a 256-bit register), the activations in
/// groups of up to 4. `maddubs` stands in for `dpbusd`: two products of a
/// 6-bit quant and an activation byte, and two such pairs, stay in i16.
macro_rules! avx2_driver {
    ($name:ident, $half:ident, $sb:ident, $ty:ty) => {
        /// [`crate::quant::tiles::TileDotFn`] on AVX2.
        ///
        /// # Safety
        /// The CPU must support AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name(
            tile: &[u8],
            nb: usize,
            acts: &[u8],
            stride: usize,
            n: usize,
            out: &mut [f32],
        ) {
            // The bounds every unchecked load below relies on.
            super::check_dot_bounds::<$ty>(tile, nb, n, out);
            let mut c = 0;
            while c < n {
                macro_rules! run {
                    ($size:literal) => {{
                        let a: [&[BlockQ8K]; $size] =
                            core::array::from_fn(|k| activation(acts, (c + k) * stride, nb / SUBS));
                        let (t, ns) = (tile.as_ptr(), nb / SUBS);
                        for half in 0..2 {
                            // SAFETY: the tile holds ns superblocks (asserted
                            // above) and each activation as many.
                            let acc = unsafe { $half::<$ty, $size>(t, ns, half, a) };
                            for (k, v) in acc.iter().enumerate() {
                                let at = TILE_ROWS * (c + k) + 8 * half;
                                let o = &mut out[at..at + 8];
                                // SAFETY: o is 8 floats long.
                                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *v) };
                            }
                        }
                        $size
                    }};
                }
                c += match n - c {
                    4.. => run!(4),
                    3 => run!(3),
                    2 => run!(2),
                    _ => {
                        // One activation (decode): both halves superblock
                        // by superblock, so each is read from L1 the second
                        // time and the halves' chains interleave; each
                        // half's sum in the same order as `$half`'s.
                        let a = [activation(acts, c * stride, nb / SUBS)];
                        let (t, ns) = (tile.as_ptr(), nb / SUBS);
                        let mut acc = [[_mm256_setzero_ps(); 1]; 2];
                        for s in 0..ns {
                            let sb = <$ty as KTile>::SB;
                            prefetch::ahead(t as usize + s * sb, sb); // see `prefetch`
                            for (half, acc) in acc.iter_mut().enumerate() {
                                // SAFETY: as `run!`'s, superblock s < ns.
                                unsafe { $sb::<$ty, 1>(t, s, half, a, acc) };
                            }
                        }
                        let o = &mut out[TILE_ROWS * c..TILE_ROWS * (c + 1)];
                        // SAFETY: o is 16 floats long.
                        unsafe {
                            _mm256_storeu_ps(o.as_mut_ptr(), acc[0][0]);
                            _mm256_storeu_ps(o.as_mut_ptr().add(8), acc[1][0]);
                        }
                        1
                    }
                };
            }
        }
    };
}

avx2_driver!(dot_avx2_q4k, half_q4k, sb_q4k, Q4K);
avx2_driver!(dot_avx2_q5k, half_q4k, sb_q4k, Q5K);
avx2_driver!(dot_avx2_q6k, half_q6k, sb_q6k, Q6K);

/// 4 activation bytes from byte `$off` at `$y`, in every 32-bit lane.
macro_rules! bcast256 {
    ($y:expr, $off:expr) => {
        _mm256_set1_epi32(core::ptr::read_unaligned($y.add($off).cast::<i32>()))
    };
}

/// Rows `8·half..8·half + 8` of a Q4_K tile against `N` activations.
///
/// # Safety
/// As [`group_q4k`], on AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_q4k<T: KTile, const N: usize>(
    tile: *const u8,
    ns: usize,
    half: usize,
    acts: [&[BlockQ8K]; N],
) -> [__m256; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    for s in 0..ns {
        // SAFETY: the caller's contract, for superblock s < ns.
        unsafe { sb_q4k::<T, N>(tile, s, half, acts, &mut acc) };
    }
    acc
}

/// Superblock `s` of rows `8·half..8·half + 8` of a Q4_K (or Q5_K) tile against
/// `N` activations, added to `acc`.
///
/// # Safety
/// As [`half_q4k`], for `s < ns`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sb_q4k<T: KTile, const N: usize>(
    tile: *const u8,
    s: usize,
    half: usize,
    acts: [&[BlockQ8K]; N],
    acc: &mut [__m256; N],
) {
    // SAFETY: as in `group_q4k`; this half's rows are 8 lanes further.
    unsafe {
        let t = tile.add(s * T::SB);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(t.add(16 * half).cast()));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(t.add(q4k::DMIN + 16 * half).cast()));
        let mut isum = [_mm256_setzero_si256(); N];
        let mut summ = [_mm256_setzero_si256(); N];
        // Sub-blocks in pairs: the odd one takes the high nibbles, and as
        // a constant its shift is an immediate or none (shifts by a
        // register count were 2 of ~9 operations per 64 quants, and half
        // of them shifted by zero).
        for j in (0..SUBS).step_by(2) {
            sub_q4k::<T, N, false>(t, s, j, half, acts, &mut isum);
            sub_q4k::<T, N, true>(t, s, j + 1, half, acts, &mut isum);
        }
        for p in 0..4 {
            let at = q4k::MIN + 32 * p + 16 * half;
            let mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(t.add(at).cast()));
            for (a, summ) in acts.iter().zip(summ.iter_mut()) {
                let pair = _mm256_set1_epi32(min_pair(a.get_unchecked(s), p));
                *summ = _mm256_add_epi32(*summ, _mm256_madd_epi16(mins, pair));
            }
        }
        for (((a, isum), summ), acc) in acts.iter().zip(isum).zip(summ).zip(acc.iter_mut()) {
            let dy = _mm256_set1_ps(a.get_unchecked(s).d);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, dy), *acc);
            *acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(dmin, dy), *acc);
        }
    }
}

/// Sub-block `j` (odd where `ODD`) of superblock `s` at `t`, rows
/// `8·half..8·half + 8` of a Q4_K (or Q5_K) tile, against `N`
/// activations: the scaled quant sums added to `isum`.
///
/// # Safety
/// As [`sb_q4k`], with `t` the superblock's start and `j < SUBS`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sub_q4k<T: KTile, const N: usize, const ODD: bool>(
    t: *const u8,
    s: usize,
    j: usize,
    half: usize,
    acts: [&[BlockQ8K]; N],
    isum: &mut [__m256i; N],
) {
    // SAFETY: as in `sb_q4k` (the caller's contract): sub-block j's
    // scales, quants and fifth-bit plane are inside the superblock.
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let at = q4k::SC + 16 * j + 8 * half;
        let sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(t.add(at).cast()));
        // The row's scale in both i16 halves of its lane, for madd.
        let sc = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
        let pair = t.add(q4k::QS + T::PAIR * (j / 2));
        let q = pair.add(32 * half);
        let nibbles = |v: __m256i| {
            let v = if ODD { _mm256_srli_epi16::<4>(v) } else { v };
            _mm256_and_si256(v, low)
        };
        for k in 0..4 {
            let v0 = _mm256_loadu_si256(q.add(64 * k).cast());
            let v1 = _mm256_loadu_si256(q.add(64 * (k + 4)).cast());
            let (w0, w1) = (nibbles(v0), nibbles(v1));
            let (w0, w1) = if T::FIFTH {
                // This half's 32 bytes of the sub-block's plane.
                let at = q5k::MASKS + 64 * (j % 2) + 32 * half;
                let plane = _mm256_loadu_si256(pair.add(at).cast());
                (
                    _mm256_add_epi8(w0, fifth_bits(plane, k)),
                    _mm256_add_epi8(w1, fifth_bits(plane, k + 4)),
                )
            } else {
                (w0, w1)
            };
            for (a, isum) in acts.iter().zip(isum.iter_mut()) {
                let y = a.get_unchecked(s).qs.as_ptr().add(32 * j);
                // Each pair ≤ 2·31·127, two of them ≤ 15748: i16.
                let p = _mm256_add_epi16(
                    _mm256_maddubs_epi16(w0, bcast256!(y, 4 * k)),
                    _mm256_maddubs_epi16(w1, bcast256!(y, 16 + 4 * k)),
                );
                *isum = _mm256_add_epi32(*isum, _mm256_madd_epi16(p, sc));
            }
        }
    }
}

/// Rows `8·half..8·half + 8` of a Q6_K tile against `N` activations.
///
/// # Safety
/// As [`group_q6k`], on AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_q6k<T: KTile, const N: usize>(
    tile: *const u8,
    ns: usize,
    half: usize,
    acts: [&[BlockQ8K]; N],
) -> [__m256; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    for s in 0..ns {
        // SAFETY: the caller's contract, for superblock s < ns.
        unsafe { sb_q6k::<T, N>(tile, s, half, acts, &mut acc) };
    }
    acc
}

/// Superblock `s` of rows `8·half..8·half + 8` of a Q6_K tile against
/// `N` activations, added to `acc`.
///
/// # Safety
/// As [`half_q6k`], for `s < ns`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sb_q6k<T: KTile, const N: usize>(
    tile: *const u8,
    s: usize,
    half: usize,
    acts: [&[BlockQ8K]; N],
    acc: &mut [__m256; N],
) {
    // SAFETY: as in `group_q4k`; this half's rows are 8 lanes further.
    unsafe {
        let t = tile.add(s * Q6K::SB);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(t.add(16 * half).cast()));
        let mut isum = [_mm256_setzero_si256(); N];
        // In pairs, as in `sb_q4k`: each shift of the quants an immediate
        // or none.
        for j in (0..SUBS).step_by(2) {
            sub_q6k::<N, false>(t, s, j, half, acts, &mut isum);
            sub_q6k::<N, true>(t, s, j + 1, half, acts, &mut isum);
        }
        for ((a, isum), acc) in acts.iter().zip(isum).zip(acc.iter_mut()) {
            let dy = _mm256_set1_ps(a.get_unchecked(s).d);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, dy), *acc);
        }
    }
}

/// Sub-block `j` (odd where `ODD`) of superblock `s` at `t`, rows
/// `8·half..8·half + 8` of a Q6_K tile, against `N` activations: the
/// scaled quant sums, less the zero point, added to `isum`.
///
/// # Safety
/// As [`sb_q6k`], with `t` the superblock's start and `j < SUBS`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sub_q6k<const N: usize, const ODD: bool>(
    t: *const u8,
    s: usize,
    j: usize,
    half: usize,
    acts: [&[BlockQ8K]; N],
    isum: &mut [__m256i; N],
) {
    // SAFETY: as in `sb_q6k` (the caller's contract): sub-block j's
    // scales, quants and high bits are inside the superblock, and each
    // activation's superblock s is in bounds.
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let top = _mm256_set1_epi8(0x30);
        let low16 = _mm256_set1_epi32(0xffff);
        let at = q6k::SC + 32 * j + 8 * half;
        let sc0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(t.add(at).cast()));
        let sc1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(t.add(at + 16).cast()));
        // The zero point's factors: 32 times each row's two scales as
        // the i16 pair of its lane (|32·sc| ≤ 4096), against the pair
        // of Q8_K sums.
        let zsc = _mm256_slli_epi16(
            _mm256_or_si256(_mm256_and_si256(sc0, low16), _mm256_slli_epi32(sc1, 16)),
            5,
        );
        // The zero point: 32·sc·Σy per 16, Σy from Q8_K's sums: the
        // pair for sub-block j is one 32-bit broadcast from memory, and
        // one madd against `zsc` gives both terms (each ≤ 4096·2032,
        // exact in i32 like the whole sum).
        for (a, isum) in acts.iter().zip(isum.iter_mut()) {
            let sums = a.get_unchecked(s).bsums.as_ptr().add(2 * j);
            let pair = _mm256_set1_epi32(core::ptr::read_unaligned(sums.cast::<i32>()));
            *isum = _mm256_sub_epi32(*isum, _mm256_madd_epi16(zsc, pair));
        }
        // Each row's scale in both i16 halves of its lane, for madd.
        let sc0 = _mm256_or_si256(_mm256_and_si256(sc0, low16), _mm256_slli_epi32(sc0, 16));
        let sc1 = _mm256_or_si256(_mm256_and_si256(sc1, low16), _mm256_slli_epi32(sc1, 16));
        let q = t.add(q6k::QS + q6k::PAIR * (j / 2) + 32 * half);
        // The low nibble (the high one for odd sub-blocks), and the two
        // high bits moved to bits 4-5: groups m, m + 1 hold them at bits
        // 0-1 (even) or 2-3 (odd), groups m + 4, m + 5 at 4-5 or 6-7.
        let nibble = |v: __m256i| {
            let v = if ODD { _mm256_srli_epi16::<4>(v) } else { v };
            _mm256_and_si256(v, low)
        };
        let high = |h: __m256i, later: bool| match (later, ODD) {
            (false, false) => _mm256_slli_epi16::<4>(h),
            (false, true) => _mm256_slli_epi16::<2>(h),
            (true, false) => h,
            (true, true) => _mm256_srli_epi16::<2>(h),
        };
        // Groups m and m + 1 (then m + 4, m + 5) share one madd.
        for m in [0, 2] {
            let mut w = [_mm256_setzero_si256(); 4];
            for (i, w) in w.iter_mut().enumerate() {
                let g = m + i % 2;
                let h = _mm256_loadu_si256(q.add(q6k::HIGH + 64 * g).cast());
                let v = _mm256_loadu_si256(q.add(64 * (g + 4 * (i / 2))).cast());
                *w = _mm256_or_si256(nibble(v), _mm256_and_si256(high(h, i >= 2), top));
            }
            for (a, isum) in acts.iter().zip(isum.iter_mut()) {
                let y = a.get_unchecked(s).qs.as_ptr().add(32 * j);
                // Each pair ≤ 2·63·127, two of them ≤ 32004: i16.
                let p0 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(w[0], bcast256!(y, 4 * m)),
                    _mm256_maddubs_epi16(w[1], bcast256!(y, 4 * m + 4)),
                );
                let p1 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(w[2], bcast256!(y, 16 + 4 * m)),
                    _mm256_maddubs_epi16(w[3], bcast256!(y, 20 + 4 * m)),
                );
                let sum = _mm256_add_epi32(_mm256_madd_epi16(p0, sc0), _mm256_madd_epi16(p1, sc1));
                *isum = _mm256_add_epi32(*isum, sum);
            }
        }
    }
}
