//! Row tiles: a weight matrix repacked at load so that 16 rows sit side by
//! side, one row per 32-bit lane of a 512-bit register.
//!
//! The row-wise kernels ([`crate::quant::multi`]) leave each block's integer
//! sum spread over 4 lanes and pay a convert, a scale product and an FMA per
//! 4 blocks of one row and one activation. Here lane `r` of a register
//! holds 4 quants of row `r`, so one `dpbusd` against 4 bytes of an
//! activation broadcast to every lane advances 16 rows at once, a block's
//! sums end whole in their row's lane, and the float work is one convert,
//! one product and one FMA per block for 16 rows. Weights are unpacked once
//! per block for up to 8 activations. The same kernel serves decode (one
//! activation) and prefill (many).
//!
//! A tile of `nb` blocks per row holds the blocks in pairs, each pair one
//! run of whole cache lines (so a tile is one sequential stream): the two
//! blocks' scales (`d` of the 16 rows as f16, 32 bytes each), for Q4_1 the
//! two blocks' minimums likewise, then the two blocks' quants (`QB` bytes
//! each). A block's quants are 4-byte groups, group `k` of all 16 rows in
//! one 64-byte run (row `r` at `4r`). Q4_0/Q4_1 (`QB` = 256): group `k < 4`
//! is bytes `4k..4k+4` of the row's block, so its low nibbles are elements
//! `4k..4k+4` and its high nibbles `16+4k..`. Q8_0 (`QB` = 512): group
//! `k < 8` is elements `4k..4k+4` plus 128, unsigned for `dpbusd`.
//! Q5_0/Q5_1 (`QB` = 320) are the 4-bit layout followed by the fifth bits
//! as one 64-byte plane laid out like a group (row `r` at `4r`): bit
//! `2k + h` of byte `4r + i` is the fifth bit of the low (`h` = 0) or high
//! (`h` = 1) nibble of byte `4r + i` of group `k`. AVX2 moves bit `j` of
//! every byte to 16 with a shift and an AND (bytes from 32-bit masks took
//! five operations); AVX-512 tests it into a byte mask for a masked add. An
//! odd last block leaves the second of its pair zero.
//!
//! Rows past the matrix's last are zero. Every lane computes `acc = fma(f32(Σ (q − c)·y), d·dy, acc)` then,
//! with a minimum, `acc = fma(m, dy·Σy, acc)`, block after block: the
//! scalar twin does the same, so all kernels agree bit for bit, whatever
//! the number of activations or threads.

use crate::isa::PerIsa;
use crate::quant::multi::{MultiBlock, Quants};
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q4_1::BlockQ4_1;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q5_1::BlockQ5_1;
use crate::quant::q8_0::{BlockQ8_0, QK8_0};
use crate::traits::FromFloatFn;
use bytemuck::Zeroable;
use gguf::GgmlType;
use half::f16;

#[cfg(target_arch = "x86_64")]
mod x86;

/// Rows per tile: the 32-bit lanes of a 512-bit register.
pub const TILE_ROWS: usize = 16;

/// `out[16·c + r] = dot(row r of the tile, activation c)` for `n`
/// activations prepared by [`prepare`], the `c`-th at byte
/// `c · stride` of `acts`; `nb` blocks per row.
pub type TileDotFn =
    fn(tile: &[u8], nb: usize, acts: &[u8], stride: usize, n: usize, out: &mut [f32]);

/// The tile kernels of one weight type.
pub struct TileDot {
    /// Bytes of one tile of rows of `cols` elements.
    pub tile_bytes: fn(cols: usize) -> usize,
    /// Repack `rows` rows (`src`, whole blocks) into `dst`
    /// (`tiles(rows) · tile_bytes(cols)` bytes).
    pub pack: fn(src: &[u8], rows: usize, cols: usize, dst: &mut [u8]),
    /// Quantize an activation row for the kernels (whole blocks).
    pub prepare: FromFloatFn,
    /// Bytes of one activation row of `cols` elements once prepared.
    pub prepared_bytes: fn(cols: usize) -> usize,
    /// The kernels, one per instruction set ([`crate::Kernels::tile_dot`]
    /// hands them out).
    pub(crate) dots: PerIsa<TileDotFn>,
}

/// The tile kernels for `ty`, where it has them.
pub fn tile_dot(ty: GgmlType) -> Option<&'static TileDot> {
    match ty {
        GgmlType::Q4_0 => Some(&Q4_0),
        GgmlType::Q4_1 => Some(&Q4_1),
        GgmlType::Q5_0 => Some(&Q5_0),
        GgmlType::Q5_1 => Some(&Q5_1),
        GgmlType::Q8_0 => Some(&Q8_0),
        GgmlType::Q4_K => Some(&super::tiles_k::Q4_K),
        GgmlType::Q5_K => Some(&super::tiles_k::Q5_K),
        GgmlType::Q6_K => Some(&super::tiles_k::Q6_K),
        _ => None,
    }
}

