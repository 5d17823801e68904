//! The AVX-512 tile kernel (layout and arithmetic in the parent module).
//!
//! No closures or generic helpers inside the kernel: a closure does not
//! inherit `#[target_feature]`, so the intrinsics in it would become calls.

use super::{check_acts, offsets, pair_bytes, TileBlock, PREPARED_BLOCK, TILE_ROWS};
use crate::prefetch;
use crate::quant::multi::Quants;
use crate::quant::q8_0::x86::{fifth_bits, pack_quants_avx2, quantize_block_avx2};
use crate::quant::q8_0::QK8_0;
use core::arch::x86_64::*;

/// [`super::TileDotFn`] on AVX-512: the activations in groups of up to 8,
/// each group one pass over the tile.
///
/// # Safety
/// The CPU must support the [`crate::Isa::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_avx512<B: TileBlock>(
    tile: &[u8],
    nb: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    // The bounds every unchecked load below relies on.
    super::check_dot_bounds::<B>(tile, nb, n, out);
    check_acts(acts, nb, stride, n);
    let mut c = 0;
    while c < n {
        macro_rules! run {
            ($size:literal) => {{
                // Activation c + k (< n: inside `acts`, check_acts).
                let a: [*const u8; $size] =
                    core::array::from_fn(|k| acts.as_ptr().wrapping_add((c + k) * stride));
                // SAFETY: the tile holds nb blocks (asserted above) and each
                // view nb blocks of every part (check_acts).
                let acc = unsafe { group::<B, $size>(tile.as_ptr(), nb, a) };
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

/// One pass over a tile for `N` activations: the 16 rows' dots with each.
///
/// # Safety
/// AVX-512 as above; `tile` points at a tile of `nb` blocks of `B` and
/// every activation holds `nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn group<B: TileBlock, const N: usize>(
    tile: *const u8,
    nb: usize,
    acts: [*const u8; N],
) -> [__m512; N] {
    // SAFETY: the caller's contract (`# Safety`): the CPU features, and a
    // tile of `nb` blocks of `B` at `tile` and in every activation view, so
    // the offsets of each block `b < nb` (`offsets::<B>(b)`, and
    // `PREPARED_BLOCK·b` with its 48 bytes of parts) lie inside them.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); N];
        let low = _mm512_set1_epi8(0x0f);
        // 4 activation bytes from byte `$off` of block `$b`, in every lane.
        macro_rules! bcast {
            ($y:expr, $off:expr) => {
                _mm512_set1_epi32(core::ptr::read_unaligned($y.add($off).cast::<i32>()))
            };
        }
        for b in 0..nb {
            let (oq, od, om) = offsets::<B>(b);
            let q = tile.add(oq);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(od).cast()));
            let m = if B::HAS_MIN {
                _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(om).cast()))
            } else {
                _mm512_setzero_ps()
            };
            match B::QUANTS {
                Quants::Nibbles | Quants::Nibbles5 => {
                    let w = [
                        _mm512_loadu_si512(q.cast()),
                        _mm512_loadu_si512(q.add(64).cast()),
                        _mm512_loadu_si512(q.add(128).cast()),
                        _mm512_loadu_si512(q.add(192).cast()),
                    ];
                    let lo = [
                        _mm512_and_si512(w[0], low),
                        _mm512_and_si512(w[1], low),
                        _mm512_and_si512(w[2], low),
                        _mm512_and_si512(w[3], low),
                    ];
                    let hi = [
                        _mm512_and_si512(_mm512_srli_epi16(w[0], 4), low),
                        _mm512_and_si512(_mm512_srli_epi16(w[1], 4), low),
                        _mm512_and_si512(_mm512_srli_epi16(w[2], 4), low),
                        _mm512_and_si512(_mm512_srli_epi16(w[3], 4), low),
                    ];
                    let (lo, hi) = if B::QUANTS == Quants::Nibbles5 {
                        // The fifth bits: bit j of each byte of the plane
                        // as a byte mask.
                        let sixteen = _mm512_set1_epi8(16);
                        let plane = _mm512_loadu_si512(q.add(256).cast());
                        let mask = |j: u32| _mm512_test_epi8_mask(plane, _mm512_set1_epi8(1 << j));
                        (
                            [
                                _mm512_mask_add_epi8(lo[0], mask(0), lo[0], sixteen),
                                _mm512_mask_add_epi8(lo[1], mask(2), lo[1], sixteen),
                                _mm512_mask_add_epi8(lo[2], mask(4), lo[2], sixteen),
                                _mm512_mask_add_epi8(lo[3], mask(6), lo[3], sixteen),
                            ],
                            [
                                _mm512_mask_add_epi8(hi[0], mask(1), hi[0], sixteen),
                                _mm512_mask_add_epi8(hi[1], mask(3), hi[1], sixteen),
                                _mm512_mask_add_epi8(hi[2], mask(5), hi[2], sixteen),
                                _mm512_mask_add_epi8(hi[3], mask(7), hi[3], sixteen),
                            ],
                        )
                    } else {
                        (lo, hi)
                    };
                    for (a, acc) in acts.iter().zip(acc.iter_mut()) {
                        let y = a.add(PREPARED_BLOCK * b);
                        // Two chains, so the dpbusd latencies overlap.
                        let mut s0 = _mm512_set1_epi32(-B::C * *y.add(32).cast::<i32>());
                        let mut s1 = _mm512_setzero_si512();
                        s0 = _mm512_dpbusd_epi32(s0, lo[0], bcast!(y, 0));
                        s1 = _mm512_dpbusd_epi32(s1, hi[0], bcast!(y, 16));
                        s0 = _mm512_dpbusd_epi32(s0, lo[1], bcast!(y, 4));
                        s1 = _mm512_dpbusd_epi32(s1, hi[1], bcast!(y, 20));
                        s0 = _mm512_dpbusd_epi32(s0, lo[2], bcast!(y, 8));
                        s1 = _mm512_dpbusd_epi32(s1, hi[2], bcast!(y, 24));
                        s0 = _mm512_dpbusd_epi32(s0, lo[3], bcast!(y, 12));
                        s1 = _mm512_dpbusd_epi32(s1, hi[3], bcast!(y, 28));
                        let s = _mm512_add_epi32(s0, s1);
                        let dd = _mm512_mul_ps(d, _mm512_set1_ps(*y.add(36).cast::<f32>()));
                        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, *acc);
                        if B::HAS_MIN {
                            *acc =
                                _mm512_fmadd_ps(m, _mm512_set1_ps(*y.add(40).cast::<f32>()), *acc);
                        }
                    }
                }
                Quants::Signed8 => {
                    let w = [
                        _mm512_loadu_si512(q.cast()),
                        _mm512_loadu_si512(q.add(64).cast()),
                        _mm512_loadu_si512(q.add(128).cast()),
                        _mm512_loadu_si512(q.add(192).cast()),
                        _mm512_loadu_si512(q.add(256).cast()),
                        _mm512_loadu_si512(q.add(320).cast()),
                        _mm512_loadu_si512(q.add(384).cast()),
                        _mm512_loadu_si512(q.add(448).cast()),
                    ];
                    for (a, acc) in acts.iter().zip(acc.iter_mut()) {
                        let y = a.add(PREPARED_BLOCK * b);
                        let mut s0 = _mm512_set1_epi32(-B::C * *y.add(32).cast::<i32>());
                        let mut s1 = _mm512_setzero_si512();
                        s0 = _mm512_dpbusd_epi32(s0, w[0], bcast!(y, 0));
                        s1 = _mm512_dpbusd_epi32(s1, w[1], bcast!(y, 4));
                        s0 = _mm512_dpbusd_epi32(s0, w[2], bcast!(y, 8));
                        s1 = _mm512_dpbusd_epi32(s1, w[3], bcast!(y, 12));
                        s0 = _mm512_dpbusd_epi32(s0, w[4], bcast!(y, 16));
                        s1 = _mm512_dpbusd_epi32(s1, w[5], bcast!(y, 20));
                        s0 = _mm512_dpbusd_epi32(s0, w[6], bcast!(y, 24));
                        s1 = _mm512_dpbusd_epi32(s1, w[7], bcast!(y, 28));
                        let s = _mm512_add_epi32(s0, s1);
                        let dd = _mm512_mul_ps(d, _mm512_set1_ps(*y.add(36).cast::<f32>()));
                        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, *acc);
                        if B::HAS_MIN {
                            *acc =
                                _mm512_fmadd_ps(m, _mm512_set1_ps(*y.add(40).cast::<f32>()), *acc);
                        }
                    }
                }
            }
        }
        acc
    }
}

