//! Row tiles for the K-quants Q4_K, Q5_K and Q6_K: the contract and driver of
//! the legacy tiles ([`crate::quant::tiles`]), with a superblock layout of
//! their own.
//!
//! The activations are Q8_K, quantized as ggml quantizes them for its
//! K-quant dots (one scale per 256, the sums of each 16), and the integer
//! math is ggml's: per superblock and row, `isum = Σ sc·Σ q·y` exactly in
//! i32, then `acc = fma(f32(isum), d·dy, acc)` and for Q4_K's minimums
//! `acc = fma(−f32(Σ m·Σy), dmin·dy, acc)`. So tiles on or off, a K-quant
//! matrix rounds its activations as llama.cpp does.
//!
//! A tile of 16 rows holds its superblocks one after another, each a whole
//! number of cache lines, every value stored once per row (the bytes per
//! row stay within 3 % of the GGUF's, so decode reads what it read before):
//!
//! Q4_K (2368 bytes): `d` of the 16 rows as f16 (32 bytes), `dmin` (32),
//! the 6-bit scales as bytes, sub-block `j` of row `r` at `64 + 16j + r`,
//! the mins as bytes in pairs, sub-block `2p + h` of row `r` at
//! `192 + 32p + 2r + h` (so they widen to the i16 pairs of a `madd`), then
//! from 320 four pairs of sub-blocks of 512 bytes: group `k < 8` of pair `p`
//! (64 bytes, row `r` at `4r`) is bytes `32p + 4k..+4` of the row's `qs`,
//! low nibbles elements `64p + 4k..` (sub-block `2p`), high nibbles
//! `64p + 32 + 4k..` (sub-block `2p + 1`).
//!
//! Q5_K (2880 bytes): Q4_K's layout with pairs of 640 bytes: each pair's
//! 512 bytes of nibbles, then its fifth bits as two 64-byte planes laid out
//! like a group: for sub-block `2p + h`, bit `k` of byte `4r + i` of the
//! plane at `512 + 64h` is that of row `r`'s byte `i` of group `k` (as in
//! the legacy Q5 tiles: a shift and an AND on AVX2, a byte mask on
//! AVX-512).
//!
//! Q6_K (3392 bytes): `d` (32 bytes, then 32 of padding), the 16 scales as
//! i8, scale `k` of row `r` at `64 + 16k + r`, then from 320 four pairs of
//! 32-element blocks of 768 bytes: 512 bytes of low nibbles laid out as
//! Q4_K's, then four 64-byte groups of the top 2 bits: byte `i` of row `r`
//! in group `m < 4` holds, from bit 0, those of elements `64p + 4m + i`,
//! `64p + 32 + 4m + i`, `64p + 16 + 4m + i` and `64p + 48 + 4m + i`, so a
//! shift and a mask put them on nibble group `m` or `m + 4`. Quants are
//! stored unsigned (`q + 32`); each 16 elements take `32·Σy` (the Q8_K
//! sums) off before their scale.
//!
//! Rows past the matrix's last are zero. The scalar twin does every float
//! operation in the kernels' order, so all kernels agree bit for bit,
//! whatever the number of activations or threads.

use super::tiles::{TileDot, TileDotFn, TILE_ROWS};
use crate::isa::PerIsa;
use crate::quant::k_common::{unpack_scales_mins_k4, KBlock};
use crate::quant::q4_k::BlockQ4K;
use crate::quant::q5_k::BlockQ5K;
use crate::quant::q6_k::BlockQ6K;
use crate::quant::q8_k::{quantize_row, BlockQ8K};
use gguf::QK_K;
use half::f16;

#[cfg(target_arch = "x86_64")]
mod x86;

/// 32-element blocks (activation blocks, sub-blocks) per superblock.
pub(crate) const SUBS: usize = QK_K / 32;

