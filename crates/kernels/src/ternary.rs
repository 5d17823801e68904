//! Ternary (TQ2_0) matrices times one Q8_K activation, for the
//! cache-resident case: small matrices (a few hundred rows of 256–768
//! columns) decoded one token at a time, where the generic row-by-row dot
//! ([`crate::quant::tq2_0`]) spends most of its time on per-row work
//! (horizontal sums, scale conversions) rather than on multiplies.
//!
//! A [`TernaryMatrix`] is a repacked copy of TQ2_0 rows made when it is
//! bound: rows in tiles of [`TILE_ROWS`], and in each tile and 256-column
//! block [`TILE_BLOCK_BYTES`] of 2-bit fields (`value + 1`, exactly the
//! TQ2_0 bytes' information, 2 bits per weight) in the layout of one of
//! two kernels ([`TernaryKernel`]):
//! - [`TernaryKernel::Interleaved`]: "multiply-add on trits". Sixteen rows
//!   share each 64-byte line, four bytes per row, and bits `2k..2k+2` of
//!   byte `b` of a row's four hold column `16c + 4k + b`. One shift and one
//!   AND give, for 16 rows, the fields of four consecutive columns in the
//!   four bytes of each 32-bit lane, so one `vpdpbusd` (AVX-512 VNNI)
//!   against four activation bytes broadcast to every lane adds four
//!   columns to sixteen rows, each lane one row: no horizontal sums. AVX2
//!   does the same with `vpmaddubsw` + `vpmaddwd`.
//! - [`TernaryKernel::LutPairs`]: a lookup table per pair of activations (T-MAC
//!   / bitnet.cpp TL style). For each pair `(a₀, a₁)` of a block, the 16
//!   values `f₀·a₀ + f₁·a₁` over every pair of fields `(f₀, f₁)` are
//!   computed once per activation (one `vpmaddubsw` per pair) and stored as
//!   a 16-byte table of low bytes and one of high bytes; a weight byte
//!   holds two 4-bit indices `4f₀ + f₁` for one row, 64 rows per line, and
//!   `vpshufb` looks up 32 (AVX2) or 64 (AVX-512BW) rows at once. Partial
//!   sums are 16-bit and wrap; the true block sum lies in −32512..=32512,
//!   so the wrapped sum minus the block's activation sum, read as i16, is
//!   exact.
//! - [`TernaryKernel::LutTriples`]: the same idea with groups of three
//!   activations and AVX-512's `vpermw` (a 32-entry i16 table per
//!   register): a 16-bit word holds three 5-bit base-3 indices
//!   (`9f₀ + 3f₁ + f₂`; nine columns, 29 words per block, the last
//!   padded), 32 rows per register; each index is used in place (`vpermw`
//!   ignores the bits above 5), so a word costs two shifts, three lookups
//!   and three adds for 9 × 32 multiply-adds. AVX-512 only: the other sets
//!   run its scalar twin.
//!
//! All compute, per row and block, the exact integer `Σ (f − 1)·a` as
//! `Σ f·a − Σ a`, then the float result exactly as the reference does
//! ([`crate::quant::tq2_0::vec_dot_ref`]): `y = Σ_b s_b · (d_act · d_w)`
//! in block order. So every kernel and set gives bit-identical outputs,
//! equal to the reference's, on any split of the rows over threads.
//!
//! Measured (benches/ternary.rs, one thread, Zen 4 class EPYC shared with
//! other jobs, fastest of 15 rounds): at 256×256 … 768×256 the interleaved
//! kernel takes 0.36–1.05 µs per product against 2.0–5.4 µs for the
//! generic path (4.6–5.8×); the triples LUT is 2–11% slower than it (a
//! tie within noise at 768×256), and
//! the pairs LUT 2.2–2.5× slower (two lookups, two unpacks per 4
//! columns). The tables cost per token what the interleaved kernel never
//! pays, and these matrices are too short to amortize them. So
//! [`TernaryMatrix::new`] lays out for the interleaved kernel.
//!
//! [`TernaryMatrix::matvec_pair`] takes the runtime's activation pair
//! (Q8_K of `x` and of its residual) in one pass: each line is loaded and
//! masked once for both, the `vpdpbusd`s (the bound) stay. Measured as
//! above (two runs), against two `matvec`s added: 0.87–0.93× the time on
//! AVX-512, 0.82–0.91× on AVX2, 0.35× on the scalar twin (256×256 …
//! 256×768).
//!
//! Limits: field 3 (which TQ2_0 decodes as +2 but no quantizer writes) is
//! refused when binding; activations must come from the Q8_K quantizer
//! (values in −127..=127, which keeps the LUT's 16-bit sums exact).

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;

