//! Multi-activation dots for the 32-element block types ([`MultiDot`]):
//! one weight row against up to 8 activations in [`Q8Quads`] layout, so a
//! weight block is loaded and unpacked once for all of them, four blocks at
//! a time.
//!
//! Every type here is `d·(q − c) + m` per element with integer quants `q`
//! (Q5_0/Q5_1: four bits plus a fifth from `qh`), a zero point `c` (Q4_0:
//! 8; Q5_0: 16; Q8_0 on AVX-512, whose quants are offset by 128 to be
//! unsigned: 128) and a stored minimum `m` (Q4_1, Q5_1). A block then
//! contributes `(d·dy)·(Σq·y − c·Σy) + m·(dy·Σy)`: the zero point is
//! taken off in integers (exact), `dy`, `dy·Σy` and the per-lane Σy come
//! precomputed with the activation, `Σq·y` from the integer dot.

use crate::isa::PerIsa;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q4_1::BlockQ4_1;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q5_1::BlockQ5_1;
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::q8_quads::{self, Q8Quads};
use crate::traits::{MultiDot, MultiDotFn};
use bytemuck::Pod;
use half::f16;

#[cfg(target_arch = "x86_64")]
mod x86;

/// How a block stores its quants.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quants {
    /// 16 bytes, element j in the low nibble of byte j and element j + 16
    /// in the high nibble; q ∈ [0, 15].
    Nibbles,
    /// As `Nibbles`, plus bit 4 of element j in bit j of a u32
    /// ([`MultiBlock::qh`]); q ∈ [0, 31].
    Nibbles5,
    /// 32 signed bytes.
    Signed8,
}

/// A 32-element block type the multi-activation kernels take.
pub(crate) trait MultiBlock: Pod + Sync {
    const QUANTS: Quants;
    /// The zero point for the scalar and AVX2 kernels, which dot the quants
    /// as stored: 0 or a power of two.
    const ZERO_POINT: i32;
    /// The same for AVX-512, whose `dpbusd` wants unsigned quants: signed
    /// ones are offset by +128 there.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const ZERO_POINT_512: i32;
    /// Whether blocks store a minimum ([`MultiBlock::min`]).
    const HAS_MIN: bool;
    fn d(&self) -> f16;
    /// The stored minimum (zero for types without one).
    fn min(&self) -> f16;
    /// 16 bytes of nibbles or 32 signed bytes, per [`MultiBlock::QUANTS`].
    fn qs(&self) -> &[u8];
    /// Bit 4 of every quant (`Nibbles5`; zero for the others).
    fn qh(&self) -> u32 {
        0
    }
}

impl MultiBlock for BlockQ4_0 {
    const QUANTS: Quants = Quants::Nibbles;
    const ZERO_POINT: i32 = 8;
    const ZERO_POINT_512: i32 = 8;
    const HAS_MIN: bool = false;
    fn d(&self) -> f16 {
        self.d
    }
    fn min(&self) -> f16 {
        f16::ZERO
    }
    fn qs(&self) -> &[u8] {
        &self.qs
    }
}

impl MultiBlock for BlockQ4_1 {
    const QUANTS: Quants = Quants::Nibbles;
    const ZERO_POINT: i32 = 0;
    const ZERO_POINT_512: i32 = 0;
    const HAS_MIN: bool = true;
    fn d(&self) -> f16 {
        self.d
    }
    fn min(&self) -> f16 {
        self.m
    }
    fn qs(&self) -> &[u8] {
        &self.qs
    }
}

impl MultiBlock for BlockQ5_0 {
    const QUANTS: Quants = Quants::Nibbles5;
    const ZERO_POINT: i32 = 16;
    const ZERO_POINT_512: i32 = 16;
    const HAS_MIN: bool = false;
    fn d(&self) -> f16 {
        self.d
    }
    fn min(&self) -> f16 {
        f16::ZERO
    }
    fn qs(&self) -> &[u8] {
        &self.qs
    }
    fn qh(&self) -> u32 {
        u32::from_le_bytes(self.qh)
    }
}

