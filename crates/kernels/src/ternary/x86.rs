//! AVX2 and AVX-512 ternary kernels (layouts in the parent module's docs).
//! Every sum is exact, so each matches its scalar twin bit for bit.
//!
//! The safe wrappers are reachable only through `PerIsa::get` for the set
//! they are written for, whose caller guarantees the CPU supports it
//! (crate::isa); the array arguments fix every length the loads rely on.

use super::{
    accumulate, quantize_ref, Tile, BLOCK_TABLES_BYTES, TABLE3_BYTES, TABLE_BYTES,
    TILE_BLOCK_BYTES, TILE_ROWS, TRIPLES, WORDS,
};
use crate::quant::q8_k::BlockQ8K;
use crate::quant::tq1_0::x86::hsum_i32;
use bytemuck::Zeroable;
use gguf::QK_K;
use std::arch::x86_64::*;

/// A `TileFn` wrapper and its body, with this set's features, around a
/// block kernel of the same features (inlined into the body).
macro_rules! tile_fn {
    ($name:ident, $body:ident, $block:ident, $features:literal) => {
        pub(super) fn $name(t: &Tile<'_>, out: &mut [f32; TILE_ROWS]) {
            // SAFETY: see the module docs (the CPU runs the set's
            // instructions); the block kernel reads only the arrays it is
            // given.
            unsafe { $body(t, out) }
        }

        #[target_feature(enable = $features)]
        unsafe fn $body(t: &Tile<'_>, out: &mut [f32; TILE_ROWS]) {
            let mut acc = [0.0f32; TILE_ROWS];
            let mut sums = [0i32; TILE_ROWS];
            for (b, xb) in t.x.iter().enumerate() {
                // SAFETY: the caller guarantees the features `$block`
                // needs (the same as ours).
                unsafe { $block(t.block(b), &xb.qs, t.tables(b), t.bias[b], &mut sums) };
                accumulate(&mut acc, &sums, xb.d, t.scales(b));
            }
            *out = acc;
        }
    };
}

tile_fn!(
    interleaved_tile_avx512,
    interleaved_tile_avx512_body,
    interleaved_avx512,
    "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"
);
tile_fn!(
    lut_tile_avx512,
    lut_tile_avx512_body,
    lut_avx512,
    "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"
);
tile_fn!(
    lut3_tile_avx512,
    lut3_tile_avx512_body,
    lut3_avx512,
    "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"
);
tile_fn!(
    interleaved_tile_avx2,
    interleaved_tile_avx2_body,
    interleaved_avx2,
    "avx2,fma,f16c"
);
tile_fn!(lut_tile_avx2, lut_tile_avx2_body, lut_avx2, "avx2,fma,f16c");

/// A `PairTileFn` wrapper and its body, with this set's features, around
/// a pair block kernel of the same features (inlined into the body).
macro_rules! pair_tile_fn {
    ($name:ident, $body:ident, $block:ident, $features:literal) => {
        pub(super) fn $name(hi: &Tile<'_>, lo: &Tile<'_>, out: &mut [f32; TILE_ROWS]) {
            // SAFETY: see the module docs (the CPU runs the set's
            // instructions); the block kernel reads only the arrays it is
            // given.
            unsafe { $body(hi, lo, out) }
        }

        #[target_feature(enable = $features)]
        unsafe fn $body(hi: &Tile<'_>, lo: &Tile<'_>, out: &mut [f32; TILE_ROWS]) {
            let (mut acc_hi, mut acc_lo) = ([0.0f32; TILE_ROWS], [0.0f32; TILE_ROWS]);
            let (mut sums_hi, mut sums_lo) = ([0i32; TILE_ROWS], [0i32; TILE_ROWS]);
            for (b, (xh, xl)) in hi.x.iter().zip(lo.x).enumerate() {
                // SAFETY: the caller guarantees the features `$block`
                // needs (the same as ours).
                unsafe {
                    $block(
                        hi.block(b),
                        [&xh.qs, &xl.qs],
                        [hi.bias[b], lo.bias[b]],
                        [&mut sums_hi, &mut sums_lo],
                    )
                };
                accumulate(&mut acc_hi, &sums_hi, xh.d, hi.scales(b));
                accumulate(&mut acc_lo, &sums_lo, xl.d, hi.scales(b));
            }
            // The two products' sum, as `y += y_lo` after two passes.
            for ((o, h), l) in out.iter_mut().zip(acc_hi).zip(acc_lo) {
                *o = h + l;
            }
        }
    };
}

