//! x86-64 twins of [`super::scalar`]. The fast scans, threshold bits and
//! int4 squares equal the scalar results exactly (integer sums); the int4
//! dot sums in another order.

use super::{FastScanBatch, FastScanTables, GROUP};
use core::arch::x86_64::*;

/// # Safety
/// The CPU must support AVX2 and FMA; `s.len() >= q.len()/2 + 2`, `q.len()`
/// even.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn int4_dot_avx2(q: &[f32], s: &[u8]) -> f32 {
    let d = q.len();
    let nib = &s[2..2 + d / 2];
    let m = _mm_set1_epi8(15);
    let eight = _mm_set1_epi8(8);
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= d {
        // SAFETY: 8 nibble bytes from i/2: i/2 + 8 <= d/2 = nib.len().
        let b = unsafe { _mm_loadl_epi64(nib.as_ptr().add(i / 2) as *const __m128i) };
        let lo = _mm_and_si128(b, m);
        let hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
        let v = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight);
        let v0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        let v1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
        // SAFETY: i + 16 <= d = q.len().
        let (q0, q1) = unsafe {
            (
                _mm256_loadu_ps(q.as_ptr().add(i)),
                _mm256_loadu_ps(q.as_ptr().add(i + 8)),
            )
        };
        a0 = _mm256_fmadd_ps(v0, q0, a0);
        a1 = _mm256_fmadd_ps(v1, q1, a1);
        i += 16;
    }
    let a = _mm256_add_ps(a0, a1);
    let h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    let mut acc = _mm_cvtss_f32(h);
    while i < d {
        let b = nib[i / 2];
        acc += q[i] * ((b & 15) as i32 - 8) as f32;
        acc += q[i + 1] * ((b >> 4) as i32 - 8) as f32;
        i += 2;
    }
    acc * crate::format::summary::scale(s)
}

/// # Safety
/// The CPU must support AVX2; `s.len() >= 2`.
#[target_feature(enable = "avx2")]
pub unsafe fn int4_sq_avx2(s: &[u8]) -> u32 {
    let nib = &s[2..];
    let m = _mm_set1_epi8(15);
    let eight = _mm_set1_epi8(8);
    let ones = _mm_set1_epi16(1);
    let mut acc = _mm_setzero_si128();
    let mut i = 0;
    while i + 16 <= nib.len() {
        // SAFETY: i + 16 <= nib.len().
        let b = unsafe { _mm_loadu_si128(nib.as_ptr().add(i) as *const __m128i) };
        let lo = _mm_abs_epi8(_mm_sub_epi8(_mm_and_si128(b, m), eight));
        let hi = _mm_abs_epi8(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), m), eight));
        // |v|·|v| summed in pairs (at most 2·64 per i16), then in fours.
        acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_maddubs_epi16(lo, lo), ones));
        acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_maddubs_epi16(hi, hi), ones));
        i += 16;
    }
    let h = _mm_add_epi32(acc, _mm_shuffle_epi32::<0b01_00_11_10>(acc));
    let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0b10_11_00_01>(h));
    let mut sum = _mm_cvtsi128_si32(h) as u32;
    let mut tail = [0u8; 18];
    tail[2..2 + nib.len() - i].copy_from_slice(&nib[i..]);
    sum += super::scalar::int4_sq(&tail[..2 + nib.len() - i]);
    sum
}

/// Groups summed per pass over the slots: each slot's run of up to 16
/// groups (8 KB for 8-byte codes) is read whole before the next slot's,
/// with the sums kept in L1, so a scan of every slot reads the index's
/// tiles front to back (see [`crate::index`]).
const TILE: usize = 16;