impl MultiBlock for BlockQ5_1 {
    const QUANTS: Quants = Quants::Nibbles5;
    const ZERO_POINT: i32 = 0;
    const ZERO_POINT_512: i32 = 0;
    const HAS_MIN: bool = true;
    fn d(&self) -> f16 {
        self.d
    }
    fn min(&self) -> f16 {
        self.m
    }
    fn qs(&self) -> &[u8] {
        &self.qs
    }
    fn qh(&self) -> u32 {
        u32::from_le_bytes(self.qh)
    }
}

impl MultiBlock for BlockQ8_0 {
    const QUANTS: Quants = Quants::Signed8;
    const ZERO_POINT: i32 = 0;
    const ZERO_POINT_512: i32 = 128;
    const HAS_MIN: bool = false;
    fn d(&self) -> f16 {
        self.d
    }
    fn min(&self) -> f16 {
        f16::ZERO
    }
    fn qs(&self) -> &[u8] {
        bytemuck::cast_slice(&self.qs)
    }
}

/// The [`MultiDot`] of block type `B`.
pub(crate) const fn multi_dot<B: MultiBlock>() -> MultiDot {
    MultiDot {
        prepared_bytes: q8_quads::prepared_bytes,
        prepare: prepare::<B>,
        dots: dots::<B>(),
    }
}

/// Q8 quads whose lane sums carry `B`'s AVX-512 zero point (the AVX2 one
/// where it has one: the two are equal but for Q8_0, which needs none on
/// AVX2).
fn prepare<B: MultiBlock>(x: &[f32], dst: &mut [u8]) {
    q8_quads::prepare_with_zero_point(x, dst, B::ZERO_POINT_512)
}

/// Activation `c` of a call, viewed for rows of `nb` blocks.
pub(crate) fn activation(acts: &[u8], stride: usize, nb: usize, c: usize) -> Q8Quads<'_> {
    Q8Quads::new(&acts[c * stride..], nb.div_ceil(4))
}

/// Σ (q − c)·y of block `b`.
fn block_isum<B: MultiBlock>(x: &B, a: &Q8Quads<'_>, b: usize) -> i32 {
    let y = |j| a.quant(b, j) as i32;
    let h = x.qh();
    // Bit 4 of element j (Nibbles5 only; qh is zero otherwise).
    let bit4 = |j: usize| ((h >> j) & 1) as i32 * 16;
    match B::QUANTS {
        Quants::Nibbles | Quants::Nibbles5 => (x.qs().iter().enumerate())
            .map(|(j, &q)| {
                let lo = (q & 0x0f) as i32 + bit4(j);
                let hi = (q >> 4) as i32 + bit4(j + 16);
                (lo - B::ZERO_POINT) * y(j) + (hi - B::ZERO_POINT) * y(j + 16)
            })
            .sum(),
        Quants::Signed8 => (x.qs().iter().enumerate())
            .map(|(j, &q)| (q as i8 as i32 - B::ZERO_POINT) * y(j))
            .sum(),
    }
}

/// Scalar twin of the kernels: per block (d·dy)·Σ(q − c)·y + m·(dy·Σy), in
/// block order.
pub(crate) fn dot_ref<B: MultiBlock>(
    w: &[u8],
    row_bytes: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    let nb = row_bytes / std::mem::size_of::<B>();
    for (row, out) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
        let row: &[B] = bytemuck::cast_slice(row);
        for (c, o) in out.iter_mut().enumerate() {
            let a = activation(acts, stride, nb, c);
            let mut sum = 0.0f32;
            for (b, x) in row.iter().enumerate() {
                let sumi = block_isum(x, &a, b);
                sum += x.d().to_f32() * a.scale(b) * sumi as f32;
                if B::HAS_MIN {
                    sum += x.min().to_f32() * a.scaled_sum(b);
                }
            }
            *o = sum;
        }
    }
}