/// Tile layout of one K-quant type.
pub(crate) trait KTile {
    /// Bytes of one superblock of 16 rows.
    const SB: usize;
    /// Pack row `r` of a tile's superblock at `dst` from `src`, one block.
    fn pack_block(src: &[u8], r: usize, dst: &mut [u8]);
    /// Bytes of one stored block.
    const BLOCK: usize;
    /// Bytes of a pair of 32-element sub-blocks.
    const PAIR: usize;
    /// Whether the quants have a fifth bit (Q5_K: the Q4_K layout, then
    /// byte masks of the fifth bits).
    const FIFTH: bool = false;
}

pub(crate) struct Q4K;
pub(crate) struct Q5K;
pub(crate) struct Q6K;

/// Q4_K's layout offsets.
pub(crate) mod q4k {
    pub const DMIN: usize = 32;
    pub const SC: usize = 64;
    pub const MIN: usize = 192;
    pub const QS: usize = 320;
    pub const PAIR: usize = 512;
}

/// Q5_K's layout: Q4_K's, each pair of sub-blocks followed by its fifth
/// bits, so a superblock is still read front to back.
pub(crate) mod q5k {
    pub const PAIR: usize = super::q4k::PAIR + 128;
    /// Where a pair's fifth bits start: for sub-block `2p + h`, a plane at
    /// `MASKS + 64h` whose byte `4r + i` holds, in bit `k`, that of row
    /// `r`'s byte `i` of group `k`.
    pub const MASKS: usize = super::q4k::PAIR;
}

/// Q6_K's layout offsets.
pub(crate) mod q6k {
    pub const SC: usize = 64;
    pub const QS: usize = 320;
    pub const PAIR: usize = 768;
    /// Where the top bits start in a pair.
    pub const HIGH: usize = 512;
}

/// Pack the Q4_K part of a Q4_K or Q5_K block into row `r` of a superblock.
fn pack_q4k_part<T: KTile>(
    d: f16,
    dmin: f16,
    scales: &[u8; 12],
    qs: &[u8],
    r: usize,
    t: &mut [u8],
) {
    t[2 * r..2 * r + 2].copy_from_slice(&d.to_bits().to_le_bytes());
    let at = q4k::DMIN + 2 * r;
    t[at..at + 2].copy_from_slice(&dmin.to_bits().to_le_bytes());
    let sm = unpack_scales_mins_k4(scales);
    for j in 0..SUBS {
        t[q4k::SC + 16 * j + r] = sm[j];
        t[q4k::MIN + 32 * (j / 2) + 2 * r + j % 2] = sm[8 + j];
    }
    for p in 0..4 {
        for k in 0..8 {
            let at = q4k::QS + T::PAIR * p + 64 * k + 4 * r;
            t[at..at + 4].copy_from_slice(&qs[32 * p + 4 * k..32 * p + 4 * k + 4]);
        }
    }
}

impl KTile for Q4K {
    const SB: usize = q4k::QS + 4 * q4k::PAIR;
    const PAIR: usize = q4k::PAIR;
    const BLOCK: usize = std::mem::size_of::<BlockQ4K>();
    fn pack_block(src: &[u8], r: usize, t: &mut [u8]) {
        let x: BlockQ4K = bytemuck::pod_read_unaligned(src);
        pack_q4k_part::<Q4K>(x.d, x.dmin, &x.scales, &x.qs, r, t);
    }
}

impl KTile for Q5K {
    const SB: usize = q4k::QS + 4 * q5k::PAIR;
    const PAIR: usize = q5k::PAIR;
    const BLOCK: usize = std::mem::size_of::<BlockQ5K>();
    const FIFTH: bool = true;
    fn pack_block(src: &[u8], r: usize, t: &mut [u8]) {
        let x: BlockQ5K = bytemuck::pod_read_unaligned(src);
        pack_q4k_part::<Q5K>(x.d, x.dmin, &x.scales, &x.qs, r, t);
        for j in 0..SUBS {
            let plane = q4k::QS + q5k::PAIR * (j / 2) + q5k::MASKS + 64 * (j % 2);
            for k in 0..8 {
                for i in 0..4 {
                    t[plane + 4 * r + i] |= (x.qh[4 * k + i] >> j & 1) << k;
                }
            }
        }
    }
}