use crate::dispatch::Kernels;
use crate::isa::{Isa, PerIsa};
use crate::pool::ThreadPool;
use crate::quant::q8_k::BlockQ8K;
use crate::quant::tq2_0::BlockTQ2_0;
use bytemuck::{Pod, Zeroable};
use gguf::QK_K;
use std::cell::RefCell;
use std::fmt;

/// Rows per tile of the repacked layout (the unit of work of a thread;
/// rows are padded with zero weights to whole tiles).
pub const TILE_ROWS: usize = 64;
/// Bytes of one tile's 256-column block: 64 rows × 256 fields × 2 bits.
pub const TILE_BLOCK_BYTES: usize = TILE_ROWS * QK_K / 4;
/// Pairs of activations per block, one lookup table each.
const PAIRS: usize = QK_K / 2;
/// One pair's table: 16 low bytes, then 16 high bytes of the i16 values.
const TABLE_BYTES: usize = 32;
/// Words of nine columns (three groups of three) per block in the
/// [`TernaryKernel::LutTriples`] layout; columns 256..261 are padding.
const WORDS: usize = QK_K.div_ceil(9);
/// Groups of three activations per block with a table each.
const TRIPLES: usize = 3 * WORDS;
/// One triple's table: 32 i16 entries (27 used).
const TABLE3_BYTES: usize = 64;
/// The lookup tables of one block (room for either LUT kernel's).
pub const BLOCK_TABLES_BYTES: usize = TRIPLES * TABLE3_BYTES;
const _: () = assert!(PAIRS * TABLE_BYTES <= BLOCK_TABLES_BYTES);
const _: () = assert!(WORDS * 2 * TILE_ROWS <= TILE_BLOCK_BYTES);

/// Which kernel a [`TernaryMatrix`] is laid out for (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TernaryKernel {
    /// Row-interleaved 2-bit fields, multiply-add (VNNI on AVX-512).
    Interleaved,
    /// Lookup tables of activation pairs, `vpshufb`.
    LutPairs,
    /// Lookup tables of activation triples, `vpermw` (AVX-512 only; the
    /// other sets run its scalar twin).
    LutTriples,
}

impl TernaryKernel {
    pub const ALL: [TernaryKernel; 3] = [
        TernaryKernel::Interleaved,
        TernaryKernel::LutPairs,
        TernaryKernel::LutTriples,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TernaryKernel::Interleaved => "interleaved",
            TernaryKernel::LutPairs => "lut-pairs",
            TernaryKernel::LutTriples => "lut-triples",
        }
    }
}

/// Why TQ2_0 rows cannot be bound as a [`TernaryMatrix`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TernaryError {
    /// Columns are not a whole number of 256-wide blocks.
    RaggedCols { cols: usize },
    /// `rows × cols` overflows.
    TooLarge { rows: usize, cols: usize },
    /// Not `rows × cols / 256` blocks.
    BlockCount {
        rows: usize,
        cols: usize,
        expected: usize,
        actual: usize,
    },
    /// A 2-bit field holds 3 (decoded as +2: not ternary).
    NotTernary { row: usize, col: usize },
}

impl fmt::Display for TernaryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TernaryError::RaggedCols { cols } => write!(
                f,
                "ternary matrix: {cols} columns is not a multiple of the {QK_K}-wide TQ2_0 block"
            ),
            TernaryError::TooLarge { rows, cols } => {
                write!(f, "ternary matrix of {rows}×{cols} is too large to address")
            }
            TernaryError::BlockCount {
                rows,
                cols,
                expected,
                actual,
            } => write!(
                f,
                "ternary matrix {rows}×{cols}: expected {expected} TQ2_0 blocks, got {actual}"
            ),
            TernaryError::NotTernary { row, col } => write!(
                f,
                "ternary matrix: weight ({row}, {col}) has TQ2_0 field 3 (+2), not a ternary value"
            ),
        }
    }
}

impl std::error::Error for TernaryError {}

/// The integer sums `Σ f·a − bias` of one tile's block for its 64 rows:
/// `w` is the block's [`TILE_BLOCK_BYTES`], `qs` the activation block,
/// `tables` the block's [`BLOCK_TABLES_BYTES`] (LUT kernels only) and
/// `bias` the activation block's sum.
type BlockSumsFn = fn(
    w: &[u8; TILE_BLOCK_BYTES],
    qs: &[i8; QK_K],
    tables: &[u8; BLOCK_TABLES_BYTES],
    bias: i32,
    sums: &mut [i32; TILE_ROWS],
);

/// What a kernel needs for one tile of 64 rows: its blocks' fields, the
/// activation, the activation's tables (LUT kernels only) and block sums,
/// and the tile's weight scales.
pub struct Tile<'a> {
    w: &'a [u8],
    x: &'a [BlockQ8K],
    tables: &'a [u8],
    bias: &'a [i32],
    scales: &'a [f32],
}

