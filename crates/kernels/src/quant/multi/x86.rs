//! x86-64 multi-activation kernels (see the parent module and
//! [`crate::quant::q8_quads`] for the layout).
//!
//! No closures, `Option` combinators or generic helper functions in these
//! kernels: a closure does not inherit `#[target_feature]` and LLVM declines
//! to inline generic helpers here, so the intrinsics in them become calls.
//! Generic pieces are macros instead.

use super::{MultiBlock, Quants};
use crate::quant::q8_0::x86::*;
use crate::quant::q8_quads::Q8Quads;
use core::arch::x86_64::*;

/// The blocks of quad `$q` of row `$w` (`None` past the end of the row:
/// they count as all zero), and their [d₀, m₀, d₁, m₁, …] as f32.
macro_rules! weight_quad {
    ($w:expr, $q:expr) => {{
        let w = $w;
        let b = [
            w.get(4 * $q),
            w.get(4 * $q + 1),
            w.get(4 * $q + 2),
            w.get(4 * $q + 3),
        ];
        let mut h = [0u16; 8];
        for k in 0..4 {
            if let Some(x) = b[k] {
                h[2 * k] = x.d().to_bits();
                h[2 * k + 1] = x.min().to_bits();
            }
        }
        // SAFETY: an unaligned 16-byte load from a 16-byte array.
        let bits = unsafe { _mm_loadu_si128(h.as_ptr().cast()) };
        (b, _mm256_cvtph_ps(bits))
    }};
}

/// 16 quant bytes of block `$b` from byte `$off` of its quants, zero for a
/// missing block.
macro_rules! part {
    ($b:expr, $off:expr) => {
        match $b {
            Some(x) => {
                let qs = x.qs();
                assert!($off + 16 <= qs.len());
                // SAFETY: the 16 bytes from $off lie inside qs (asserted).
                unsafe { _mm_loadu_si128(qs.as_ptr().add($off).cast()) }
            }
            None => _mm_setzero_si128(),
        }
    };
}

/// The blocks of a quad lying wholly inside the row (no `Option`s: the
/// common case, and at one or two activations the weight side's branches
/// are a good part of the work), and their [d₀, m₀, d₁, m₁, …] as f32.
macro_rules! weight_quad_full {
    ($w:expr, $q:expr) => {{
        let b = [
            &$w[4 * $q],
            &$w[4 * $q + 1],
            &$w[4 * $q + 2],
            &$w[4 * $q + 3],
        ];
        let h: [u16; 8] = [
            b[0].d().to_bits(),
            b[0].min().to_bits(),
            b[1].d().to_bits(),
            b[1].min().to_bits(),
            b[2].d().to_bits(),
            b[2].min().to_bits(),
            b[3].d().to_bits(),
            b[3].min().to_bits(),
        ];
        // SAFETY: an unaligned 16-byte load from a 16-byte array.
        let bits = unsafe { _mm_loadu_si128(h.as_ptr().cast()) };
        (b, _mm256_cvtph_ps(bits))
    }};
}

/// [`part!`] of a block that exists.
macro_rules! part_full {
    ($b:expr, $off:expr) => {{
        let qs = $b.qs();
        assert!($off + 16 <= qs.len());
        // SAFETY: qs() is 16 (nibbles) or 32 (bytes) long and $off + 16
        // stays within it (checked above).
        unsafe { _mm_loadu_si128(qs.as_ptr().add($off).cast()) }
    }};
}

/// Bit 4 of a 5-bit block's quants (its `qh`), zero for a missing block.
macro_rules! qh {
    ($b:expr) => {
        match $b {
            Some(x) => x.qh(),
            None => 0,
        }
    };
}

/// [`qh!`] of a block that exists.
macro_rules! qh_full {
    ($b:expr) => {
        $b.qh()
    };
}