pair_tile_fn!(
    interleaved_pair_tile_avx512,
    interleaved_pair_tile_avx512_body,
    interleaved_pair_avx512,
    "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"
);
pair_tile_fn!(
    interleaved_pair_tile_avx2,
    interleaved_pair_tile_avx2_body,
    interleaved_pair_avx2,
    "avx2,fma,f16c"
);

/// Four activation bytes `qs[j..j + 4]` broadcast to every 32-bit lane.
///
/// # Safety
/// `j + 4 <= QK_K`.
#[inline(always)]
unsafe fn quad(qs: &[i8; QK_K], j: usize) -> i32 {
    debug_assert!(j + 4 <= QK_K);
    // SAFETY: the caller keeps the 4 bytes inside `qs`.
    unsafe { std::ptr::read_unaligned(qs.as_ptr().add(j).cast::<i32>()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn interleaved_avx512(
    w: &[u8; TILE_BLOCK_BYTES],
    qs: &[i8; QK_K],
    _tables: &[u8; BLOCK_TABLES_BYTES],
    bias: i32,
    sums: &mut [i32; TILE_ROWS],
) {
    // Field k is masked in place (`v & 3 << 2k`, no shift), so its
    // accumulator collects 4^k · Σ f·a, an exact multiple of 4^k (at most
    // 192 · 128 · 256 < 2^31), shifted back once at the end: one AND per
    // `vpdpbusd` instead of a shift and an AND.
    let masks = [3u8, 3 << 2, 3 << 4, 3 << 6].map(|m| _mm512_set1_epi8(m as i8));
    // [16 rows][field k]: 16 independent `vpdpbusd` chains.
    let mut acc = [[_mm512_setzero_si512(); 4]; 4];
    for c in 0..QK_K / 16 {
        // SAFETY: 16c + 4k + 4 <= 256.
        let a = std::array::from_fn::<_, 4, _>(|k| unsafe {
            _mm512_set1_epi32(quad(qs, 16 * c + 4 * k))
        });
        for (s, acc) in acc.iter_mut().enumerate() {
            // SAFETY: 256c + 64s + 64 <= 4096 = TILE_BLOCK_BYTES.
            let v = unsafe { _mm512_loadu_si512(w.as_ptr().add(256 * c + 64 * s).cast()) };
            for k in 0..4 {
                acc[k] = _mm512_dpbusd_epi32(acc[k], _mm512_and_si512(v, masks[k]), a[k]);
            }
        }
    }
    let bias = _mm512_set1_epi32(bias);
    for (s, acc) in acc.iter().enumerate() {
        let sum = _mm512_add_epi32(
            _mm512_add_epi32(acc[0], _mm512_srai_epi32::<2>(acc[1])),
            _mm512_add_epi32(
                _mm512_srai_epi32::<4>(acc[2]),
                _mm512_srai_epi32::<6>(acc[3]),
            ),
        );
        // SAFETY: 16s + 16 <= 64 = TILE_ROWS.
        unsafe {
            _mm512_storeu_si512(
                sums.as_mut_ptr().add(16 * s).cast(),
                _mm512_sub_epi32(sum, bias),
            )
        };
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn interleaved_avx2(
    w: &[u8; TILE_BLOCK_BYTES],
    qs: &[i8; QK_K],
    _tables: &[u8; BLOCK_TABLES_BYTES],
    bias: i32,
    sums: &mut [i32; TILE_ROWS],
) {
    let mask = _mm256_set1_epi8(3);
    let ones = _mm256_set1_epi16(1);
    // Two passes of 32 rows: the 32-byte halves of each line's first (h =
    // 0) or second (h = 1) 128 bytes are rows 32h + 8q .. + 8.
    for h in 0..2 {
        let mut acc = [_mm256_set1_epi32(bias.wrapping_neg()); 4];
        for c in 0..QK_K / 16 {
            // SAFETY: 16c + 4k + 4 <= 256.
            let a = std::array::from_fn::<_, 4, _>(|k| unsafe {
                _mm256_set1_epi32(quad(qs, 16 * c + 4 * k))
            });
            for (q, acc) in acc.iter_mut().enumerate() {
                // SAFETY: 256c + 128h + 32q + 32 <= 4096.
                let v = unsafe {
                    _mm256_loadu_si256(w.as_ptr().add(256 * c + 128 * h + 32 * q).cast())
                };
                // i16 pairs: fields <= 3, |a| <= 128, so each product pair
                // is at most 768 and four of them 3072: no saturation.
                let p0 = _mm256_maddubs_epi16(_mm256_and_si256(v, mask), a[0]);
                let p1 =
                    _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi32::<2>(v), mask), a[1]);
                let p2 =
                    _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi32::<4>(v), mask), a[2]);
                let p3 =
                    _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi32::<6>(v), mask), a[3]);
                let p = _mm256_add_epi16(_mm256_add_epi16(p0, p1), _mm256_add_epi16(p2, p3));
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(p, ones));
            }
        }
        for (q, acc) in acc.iter().enumerate() {
            // SAFETY: 32h + 8q + 8 <= 64 = TILE_ROWS.
            unsafe { _mm256_storeu_si256(sums.as_mut_ptr().add(32 * h + 8 * q).cast(), *acc) };
        }
    }
}