/// # Safety
/// The CPU must support AVX2; every slot holds `out.len()/GROUP` groups of
/// `code_bytes · GROUP` bytes; `t` is built for `slots.len()` slots.
#[target_feature(enable = "avx2")]
pub unsafe fn fast_scan_avx2(t: &FastScanTables, slots: &[&[u8]], out: &mut [u16]) {
    let cb = t.code_bytes;
    let groups = out.len() / GROUP;
    let m = _mm256_set1_epi8(15);
    let low = _mm256_set1_epi16(0xff);
    // Per group of the tile: even and odd blocks of both 32-block halves.
    let mut acc = [_mm256_setzero_si256(); 4 * TILE];
    for t0 in (0..groups).step_by(TILE) {
        let tn = TILE.min(groups - t0);
        acc.fill(_mm256_setzero_si256());
        for (si, slot) in slots.iter().enumerate() {
            for g in 0..tn {
                for half in 0..2 {
                    let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    for b in 0..cb {
                        let row = ((t0 + g) * cb + b) * GROUP + half * 32;
                        let tab = (si * cb + b) * 32;
                        // SAFETY: row + 32 <= (t0 + g + 1)·cb·GROUP <=
                        // slot.len() since b < cb and t0 + g < groups;
                        // tab + 32 <= tables.len().
                        let (v, tl, th) = unsafe {
                            (
                                _mm256_loadu_si256(slot.as_ptr().add(row) as *const __m256i),
                                _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                    t.tables.as_ptr().add(tab) as *const __m128i,
                                )),
                                _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                    t.tables.as_ptr().add(tab + 16) as *const __m128i,
                                )),
                            )
                        };
                        let lo = _mm256_and_si256(v, m);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
                        // Entries are at most 127, so a pair fits a byte.
                        let s = _mm256_add_epi8(
                            _mm256_shuffle_epi8(tl, lo),
                            _mm256_shuffle_epi8(th, hi),
                        );
                        even = _mm256_add_epi16(even, _mm256_and_si256(s, low));
                        odd = _mm256_add_epi16(odd, _mm256_srli_epi16(s, 8));
                    }
                    let k = 4 * g + 2 * half;
                    acc[k] = _mm256_add_epi16(acc[k], even);
                    acc[k + 1] = _mm256_add_epi16(acc[k + 1], odd);
                }
            }
        }
        for g in 0..tn {
            for half in 0..2 {
                let k = 4 * g + 2 * half;
                // u16 lane i of `even` is block 2i, of `odd` block 2i + 1
                // (per 128-bit lane); interleave them back into block order.
                let lo = _mm256_unpacklo_epi16(acc[k], acc[k + 1]);
                let hi = _mm256_unpackhi_epi16(acc[k], acc[k + 1]);
                let o = (t0 + g) * GROUP + half * 32;
                // SAFETY: o + 32 <= (t0 + g + 1)·GROUP <= out.len().
                unsafe {
                    _mm256_storeu_si256(
                        out.as_mut_ptr().add(o) as *mut __m256i,
                        _mm256_permute2x128_si256::<0x20>(lo, hi),
                    );
                    _mm256_storeu_si256(
                        out.as_mut_ptr().add(o + 16) as *mut __m256i,
                        _mm256_permute2x128_si256::<0x31>(lo, hi),
                    );
                }
            }
        }
    }
}