/// [`super::TileDotFn`] on AVX2: each tile as two halves of 8 rows (one per
/// 32-bit lane of a 256-bit register), the activations in groups of up to
/// 4 (what leaves the accumulators and sums in 16 registers); a single
/// activation takes both halves in one pass ([`whole_one`]). `maddubs`
/// stands in for `dpbusd`: nibble pairs stay far inside i16, and Q8_0 goes
/// through the sign trick on its signed quants (so its zero point is 0
/// here; the integer sums are the same either way).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_avx2<B: TileBlock>(
    tile: &[u8],
    nb: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    // The bounds every unchecked load below relies on.
    super::check_dot_bounds::<B>(tile, nb, n, out);
    check_acts(acts, nb, stride, n);
    if B::QUANTS == Quants::Nibbles5 && n >= UNPACK_FROM {
        UNPACKED_TILE.with_borrow_mut(|buf| {
            if buf.len() < UNPACKED_BLOCK * nb {
                buf.resize(UNPACKED_BLOCK * nb, 0);
            }
            // SAFETY: the tile holds nb blocks (asserted above) and `buf`
            // UNPACKED_BLOCK·nb bytes, which `unpack` fills; this fn's
            // features; the bounds checked above.
            unsafe {
                unpack::<B>(tile.as_ptr(), nb, buf.as_mut_ptr());
                groups::<B, true>(tile, nb, acts, stride, n, out, buf.as_ptr());
            }
        });
    } else {
        // SAFETY: this fn's features; the bounds checked above.
        unsafe { groups::<B, false>(tile, nb, acts, stride, n, out, core::ptr::null()) };
    }
}