/// Runs `$group::<B, N>` over the rows of `$w` for the activations in groups
/// of 8, 4, 2 and 1 (none larger than `$max`); a group's views are made
/// once for all rows.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_macros))]
macro_rules! in_groups {
    ($group:ident, $B:ty, $max:expr, $w:expr, $rb:expr, $acts:expr, $stride:expr, $n:expr, $out:expr) => {{
        let (w, rb, acts, stride, n, out): (&[u8], usize, &[u8], usize, usize, &mut [f32]) =
            ($w, $rb, $acts, $stride, $n, $out);
        let nb = rb / std::mem::size_of::<$B>();
        let mut c = 0;
        while c < n {
            let left = (n - c).min($max);
            macro_rules! rows {
                ($size:literal) => {{
                    let a: [Q8Quads<'_>; $size] =
                        core::array::from_fn(|k| activation(acts, stride, nb, c + k));
                    for (row, o) in w.chunks_exact(rb).zip(out.chunks_exact_mut(n)) {
                        let row: &[$B] = bytemuck::cast_slice(row);
                        o[c..c + $size].copy_from_slice(&$group::<$B, $size>(row, a));
                    }
                    $size
                }};
            }
            c += match left {
                8.. => rows!(8),
                4.. => rows!(4),
                2.. => rows!(2),
                _ => rows!(1),
            };
        }
    }};
}

/// The kernels of `B`: AVX-512 takes up to 8 activations per pass, AVX2
/// four (eight would not leave the accumulators in 16 registers).
const fn dots<B: MultiBlock>() -> PerIsa<MultiDotFn> {
    let dots = PerIsa::new(dot_ref::<B> as MultiDotFn);
    #[cfg(target_arch = "x86_64")]
    let dots = dots
        .avx2(dot_avx2::<B> as MultiDotFn)
        .avx512(dot_avx512::<B> as MultiDotFn);
    dots
}

#[cfg(target_arch = "x86_64")]
fn dot_avx512<B: MultiBlock>(
    w: &[u8],
    rb: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    use x86::group_avx512 as group;
    // SAFETY: reachable only through `PerIsa::get(Isa::Avx512)`, whose
    // caller guarantees the CPU has the AVX-512 set; `in_groups!` hands
    // the kernel whole blocks of a row and activation views checked by
    // `Q8Quads::new`.
    unsafe { in_groups!(group, B, 8, w, rb, acts, stride, n, out) }
}

#[cfg(target_arch = "x86_64")]
fn dot_avx2<B: MultiBlock>(
    w: &[u8],
    rb: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    use x86::group_avx2 as group;
    // SAFETY: as in `dot_avx512`, for `PerIsa::get(Isa::Avx2)`.
    unsafe { in_groups!(group, B, 4, w, rb, acts, stride, n, out) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 kernel reads the lane sums prepared for ZERO_POINT_512.
    #[test]
    fn avx2_zero_point_is_the_prepared_one_or_none() {
        fn check<B: MultiBlock>() {
            assert!(B::ZERO_POINT == 0 || B::ZERO_POINT == B::ZERO_POINT_512);
        }
        check::<BlockQ4_0>();
        check::<BlockQ4_1>();
        check::<BlockQ5_0>();
        check::<BlockQ5_1>();
        check::<BlockQ8_0>();
    }

    /// Zero points are powers of two (the scalar kernels' shifts).
    #[test]
    fn zero_points_are_powers_of_two() {
        for z in [
            BlockQ5_0::ZERO_POINT,
            BlockQ5_0::ZERO_POINT_512,
            BlockQ4_0::ZERO_POINT,
            BlockQ4_0::ZERO_POINT_512,
            BlockQ4_1::ZERO_POINT,
            BlockQ4_1::ZERO_POINT_512,
            BlockQ8_0::ZERO_POINT,
            BlockQ8_0::ZERO_POINT_512,
        ] {
            assert!(z == 0 || (z as u32).is_power_of_two(), "{z}");
        }
    }
}