/// # Safety
/// The CPU must support AVX-512 F/BW; sizes as [`fast_scan_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx2")]
pub unsafe fn fast_scan_avx512(t: &FastScanTables, slots: &[&[u8]], out: &mut [u16]) {
    let cb = t.code_bytes;
    let groups = out.len() / GROUP;
    let m = _mm512_set1_epi8(15);
    let low = _mm512_set1_epi16(0xff);
    let first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    let second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    let mut acc = [_mm512_setzero_si512(); 2 * TILE];
    for t0 in (0..groups).step_by(TILE) {
        let tn = TILE.min(groups - t0);
        acc.fill(_mm512_setzero_si512());
        for (si, slot) in slots.iter().enumerate() {
            for g in 0..tn {
                let (mut even, mut odd) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for b in 0..cb {
                    let row = ((t0 + g) * cb + b) * GROUP;
                    let tab = (si * cb + b) * 32;
                    // SAFETY: row + 64 <= (t0 + g + 1)·cb·GROUP <=
                    // slot.len(); tab + 32 <= tables.len().
                    let (v, tl, th) = unsafe {
                        (
                            _mm512_loadu_si512(slot.as_ptr().add(row) as *const _),
                            _mm512_broadcast_i32x4(_mm_loadu_si128(
                                t.tables.as_ptr().add(tab) as *const __m128i
                            )),
                            _mm512_broadcast_i32x4(_mm_loadu_si128(
                                t.tables.as_ptr().add(tab + 16) as *const __m128i,
                            )),
                        )
                    };
                    let lo = _mm512_and_si512(v, m);
                    let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
                    let s =
                        _mm512_add_epi8(_mm512_shuffle_epi8(tl, lo), _mm512_shuffle_epi8(th, hi));
                    even = _mm512_add_epi16(even, _mm512_and_si512(s, low));
                    odd = _mm512_add_epi16(odd, _mm512_srli_epi16(s, 8));
                }
                acc[2 * g] = _mm512_add_epi16(acc[2 * g], even);
                acc[2 * g + 1] = _mm512_add_epi16(acc[2 * g + 1], odd);
            }
        }
        for g in 0..tn {
            let lo = _mm512_unpacklo_epi16(acc[2 * g], acc[2 * g + 1]);
            let hi = _mm512_unpackhi_epi16(acc[2 * g], acc[2 * g + 1]);
            let o = (t0 + g) * GROUP;
            // SAFETY: o + 64 <= out.len().
            unsafe {
                _mm512_storeu_si512(
                    out.as_mut_ptr().add(o) as *mut _,
                    _mm512_permutex2var_epi64(lo, first, hi),
                );
                _mm512_storeu_si512(
                    out.as_mut_ptr().add(o + 32) as *mut _,
                    _mm512_permutex2var_epi64(lo, second, hi),
                );
            }
        }
    }
}

/// Queries per pass of [`fast_scan_many_avx2`]: two u16 accumulators each,
/// with the row, its nibbles and two tables, fill the 16 registers.
const MANY_AVX2: usize = 4;
/// Queries per pass of [`fast_scan_many_avx512`] (of 32 registers).
const MANY_AVX512: usize = 8;

/// # Safety
/// The CPU must support AVX2; `t.tables` holds `t.slots · code_bytes ·
/// queries · 32` bytes; `slots.len() = t.slots`, each holding
/// `out.len() / queries / GROUP` groups of `code_bytes · GROUP` bytes;
/// `out.len()` is a multiple of `queries · GROUP`.
#[target_feature(enable = "avx2")]
pub unsafe fn fast_scan_many_avx2(t: &FastScanBatch, slots: &[&[u8]], out: &mut [u16]) {
    let mut q0 = 0;
    while q0 < t.queries {
        let take = (t.queries - q0).min(MANY_AVX2);
        // SAFETY: the caller's guarantees; q0 + take <= queries.
        unsafe {
            match take {
                1 => many_avx2::<1>(t, q0, slots, out),
                2 => many_avx2::<2>(t, q0, slots, out),
                3 => many_avx2::<3>(t, q0, slots, out),
                _ => many_avx2::<4>(t, q0, slots, out),
            }
        }
        q0 += take;
    }
}