/// [`interleaved_avx512`] for two activations from one load and mask of
/// each weight line. Their 32 accumulators and the masks would not fit
/// the 32 registers, so the tile goes in two halves of 32 rows (lines
/// `2h`, `2h + 1` of each 256-byte chunk); the activation broadcasts fold
/// into `vpdpbusd`'s memory operand.
// The accumulators are indexed by activation, line and field at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn interleaved_pair_avx512(
    w: &[u8; TILE_BLOCK_BYTES],
    qs: [&[i8; QK_K]; 2],
    bias: [i32; 2],
    sums: [&mut [i32; TILE_ROWS]; 2],
) {
    let masks = [3u8, 3 << 2, 3 << 4, 3 << 6].map(|m| _mm512_set1_epi8(m as i8));
    let mut out = [[0i32; TILE_ROWS]; 2];
    for h in 0..2 {
        // [activation][line 2h + j][field k], fields masked in place as in
        // `interleaved_avx512`.
        let mut acc = [[[_mm512_setzero_si512(); 4]; 2]; 2];
        for c in 0..QK_K / 16 {
            let a = qs.map(|qs| {
                std::array::from_fn::<_, 4, _>(|k| {
                    // SAFETY: 16c + 4k + 4 <= 256.
                    _mm512_set1_epi32(unsafe { quad(qs, 16 * c + 4 * k) })
                })
            });
            for j in 0..2 {
                // SAFETY: 256c + 64(2h + j) + 64 <= 4096 = TILE_BLOCK_BYTES.
                let v = unsafe {
                    _mm512_loadu_si512(w.as_ptr().add(256 * c + 64 * (2 * h + j)).cast())
                };
                for k in 0..4 {
                    let f = _mm512_and_si512(v, masks[k]);
                    for x in 0..2 {
                        acc[x][j][k] = _mm512_dpbusd_epi32(acc[x][j][k], f, a[x][k]);
                    }
                }
            }
        }
        for x in 0..2 {
            let b = _mm512_set1_epi32(bias[x]);
            for (j, acc) in acc[x].iter().enumerate() {
                let sum = _mm512_add_epi32(
                    _mm512_add_epi32(acc[0], _mm512_srai_epi32::<2>(acc[1])),
                    _mm512_add_epi32(
                        _mm512_srai_epi32::<4>(acc[2]),
                        _mm512_srai_epi32::<6>(acc[3]),
                    ),
                );
                // SAFETY: 16(2h + j) + 16 <= 64 = TILE_ROWS.
                unsafe {
                    _mm512_storeu_si512(
                        out[x].as_mut_ptr().add(16 * (2 * h + j)).cast(),
                        _mm512_sub_epi32(sum, b),
                    )
                };
            }
        }
    }
    let [hi, lo] = sums;
    *hi = out[0];
    *lo = out[1];
}