/// Whether models should repack their weights into row tiles: where they
/// pay with the kernels this process selected ([`crate::Kernels::tiles_pay`]),
/// unless its configuration turned them off ([`crate::Config::tiles`]).
pub fn wanted() -> bool {
    crate::config().tiles && crate::selected().tiles_pay()
}

/// Tiles for `rows` rows.
pub fn tiles(rows: usize) -> usize {
    rows.div_ceil(TILE_ROWS)
}

static Q4_0: TileDot = tile_dot_of::<BlockQ4_0>();
static Q4_1: TileDot = tile_dot_of::<BlockQ4_1>();
static Q5_0: TileDot = tile_dot_of::<BlockQ5_0>();
static Q5_1: TileDot = tile_dot_of::<BlockQ5_1>();
static Q8_0: TileDot = tile_dot_of::<BlockQ8_0>();

const fn tile_dot_of<B: TileBlock>() -> TileDot {
    TileDot {
        tile_bytes: tile_bytes::<B>,
        pack: pack::<B>,
        prepare,
        prepared_bytes,
        dots: dots::<B>(),
    }
}

/// A block type with tile kernels.
pub(crate) trait TileBlock: MultiBlock {
    /// Bytes of packed quants per block of 16 rows.
    const QB: usize;
    /// The zero point the kernels take off: quants are dotted as packed
    /// (unsigned) and `c·Σy` is subtracted.
    const C: i32;
}

impl TileBlock for BlockQ4_0 {
    const QB: usize = 256;
    const C: i32 = 8;
}
impl TileBlock for BlockQ4_1 {
    const QB: usize = 256;
    const C: i32 = 0;
}
impl TileBlock for BlockQ5_0 {
    const QB: usize = 320;
    const C: i32 = 16;
}
impl TileBlock for BlockQ5_1 {
    const QB: usize = 320;
    const C: i32 = 0;
}
impl TileBlock for BlockQ8_0 {
    const QB: usize = 512;
    const C: i32 = 128;
}

fn blocks(cols: usize) -> usize {
    assert!(
        cols.is_multiple_of(QK8_0),
        "tiles: {cols} columns are not whole blocks"
    );
    cols / QK8_0
}

/// 64-byte groups of 4 quants per row in a block.
const fn groups<B: TileBlock>() -> usize {
    match B::QUANTS {
        Quants::Signed8 => 8,
        _ => 4,
    }
}

/// Bytes of a pair of blocks: scales (and minimums), then quants.
pub(crate) const fn pair_bytes<B: TileBlock>() -> usize {
    64 * head_lines::<B>() + 2 * B::QB
}

/// Cache lines of scales (and minimums) heading a pair.
const fn head_lines<B: TileBlock>() -> usize {
    if B::HAS_MIN {
        2
    } else {
        1
    }
}

/// Where block `b`'s quants, scales and minimums start in a tile.
pub(crate) const fn offsets<B: TileBlock>(b: usize) -> (usize, usize, usize) {
    let pair = (b / 2) * pair_bytes::<B>();
    let half = b % 2;
    (
        pair + 64 * head_lines::<B>() + half * B::QB,
        pair + 32 * half,
        pair + 64 + 32 * half,
    )
}

fn tile_bytes<B: TileBlock>(cols: usize) -> usize {
    blocks(cols).div_ceil(2) * pair_bytes::<B>()
}

fn pack<B: TileBlock>(src: &[u8], rows: usize, cols: usize, dst: &mut [u8]) {
    let nb = blocks(cols);
    let tb = tile_bytes::<B>(cols);
    let src: &[B] = bytemuck::cast_slice(src);
    assert_eq!(src.len(), rows * nb, "tiles: source is not {rows} rows");
    assert_eq!(dst.len(), tiles(rows) * tb, "tiles: wrong buffer size");
    dst.fill(0);
    for (t, tile) in dst.chunks_exact_mut(tb).enumerate() {
        for r in 0..TILE_ROWS.min(rows - t * TILE_ROWS) {
            let row = &src[(t * TILE_ROWS + r) * nb..][..nb];
            for (b, x) in row.iter().enumerate() {
                let (oq, od, om) = offsets::<B>(b);
                let q = &mut tile[oq..oq + B::QB];
                let qs = x.qs();
                for k in 0..groups::<B>() {
                    for i in 0..4 {
                        q[64 * k + 4 * r + i] = match B::QUANTS {
                            Quants::Signed8 => qs[4 * k + i] ^ 0x80,
                            _ => qs[4 * k + i],
                        };
                        if B::QUANTS == Quants::Nibbles5 {
                            let h = x.qh();
                            for (half, bit) in [(0, 4 * k + i), (1, 16 + 4 * k + i)] {
                                q[256 + 4 * r + i] |= (((h >> bit) & 1) as u8) << (2 * k + half);
                            }
                        }
                    }
                }
                tile[od + 2 * r..od + 2 * r + 2].copy_from_slice(&x.d().to_bits().to_le_bytes());
                if B::HAS_MIN {
                    tile[om + 2 * r..om + 2 * r + 2]
                        .copy_from_slice(&x.min().to_bits().to_le_bytes());
                }
            }
        }
    }
}