/// Queries `q0..q0 + M` of the batch. Per half group (32 blocks) and
/// query, `both` sums the looked-up bytes as u16 lanes (even block + 256 ·
/// odd block, mod 2^16) and `odd` the odd blocks' bytes; even = both −
/// odd · 256 at the end. One add and one shift per lookup pair instead of
/// masking out the even bytes too.
///
/// # Safety
/// As [`fast_scan_many_avx2`], and `q0 + M <= t.queries`.
#[target_feature(enable = "avx2")]
unsafe fn many_avx2<const M: usize>(
    t: &FastScanBatch,
    q0: usize,
    slots: &[&[u8]],
    out: &mut [u16],
) {
    let (cb, m) = (t.code_bytes, t.queries);
    let per_query = out.len() / m;
    let groups = per_query / GROUP;
    let mask = _mm256_set1_epi8(15);
    for g in 0..groups {
        for half in 0..2 {
            let mut both = [_mm256_setzero_si256(); M];
            let mut odd = [_mm256_setzero_si256(); M];
            for (si, slot) in slots.iter().enumerate() {
                for b in 0..cb {
                    let row = (g * cb + b) * GROUP + half * 32;
                    // SAFETY: row + 32 <= (g + 1)·cb·GROUP <= slot.len().
                    let v = unsafe { _mm256_loadu_si256(slot.as_ptr().add(row) as *const __m256i) };
                    let lo = _mm256_and_si256(v, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
                    let tab = ((si * cb + b) * m + q0) * 32;
                    for q in 0..M {
                        // SAFETY: tab + 32·(q + 1) <= ((si·cb + b)·m + q0
                        // + M)·32 <= tables.len().
                        let (tl, th) = unsafe {
                            let p = t.tables.as_ptr().add(tab + q * 32);
                            (
                                _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i)),
                                _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                    p.add(16) as *const __m128i
                                )),
                            )
                        };
                        let s = _mm256_add_epi8(
                            _mm256_shuffle_epi8(tl, lo),
                            _mm256_shuffle_epi8(th, hi),
                        );
                        both[q] = _mm256_add_epi16(both[q], s);
                        odd[q] = _mm256_add_epi16(odd[q], _mm256_srli_epi16(s, 8));
                    }
                }
            }
            for q in 0..M {
                let even = _mm256_sub_epi16(both[q], _mm256_slli_epi16(odd[q], 8));
                // Lane i of `even` is block 2i, of `odd` block 2i + 1 (per
                // 128-bit lane): interleave them back into block order.
                let lo = _mm256_unpacklo_epi16(even, odd[q]);
                let hi = _mm256_unpackhi_epi16(even, odd[q]);
                let o = (q0 + q) * per_query + g * GROUP + half * 32;
                // SAFETY: o + 32 <= (q0 + q)·per_query + (g + 1)·GROUP <=
                // (q0 + q + 1)·per_query <= out.len().
                unsafe {
                    _mm256_storeu_si256(
                        out.as_mut_ptr().add(o) as *mut __m256i,
                        _mm256_permute2x128_si256::<0x20>(lo, hi),
                    );
                    _mm256_storeu_si256(
                        out.as_mut_ptr().add(o + 16) as *mut __m256i,
                        _mm256_permute2x128_si256::<0x31>(lo, hi),
                    );
                }
            }
        }
    }
}

/// # Safety
/// The CPU must support AVX-512 F/BW; sizes as [`fast_scan_many_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx2")]
pub unsafe fn fast_scan_many_avx512(t: &FastScanBatch, slots: &[&[u8]], out: &mut [u16]) {
    let mut q0 = 0;
    while q0 < t.queries {
        let take = (t.queries - q0).min(MANY_AVX512);
        // SAFETY: the caller's guarantees; q0 + take <= queries.
        unsafe {
            match take {
                1 => many_avx512::<1>(t, q0, slots, out),
                2 => many_avx512::<2>(t, q0, slots, out),
                3 => many_avx512::<3>(t, q0, slots, out),
                4 => many_avx512::<4>(t, q0, slots, out),
                5 => many_avx512::<5>(t, q0, slots, out),
                6 => many_avx512::<6>(t, q0, slots, out),
                7 => many_avx512::<7>(t, q0, slots, out),
                _ => many_avx512::<8>(t, q0, slots, out),
            }
        }
        q0 += take;
    }
}