impl<'a> Tile<'a> {
    fn block(&self, b: usize) -> &'a [u8; TILE_BLOCK_BYTES] {
        self.w[b * TILE_BLOCK_BYTES..(b + 1) * TILE_BLOCK_BYTES]
            .try_into()
            .expect("a tile block is TILE_BLOCK_BYTES long")
    }
    fn tables(&self, b: usize) -> &'a [u8; BLOCK_TABLES_BYTES] {
        if self.tables.is_empty() {
            return &NO_TABLES;
        }
        self.tables[b * BLOCK_TABLES_BYTES..(b + 1) * BLOCK_TABLES_BYTES]
            .try_into()
            .expect("whole tables")
    }
    fn scales(&self, b: usize) -> &'a [f32; TILE_ROWS] {
        self.scales[b * TILE_ROWS..(b + 1) * TILE_ROWS]
            .try_into()
            .expect("a scale per row")
    }
}

/// One tile's outputs: each block's integer sums, then the reference's
/// float arithmetic, lane by lane (`y += s · (d_act · d_w)` in block
/// order from 0).
pub type TileFn = fn(t: &Tile<'_>, out: &mut [f32; TILE_ROWS]);

/// The float part every [`TileFn`] shares (the SIMD ones inline it).
#[inline(always)]
fn accumulate(acc: &mut [f32; TILE_ROWS], sums: &[i32; TILE_ROWS], d: f32, sc: &[f32; TILE_ROWS]) {
    for ((a, &s), &w) in acc.iter_mut().zip(sums).zip(sc) {
        *a += s as f32 * (d * w);
    }
}

/// A [`TileFn`] from a block kernel.
#[inline(always)]
fn tile_with(sums_fn: BlockSumsFn, t: &Tile<'_>, out: &mut [f32; TILE_ROWS]) {
    let mut acc = [0.0f32; TILE_ROWS];
    let mut sums = [0i32; TILE_ROWS];
    for (b, xb) in t.x.iter().enumerate() {
        sums_fn(t.block(b), &xb.qs, t.tables(b), t.bias[b], &mut sums);
        accumulate(&mut acc, &sums, xb.d, t.scales(b));
    }
    *out = acc;
}

fn interleaved_tile_ref(t: &Tile<'_>, out: &mut [f32; TILE_ROWS]) {
    tile_with(interleaved_sums_ref, t, out)
}
fn lut_tile_ref(t: &Tile<'_>, out: &mut [f32; TILE_ROWS]) {
    tile_with(lut_sums_ref, t, out)
}
fn lut3_tile_ref(t: &Tile<'_>, out: &mut [f32; TILE_ROWS]) {
    tile_with(lut3_sums_ref, t, out)
}

/// One tile's outputs for an activation pair (`hi` and `lo`, the same
/// weights): each activation's float sums kept apart, in block order as a
/// [`TileFn`] computes them, then `out = y_hi + y_lo` lane by lane, so the
/// result is bit-identical to two products added.
pub type PairTileFn = fn(hi: &Tile<'_>, lo: &Tile<'_>, out: &mut [f32; TILE_ROWS]);

/// The integer sums of one tile's block for two activations (`hi`, `lo`)
/// from one read of the weights; each as [`BlockSumsFn`] gives it.
type PairSumsFn = fn(
    w: &[u8; TILE_BLOCK_BYTES],
    qs: [&[i8; QK_K]; 2],
    bias: [i32; 2],
    sums: [&mut [i32; TILE_ROWS]; 2],
);

/// A [`PairTileFn`] from a pair block kernel.
#[inline(always)]
fn pair_tile_with(sums_fn: PairSumsFn, hi: &Tile<'_>, lo: &Tile<'_>, out: &mut [f32; TILE_ROWS]) {
    let (mut acc_hi, mut acc_lo) = ([0.0f32; TILE_ROWS], [0.0f32; TILE_ROWS]);
    let (mut sums_hi, mut sums_lo) = ([0i32; TILE_ROWS], [0i32; TILE_ROWS]);
    for (b, (xh, xl)) in hi.x.iter().zip(lo.x).enumerate() {
        sums_fn(
            hi.block(b),
            [&xh.qs, &xl.qs],
            [hi.bias[b], lo.bias[b]],
            [&mut sums_hi, &mut sums_lo],
        );
        accumulate(&mut acc_hi, &sums_hi, xh.d, hi.scales(b));
        accumulate(&mut acc_lo, &sums_lo, xl.d, hi.scales(b));
    }
    for ((o, h), l) in out.iter_mut().zip(acc_hi).zip(acc_lo) {
        *o = h + l;
    }
}

fn interleaved_pair_tile_ref(hi: &Tile<'_>, lo: &Tile<'_>, out: &mut [f32; TILE_ROWS]) {
    pair_tile_with(interleaved_pair_sums_ref, hi, lo, out)
}

/// Q8_K quantization of one block, bit-identical to
/// [`crate::quant::q8_k::quantize_row`].
pub type QuantizeFn = fn(x: &[f32; QK_K], y: &mut BlockQ8K);

/// The lookup tables of one activation block.
pub type TablesFn = fn(qs: &[i8; QK_K], tables: &mut [u8; BLOCK_TABLES_BYTES]);

/// The ternary kernels of one instruction set.
#[derive(Clone, Copy)]
pub struct TernaryKernels {
    /// The set they are written for.
    pub isa: Isa,
    pub interleaved: TileFn,
    /// [`TernaryKernel::Interleaved`] on an activation pair.
    pub interleaved_pair: PairTileFn,
    pub lut: TileFn,
    pub tables: TablesFn,
    pub lut3: TileFn,
    pub tables3: TablesFn,
    pub quantize: QuantizeFn,
    /// The sum of an activation block's values.
    pub act_sum: fn(&[i8; QK_K]) -> i32,
}

impl TernaryKernels {
    /// The ternary kernels of `kernels`' set (holding the table proves the
    /// CPU supports it).
    pub fn of(kernels: &'static Kernels) -> TernaryKernels {
        // SAFETY: `dispatch::table` builds a `Kernels` only for a set the
        // CPU supports, so `kernels.isa()` is supported.
        unsafe { KERNELS.get(kernels.isa()) }
    }

    fn tile(&self, kernel: TernaryKernel) -> TileFn {
        match kernel {
            TernaryKernel::Interleaved => self.interleaved,
            TernaryKernel::LutPairs => self.lut,
            TernaryKernel::LutTriples => self.lut3,
        }
    }

    fn tables(&self, kernel: TernaryKernel) -> Option<TablesFn> {
        match kernel {
            TernaryKernel::Interleaved => None,
            TernaryKernel::LutPairs => Some(self.tables),
            TernaryKernel::LutTriples => Some(self.tables3),
        }
    }
}

/// Scalar twins everywhere; SIMD on AVX2 and AVX-512 (NEON has none yet).
pub(crate) const KERNELS: PerIsa<TernaryKernels> = {
    let k = PerIsa::new(TernaryKernels {
        isa: Isa::Scalar,
        interleaved: interleaved_tile_ref,
        interleaved_pair: interleaved_pair_tile_ref,
        lut: lut_tile_ref,
        tables: tables_ref,
        lut3: lut3_tile_ref,
        tables3: tables3_ref,
        quantize: quantize_ref,
        act_sum: act_sum_ref,
    });
    #[cfg(target_arch = "x86_64")]
    let k = k
        .avx2(TernaryKernels {
            isa: Isa::Avx2,
            interleaved: x86::interleaved_tile_avx2,
            interleaved_pair: x86::interleaved_pair_tile_avx2,
            lut: x86::lut_tile_avx2,
            tables: x86::tables_avx2,
            lut3: lut3_tile_ref,
            tables3: tables3_ref,
            quantize: x86::quantize_avx2,
            act_sum: x86::act_sum_avx2,
        })
        .avx512(TernaryKernels {
            isa: Isa::Avx512,
            interleaved: x86::interleaved_tile_avx512,
            interleaved_pair: x86::interleaved_pair_tile_avx512,
            lut: x86::lut_tile_avx512,
            tables: x86::tables_avx2,
            lut3: x86::lut3_tile_avx512,
            tables3: x86::tables3_avx512,
            quantize: x86::quantize_avx512,
            act_sum: x86::act_sum_avx2,
        });
    k
};

/// A cache line, so tiles and tables start 64-byte aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Line([u8; 64]);

/// A `rows × cols` TQ2_0 matrix repacked for one [`TernaryKernel`] (module
/// docs), with the kernels of the set selected when it was bound.
pub struct TernaryMatrix {
    rows: usize,
    cols: usize,
    blocks: usize,
    kernel: TernaryKernel,
    /// `[tile][block]` × [`TILE_BLOCK_BYTES`].
    packed: Vec<Line>,
    /// Weight scales as f32, `[tile][block][row in tile]` (0 for padding).
    scales: Vec<f32>,
    kernels: TernaryKernels,
}

/// The kernel [`TernaryMatrix::new`] lays out for: the fastest on the
/// cachefit ternary shapes (module docs).
pub const DEFAULT_KERNEL: TernaryKernel = TernaryKernel::Interleaved;

/// Field `j` (0..256) of a TQ2_0 block.
fn field(b: &BlockTQ2_0, j: usize) -> u8 {
    (b.qs[32 * (j / 128) + j % 32] >> (2 * ((j % 128) / 32))) & 3
}

/// Byte and shift of the field of `(row, col)` (within a tile and block)
/// in the interleaved layout.
fn interleaved_pos(row: usize, col: usize) -> (usize, u32) {
    let (c, k, b) = (col / 16, (col % 16) / 4, col % 4);
    let (s, i) = (row / 16, row % 16);
    (c * 256 + s * 64 + i * 4 + b, 2 * k as u32)
}

/// Byte and shift of the field of `(row, col)` in the LUT layout: the
/// byte of columns `4p..4p+4` holds `4f(4p) + f(4p+1)` in its low nibble,
/// `4f(4p+2) + f(4p+3)` in its high one.
fn lut_pos(row: usize, col: usize) -> (usize, u32) {
    let (p, m) = (col / 4, col % 4);
    (
        p * TILE_ROWS + row,
        4 * (m as u32 / 2) + 2 * (1 - m as u32 % 2),
    )
}

/// Word `u` of a row's block in the triples layout: three 5-bit indices
/// `9f₀ + 3f₁ + f₂`, one per group of three columns `9u + 3m ..`, in bits
/// `5m..5m + 5`; columns past the block read field 1.
fn triples_word(fields: &[u8; QK_K], u: usize) -> u16 {
    let f = |j: usize| fields.get(j).copied().unwrap_or(1) as u16;
    (0..3).fold(0u16, |w, m| {
        let j = 9 * u + 3 * m;
        w | (9 * f(j) + 3 * f(j + 1) + f(j + 2)) << (5 * m)
    })
}

impl TernaryMatrix {
    /// Repack `w` (`rows` rows of `cols / 256` blocks, row-major) for
    /// [`DEFAULT_KERNEL`] with the selected kernels.
    pub fn new(rows: usize, cols: usize, w: &[BlockTQ2_0]) -> Result<TernaryMatrix, TernaryError> {
        Self::with_kernel(rows, cols, w, DEFAULT_KERNEL, crate::selected())
    }

    /// Repack `w` for `kernel`, with `kernels`' set (tests and benchmarks
    /// hold each to the others).
    pub fn with_kernel(
        rows: usize,
        cols: usize,
        w: &[BlockTQ2_0],
        kernel: TernaryKernel,
        kernels: &'static Kernels,
    ) -> Result<TernaryMatrix, TernaryError> {
        if !cols.is_multiple_of(QK_K) {
            return Err(TernaryError::RaggedCols { cols });
        }
        let blocks = cols / QK_K;
        let expected = rows
            .checked_mul(blocks)
            .filter(|&n| n.checked_mul(TILE_BLOCK_BYTES).is_some())
            .ok_or(TernaryError::TooLarge { rows, cols })?;
        if w.len() != expected {
            return Err(TernaryError::BlockCount {
                rows,
                cols,
                expected,
                actual: w.len(),
            });
        }
        let tiles = rows.div_ceil(TILE_ROWS);
        let mut packed = vec![Line::zeroed(); tiles * blocks * TILE_BLOCK_BYTES / 64];
        let mut scales = vec![0.0f32; tiles * blocks * TILE_ROWS];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut packed);
        let pos = match kernel {
            TernaryKernel::Interleaved => interleaved_pos,
            TernaryKernel::LutPairs | TernaryKernel::LutTriples => lut_pos,
        };
        for r in 0..tiles * TILE_ROWS {
            let (t, i) = (r / TILE_ROWS, r % TILE_ROWS);
            for b in 0..blocks {
                let tb = t * blocks + b;
                let dst = &mut bytes[tb * TILE_BLOCK_BYTES..(tb + 1) * TILE_BLOCK_BYTES];
                // Padding rows hold field 1 (weight 0) so every kernel's
                // `Σ f·a − Σ a` gives them 0.
                let block = w.get(r * blocks + b).filter(|_| r < rows);
                if let Some(block) = block {
                    scales[tb * TILE_ROWS + i] = block.d.to_f32();
                }
                let mut fields = [1u8; QK_K];
                for (j, f) in fields.iter_mut().enumerate() {
                    *f = block.map_or(1, |blk| field(blk, j));
                    if *f == 3 {
                        return Err(TernaryError::NotTernary {
                            row: r,
                            col: b * QK_K + j,
                        });
                    }
                }
                if kernel == TernaryKernel::LutTriples {
                    for u in 0..WORDS {
                        let word = triples_word(&fields, u);
                        dst[2 * (u * TILE_ROWS + i)..][..2].copy_from_slice(&word.to_le_bytes());
                    }
                } else {
                    for (j, &f) in fields.iter().enumerate() {
                        let (byte, shift) = pos(i, j);
                        dst[byte] |= f << shift;
                    }
                }
            }
        }
        Ok(TernaryMatrix {
            rows,
            cols,
            blocks,
            kernel,
            packed,
            scales,
            kernels: TernaryKernels::of(kernels),
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn kernel(&self) -> TernaryKernel {
        self.kernel
    }
    /// The set whose kernels the products run.
    pub fn isa(&self) -> Isa {
        self.kernels.isa
    }
    /// Bytes a product reads: the repacked fields (padding included) and
    /// the f32 scales; the LUT kernel also writes and reads
    /// [`BLOCK_TABLES_BYTES`] of tables per block.
    pub fn bytes(&self) -> usize {
        self.packed.len() * 64 + self.scales.len() * 4
    }

    /// `y = W · x` for one activation row `x` of `cols / 256` Q8_K blocks
    /// (from the Q8_K quantizer), `y` of `rows`. Bit-identical to
    /// [`crate::quant::tq2_0::vec_dot_ref`] per row, for every kernel, set
    /// and thread count.
    pub fn matvec(&self, pool: &ThreadPool, x: &[BlockQ8K], y: &mut [f32]) {
        assert_eq!(
            x.len(),
            self.blocks,
            "ternary matvec: x has {} Q8_K blocks, the matrix {} columns",
            x.len(),
            self.cols
        );
        assert_eq!(
            y.len(),
            self.rows,
            "ternary matvec: y has {} elements, the matrix {} rows",
            y.len(),
            self.rows
        );
        if self.rows == 0 {
            return;
        }
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let Scratch { tables, bias, .. } = &mut *s;
            bias.clear();
            bias.extend(x.iter().map(|b| (self.kernels.act_sum)(&b.qs)));
            let tables: &[u8] = if let Some(build) = self.kernels.tables(self.kernel) {
                let n = self.blocks * BLOCK_TABLES_BYTES / 64;
                if tables.len() < n {
                    tables.resize(n, Line::zeroed());
                }
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut tables[..n]);
                for (xb, t) in x.iter().zip(bytes.chunks_exact_mut(BLOCK_TABLES_BYTES)) {
                    build(&xb.qs, t.try_into().expect("whole tables"));
                }
                bytemuck::cast_slice(&tables[..n])
            } else {
                &[]
            };
            let bias = &bias[..];
            pool.for_each_chunk_mut(y, TILE_ROWS, |start, out, _| {
                self.tile(start / TILE_ROWS, x, tables, bias, out)
            });
        })
    }

    /// `y = W · hi + W · lo` for an activation pair (the runtime's Q8_K
    /// `hi` and its residual `lo`), bit-identical to `matvec(hi) → y`,
    /// `matvec(lo) → y_lo`, then `y[i] += y_lo[i]`: the interleaved kernel
    /// reads and unpacks each weight line once for both activations (two
    /// sets of integer sums, two float accumulations added at the end).
    /// The LUT kernels run two products: their per-activation tables, not
    /// the weights, dominate what they read.
    pub fn matvec_pair(&self, pool: &ThreadPool, hi: &[BlockQ8K], lo: &[BlockQ8K], y: &mut [f32]) {
        for (name, x) in [("hi", hi), ("lo", lo)] {
            assert_eq!(
                x.len(),
                self.blocks,
                "ternary matvec_pair: {name} has {} Q8_K blocks, the matrix {} columns",
                x.len(),
                self.cols
            );
        }
        assert_eq!(
            y.len(),
            self.rows,
            "ternary matvec_pair: y has {} elements, the matrix {} rows",
            y.len(),
            self.rows
        );
        if self.rows == 0 {
            return;
        }
        if self.kernel != TernaryKernel::Interleaved {
            // `matvec` borrows the scratch itself: take the buffer out.
            let mut y_lo = SCRATCH.with(|s| std::mem::take(&mut s.borrow_mut().y_lo));
            y_lo.clear();
            y_lo.resize(self.rows, 0.0);
            self.matvec(pool, hi, y);
            self.matvec(pool, lo, &mut y_lo);
            for (a, b) in y.iter_mut().zip(&y_lo) {
                *a += b;
            }
            SCRATCH.with(|s| s.borrow_mut().y_lo = y_lo);
            return;
        }
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let bias = &mut s.bias;
            bias.clear();
            bias.extend(hi.iter().chain(lo).map(|b| (self.kernels.act_sum)(&b.qs)));
            let (bias_hi, bias_lo) = bias.split_at(self.blocks);
            let f = self.kernels.interleaved_pair;
            pool.for_each_chunk_mut(y, TILE_ROWS, |start, out, _| {
                let t = start / TILE_ROWS;
                let (th, tl) = (
                    self.tile_view(t, hi, &[], bias_hi),
                    self.tile_view(t, lo, &[], bias_lo),
                );
                run_tile(out, |all| f(&th, &tl, all));
            });
        })
    }

    /// Tile `t`'s weights and scales with an activation's data.
    fn tile_view<'a>(
        &'a self,
        t: usize,
        x: &'a [BlockQ8K],
        tables: &'a [u8],
        bias: &'a [i32],
    ) -> Tile<'a> {
        let tb = self.blocks * TILE_BLOCK_BYTES;
        let ts = self.blocks * TILE_ROWS;
        Tile {
            w: &bytemuck::cast_slice(&self.packed)[t * tb..(t + 1) * tb],
            x,
            tables,
            bias,
            scales: &self.scales[t * ts..(t + 1) * ts],
        }
    }

    /// Rows of tile `t` into `out`.
    fn tile(&self, t: usize, x: &[BlockQ8K], tables: &[u8], bias: &[i32], out: &mut [f32]) {
        let tile = self.tile_view(t, x, tables, bias);
        let f = self.kernels.tile(self.kernel);
        run_tile(out, |all| f(&tile, all));
    }
}