/// [`dot_avx2`]'s passes over the activations, the quants read from
/// `unpacked` ([`unpack`]'s bytes of this tile) where `UNPACKED`.
///
/// # Safety
/// As [`dot_avx2`], with its bounds checked, and where `UNPACKED`
/// `unpacked` holding this tile's `UNPACKED_BLOCK·nb` bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups<B: TileBlock, const UNPACKED: bool>(
    tile: &[u8],
    nb: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
    unpacked: *const u8,
) {
    let mut c = 0;
    while c < n {
        macro_rules! run {
            ($size:literal) => {{
                // Activation c + k (< n: inside `acts`, check_acts).
                let a: [*const u8; $size] =
                    core::array::from_fn(|k| acts.as_ptr().wrapping_add((c + k) * stride));
                for half in 0..2 {
                    // SAFETY: the tile holds nb blocks (asserted by the
                    // caller) and each view nb blocks of every part
                    // (check_acts); `unpacked` as this fn's contract.
                    let acc = unsafe {
                        half_group::<B, $size, UNPACKED>(tile.as_ptr(), nb, half, a, unpacked)
                    };
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
                let a = acts.as_ptr().wrapping_add(c * stride);
                // SAFETY: as `run!`'s, for activation c < n.
                let acc = unsafe { whole_one::<B>(tile.as_ptr(), nb, a) };
                let o = &mut out[TILE_ROWS * c..TILE_ROWS * (c + 1)];
                // SAFETY: o is 16 floats long.
                unsafe {
                    _mm256_storeu_ps(o.as_mut_ptr(), acc[0]);
                    _mm256_storeu_ps(o.as_mut_ptr().add(8), acc[1]);
                }
                1
            }
        };
    }
}

/// `s − c·Σy` for the prepared activation block at `y` (no zero point for
/// Q8_0, whose quants were dotted signed), from the block's 8·Σy broadcast
/// from memory: Q4_0's once, Q5_0's twice.
///
/// # Safety
/// `y` is a prepared block ([`PREPARED_BLOCK`] bytes), on AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn minus_zero_point<B: TileBlock>(s: __m256i, y: *const u8) -> __m256i {
    // SAFETY: Σy and 8·Σy are bytes 32..36 and 44..48 of the block (the
    // caller's contract).
    let word = |at: usize| unsafe { core::ptr::read_unaligned(y.add(at).cast::<i32>()) };
    match (B::QUANTS, B::C) {
        (Quants::Signed8, _) | (_, 0) => s,
        (_, 8) => _mm256_sub_epi32(s, _mm256_set1_epi32(word(44))),
        (_, 16) => {
            let z = _mm256_set1_epi32(word(44));
            _mm256_sub_epi32(_mm256_sub_epi32(s, z), z)
        }
        (_, c) => _mm256_sub_epi32(s, _mm256_set1_epi32(c * word(32))),
    }
}

/// All 16 rows of a tile against one activation (decode, or a batch's
/// last): [`half_group`]'s arithmetic for both halves in one pass, so each
/// 64-byte line of quants is read once, each activation broadcast serves
/// both halves, and the halves' accumulators are two independent chains.
/// Lane for lane the same operations as `half_group::<B, 1>`.
///
/// # Safety
/// As [`group`], on AVX2, with the one activation at `act`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn whole_one<B: TileBlock>(tile: *const u8, nb: usize, act: *const u8) -> [__m256; 2] {
    // SAFETY: the caller's contract: a tile of `nb` blocks of `B` at `tile`
    // and an activation view of nb blocks at `act`, so the offsets of each
    // block `b < nb` (`offsets::<B>(b)`, and `PREPARED_BLOCK·b` with its 48
    // bytes of parts) lie inside them. The prefetch is a hint.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 2];
        let ones = _mm256_set1_epi16(1);
        let bcast = |y: *const u8, off: usize| {
            _mm256_set1_epi32(core::ptr::read_unaligned(y.add(off).cast::<i32>()))
        };
        for b in 0..nb {
            let (oq, od, om) = offsets::<B>(b);
            if b % 2 == 0 {
                // Decode streams the tiles once: name the lines ahead
                // (past the tile's end, the next tile's) at each pair.
                let pair = (b / 2) * pair_bytes::<B>();
                prefetch::ahead(tile as usize + pair, pair_bytes::<B>());
            }
            let q = tile.add(oq);
            let y = act.add(PREPARED_BLOCK * b);
            let mut s = [_mm256_setzero_si256(); 2];
            match B::QUANTS {
                Quants::Nibbles | Quants::Nibbles5 => {
                    // As in `half_group`: exact i16 sums before each madd.
                    let per_madd = if B::QUANTS == Quants::Nibbles { 4 } else { 2 };
                    let mut p16 = [_mm256_setzero_si256(); 2];
                    for k in 0..4 {
                        let (ylo, yhi) = (bcast(y, 4 * k), bcast(y, 16 + 4 * k));
                        for h in 0..2 {
                            let (lo, hi) = unpack_group::<B>(q.add(32 * h), k);
                            let p = _mm256_add_epi16(
                                _mm256_maddubs_epi16(lo, ylo),
                                _mm256_maddubs_epi16(hi, yhi),
                            );
                            p16[h] = _mm256_add_epi16(p16[h], p);
                            if (k + 1) % per_madd == 0 {
                                s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(p16[h], ones));
                                p16[h] = _mm256_setzero_si256();
                            }
                        }
                    }
                }
                Quants::Signed8 => {
                    let flip = _mm256_set1_epi8(-128);
                    for k in 0..8 {
                        let yk = bcast(y, 4 * k);
                        for (h, s) in s.iter_mut().enumerate() {
                            let w = _mm256_loadu_si256(q.add(64 * k + 32 * h).cast());
                            let w = _mm256_xor_si256(w, flip);
                            let sy = _mm256_sign_epi8(yk, w);
                            let p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), sy);
                            *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p, ones));
                        }
                    }
                }
            }
            let dy = _mm256_set1_ps(*y.add(36).cast::<f32>());
            for (h, (s, acc)) in s.iter().zip(acc.iter_mut()).enumerate() {
                let d = _mm256_cvtph_ps(_mm_loadu_si128(tile.add(od + 16 * h).cast()));
                let s = minus_zero_point::<B>(*s, y);
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, dy), *acc);
                if B::HAS_MIN {
                    let m = _mm256_cvtph_ps(_mm_loadu_si128(tile.add(om + 16 * h).cast()));
                    *acc = _mm256_fmadd_ps(m, _mm256_set1_ps(*y.add(40).cast::<f32>()), *acc);
                }
            }
        }
        acc
    }
}