impl KTile for Q6K {
    const SB: usize = q6k::QS + 4 * q6k::PAIR;
    const PAIR: usize = q6k::PAIR;
    const BLOCK: usize = std::mem::size_of::<BlockQ6K>();
    fn pack_block(src: &[u8], r: usize, t: &mut [u8]) {
        let x: BlockQ6K = bytemuck::pod_read_unaligned(src);
        t[2 * r..2 * r + 2].copy_from_slice(&x.d.to_bits().to_le_bytes());
        let dec = x.decode();
        for (k, &s) in dec.scales.iter().enumerate() {
            t[q6k::SC + 16 * k + r] = s as i8 as u8;
        }
        // Back to the stored 6-bit values.
        let q = |e: usize| (dec.q[e] + 32) as u8;
        for p in 0..4 {
            let pair = q6k::QS + q6k::PAIR * p;
            for k in 0..8 {
                for i in 0..4 {
                    let (lo, hi) = (q(64 * p + 4 * k + i), q(64 * p + 32 + 4 * k + i));
                    t[pair + 64 * k + 4 * r + i] = (lo & 15) | (hi & 15) << 4;
                }
            }
            for m in 0..4 {
                for i in 0..4 {
                    let top = |e: usize| q(64 * p + e + 4 * m + i) >> 4;
                    t[pair + q6k::HIGH + 64 * m + 4 * r + i] =
                        top(0) | top(32) << 2 | top(16) << 4 | top(48) << 6;
                }
            }
        }
    }
}

pub(crate) static Q4_K: TileDot = TileDot {
    tile_bytes: tile_bytes::<Q4K>,
    pack: pack::<Q4K>,
    prepare,
    prepared_bytes,
    dots: q4k_dots(),
};
pub(crate) static Q5_K: TileDot = TileDot {
    tile_bytes: tile_bytes::<Q5K>,
    pack: pack::<Q5K>,
    prepare,
    prepared_bytes,
    dots: q5k_dots(),
};
pub(crate) static Q6_K: TileDot = TileDot {
    tile_bytes: tile_bytes::<Q6K>,
    pack: pack::<Q6K>,
    prepare,
    prepared_bytes,
    dots: q6k_dots(),
};

/// The superblocks of a row of `cols` elements.
fn superblocks(cols: usize) -> usize {
    assert!(
        cols.is_multiple_of(QK_K),
        "tiles: {cols} columns are not whole K-quant superblocks of {QK_K}"
    );
    cols / QK_K
}

fn tile_bytes<T: KTile>(cols: usize) -> usize {
    superblocks(cols) * T::SB
}

fn pack<T: KTile>(src: &[u8], rows: usize, cols: usize, dst: &mut [u8]) {
    let ns = superblocks(cols);
    let tb = tile_bytes::<T>(cols);
    assert_eq!(
        src.len(),
        rows * ns * T::BLOCK,
        "tiles: source is not {rows} rows"
    );
    assert_eq!(
        dst.len(),
        super::tiles::tiles(rows) * tb,
        "tiles: wrong buffer size"
    );
    dst.fill(0);
    for (t, tile) in dst.chunks_exact_mut(tb).enumerate() {
        for r in 0..TILE_ROWS.min(rows - t * TILE_ROWS) {
            let row = &src[(t * TILE_ROWS + r) * ns * T::BLOCK..][..ns * T::BLOCK];
            for (s, x) in row.chunks_exact(T::BLOCK).enumerate() {
                T::pack_block(x, r, &mut tile[s * T::SB..(s + 1) * T::SB]);
            }
        }
    }
}

/// The bounds every kernel's unchecked loads and stores rely on: `nb`
/// activation blocks of 32 are whole superblocks, `tile` holds them, `out`
/// 16 rows per activation.
pub(crate) fn check_dot_bounds<T: KTile>(tile: &[u8], nb: usize, n: usize, out: &[f32]) {
    assert!(
        nb.is_multiple_of(SUBS),
        "tiles: {nb} blocks of 32 are not whole K-quant superblocks"
    );
    assert!(tile.len() >= nb / SUBS * T::SB, "tiles: tile too short");
    assert!(out.len() >= TILE_ROWS * n, "tiles: output too short");
}