/// `f` on a whole tile's outputs, written to `out` (a whole tile, or the
/// last, partial one).
#[inline(always)]
fn run_tile(out: &mut [f32], f: impl FnOnce(&mut [f32; TILE_ROWS])) {
    match out.try_into() {
        Ok(out) => f(out),
        Err(_) => {
            let mut all = [0.0f32; TILE_ROWS];
            f(&mut all);
            out.copy_from_slice(&all[..out.len()]);
        }
    }
}

impl fmt::Debug for TernaryMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TernaryMatrix")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("kernel", &self.kernel)
            .field("isa", &self.kernels.isa)
            .finish()
    }
}

/// What kernels without tables get for them.
static NO_TABLES: [u8; BLOCK_TABLES_BYTES] = [0; BLOCK_TABLES_BYTES];

/// Per-thread buffers of [`TernaryMatrix::matvec`] (on the calling
/// thread): they grow to the widest matrix, then stay.
#[derive(Default)]
struct Scratch {
    tables: Vec<Line>,
    bias: Vec<i32>,
    /// The `lo` product of [`TernaryMatrix::matvec_pair`]'s two-pass path.
    y_lo: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Quantize `x` (a whole number of 256-element blocks) to Q8_K with the
/// selected kernels: the activation of [`TernaryMatrix::matvec`],
/// bit-identical to [`crate::quant::q8_k::quantize_row`] for finite
/// inputs (NaN and infinities give unspecified, memory-safe results).
pub fn quantize_activation(x: &[f32], y: &mut [BlockQ8K]) {
    quantize_activation_with(&TernaryKernels::of(crate::selected()), x, y)
}

/// [`quantize_activation`] with a given set's kernels.
pub fn quantize_activation_with(k: &TernaryKernels, x: &[f32], y: &mut [BlockQ8K]) {
    assert_eq!(
        x.len(),
        y.len() * QK_K,
        "quantize_activation: {} values for {} Q8_K blocks",
        x.len(),
        y.len()
    );
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        (k.quantize)(xb.try_into().expect("a whole block"), yb);
    }
}