/// Bytes of one block of a tile unpacked by [`unpack`]: 16 rows × 32
/// quants.
const UNPACKED_BLOCK: usize = 512;

/// Activations per call from which [`dot_avx2`] unpacks a 5-bit tile once
/// instead of once per group of 4: each unpacked group then serves them
/// all (the fifth bits were 6 of some 14 operations per group). 4-bit
/// tiles unpack in 3 and ran 0.85-0.93x unpacked (stored, then loaded).
const UNPACK_FROM: usize = 8;

/// Group `k` of one half of a 4- or 5-bit block at `q` (that half's first
/// byte) as the quants' low and high nibbles, each a byte, the fifth bits
/// added.
///
/// # Safety
/// `q` is a half of a block of `B` inside a tile, on AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_group<B: TileBlock>(q: *const u8, k: usize) -> (__m256i, __m256i) {
    let low = _mm256_set1_epi8(0x0f);
    // SAFETY: group k's 32 bytes of this half and its 32 bytes of the
    // fifth-bit plane (256 bytes on) are inside the block (the caller's
    // contract).
    let (w, plane) = unsafe {
        (
            _mm256_loadu_si256(q.add(64 * k).cast()),
            if B::QUANTS == Quants::Nibbles5 {
                _mm256_loadu_si256(q.add(256).cast())
            } else {
                _mm256_setzero_si256()
            },
        )
    };
    let lo = _mm256_and_si256(w, low);
    let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
    if B::QUANTS == Quants::Nibbles5 {
        (
            _mm256_add_epi8(lo, fifth_bits(plane, 2 * k)),
            _mm256_add_epi8(hi, fifth_bits(plane, 2 * k + 1)),
        )
    } else {
        (lo, hi)
    }
}