fn half(tile: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([tile[at], tile[at + 1]])).to_f32()
}

/// Bytes of one activation of `cols` elements prepared for the K tiles:
/// Q8_K blocks.
pub fn prepared_bytes(cols: usize) -> usize {
    superblocks(cols) * std::mem::size_of::<BlockQ8K>()
}

/// Quantize `x` (whole superblocks) to Q8_K into `dst`
/// (`prepared_bytes(x.len())` bytes, 4-aligned), as ggml does for the
/// K-quant dots.
pub fn prepare(x: &[f32], dst: &mut [u8]) {
    assert_eq!(
        dst.len(),
        prepared_bytes(x.len()),
        "tiles: wrong activation buffer"
    );
    quantize_row(x, bytemuck::cast_slice_mut(dst));
}

/// Activation `c` of `acts` (`c · stride` bytes in, 4-aligned) as the `ns`
/// Q8_K blocks the kernels read; checks its length.
pub(crate) fn activation(acts: &[u8], at: usize, ns: usize) -> &[BlockQ8K] {
    let len = ns * std::mem::size_of::<BlockQ8K>();
    assert!(acts.len() >= at + len, "tiles: activation buffer too short");
    bytemuck::cast_slice(&acts[at..at + len])
}

/// The Q4_K minimums' activation sums of sub-blocks `2p` and `2p + 1`, as
/// the i16 pair the kernels multiply with a row's two minimums.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn min_pair(y: &BlockQ8K, p: usize) -> i32 {
    let b = &y.bsums[4 * p..4 * p + 4];
    let (lo, hi) = (b[0] as i32 + b[1] as i32, b[2] as i32 + b[3] as i32);
    (lo & 0xffff) | hi << 16
}

/// Scalar twin of the Q4_K and Q5_K kernels.
fn dot_ref_q4k<T: KTile>(
    tile: &[u8],
    nb: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    check_dot_bounds::<T>(tile, nb, n, out);
    let ns = nb / SUBS;
    for c in 0..n {
        let a = activation(acts, c * stride, ns);
        for r in 0..TILE_ROWS {
            let mut acc = 0.0f32;
            for (s, y) in a.iter().enumerate() {
                let t = &tile[s * T::SB..(s + 1) * T::SB];
                let (d, dmin) = (half(t, 2 * r), half(t, q4k::DMIN + 2 * r));
                let (mut isum, mut summ) = (0i32, 0i32);
                for j in 0..SUBS {
                    let q = &t[q4k::QS + T::PAIR * (j / 2)..];
                    let mut sum = 0i32;
                    for k in 0..8 {
                        for i in 0..4 {
                            let mut w = (q[64 * k + 4 * r + i] >> (4 * (j % 2)) & 15) as i32;
                            if T::FIFTH {
                                let at = q5k::MASKS + 64 * (j % 2) + 4 * r + i;
                                w += 16 * (q[at] >> k & 1) as i32;
                            }
                            sum += w * y.qs[32 * j + 4 * k + i] as i32;
                        }
                    }
                    isum += sum * t[q4k::SC + 16 * j + r] as i32;
                    let ysum = y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32;
                    summ += ysum * t[q4k::MIN + 32 * (j / 2) + 2 * r + j % 2] as i32;
                }
                acc = (isum as f32).mul_add(d * y.d, acc);
                acc = (-(summ as f32)).mul_add(dmin * y.d, acc);
            }
            out[TILE_ROWS * c + r] = acc;
        }
    }
}