/// Scalar twin of the block quantizers: the reference.
fn quantize_ref(x: &[f32; QK_K], y: &mut BlockQ8K) {
    crate::quant::q8_k::quantize_row(x, std::slice::from_mut(y))
}

fn act_sum_ref(qs: &[i8; QK_K]) -> i32 {
    qs.iter().map(|&q| q as i32).sum()
}

/// Scalar twin of the interleaved kernels: the layout walked line by
/// line (see [`interleaved_pos`]).
fn interleaved_sums_ref(
    w: &[u8; TILE_BLOCK_BYTES],
    qs: &[i8; QK_K],
    _tables: &[u8; BLOCK_TABLES_BYTES],
    bias: i32,
    sums: &mut [i32; TILE_ROWS],
) {
    sums.fill(-bias);
    for (c, chunk) in w.chunks_exact(256).enumerate() {
        let a = &qs[16 * c..16 * c + 16];
        for (r, bytes) in chunk.chunks_exact(4).enumerate() {
            // Line s = r / 16, lane i = r % 16: row 16s + i = r.
            let mut acc = 0i32;
            for (b, &v) in bytes.iter().enumerate() {
                for k in 0..4 {
                    acc += ((v >> (2 * k)) & 3) as i32 * a[4 * k + b] as i32;
                }
            }
            sums[r] += acc;
        }
    }
}