/// The quad's quants as two 512-bit registers for `dpbusd` (unsigned),
/// through `$part` (`part!` or `part_full!`) and `$qh` (`qh!` or
/// `qh_full!`).
macro_rules! quad_quants {
    ($B:ty, $part:ident, $qh:ident, $b:expr) => {{
        let b = $b;
        match <$B>::QUANTS {
            Quants::Nibbles | Quants::Nibbles5 => {
                let v = quad_i(
                    $part!(b[0], 0),
                    $part!(b[1], 0),
                    $part!(b[2], 0),
                    $part!(b[3], 0),
                );
                let m = _mm512_set1_epi8(0x0f);
                let (lo, hi) = (
                    _mm512_and_si512(v, m),
                    _mm512_and_si512(_mm512_srli_epi16(v, 4), m),
                );
                if <$B>::QUANTS == Quants::Nibbles5 {
                    // Bit j of qh is bit 4 of element j: the low nibbles
                    // (elements 0..16 of each block) take its low halves,
                    // the high nibbles its high halves; add 16 where set.
                    let h = [$qh!(b[0]), $qh!(b[1]), $qh!(b[2]), $qh!(b[3])];
                    let mut mlo = 0u64;
                    let mut mhi = 0u64;
                    for (k, &hk) in h.iter().enumerate() {
                        mlo |= ((hk & 0xffff) as u64) << (16 * k);
                        mhi |= ((hk >> 16) as u64) << (16 * k);
                    }
                    let sixteen = _mm512_set1_epi8(16);
                    (
                        _mm512_mask_add_epi8(lo, mlo, lo, sixteen),
                        _mm512_mask_add_epi8(hi, mhi, hi, sixteen),
                    )
                } else {
                    (lo, hi)
                }
            }
            Quants::Signed8 => {
                // + 128 → unsigned for dpbusd (taken off again with the
                // lane sums). Missing blocks become 128 but meet zero
                // activations and zero lane sums.
                let o = _mm512_set1_epi8(-128);
                let a = quad_i(
                    $part!(b[0], 0),
                    $part!(b[1], 0),
                    $part!(b[2], 0),
                    $part!(b[3], 0),
                );
                let c = quad_i(
                    $part!(b[0], 16),
                    $part!(b[1], 16),
                    $part!(b[2], 16),
                    $part!(b[3], 16),
                );
                (_mm512_xor_si512(a, o), _mm512_xor_si512(c, o))
            }
        }
    }};
}

/// Activations up to which [`group_avx512`] takes whole quads without
/// `Option`s (measured: +7% at one, −4% at eight, where the extra code
/// costs more than the branches it saves).
const FULL_QUADS_UP_TO: usize = 2;

/// Checks that every activation holds the quads of a `nb`-block row: the
/// bound the unchecked loads below rely on.
fn check_quads(nb: usize, acts: &[Q8Quads<'_>]) -> usize {
    let q = nb.div_ceil(4);
    for a in acts {
        assert!(a.qs.len() >= 128 * q && a.dy.len() >= 16 * q);
        assert!(a.sy.len() >= 8 * q && a.ls.len() >= 16 * q);
    }
    q
}

/// Four 128-bit parts → one 512-bit register, `a` lowest.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn quad_i(a: __m128i, b: __m128i, c: __m128i, d: __m128i) -> __m512i {
    let lo = _mm256_set_m128i(b, a);
    let hi = _mm256_set_m128i(d, c);
    pair_i(lo, hi)
}