/// Queries `q0..q0 + M`, a whole group (64 blocks) per register; sums as
/// in [`many_avx2`].
///
/// # Safety
/// As [`fast_scan_many_avx512`], and `q0 + M <= t.queries`.
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn many_avx512<const M: usize>(
    t: &FastScanBatch,
    q0: usize,
    slots: &[&[u8]],
    out: &mut [u16],
) {
    let (cb, m) = (t.code_bytes, t.queries);
    let per_query = out.len() / m;
    let groups = per_query / GROUP;
    let mask = _mm512_set1_epi8(15);
    let first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    let second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    for g in 0..groups {
        let mut both = [_mm512_setzero_si512(); M];
        let mut odd = [_mm512_setzero_si512(); M];
        for (si, slot) in slots.iter().enumerate() {
            for b in 0..cb {
                let row = (g * cb + b) * GROUP;
                // SAFETY: row + 64 <= (g + 1)·cb·GROUP <= slot.len().
                let v = unsafe { _mm512_loadu_si512(slot.as_ptr().add(row) as *const _) };
                let lo = _mm512_and_si512(v, mask);
                let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
                let tab = ((si * cb + b) * m + q0) * 32;
                for q in 0..M {
                    // SAFETY: tab + 32·(q + 1) <= tables.len() as in
                    // many_avx2.
                    let (tl, th) = unsafe {
                        let p = t.tables.as_ptr().add(tab + q * 32);
                        (
                            _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i)),
                            _mm512_broadcast_i32x4(_mm_loadu_si128(p.add(16) as *const __m128i)),
                        )
                    };
                    let s =
                        _mm512_add_epi8(_mm512_shuffle_epi8(tl, lo), _mm512_shuffle_epi8(th, hi));
                    both[q] = _mm512_add_epi16(both[q], s);
                    odd[q] = _mm512_add_epi16(odd[q], _mm512_srli_epi16(s, 8));
                }
            }
        }
        for q in 0..M {
            let even = _mm512_sub_epi16(both[q], _mm512_slli_epi16(odd[q], 8));
            let lo = _mm512_unpacklo_epi16(even, odd[q]);
            let hi = _mm512_unpackhi_epi16(even, odd[q]);
            let o = (q0 + q) * per_query + g * GROUP;
            // SAFETY: o + 64 <= (q0 + q + 1)·per_query <= out.len().
            unsafe {
                _mm512_storeu_si512(
                    out.as_mut_ptr().add(o) as *mut _,
                    _mm512_permutex2var_epi64(lo, first, hi),
                );
                _mm512_storeu_si512(
                    out.as_mut_ptr().add(o + 32) as *mut _,
                    _mm512_permutex2var_epi64(lo, second, hi),
                );
            }
        }
    }
}

/// # Safety
/// The CPU must support AVX2; `bits.len() = scores.len().div_ceil(64)`.
#[target_feature(enable = "avx2")]
pub unsafe fn at_least_avx2(scores: &[u16], floor: u16, bits: &mut [u64]) {
    let n = scores.len();
    let f = _mm256_set1_epi16(floor as i16);
    let whole = n / 64;
    for (w, word) in bits.iter_mut().enumerate().take(whole) {
        let mut m = 0u64;
        for half in 0..2 {
            let at = w * 64 + half * 32;
            // SAFETY: at + 32 <= whole·64 <= n.
            let (a, b) = unsafe {
                (
                    _mm256_loadu_si256(scores.as_ptr().add(at) as *const __m256i),
                    _mm256_loadu_si256(scores.as_ptr().add(at + 16) as *const __m256i),
                )
            };
            // s >= floor exactly when max(s, floor) == s (unsigned).
            let ga = _mm256_cmpeq_epi16(_mm256_max_epu16(a, f), a);
            let gb = _mm256_cmpeq_epi16(_mm256_max_epu16(b, f), b);
            // Lanes of 0 or −1 pack to bytes in the order a0..7 b0..7
            // a8..15 b8..15; the permute puts them back in score order.
            let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi16(ga, gb));
            m |= (_mm256_movemask_epi8(packed) as u32 as u64) << (half * 32);
        }
        *word = m;
    }
    if whole < bits.len() {
        super::scalar::at_least(&scores[whole * 64..], floor, &mut bits[whole..]);
    }
}

/// # Safety
/// The CPU must support AVX-512 F/BW; sizes as [`at_least_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx2")]
pub unsafe fn at_least_avx512(scores: &[u16], floor: u16, bits: &mut [u64]) {
    let n = scores.len();
    let f = _mm512_set1_epi16(floor as i16);
    for (w, word) in bits.iter_mut().enumerate() {
        let mut m = 0u64;
        for half in 0..2 {
            let at = w * 64 + half * 32;
            if at >= n {
                break;
            }
            let lanes = (n - at).min(32);
            let keep: __mmask32 = if lanes == 32 { !0 } else { (1u32 << lanes) - 1 };
            // SAFETY: the masked load reads only the `lanes` scores from
            // `at` on, all below n; the others are not touched.
            let v =
                unsafe { _mm512_maskz_loadu_epi16(keep, scores.as_ptr().add(at) as *const i16) };
            m |= ((_mm512_cmpge_epu16_mask(v, f) & keep) as u64) << (half * 32);
        }
        *word = m;
    }
}