/// Scalar twin of the Q6_K kernels.
fn dot_ref_q6k(tile: &[u8], nb: usize, acts: &[u8], stride: usize, n: usize, out: &mut [f32]) {
    check_dot_bounds::<Q6K>(tile, nb, n, out);
    let ns = nb / SUBS;
    for c in 0..n {
        let a = activation(acts, c * stride, ns);
        for r in 0..TILE_ROWS {
            let mut acc = 0.0f32;
            for (s, y) in a.iter().enumerate() {
                let t = &tile[s * Q6K::SB..(s + 1) * Q6K::SB];
                let d = half(t, 2 * r);
                let mut isum = 0i32;
                for j in 0..SUBS {
                    let pair = &t[q6k::QS + q6k::PAIR * (j / 2)..];
                    let mut sums = [-32 * y.bsums[2 * j] as i32, -32 * y.bsums[2 * j + 1] as i32];
                    for k in 0..8 {
                        for i in 0..4 {
                            let w = pair[64 * k + 4 * r + i] >> (4 * (j % 2)) & 15;
                            let top = pair[q6k::HIGH + 64 * (k % 4) + 4 * r + i];
                            // Bits 0..4 of `top` go to groups 0..4, 4..8 to 4..8.
                            let top = top >> (2 * (j % 2) + 4 * (k / 4)) & 3;
                            let q = (w | top << 4) as i32;
                            sums[k / 4] += q * y.qs[32 * j + 4 * k + i] as i32;
                        }
                    }
                    for (h, sum) in sums.into_iter().enumerate() {
                        isum += sum * t[q6k::SC + 16 * (2 * j + h) + r] as i8 as i32;
                    }
                }
                acc = (isum as f32).mul_add(d * y.d, acc);
            }
            out[TILE_ROWS * c + r] = acc;
        }
    }
}

/// Q4_K's kernels: SIMD on AVX-512 and AVX2, the scalar twin elsewhere.
const fn q4k_dots() -> PerIsa<TileDotFn> {
    let dots = PerIsa::new(dot_ref_q4k::<Q4K> as TileDotFn);
    #[cfg(target_arch = "x86_64")]
    let dots = dots
        .avx2(avx2_q4k as TileDotFn)
        .avx512(avx512_q4k as TileDotFn);
    dots
}

/// Q5_K's kernels, as Q4_K's.
const fn q5k_dots() -> PerIsa<TileDotFn> {
    let dots = PerIsa::new(dot_ref_q4k::<Q5K> as TileDotFn);
    #[cfg(target_arch = "x86_64")]
    let dots = dots
        .avx2(avx2_q5k as TileDotFn)
        .avx512(avx512_q5k as TileDotFn);
    dots
}

/// Q6_K's kernels, as Q4_K's.
const fn q6k_dots() -> PerIsa<TileDotFn> {
    let dots = PerIsa::new(dot_ref_q6k as TileDotFn);
    #[cfg(target_arch = "x86_64")]
    let dots = dots
        .avx2(avx2_q6k as TileDotFn)
        .avx512(avx512_q6k as TileDotFn);
    dots
}

#[cfg(target_arch = "x86_64")]
macro_rules! safe_kernel {
    ($name:ident, $kernel:path) => {
        fn $name(tile: &[u8], nb: usize, acts: &[u8], stride: usize, n: usize, out: &mut [f32]) {
            // SAFETY: reachable only through `PerIsa::get` for the set named
            // here, whose caller guarantees the CPU has it; the kernel checks
            // the tile, activation and output bounds it relies on.
            unsafe { $kernel(tile, nb, acts, stride, n, out) }
        }
    };
}
#[cfg(target_arch = "x86_64")]
safe_kernel!(avx512_q4k, x86::dot_avx512_q4k);
#[cfg(target_arch = "x86_64")]
safe_kernel!(avx512_q5k, x86::dot_avx512_q5k);
#[cfg(target_arch = "x86_64")]
safe_kernel!(avx512_q6k, x86::dot_avx512_q6k);
#[cfg(target_arch = "x86_64")]
safe_kernel!(avx2_q4k, x86::dot_avx2_q4k);
#[cfg(target_arch = "x86_64")]
safe_kernel!(avx2_q5k, x86::dot_avx2_q5k);
#[cfg(target_arch = "x86_64")]
safe_kernel!(avx2_q6k, x86::dot_avx2_q6k);

#[cfg(test)]
mod tests;