/// [`interleaved_avx2`] for two activations: each 32-byte load is
/// shifted and masked once into its four fields, then multiplied by both.
// The accumulators are indexed by activation and row group at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn interleaved_pair_avx2(
    w: &[u8; TILE_BLOCK_BYTES],
    qs: [&[i8; QK_K]; 2],
    bias: [i32; 2],
    sums: [&mut [i32; TILE_ROWS]; 2],
) {
    let mask = _mm256_set1_epi8(3);
    let ones = _mm256_set1_epi16(1);
    let mut out = [[0i32; TILE_ROWS]; 2];
    for h in 0..2 {
        let mut acc = bias.map(|b| [_mm256_set1_epi32(b.wrapping_neg()); 4]);
        for c in 0..QK_K / 16 {
            let a = qs.map(|qs| {
                std::array::from_fn::<_, 4, _>(|k| {
                    // SAFETY: 16c + 4k + 4 <= 256.
                    _mm256_set1_epi32(unsafe { quad(qs, 16 * c + 4 * k) })
                })
            });
            for q in 0..4 {
                // SAFETY: 256c + 128h + 32q + 32 <= 4096.
                let v = unsafe {
                    _mm256_loadu_si256(w.as_ptr().add(256 * c + 128 * h + 32 * q).cast())
                };
                let f = [
                    _mm256_and_si256(v, mask),
                    _mm256_and_si256(_mm256_srli_epi32::<2>(v), mask),
                    _mm256_and_si256(_mm256_srli_epi32::<4>(v), mask),
                    _mm256_and_si256(_mm256_srli_epi32::<6>(v), mask),
                ];
                for x in 0..2 {
                    // No saturation: see `interleaved_avx2`.
                    let p = _mm256_add_epi16(
                        _mm256_add_epi16(
                            _mm256_maddubs_epi16(f[0], a[x][0]),
                            _mm256_maddubs_epi16(f[1], a[x][1]),
                        ),
                        _mm256_add_epi16(
                            _mm256_maddubs_epi16(f[2], a[x][2]),
                            _mm256_maddubs_epi16(f[3], a[x][3]),
                        ),
                    );
                    acc[x][q] = _mm256_add_epi32(acc[x][q], _mm256_madd_epi16(p, ones));
                }
            }
        }
        for x in 0..2 {
            for (q, acc) in acc[x].iter().enumerate() {
                // SAFETY: 32h + 8q + 8 <= 64 = TILE_ROWS.
                unsafe {
                    _mm256_storeu_si256(out[x].as_mut_ptr().add(32 * h + 8 * q).cast(), *acc)
                };
            }
        }
    }
    let [hi, lo] = sums;
    *hi = out[0];
    *lo = out[1];
}