/// `N` dots of one row. Per activation the operations are the same for
/// every `N` (so results are too): per quad of blocks two `dpbusd` into
/// one register (4 lanes per block), then one convert, one scale product
/// d·dy and one FMA on 16 lanes; the zero point comes off the integer sums
/// and a stored minimum's m·dy·Σy goes to an 8-lane side accumulator.
///
/// # Safety
/// The CPU must support the [`crate::Isa::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn group_avx512<B: MultiBlock, const N: usize>(
    w: &[B],
    acts: [Q8Quads<'_>; N],
) -> [f32; N] {
    let nq = check_quads(w.len(), &acts);
    let mut acc = [_mm512_setzero_ps(); N];
    let mut accm = [_mm256_setzero_ps(); N];
    let lanes = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    let full = if N <= FULL_QUADS_UP_TO {
        w.len() / 4
    } else {
        0
    };
    for q in 0..nq {
        let (qa, qb, dm) = if q < full {
            let (b, dm) = weight_quad_full!(w, q);
            let (qa, qb) = quad_quants!(B, part_full, qh_full, b);
            (qa, qb, dm)
        } else {
            let (b, dm) = weight_quad!(w, q);
            let (qa, qb) = quad_quants!(B, part, qh, b);
            (qa, qb, dm)
        };
        let dw = _mm512_permutexvar_ps(lanes, _mm512_castps256_ps512(dm));
        for (a, (acc, accm)) in acts.iter().zip(acc.iter_mut().zip(accm.iter_mut())) {
            // SAFETY: q < nq and check_quads saw 128·nq quants, 16·nq
            // scales and 8·nq sums in every activation.
            let (ya, yb, dy) = unsafe {
                (
                    _mm512_loadu_si512(a.qs.as_ptr().add(128 * q).cast()),
                    _mm512_loadu_si512(a.qs.as_ptr().add(128 * q + 64).cast()),
                    _mm512_loadu_ps(a.dy.as_ptr().add(16 * q)),
                )
            };
            // The sums start from −c·(lane sums) (prepared with the
            // activation), which takes the zero point off exactly.
            let start = if B::ZERO_POINT_512 != 0 {
                // SAFETY: as above (16·nq lane sums).
                unsafe { _mm512_loadu_si512(a.ls.as_ptr().add(16 * q).cast()) }
            } else {
                _mm512_setzero_si512()
            };
            let sums = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, qa, ya), qb, yb);
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(dw, dy), *acc);
            if B::HAS_MIN {
                // SAFETY: as above (8·nq sums).
                let sy = unsafe { _mm256_loadu_ps(a.sy.as_ptr().add(8 * q)) };
                *accm = _mm256_fmadd_ps(dm, sy, *accm);
            }
        }
    }
    let mut out = [0.0; N];
    for c in 0..N {
        // One reduction: the side sums join the low 8 lanes first.
        out[c] = _mm512_reduce_add_ps(_mm512_add_ps(acc[c], _mm512_zextps256_ps512(accm[c])));
    }
    out
}