/// The quants of a 4- or 5-bit tile of `nb` blocks as bytes: block `b`,
/// group `k`, half `h` at `UNPACKED_BLOCK·b + 128k + 64h`, low nibbles
/// then high, what [`unpack_group`] gives.
///
/// # Safety
/// A tile of `nb` blocks of `B` at `tile`; `dst` holds
/// `UNPACKED_BLOCK·nb` bytes; on AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack<B: TileBlock>(tile: *const u8, nb: usize, dst: *mut u8) {
    for b in 0..nb {
        let (oq, _, _) = offsets::<B>(b);
        for k in 0..4 {
            for h in 0..2 {
                // SAFETY: block b < nb is in the tile, and its unpacked
                // bytes in `dst` (the caller's contract).
                unsafe {
                    let (lo, hi) = unpack_group::<B>(tile.add(oq + 32 * h), k);
                    let u = dst.add(UNPACKED_BLOCK * b + 128 * k + 64 * h);
                    _mm256_storeu_si256(u.cast(), lo);
                    _mm256_storeu_si256(u.add(32).cast(), hi);
                }
            }
        }
    }
}

thread_local! {
    /// Each thread's buffer for [`unpack`]: grown to the widest tile seen.
    static UNPACKED_TILE: core::cell::RefCell<Vec<u8>> =
        const { core::cell::RefCell::new(Vec::new()) };
}