pub(super) fn tables_avx2(qs: &[i8; QK_K], tables: &mut [u8; BLOCK_TABLES_BYTES]) {
    // SAFETY: see the module docs (the CPU runs AVX2; the AVX-512 set
    // implies it).
    unsafe { tables_avx2_impl(qs, tables) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tables_avx2_impl(qs: &[i8; QK_K], tables: &mut [u8; BLOCK_TABLES_BYTES]) {
    // Byte pairs (f₀, f₁) = (idx >> 2, idx & 3) for idx = 0..16, so one
    // `vpmaddubsw` against (a₀, a₁) repeated gives all 16 entries as i16
    // (entries 0..8 in the low lane, 8..16 in the high one).
    let coeffs = _mm256_setr_epi8(
        0, 0, 0, 1, 0, 2, 0, 3, 1, 0, 1, 1, 1, 2, 1, 3, //
        2, 0, 2, 1, 2, 2, 2, 3, 3, 0, 3, 1, 3, 2, 3, 3,
    );
    // Per lane: the 8 low bytes, then the 8 high bytes.
    let split = _mm256_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, //
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
    );
    for g in 0..QK_K / 2 {
        // SAFETY: 2g + 2 <= 256.
        let pair = unsafe { std::ptr::read_unaligned(qs.as_ptr().add(2 * g).cast::<i16>()) };
        let t = _mm256_maddubs_epi16(coeffs, _mm256_set1_epi16(pair));
        // Qwords (low 0..8, high 0..8, low 8..16, high 8..16) →
        // (low 0..16, high 0..16).
        let t = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(t, split));
        // SAFETY: 32g + 32 <= 4096 = BLOCK_TABLES_BYTES.
        unsafe { _mm256_storeu_si256(tables.as_mut_ptr().add(TABLE_BYTES * g).cast(), t) };
    }
}