/// [`group_avx512`] with 256-bit registers: blocks 0–1 and 2–3 of a quad
/// each go through `maddubs` into 8 lanes; signed quants use the sign trick
/// (exact: activations never hold −128).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn group_avx2<B: MultiBlock, const N: usize>(
    w: &[B],
    acts: [Q8Quads<'_>; N],
) -> [f32; N] {
    let nq = check_quads(w.len(), &acts);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut accm = [_mm256_setzero_ps(); N];
    let (lanes01, lanes23) = (
        _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2),
        _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6),
    );
    let ones = _mm256_set1_epi16(1);
    for q in 0..nq {
        let (b, dm) = weight_quad!(w, q);
        // First and last 16 elements of blocks 0–1 and of blocks 2–3.
        let (a01, b01, a23, b23) = match B::QUANTS {
            Quants::Nibbles | Quants::Nibbles5 => {
                let m = _mm256_set1_epi8(0x0f);
                let v01 = _mm256_set_m128i(part!(b[1], 0), part!(b[0], 0));
                let v23 = _mm256_set_m128i(part!(b[3], 0), part!(b[2], 0));
                let q = (
                    _mm256_and_si256(v01, m),
                    _mm256_and_si256(_mm256_srli_epi16(v01, 4), m),
                    _mm256_and_si256(v23, m),
                    _mm256_and_si256(_mm256_srli_epi16(v23, 4), m),
                );
                if B::QUANTS == Quants::Nibbles5 {
                    // Bit 4 of each element from qh, as in group_avx512:
                    // a register of low nibbles holds elements 0..16 of
                    // two blocks, one of high nibbles elements 16..32.
                    let h = [qh!(b[0]), qh!(b[1]), qh!(b[2]), qh!(b[3])];
                    let halves = |x: u32, y: u32, hi: bool| {
                        let (x, y) = if hi {
                            (x >> 16, y >> 16)
                        } else {
                            (x & 0xffff, y & 0xffff)
                        };
                        x | y << 16
                    };
                    let sixteen = _mm256_set1_epi8(16);
                    (
                        _mm256_or_si256(
                            q.0,
                            _mm256_and_si256(
                                bytes_from_bits_32(halves(h[0], h[1], false)),
                                sixteen,
                            ),
                        ),
                        _mm256_or_si256(
                            q.1,
                            _mm256_and_si256(bytes_from_bits_32(halves(h[0], h[1], true)), sixteen),
                        ),
                        _mm256_or_si256(
                            q.2,
                            _mm256_and_si256(
                                bytes_from_bits_32(halves(h[2], h[3], false)),
                                sixteen,
                            ),
                        ),
                        _mm256_or_si256(
                            q.3,
                            _mm256_and_si256(bytes_from_bits_32(halves(h[2], h[3], true)), sixteen),
                        ),
                    )
                } else {
                    q
                }
            }
            Quants::Signed8 => (
                _mm256_set_m128i(part!(b[1], 0), part!(b[0], 0)),
                _mm256_set_m128i(part!(b[1], 16), part!(b[0], 16)),
                _mm256_set_m128i(part!(b[3], 0), part!(b[2], 0)),
                _mm256_set_m128i(part!(b[3], 16), part!(b[2], 16)),
            ),
        };
        let dw01 = _mm256_permutevar8x32_ps(dm, lanes01);
        let dw23 = _mm256_permutevar8x32_ps(dm, lanes23);
        for (a, (acc, accm)) in acts.iter().zip(acc.iter_mut().zip(accm.iter_mut())) {
            // SAFETY: as in group_avx512.
            let p = unsafe { a.qs.as_ptr().add(128 * q) };
            // SAFETY: as in group_avx512: q < nq, and check_quads saw 128·nq
            // quants and 16·nq scales in every activation.
            let (ya01, ya23, yb01, yb23, dy01, dy23) = unsafe {
                (
                    _mm256_loadu_si256(p.cast()),
                    _mm256_loadu_si256(p.add(32).cast()),
                    _mm256_loadu_si256(p.add(64).cast()),
                    _mm256_loadu_si256(p.add(96).cast()),
                    _mm256_loadu_ps(a.dy.as_ptr().add(16 * q)),
                    _mm256_loadu_ps(a.dy.as_ptr().add(16 * q + 8)),
                )
            };
            let (mut i01, mut i23) = match B::QUANTS {
                // i16 pair sums stay below 2·2·31·127: no saturation.
                Quants::Nibbles | Quants::Nibbles5 => (
                    _mm256_madd_epi16(
                        _mm256_add_epi16(
                            _mm256_maddubs_epi16(a01, ya01),
                            _mm256_maddubs_epi16(b01, yb01),
                        ),
                        ones,
                    ),
                    _mm256_madd_epi16(
                        _mm256_add_epi16(
                            _mm256_maddubs_epi16(a23, ya23),
                            _mm256_maddubs_epi16(b23, yb23),
                        ),
                        ones,
                    ),
                ),
                Quants::Signed8 => (
                    _mm256_add_epi32(dot_i8_i8(a01, ya01), dot_i8_i8(b01, yb01)),
                    _mm256_add_epi32(dot_i8_i8(a23, ya23), dot_i8_i8(b23, yb23)),
                ),
            };
            if B::ZERO_POINT != 0 {
                // The lane sums come as −c·Σ for c = ZERO_POINT_512, which
                // is ZERO_POINT wherever that is not 0 (a test checks).
                // SAFETY: as above (16·nq lane sums).
                let (l01, l23) = unsafe {
                    (
                        _mm256_loadu_si256(a.ls.as_ptr().add(16 * q).cast()),
                        _mm256_loadu_si256(a.ls.as_ptr().add(16 * q + 8).cast()),
                    )
                };
                i01 = _mm256_add_epi32(i01, l01);
                i23 = _mm256_add_epi32(i23, l23);
            }
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i01), _mm256_mul_ps(dw01, dy01), *acc);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i23), _mm256_mul_ps(dw23, dy23), *acc);
            if B::HAS_MIN {
                // SAFETY: as above (8·nq sums).
                let sy = unsafe { _mm256_loadu_ps(a.sy.as_ptr().add(8 * q)) };
                *accm = _mm256_fmadd_ps(dm, sy, *accm);
            }
        }
    }
    let mut out = [0.0; N];
    for c in 0..N {
        out[c] = hsum_f32x8(_mm256_add_ps(acc[c], accm[c]));
    }
    out
}
