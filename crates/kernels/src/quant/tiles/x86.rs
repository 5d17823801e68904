//! The AVX-512 tile kernel (layout and arithmetic in the parent module).
//!
//! No closures or generic helpers inside the kernel: a closure does not
//! inherit `#[target_feature]`, so the intrinsics in it would become calls.

use super::{offsets, Prepared, TileBlock, TILE_ROWS};
use crate::quant::multi::Quants;
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
    assert!(
        tile.len() >= nb.div_ceil(2) * super::pair_bytes::<B>(),
        "tiles: tile too short"
    );
    assert!(out.len() >= TILE_ROWS * n, "tiles: output too short");
    let mut c = 0;
    while c < n {
        macro_rules! run {
            ($size:literal) => {{
                // Prepared::new checks each activation's length.
                let a: [Prepared<'_>; $size] =
                    core::array::from_fn(|k| Prepared::new(&acts[(c + k) * stride..], nb));
                // SAFETY: the tile holds nb blocks (asserted above) and each
                // view nb blocks of every part (checked by Prepared::new).
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
    acts: [Prepared<'_>; N],
) -> [__m512; N] {
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
                    // The fifth bits: a byte mask per half of each group.
                    let sixteen = _mm512_set1_epi8(16);
                    let mask =
                        |j: usize| core::ptr::read_unaligned(q.add(256 + 8 * j).cast::<u64>());
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
                    let y = a.qy.as_ptr().add(QK8_0 * b);
                    // Two chains, so the dpbusd latencies overlap.
                    let mut s0 = _mm512_set1_epi32(-B::C * *a.sy.get_unchecked(b));
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
                    let dd = _mm512_mul_ps(d, _mm512_set1_ps(*a.dy.get_unchecked(b)));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, *acc);
                    if B::HAS_MIN {
                        *acc = _mm512_fmadd_ps(m, _mm512_set1_ps(*a.dsy.get_unchecked(b)), *acc);
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
                    let y = a.qy.as_ptr().add(QK8_0 * b);
                    let mut s0 = _mm512_set1_epi32(-B::C * *a.sy.get_unchecked(b));
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
                    let dd = _mm512_mul_ps(d, _mm512_set1_ps(*a.dy.get_unchecked(b)));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, *acc);
                    if B::HAS_MIN {
                        *acc = _mm512_fmadd_ps(m, _mm512_set1_ps(*a.dsy.get_unchecked(b)), *acc);
                    }
                }
            }
        }
    }
    acc
}