/// Lane `j` of the i16 results of `unpacklo/hi_epi8` over 16-byte lanes:
/// row `16 (j / 8) + j % 8` (+ 8 for `unpackhi`).
#[inline(always)]
fn unpacked_row(j: usize, hi: bool) -> usize {
    16 * (j / 8) + j % 8 + if hi { 8 } else { 0 }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn lut_avx512(
    w: &[u8; TILE_BLOCK_BYTES],
    _qs: &[i8; QK_K],
    tables: &[u8; BLOCK_TABLES_BYTES],
    bias: i32,
    sums: &mut [i32; TILE_ROWS],
) {
    let nibble = _mm512_set1_epi8(0x0f);
    // Wrapping i16 sums (module docs): unpacklo and unpackhi rows.
    let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
    for p in 0..QK_K / 4 {
        // SAFETY: 64p + 64 <= 4096; tables 32(2p + 1) + 32 <= 4096.
        let (v, t) = unsafe {
            let t = tables.as_ptr().add(2 * TABLE_BYTES * p);
            (
                _mm512_loadu_si512(w.as_ptr().add(64 * p).cast()),
                std::array::from_fn::<_, 4, _>(|i| {
                    _mm512_broadcast_i32x4(_mm_loadu_si128(t.add(16 * i).cast()))
                }),
            )
        };
        let i0 = _mm512_and_si512(v, nibble);
        let i1 = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
        let (l0, h0) = (_mm512_shuffle_epi8(t[0], i0), _mm512_shuffle_epi8(t[1], i0));
        let (l1, h1) = (_mm512_shuffle_epi8(t[2], i1), _mm512_shuffle_epi8(t[3], i1));
        lo = _mm512_add_epi16(
            lo,
            _mm512_add_epi16(_mm512_unpacklo_epi8(l0, h0), _mm512_unpacklo_epi8(l1, h1)),
        );
        hi = _mm512_add_epi16(
            hi,
            _mm512_add_epi16(_mm512_unpackhi_epi8(l0, h0), _mm512_unpackhi_epi8(l1, h1)),
        );
    }
    let b = _mm512_set1_epi16(bias as i16);
    let (mut l, mut h) = ([0i16; 32], [0i16; 32]);
    // SAFETY: 64-byte stores into 64-byte arrays.
    unsafe {
        _mm512_storeu_si512(l.as_mut_ptr().cast(), _mm512_sub_epi16(lo, b));
        _mm512_storeu_si512(h.as_mut_ptr().cast(), _mm512_sub_epi16(hi, b));
    }
    for j in 0..32 {
        sums[unpacked_row(j, false)] = l[j] as i32;
        sums[unpacked_row(j, true)] = h[j] as i32;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lut_avx2(
    w: &[u8; TILE_BLOCK_BYTES],
    _qs: &[i8; QK_K],
    tables: &[u8; BLOCK_TABLES_BYTES],
    bias: i32,
    sums: &mut [i32; TILE_ROWS],
) {
    let nibble = _mm256_set1_epi8(0x0f);
    // Per 32-row half: wrapping i16 sums of the unpacklo and unpackhi rows.
    let mut acc = [[_mm256_setzero_si256(); 2]; 2];
    for p in 0..QK_K / 4 {
        // SAFETY: tables 32(2p + 1) + 32 <= 4096.
        let t = unsafe {
            let t = tables.as_ptr().add(2 * TABLE_BYTES * p);
            std::array::from_fn::<_, 4, _>(|i| {
                _mm256_broadcastsi128_si256(_mm_loadu_si128(t.add(16 * i).cast()))
            })
        };
        for (h, acc) in acc.iter_mut().enumerate() {
            // SAFETY: 64p + 32h + 32 <= 4096.
            let v = unsafe { _mm256_loadu_si256(w.as_ptr().add(64 * p + 32 * h).cast()) };
            let i0 = _mm256_and_si256(v, nibble);
            let i1 = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
            let (l0, h0) = (_mm256_shuffle_epi8(t[0], i0), _mm256_shuffle_epi8(t[1], i0));
            let (l1, h1) = (_mm256_shuffle_epi8(t[2], i1), _mm256_shuffle_epi8(t[3], i1));
            acc[0] = _mm256_add_epi16(
                acc[0],
                _mm256_add_epi16(_mm256_unpacklo_epi8(l0, h0), _mm256_unpacklo_epi8(l1, h1)),
            );
            acc[1] = _mm256_add_epi16(
                acc[1],
                _mm256_add_epi16(_mm256_unpackhi_epi8(l0, h0), _mm256_unpackhi_epi8(l1, h1)),
            );
        }
    }
    let b = _mm256_set1_epi16(bias as i16);
    for (h, acc) in acc.iter().enumerate() {
        let (mut l, mut u) = ([0i16; 16], [0i16; 16]);
        // SAFETY: 32-byte stores into 32-byte arrays.
        unsafe {
            _mm256_storeu_si256(l.as_mut_ptr().cast(), _mm256_sub_epi16(acc[0], b));
            _mm256_storeu_si256(u.as_mut_ptr().cast(), _mm256_sub_epi16(acc[1], b));
        }
        for j in 0..16 {
            sums[32 * h + unpacked_row(j, false)] = l[j] as i32;
            sums[32 * h + unpacked_row(j, true)] = u[j] as i32;
        }
    }
}

pub(super) fn quantize_avx512(x: &[f32; QK_K], y: &mut BlockQ8K) {
    // SAFETY: see the module docs (the CPU runs AVX-512 F/BW).
    unsafe { quantize_avx512_impl(x, y) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn quantize_avx512_impl(x: &[f32; QK_K], y: &mut BlockQ8K) {
    // SAFETY: 16i + 16 <= 256.
    let v = std::array::from_fn::<_, 16, _>(|i| unsafe { _mm512_loadu_ps(x.as_ptr().add(16 * i)) });
    let amax = _mm512_reduce_max_ps(v.iter().fold(_mm512_setzero_ps(), |m, &v| {
        _mm512_max_ps(m, _mm512_abs_ps(v))
    }));
    if amax == 0.0 {
        *y = BlockQ8K::zeroed();
        return;
    }
    // The reference keeps the first element of the largest magnitude (its
    // sign sets the scale's); NaN inputs take the reference's path too.
    let target = _mm512_set1_ps(amax);
    let first = v.iter().enumerate().find_map(|(i, &v)| {
        let hits = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(v), target);
        (hits != 0).then(|| 16 * i + hits.trailing_zeros() as usize)
    });
    let Some(i) = first else {
        return quantize_ref(x, y);
    };
    let iscale = -127.0 / x[i];
    let (s, top) = (_mm512_set1_ps(iscale), _mm512_set1_epi32(127));
    for (i, v) in v.iter().enumerate() {
        // Round half to even (the default MXCSR mode), like `nearest_int`
        // for every |value| <= 2^22 (here <= 127).
        let q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(s, *v)), top);
        // SAFETY: 16 bytes at 16i, inside the 256 of `qs`.
        unsafe {
            _mm_storeu_si128(
                y.qs.as_mut_ptr().add(16 * i).cast(),
                _mm512_cvtepi32_epi8(q),
            )
        };
        y.bsums[i] = _mm512_reduce_add_epi32(q) as i16;
    }
    y.d = 1.0 / iscale;
}

pub(super) fn quantize_avx2(x: &[f32; QK_K], y: &mut BlockQ8K) {
    // SAFETY: see the module docs (the CPU runs AVX2).
    unsafe { quantize_avx2_impl(x, y) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_avx2_impl(x: &[f32; QK_K], y: &mut BlockQ8K) {
    // SAFETY: 8i + 8 <= 256.
    let v = std::array::from_fn::<_, 32, _>(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
    let sign = _mm256_set1_ps(-0.0);
    let m = v.iter().fold(_mm256_setzero_ps(), |m, &v| {
        _mm256_max_ps(m, _mm256_andnot_ps(sign, v))
    });
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
    if amax == 0.0 {
        *y = BlockQ8K::zeroed();
        return;
    }
    let target = _mm256_set1_ps(amax);
    let first = v.iter().enumerate().find_map(|(i, &v)| {
        let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, v), target);
        let hits = _mm256_movemask_ps(eq) as u32;
        (hits != 0).then(|| 8 * i + hits.trailing_zeros() as usize)
    });
    let Some(i) = first else {
        return quantize_ref(x, y);
    };
    let iscale = -127.0 / x[i];
    let (s, top, ones) = (
        _mm256_set1_ps(iscale),
        _mm256_set1_epi32(127),
        _mm256_set1_epi16(1),
    );
    for (g, v) in v.chunks_exact(2).enumerate() {
        let q = |v| _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(s, v)), top);
        // i16 lanes (a0..4 b0..4 | a4..8 b4..8) → (a0..8 | b0..8).
        let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q(v[0]), q(v[1])));
        let b = _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p));
        // SAFETY: 16 bytes at 16g, inside the 256 of `qs`.
        unsafe { _mm_storeu_si128(y.qs.as_mut_ptr().add(16 * g).cast(), b) };
        y.bsums[g] = hsum_i32(_mm256_madd_epi16(p, ones)) as i16;
    }
    y.d = 1.0 / iscale;
}