/// Scalar twin of the interleaved pair kernels: each field extracted once
/// and multiplied by both activations.
fn interleaved_pair_sums_ref(
    w: &[u8; TILE_BLOCK_BYTES],
    qs: [&[i8; QK_K]; 2],
    bias: [i32; 2],
    sums: [&mut [i32; TILE_ROWS]; 2],
) {
    let [sums_hi, sums_lo] = sums;
    sums_hi.fill(-bias[0]);
    sums_lo.fill(-bias[1]);
    for (c, chunk) in w.chunks_exact(256).enumerate() {
        let (a_hi, a_lo) = (&qs[0][16 * c..16 * c + 16], &qs[1][16 * c..16 * c + 16]);
        for (r, bytes) in chunk.chunks_exact(4).enumerate() {
            let (mut acc_hi, mut acc_lo) = (0i32, 0i32);
            for (b, &v) in bytes.iter().enumerate() {
                for k in 0..4 {
                    let f = ((v >> (2 * k)) & 3) as i32;
                    acc_hi += f * a_hi[4 * k + b] as i32;
                    acc_lo += f * a_lo[4 * k + b] as i32;
                }
            }
            sums_hi[r] += acc_hi;
            sums_lo[r] += acc_lo;
        }
    }
}

/// Scalar twin of the table builders: entry `4f₀ + f₁` of pair `g` is
/// `f₀·a[2g] + f₁·a[2g+1]`, low bytes then high bytes.
fn tables_ref(qs: &[i8; QK_K], tables: &mut [u8; BLOCK_TABLES_BYTES]) {
    for (g, t) in tables.chunks_exact_mut(TABLE_BYTES).take(PAIRS).enumerate() {
        let (a0, a1) = (qs[2 * g] as i16, qs[2 * g + 1] as i16);
        for idx in 0..16 {
            let v = (idx >> 2) as i16 * a0 + (idx & 3) as i16 * a1;
            t[idx] = v as u8;
            t[16 + idx] = (v >> 8) as u8;
        }
    }
}

