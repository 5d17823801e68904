//! x86-64 multi-activation kernels (see the parent module).

use super::{MultiBlock, Quants};
use crate::quant::q8_0::x86::*;
use crate::quant::q8_pairs::Q8Pairs;
use core::arch::x86_64::*;
use half::f16;

/// Sum of four lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_f32x4(v: __m128) -> f32 {
    let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Weight pair `i` of a row: [d₀, m₀, d₁, m₁] as f32 (m from `$factor`, see
/// [`MultiBlock`]), and the blocks (the second `None` past the end of an
/// odd row: it counts as all zero).
///
/// No closures or `Option` combinators in these kernels: a closure does not
/// inherit `#[target_feature]`, so the intrinsics in it become calls.
macro_rules! weight_pair {
    ($w:expr, $i:expr, $factor:expr) => {{
        let b0 = &$w[2 * $i];
        let b1 = $w.get(2 * $i + 1);
        let (d1, m1) = match b1 {
            Some(b) => (b.d(), b.min_field()),
            None => (f16::ZERO, f16::ZERO),
        };
        let s = f16x4(b0.d(), b0.min_field(), d1, m1);
        (
            _mm_mul_ps(s, _mm_setr_ps(1.0, $factor, 1.0, $factor)),
            b0,
            b1,
        )
    }};
}

/// 32 quants of a block as bytes in element order: nibbles unpacked, or the
/// signed bytes as stored.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn quants_256<B: MultiBlock>(b: &B) -> __m256i {
    match B::QUANTS {
        Quants::Nibbles => nibbles_32(b.qs().try_into().unwrap()),
        Quants::Signed8 => load_i8x32(bytemuck::cast_slice(b.qs()).try_into().unwrap()),
    }
}

/// Checks that every activation holds the pairs of a `nb`-block row: the
/// bound the unchecked loads below rely on.
fn check_pairs(nb: usize, acts: &[Q8Pairs<'_>]) -> usize {
    let p = nb.div_ceil(2);
    for a in acts {
        assert!(a.qs.len() >= 64 * p && a.dy.len() >= 16 * p && a.sy.len() >= 4 * p);
    }
    p
}

/// `N` dots of one row. Per activation the operations are the same for
/// every `N` (so results are too): per pair one `dpbusd`, the block scales
/// d·dy on 16 lanes times the converted integer sums, and m·dy·Σy on a
/// 4-lane side accumulator.
///
/// # Safety
/// The CPU must support the [`crate::Isa::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn group_avx512<B: MultiBlock, const N: usize>(
    w: &[B],
    acts: [Q8Pairs<'_>; N],
) -> [f32; N] {
    let p = check_pairs(w.len(), &acts);
    let mut acc = [_mm512_setzero_ps(); N];
    let mut accm = [_mm_setzero_ps(); N];
    let lanes_0_2 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(2), 1);
    for i in 0..p {
        let (s, b0, b1) = weight_pair!(w, i, B::MIN_FACTOR_512);
        let q = match (B::QUANTS, b1) {
            (Quants::Nibbles, Some(b1)) => {
                nibbles_pair(b0.qs().try_into().unwrap(), b1.qs().try_into().unwrap())
            }
            (_, Some(b1)) => pair_i(quants_256(b0), quants_256(b1)),
            (_, None) => pair_i(quants_256(b0), _mm256_setzero_si256()),
        };
        // Signed quants + 128 → unsigned for dpbusd (m carries −128·d). The
        // zero padding of an odd row becomes 128 but meets zero activations.
        let q = match B::QUANTS {
            Quants::Signed8 => _mm512_xor_si512(q, _mm512_set1_epi8(-128)),
            Quants::Nibbles => q,
        };
        let dw = _mm512_permutexvar_ps(lanes_0_2, _mm512_castps128_ps512(s));
        for (a, (acc, accm)) in acts.iter().zip(acc.iter_mut().zip(accm.iter_mut())) {
            // SAFETY: i < p and check_pairs saw 64·p quants, 16·p scales and
            // 4·p sums in every activation.
            let (y, dy, sy) = unsafe {
                (
                    _mm512_loadu_si512(a.qs.as_ptr().add(64 * i).cast()),
                    _mm512_loadu_ps(a.dy.as_ptr().add(16 * i)),
                    _mm_loadu_ps(a.sy.as_ptr().add(4 * i)),
                )
            };
            let dot = _mm512_cvtepi32_ps(dpbusd(q, y));
            *acc = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, dy), *acc);
            *accm = _mm_fmadd_ps(s, sy, *accm);
        }
    }
    let mut out = [0.0; N];
    for c in 0..N {
        out[c] = _mm512_reduce_add_ps(acc[c]) + hsum_f32x4(accm[c]);
    }
    out
}

/// [`group_avx512`] with 256-bit registers: the two blocks of a pair go
/// through `maddubs` one after the other into one accumulator; signed quants
/// use the sign trick (exact: activations never hold −128).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn group_avx2<B: MultiBlock, const N: usize>(
    w: &[B],
    acts: [Q8Pairs<'_>; N],
) -> [f32; N] {
    let p = check_pairs(w.len(), &acts);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut accm = [_mm_setzero_ps(); N];
    for i in 0..p {
        let (s, b0, b1) = weight_pair!(w, i, B::MIN_FACTOR);
        let q0 = quants_256(b0);
        let q1 = match b1 {
            Some(b) => quants_256(b),
            None => _mm256_setzero_si256(),
        };
        let (dw0, dw1) = (splat_lane(s, 0), splat_lane(s, 2));
        for (a, (acc, accm)) in acts.iter().zip(acc.iter_mut().zip(accm.iter_mut())) {
            // SAFETY: as in group_avx512.
            let (y0, y1, dy0, dy1, sy) = unsafe {
                (
                    _mm256_loadu_si256(a.qs.as_ptr().add(64 * i).cast()),
                    _mm256_loadu_si256(a.qs.as_ptr().add(64 * i + 32).cast()),
                    _mm256_loadu_ps(a.dy.as_ptr().add(16 * i)),
                    _mm256_loadu_ps(a.dy.as_ptr().add(16 * i + 8)),
                    _mm_loadu_ps(a.sy.as_ptr().add(4 * i)),
                )
            };
            let (i0, i1) = match B::QUANTS {
                Quants::Nibbles => (dot_u8_i8(q0, y0), dot_u8_i8(q1, y1)),
                Quants::Signed8 => (dot_i8_i8(q0, y0), dot_i8_i8(q1, y1)),
            };
            let (d0, d1) = (_mm256_cvtepi32_ps(i0), _mm256_cvtepi32_ps(i1));
            *acc = _mm256_fmadd_ps(d0, _mm256_mul_ps(dw0, dy0), *acc);
            *acc = _mm256_fmadd_ps(d1, _mm256_mul_ps(dw1, dy1), *acc);
            *accm = _mm_fmadd_ps(s, sy, *accm);
        }
    }
    let mut out = [0.0; N];
    for c in 0..N {
        out[c] = hsum_f32x8(acc[c]) + hsum_f32x4(accm[c]);
    }
    out
}