pub(super) fn act_sum_avx2(qs: &[i8; QK_K]) -> i32 {
    // SAFETY: see the module docs (the CPU runs AVX2).
    unsafe { act_sum_avx2_impl(qs) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn act_sum_avx2_impl(qs: &[i8; QK_K]) -> i32 {
    // `q + 128` as u8 summed by `vpsadbw` in 64-bit lanes, offset removed.
    let flip = _mm256_set1_epi8(-128);
    let mut s = _mm256_setzero_si256();
    for i in 0..QK_K / 32 {
        // SAFETY: 32i + 32 <= 256.
        let v = unsafe { _mm256_loadu_si256(qs.as_ptr().add(32 * i).cast()) };
        s = _mm256_add_epi64(
            s,
            _mm256_sad_epu8(_mm256_xor_si256(v, flip), _mm256_setzero_si256()),
        );
    }
    hsum_i32(s) - 128 * QK_K as i32
}

pub(super) fn tables3_avx512(qs: &[i8; QK_K], tables: &mut [u8; BLOCK_TABLES_BYTES]) {
    // SAFETY: see the module docs (the CPU runs AVX-512 BW).
    unsafe { tables3_avx512_impl(qs, tables) }
}

/// `[f₀, f₁]` and `[f₂, 0]` byte pairs of entry `idx` (`9f₀ + 3f₁ + f₂`)
/// in i16 lane `idx`; lanes 27..32 zero.
const fn triple_coeffs() -> ([u8; 64], [u8; 64]) {
    let (mut c01, mut c2) = ([0u8; 64], [0u8; 64]);
    let mut idx = 0;
    while idx < 27 {
        c01[2 * idx] = (idx / 9) as u8;
        c01[2 * idx + 1] = (idx / 3 % 3) as u8;
        c2[2 * idx] = (idx % 3) as u8;
        idx += 1;
    }
    (c01, c2)
}
const TRIPLE_COEFFS: ([u8; 64], [u8; 64]) = triple_coeffs();

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn tables3_avx512_impl(qs: &[i8; QK_K], tables: &mut [u8; BLOCK_TABLES_BYTES]) {
    // Activations past the block are 0 (the padding columns' tables).
    let mut a = [0i8; 3 * TRIPLES + 1];
    a[..QK_K].copy_from_slice(qs);
    // SAFETY: 64-byte loads of 64-byte arrays.
    let (c01, c2) = unsafe {
        (
            _mm512_loadu_si512(TRIPLE_COEFFS.0.as_ptr().cast()),
            _mm512_loadu_si512(TRIPLE_COEFFS.1.as_ptr().cast()),
        )
    };
    for g in 0..TRIPLES {
        // SAFETY: 3g + 4 <= 3 · TRIPLES + 1 = a.len().
        let (p01, p23) = unsafe {
            (
                std::ptr::read_unaligned(a.as_ptr().add(3 * g).cast::<i16>()),
                std::ptr::read_unaligned(a.as_ptr().add(3 * g + 2).cast::<i16>()),
            )
        };
        // |f·a| sums stay within 3 · 2 · 128: no `vpmaddubsw` saturation.
        let t = _mm512_add_epi16(
            _mm512_maddubs_epi16(c01, _mm512_set1_epi16(p01)),
            _mm512_maddubs_epi16(c2, _mm512_set1_epi16(p23)),
        );
        // SAFETY: 64g + 64 <= 64 · TRIPLES = BLOCK_TABLES_BYTES.
        unsafe { _mm512_storeu_si512(tables.as_mut_ptr().add(TABLE3_BYTES * g).cast(), t) };
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn lut3_avx512(
    w: &[u8; TILE_BLOCK_BYTES],
    _qs: &[i8; QK_K],
    tables: &[u8; BLOCK_TABLES_BYTES],
    bias: i32,
    sums: &mut [i32; TILE_ROWS],
) {
    // Wrapping i16 sums (parent docs), rows 32h + lane; two per half so
    // the adds form shorter chains.
    let mut acc = [[_mm512_setzero_si512(); 2]; 2];
    for u in 0..WORDS {
        // SAFETY: tables 64(3u + 2) + 64 <= 64 · TRIPLES; weights
        // 128u + 64h + 64 <= 128 · WORDS <= TILE_BLOCK_BYTES.
        let t = std::array::from_fn::<_, 3, _>(|m| unsafe {
            _mm512_loadu_si512(tables.as_ptr().add(TABLE3_BYTES * (3 * u + m)).cast())
        });
        for (h, acc) in acc.iter_mut().enumerate() {
            // SAFETY: as above.
            let v = unsafe { _mm512_loadu_si512(w.as_ptr().add(128 * u + 64 * h).cast()) };
            let l0 = _mm512_permutexvar_epi16(v, t[0]);
            let l1 = _mm512_permutexvar_epi16(_mm512_srli_epi16::<5>(v), t[1]);
            let l2 = _mm512_permutexvar_epi16(_mm512_srli_epi16::<10>(v), t[2]);
            acc[0] = _mm512_add_epi16(acc[0], l0);
            acc[1] = _mm512_add_epi16(acc[1], _mm512_add_epi16(l1, l2));
        }
    }
    let b = _mm512_set1_epi16(bias as i16);
    for (h, acc) in acc.iter().enumerate() {
        let s = _mm512_sub_epi16(_mm512_add_epi16(acc[0], acc[1]), b);
        // SAFETY: 32h + 32 <= 64 = TILE_ROWS (two stores of 16 i32).
        unsafe {
            let out = sums.as_mut_ptr().add(32 * h);
            _mm512_storeu_si512(out.cast(), _mm512_cvtepi16_epi32(_mm512_castsi512_si256(s)));
            _mm512_storeu_si512(
                out.add(16).cast(),
                _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64::<1>(s)),
            );
        }
    }
}