/// Bytes of one prepared activation block: the 32 quants, then Σy (i32),
/// dy and dy·Σy (f32), and 8·Σy (i32), the zero point of Q4_0 (Q5_0's
/// twice) ready to broadcast: from Σy each kernel paid a product in a
/// general register and a move across. One block's parts sit together
/// so a kernel reaches every part of every activation from one offset
/// (per-part pointers for 8 activations outnumbered the registers).
pub(crate) const PREPARED_BLOCK: usize = 48;

/// Bytes of one activation of `cols` elements prepared for the tiles.
pub fn prepared_bytes(cols: usize) -> usize {
    blocks(cols) * PREPARED_BLOCK
}

/// An activation quantized like Q8_0 (ggml-cpu's run-time quantizer),
/// block `b` at byte `48·b` ([`PREPARED_BLOCK`]): `qy` the quants, `sy`
/// the block's Σy, `dy` its scale, `dsy` dy·Σy and `sy8` 8·Σy.
#[derive(Clone, Copy)]
pub(crate) struct Prepared<'a> {
    bytes: &'a [u8],
}

impl<'a> Prepared<'a> {
    /// View `bytes` as an activation of `nb` blocks.
    pub fn new(bytes: &'a [u8], nb: usize) -> Prepared<'a> {
        Prepared {
            bytes: &bytes[..nb * PREPARED_BLOCK],
        }
    }

    fn word(&self, b: usize, at: usize) -> [u8; 4] {
        self.bytes[PREPARED_BLOCK * b + at..][..4]
            .try_into()
            .unwrap()
    }

    /// Block `b`'s quants.
    pub fn qy(&self, b: usize) -> &'a [i8] {
        bytemuck::cast_slice(&self.bytes[PREPARED_BLOCK * b..][..QK8_0])
    }

    pub fn sy(&self, b: usize) -> i32 {
        i32::from_le_bytes(self.word(b, 32))
    }

    pub fn dy(&self, b: usize) -> f32 {
        f32::from_le_bytes(self.word(b, 36))
    }

    pub fn dsy(&self, b: usize) -> f32 {
        f32::from_le_bytes(self.word(b, 40))
    }

    #[cfg(test)]
    pub fn sy8(&self, b: usize) -> i32 {
        i32::from_le_bytes(self.word(b, 44))
    }
}

/// Quantize `x` (whole blocks) into `dst` (`prepared_bytes(x.len())` bytes,
/// 4-aligned), with the selected kernels' [`PREPARE`].
pub fn prepare(x: &[f32], dst: &mut [u8]) {
    (crate::selected().tile_prepare)(x, dst)
}

/// [`prepare`] of every set: one fused pass on both x86 sets, bit-identical
/// to the scalar twin.
pub(crate) const PREPARE: PerIsa<FromFloatFn> = {
    let k = PerIsa::new(prepare_ref as FromFloatFn);
    #[cfg(target_arch = "x86_64")]
    let k = k.avx2(prepare_avx2 as FromFloatFn);
    k
};

#[cfg(target_arch = "x86_64")]
fn prepare_avx2(x: &[f32], dst: &mut [u8]) {
    // SAFETY: reachable only through `PerIsa::get` for an x86 set, whose
    // caller guarantees AVX2, FMA and F16C; the kernel checks its lengths.
    unsafe { x86::prepare_avx2(x, dst) }
}

/// Scalar twin of [`prepare`]: ggml-cpu's Q8_0 quantizer, block by block,
/// and each block's parts.
fn prepare_ref(x: &[f32], dst: &mut [u8]) {
    assert_eq!(
        dst.len(),
        prepared_bytes(x.len()),
        "tiles: wrong activation buffer"
    );
    let mut block = [BlockQ8_0::zeroed()];
    for (xb, out) in x
        .chunks_exact(QK8_0)
        .zip(dst.chunks_exact_mut(PREPARED_BLOCK))
    {
        crate::quant::q8_0::quantize_row_activation_ref(xb, &mut block);
        let q = &block[0].qs;
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        let d = block[0].d.to_f32();
        out[..QK8_0].copy_from_slice(bytemuck::cast_slice(q));
        out[32..36].copy_from_slice(&sum.to_le_bytes());
        out[36..40].copy_from_slice(&d.to_le_bytes());
        out[40..44].copy_from_slice(&(d * sum as f32).to_le_bytes());
        out[44..48].copy_from_slice(&(8 * sum).to_le_bytes());
    }
}