/// Rows `8·half..8·half + 8` of a tile against `N` activations, the
/// quants read from `unpacked` where `UNPACKED`.
///
/// # Safety
/// As [`group`], on AVX2; where `UNPACKED`, `unpacked` holds [`unpack`]'s
/// bytes of this tile.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_group<B: TileBlock, const N: usize, const UNPACKED: bool>(
    tile: *const u8,
    nb: usize,
    half: usize,
    acts: [*const u8; N],
    unpacked: *const u8,
) -> [__m256; N] {
    // SAFETY: the caller's contract (`# Safety`): the CPU features, and a
    // tile of `nb` blocks of `B` at `tile` and in every activation view, so
    // the offsets of each block `b < nb` (`offsets::<B>(b)`, and
    // `PREPARED_BLOCK·b` with its 48 bytes of parts) lie inside them.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        let ones = _mm256_set1_epi16(1);
        macro_rules! bcast {
            ($y:expr, $off:expr) => {
                _mm256_set1_epi32(core::ptr::read_unaligned($y.add($off).cast::<i32>()))
            };
        }
        for b in 0..nb {
            let (oq, od, om) = offsets::<B>(b);
            // This half's 8 rows: 32 bytes into each 64-byte group, 16 into
            // the scales.
            let q = tile.add(oq + 32 * half);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(tile.add(od + 16 * half).cast()));
            let m = if B::HAS_MIN {
                _mm256_cvtph_ps(_mm_loadu_si128(tile.add(om + 16 * half).cast()))
            } else {
                _mm256_setzero_ps()
            };
            let mut s = [_mm256_setzero_si256(); N];
            match B::QUANTS {
                Quants::Nibbles | Quants::Nibbles5 => {
                    // Groups' i16 sums added before one `madd`: each ≤
                    // 2·2·15·127 = 7620 for 4-bit quants (four of them
                    // ≤ 30480), ≤ 15748 with the fifth bit (two): exact.
                    let per_madd = if B::QUANTS == Quants::Nibbles { 4 } else { 2 };
                    let mut p16 = [_mm256_setzero_si256(); N];
                    for k in 0..4 {
                        let (lo, hi) = if UNPACKED {
                            // What `unpack` stored for this block, group, half.
                            let u = unpacked.add(UNPACKED_BLOCK * b + 128 * k + 64 * half);
                            (
                                _mm256_loadu_si256(u.cast()),
                                _mm256_loadu_si256(u.add(32).cast()),
                            )
                        } else {
                            unpack_group::<B>(q, k)
                        };
                        for ((a, s), p16) in acts.iter().zip(s.iter_mut()).zip(p16.iter_mut()) {
                            let y = a.add(PREPARED_BLOCK * b);
                            let p = _mm256_add_epi16(
                                _mm256_maddubs_epi16(lo, bcast!(y, 4 * k)),
                                _mm256_maddubs_epi16(hi, bcast!(y, 16 + 4 * k)),
                            );
                            *p16 = _mm256_add_epi16(*p16, p);
                            if (k + 1) % per_madd == 0 {
                                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(*p16, ones));
                                *p16 = _mm256_setzero_si256();
                            }
                        }
                    }
                }
                Quants::Signed8 => {
                    let flip = _mm256_set1_epi8(-128);
                    for k in 0..8 {
                        // Back to the signed quants, then |w| against sign(y, w).
                        let w = _mm256_xor_si256(_mm256_loadu_si256(q.add(64 * k).cast()), flip);
                        let aw = _mm256_abs_epi8(w);
                        for (a, s) in acts.iter().zip(s.iter_mut()) {
                            let y = a.add(PREPARED_BLOCK * b);
                            let sy = _mm256_sign_epi8(bcast!(y, 4 * k), w);
                            *s = _mm256_add_epi32(
                                *s,
                                _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), ones),
                            );
                        }
                    }
                }
            }
            for ((a, s), acc) in acts.iter().zip(s.iter()).zip(acc.iter_mut()) {
                let y = a.add(PREPARED_BLOCK * b);
                let s = minus_zero_point::<B>(*s, y);
                let dd = _mm256_mul_ps(d, _mm256_set1_ps(*y.add(36).cast::<f32>()));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd, *acc);
                if B::HAS_MIN {
                    *acc = _mm256_fmadd_ps(m, _mm256_set1_ps(*y.add(40).cast::<f32>()), *acc);
                }
            }
        }
        acc
    }
}

/// [`super::prepare`] on AVX2 in one pass: ggml-cpu's run-time Q8_0
/// quantizer (`q8_0::x86::quantize_block_avx2`, which the row quantizer
/// runs too, so the same bits) writing each prepared block whole, its Σy
/// from the same registers.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn prepare_avx2(x: &[f32], dst: &mut [u8]) {
    let nb = x.len() / QK8_0;
    assert!(
        x.len() == nb * QK8_0 && dst.len() == super::prepared_bytes(x.len()),
        "tiles: wrong activation buffer"
    );
    for (xb, out) in x
        .chunks_exact(QK8_0)
        .zip(dst.chunks_exact_mut(PREPARED_BLOCK))
    {
        let (amax, q) = quantize_block_avx2(xb.try_into().unwrap());
        let d = half::f16::from_f32(amax / 127.0).to_f32();
        // Σy of the 32 quants (each in [-127, 127]).
        let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)));
        let p = pack_quants_avx2(q);
        // SAFETY: `out` is one prepared block of 48 bytes, the quants first.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), p) };
        out[32..36].copy_from_slice(&sum.to_le_bytes());
        out[36..40].copy_from_slice(&d.to_le_bytes());
        out[40..44].copy_from_slice(&(d * sum as f32).to_le_bytes());
        out[44..48].copy_from_slice(&(8 * sum).to_le_bytes());
    }
}