/// Scalar twin of the LUT kernels: the same table lookups, summed in i32
/// (the SIMD kernels' wrapping 16-bit sums give the same value).
fn lut_sums_ref(
    w: &[u8; TILE_BLOCK_BYTES],
    _qs: &[i8; QK_K],
    tables: &[u8; BLOCK_TABLES_BYTES],
    bias: i32,
    sums: &mut [i32; TILE_ROWS],
) {
    let entry = |g: usize, idx: u8| -> i32 {
        let t = &tables[g * TABLE_BYTES..(g + 1) * TABLE_BYTES];
        i16::from_le_bytes([t[idx as usize], t[16 + idx as usize]]) as i32
    };
    for (i, s) in sums.iter_mut().enumerate() {
        *s = (0..QK_K / 4).fold(-bias, |acc, p| {
            let v = w[p * TILE_ROWS + i];
            acc + entry(2 * p, v & 15) + entry(2 * p + 1, v >> 4)
        });
    }
}

/// Scalar twin of the triples' table builders: entry `9f₀ + 3f₁ + f₂` of
/// triple `g` is `f₀·a[3g] + f₁·a[3g+1] + f₂·a[3g+2]` (activations past
/// the block are 0; entries 27..32 are 0), as little-endian i16.
fn tables3_ref(qs: &[i8; QK_K], tables: &mut [u8; BLOCK_TABLES_BYTES]) {
    let a = |j: usize| qs.get(j).map_or(0, |&q| q as i16);
    for (g, t) in tables.chunks_exact_mut(TABLE3_BYTES).enumerate() {
        for idx in 0..32 {
            let v = if idx < 27 {
                (idx / 9) as i16 * a(3 * g)
                    + (idx / 3 % 3) as i16 * a(3 * g + 1)
                    + (idx % 3) as i16 * a(3 * g + 2)
            } else {
                0
            };
            t[2 * idx..2 * idx + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Scalar twin of the triples kernels: the same lookups, summed in i32.
fn lut3_sums_ref(
    w: &[u8; TILE_BLOCK_BYTES],
    _qs: &[i8; QK_K],
    tables: &[u8; BLOCK_TABLES_BYTES],
    bias: i32,
    sums: &mut [i32; TILE_ROWS],
) {
    let entry = |g: usize, idx: u16| -> i32 {
        let at = g * TABLE3_BYTES + 2 * (idx as usize & 31);
        i16::from_le_bytes([tables[at], tables[at + 1]]) as i32
    };
    for (i, s) in sums.iter_mut().enumerate() {
        *s = (0..WORDS).fold(-bias, |acc, u| {
            let at = 2 * (u * TILE_ROWS + i);
            let word = u16::from_le_bytes([w[at], w[at + 1]]);
            (0..3).fold(acc, |acc, m| acc + entry(3 * u + m, word >> (5 * m)))
        });
    }
}