/// The bounds every kernel's unchecked tile loads and output stores rely
/// on: `tile` holds `nb` blocks of `B`, `out` 16 rows per activation.
pub(crate) fn check_dot_bounds<B: TileBlock>(tile: &[u8], nb: usize, n: usize, out: &[f32]) {
    assert!(
        tile.len() >= nb.div_ceil(2) * pair_bytes::<B>(),
        "tiles: tile too short"
    );
    assert!(out.len() >= TILE_ROWS * n, "tiles: output too short");
}

/// The bounds and alignment the kernels' raw activation pointers rely
/// on: `n` activations of `nb` blocks, `stride` bytes apart from a
/// 4-aligned start.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn check_acts(acts: &[u8], nb: usize, stride: usize, n: usize) {
    if n == 0 {
        return;
    }
    assert!(
        acts.len() >= (n - 1) * stride + nb * PREPARED_BLOCK,
        "tiles: activations too short"
    );
    assert!(
        (acts.as_ptr() as usize).is_multiple_of(4) && stride.is_multiple_of(4),
        "tiles: activations not 4-aligned"
    );
}

/// Scalar twin of the kernels (see the module comment for the arithmetic).
fn dot_ref<B: TileBlock>(
    tile: &[u8],
    nb: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    check_dot_bounds::<B>(tile, nb, n, out);
    let half = |i: usize| f16::from_bits(u16::from_le_bytes([tile[i], tile[i + 1]])).to_f32();
    for c in 0..n {
        let a = Prepared::new(&acts[c * stride..], nb);
        for r in 0..TILE_ROWS {
            let mut acc = 0.0f32;
            for b in 0..nb {
                let (oq, od, om) = offsets::<B>(b);
                let q = &tile[oq..oq + B::QB];
                let y = a.qy(b);
                let mut isum = -B::C * a.sy(b);
                // The fifth bit (16) of the byte in half `h` of group `k`.
                let fifth = |k: usize, h: usize, i: usize| -> i32 {
                    if B::QUANTS != Quants::Nibbles5 {
                        return 0;
                    }
                    ((q[256 + 4 * r + i] >> (2 * k + h)) & 1) as i32 * 16
                };
                for k in 0..groups::<B>() {
                    for i in 0..4 {
                        let w = q[64 * k + 4 * r + i] as i32;
                        isum += match B::QUANTS {
                            Quants::Signed8 => w * y[4 * k + i] as i32,
                            _ => {
                                let lo = (w & 15) + fifth(k, 0, i);
                                let hi = (w >> 4) + fifth(k, 1, i);
                                lo * y[4 * k + i] as i32 + hi * y[16 + 4 * k + i] as i32
                            }
                        };
                    }
                }
                acc = (isum as f32).mul_add(half(od + 2 * r) * a.dy(b), acc);
                if B::HAS_MIN {
                    acc = half(om + 2 * r).mul_add(a.dsy(b), acc);
                }
            }
            out[TILE_ROWS * c + r] = acc;
        }
    }
}

/// The kernels of `B`: SIMD on AVX-512 and AVX2, the scalar twin
/// elsewhere (where tiles do not pay, [`crate::Kernels::tiles_pay`]).
const fn dots<B: TileBlock>() -> PerIsa<TileDotFn> {
    let dots = PerIsa::new(dot_ref::<B> as TileDotFn);
    #[cfg(target_arch = "x86_64")]
    let dots = dots
        .avx2(dot_avx2::<B> as TileDotFn)
        .avx512(dot_avx512::<B> as TileDotFn);
    dots
}

#[cfg(target_arch = "x86_64")]
fn dot_avx512<B: TileBlock>(
    tile: &[u8],
    nb: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    // SAFETY: reachable only through `PerIsa::get(Isa::Avx512)`, whose
    // caller guarantees the CPU has the AVX-512 set; the kernel checks the
    // tile, activation and output bounds it relies on.
    unsafe { x86::dot_avx512::<B>(tile, nb, acts, stride, n, out) }
}

#[cfg(target_arch = "x86_64")]
fn dot_avx2<B: TileBlock>(
    tile: &[u8],
    nb: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    // SAFETY: as in `dot_avx512`, for `PerIsa::get(Isa::Avx2)`.
    unsafe { x86::dot_avx2::<B>(tile, nb, acts, stride, n, out) }
}

#[cfg(test)]
mod tests;
