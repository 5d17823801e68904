//! Int8 matrices with one f32 scale per row, times an int8 vector: the
//! arithmetic of the `cachefit` architecture (docs/CACHEFIT-FORMAT.md,
//! "Runtime arithmetic").
//!
//! An activation `x` is quantized once ([`I8Vector::quantize`]): `sx =
//! max|x| / 127`, `qx = round(x / sx)` (halves away from zero). Then each
//! output is `y[r] = (Σ_c q[r][c]·qx[c]) as f32 · (scale[r] · sx)`: the sum
//! is exact in i32 and the float part is the same two products in every
//! kernel, so **every kernel set gives bit-identical outputs**, on any split
//! of the rows over threads. Tests hold each set to the scalar twin
//! ([`matvec_rows_ref`]) bit for bit.
//!
//! Kernels, eight rows per step so the activation is loaded once per eight
//! rows and the horizontal sums are shared (one transpose-add for all
//! eight):
//! - AVX2: `vpmaddubsw` with the sign trick, `|qx| · sign(q, qx)`; |qx| is
//!   precomputed with the quantized vector. Exact because weights and
//!   activations are in −127..=127 (pairs stay below 2·127² < 2¹⁵); weights
//!   holding −128 are refused by [`I8Matrix::new`]. The last partial 32-byte
//!   chunk re-reads a row's last 32 bytes against an activation masked to 0
//!   where columns were already counted, so no scalar tail.
//! - AVX-512 VNNI on a packed copy (made when the matrix is bound, if this
//!   process uses the AVX-512 kernels): rows interleaved in blocks of 16,
//!   four columns of each row per 4-byte lane, stored as `q + 128` (u8). One
//!   `vpdpbusd` of a 64-byte block against four activation bytes broadcast
//!   to every lane adds four columns to sixteen rows, so each lane
//!   accumulates one row and no horizontal sums are needed; the offset's
//!   contribution `128 · Σ_c qx[c]` is one number per activation. Four
//!   blocks (64 rows) share each broadcast. Rows and columns are padded
//!   with zeros to whole blocks in the copy.
//! - AVX-512 VNNI on the rows in place (matrices bound without packing):
//!   `vpdpbusd` on the activation offset to unsigned (`qx + 128`,
//!   precomputed) and the weights; the offset's contribution `128 ·
//!   Σ_c q[r][c]` is subtracted per row, with the row sums computed once when
//!   the matrix is bound. The tail is one masked load per row.
//!
//! Rows of up to [`MAX_COLS`] columns keep every partial sum inside i32.

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;

use crate::isa::PerIsa;
use crate::pool::ThreadPool;
use bytemuck::{Pod, Zeroable};
use std::fmt;

/// Widest row: `255 · 127 · MAX_COLS` (the VNNI kernel's offset sum) stays
/// below 2³¹.
pub const MAX_COLS: usize = 1 << 16;

/// Why an int8 matrix cannot be bound.
#[derive(Debug, Clone, PartialEq)]
pub enum I8Error {
    /// More columns than [`MAX_COLS`].
    TooWide { cols: usize },
    /// `rows × cols` overflows.
    TooLarge { rows: usize, cols: usize },
    /// The weights are not `rows × cols` long.
    DataLength { expected: usize, actual: usize },
    /// Not one scale per row.
    ScaleLength { rows: usize, actual: usize },
    /// A weight is −128 (the format allows −127..=127 only).
    MinusOneTwentyEight { row: usize, col: usize },
    /// A row's scale is NaN or infinite.
    BadScale { row: usize, scale: f32 },
}

impl fmt::Display for I8Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            I8Error::TooWide { cols } => write!(
                f,
                "int8 rows of {cols} columns are wider than the {MAX_COLS} the kernels sum exactly"
            ),
            I8Error::TooLarge { rows, cols } => {
                write!(f, "int8 matrix of {rows}×{cols} is too large to address")
            }
            I8Error::DataLength { expected, actual } => {
                write!(f, "int8 weights: expected {expected} bytes, got {actual}")
            }
            I8Error::ScaleLength { rows, actual } => {
                write!(f, "expected one scale per row ({rows}), got {actual}")
            }
            I8Error::MinusOneTwentyEight { row, col } => write!(
                f,
                "weight ({row}, {col}) is -128; int8 weights must lie in -127..=127"
            ),
            I8Error::BadScale { row, scale } => {
                write!(f, "the scale of row {row} is {scale}")
            }
        }
    }
}

impl std::error::Error for I8Error {}

/// A row-major `rows × cols` int8 matrix with one f32 scale per row,
/// borrowed in place (e.g. from a memory map), plus what the VNNI kernels
/// need, owned: each row's sum of weights, and (when packed) the
/// interleaved copy described in the module docs. The kernels its products
/// run are the selected set's, taken when it is bound.
pub struct I8Matrix<'a> {
    rows: usize,
    cols: usize,
    q: &'a [i8],
    scales: &'a [f32],
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    row_sums: Vec<i32>,
    packed: Option<Vec<Line>>,
    kernels: Int8Kernels,
}

/// Rows per block of the packed layout (one per i32 lane of a zmm).
const PACK_ROWS: usize = 16;

/// Bytes of one packed block of 16 rows: 64 per group of four columns.
fn packed_block_bytes(cols: usize) -> usize {
    cols.div_ceil(4) * 64
}

impl<'a> I8Matrix<'a> {
    /// Check the shape and values (no −128, finite scales), sum the rows,
    /// and take the selected kernels (packing the rows if they want it).
    pub fn new(
        rows: usize,
        cols: usize,
        q: &'a [i8],
        scales: &'a [f32],
    ) -> Result<I8Matrix<'a>, I8Error> {
        if cols > MAX_COLS {
            return Err(I8Error::TooWide { cols });
        }
        let expected = rows
            .checked_mul(cols)
            .ok_or(I8Error::TooLarge { rows, cols })?;
        if q.len() != expected {
            return Err(I8Error::DataLength {
                expected,
                actual: q.len(),
            });
        }
        if scales.len() != rows {
            return Err(I8Error::ScaleLength {
                rows,
                actual: scales.len(),
            });
        }
        if let Some((row, &scale)) = scales.iter().enumerate().find(|(_, s)| !s.is_finite()) {
            return Err(I8Error::BadScale { row, scale });
        }
        let mut row_sums = Vec::with_capacity(rows);
        for (row, w) in q.chunks_exact(cols.max(1)).take(rows).enumerate() {
            if let Some(col) = w.iter().position(|&v| v == i8::MIN) {
                return Err(I8Error::MinusOneTwentyEight { row, col });
            }
            row_sums.push(w.iter().map(|&v| v as i32).sum());
        }
        row_sums.resize(rows, 0); // cols == 0
        let kernels = crate::selected().int8;
        let mut m = I8Matrix {
            rows,
            cols,
            q,
            scales,
            row_sums,
            packed: None,
            kernels,
        };
        if kernels.pack {
            m.pack();
        }
        Ok(m)
    }

    /// Make the packed copy the AVX-512 kernel prefers (done by
    /// [`I8Matrix::new`] when the selected kernels want it,
    /// [`Int8Kernels::pack`]): as many bytes again as the weights.
    pub fn pack(&mut self) {
        let bb = packed_block_bytes(self.cols);
        let blocks = self.rows.div_ceil(PACK_ROWS);
        let mut buf = vec![Line([0x80; 64]); (blocks * bb).div_ceil(64)];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
        for r in 0..self.rows {
            let (b, lane) = (r / PACK_ROWS, r % PACK_ROWS);
            for (c, &w) in self.row(r).iter().enumerate() {
                bytes[b * bb + (c / 4) * 64 + lane * 4 + c % 4] = (w as u8) ^ 0x80;
            }
        }
        self.packed = Some(buf);
    }

    /// Drop the packed copy (the kernels then read the rows in place).
    pub fn unpack(&mut self) {
        self.packed = None;
    }

    /// Whether [`I8Matrix::pack`] made a copy.
    pub fn is_packed(&self) -> bool {
        self.packed.is_some()
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// All weights, row-major.
    pub fn weights(&self) -> &'a [i8] {
        self.q
    }
    pub fn scales(&self) -> &'a [f32] {
        self.scales
    }
    /// Row `r`'s weights.
    pub fn row(&self, r: usize) -> &'a [i8] {
        &self.q[r * self.cols..(r + 1) * self.cols]
    }
    /// Bytes a matvec streams: weights (as packed, if so) and scales.
    pub fn bytes(&self) -> usize {
        let w = match &self.packed {
            Some(p) => p.len() * 64,
            None => self.q.len(),
        };
        w + 4 * self.scales.len()
    }
    /// Row `r` as floats, `scale[r] · q[r][c]` (an embedding lookup).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "dequantize_row: wrong output length");
        let s = self.scales[r];
        for (o, &q) in out.iter_mut().zip(self.row(r)) {
            *o = s * q as f32;
        }
    }
}

impl fmt::Debug for I8Matrix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("I8Matrix")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

/// A cache line of bytes, so the vector's regions start 64-byte aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Line([u8; 64]);

/// An activation quantized to int8 with one scale, in the forms the
/// kernels read: `q`, `q + 128` as u8 (VNNI) and `|q|` (AVX2), each region
/// padded with zeros to whole cache lines. Reusable: it grows to the
/// longest vector seen, so a token loop allocates nothing.
#[derive(Default)]
pub struct I8Vector {
    buf: Vec<Line>,
    len: usize,
    scale: f32,
    /// Σ q (for the packed kernel's offset correction).
    sum: i32,
}

impl I8Vector {
    pub fn new() -> I8Vector {
        I8Vector::default()
    }

    /// A vector that quantizes up to `n` elements without allocating.
    pub fn with_capacity(n: usize) -> I8Vector {
        let mut v = I8Vector::new();
        v.reserve(n);
        v
    }

    /// Grow to hold `n` elements.
    pub fn reserve(&mut self, n: usize) {
        let lines = 3 * n.div_ceil(64);
        if self.buf.len() < lines {
            self.buf.resize(lines, Line::zeroed());
        }
    }

    /// Quantize `x` with the kernels this process selected.
    pub fn quantize(&mut self, x: &[f32]) {
        let k = &crate::selected().int8;
        self.quantize_by(k.quantize, k.regions, x)
    }

    /// Quantize `x` with a given set's quantizer ([`Int8Kernels::quantize`];
    /// every set gives the same bytes and scale).
    pub fn quantize_with(&mut self, quantize: QuantizeFn, x: &[f32]) {
        self.quantize_by(quantize, regions_ref, x)
    }

    /// Quantize `x` with a whole set's kernels (the same bytes, scale and
    /// sum from every set).
    pub fn quantize_kernels(&mut self, k: &Int8Kernels, x: &[f32]) {
        self.quantize_by(k.quantize, k.regions, x)
    }

    fn quantize_by(&mut self, quantize: QuantizeFn, regions: RegionsFn, x: &[f32]) {
        let n = x.len();
        let (q, u, a) = self.regions_mut(n);
        let scale = quantize(x, &mut q[..n]);
        q[n..].fill(0);
        self.sum = regions(q, u, a);
        self.scale = scale;
    }

    /// Make room for `n` values and take that length: the `q`, offset and
    /// `|q|` regions, each `n` padded to whole cache lines (the caller
    /// fills them and sets the scale and sum).
    fn regions_mut(&mut self, n: usize) -> (&mut [i8], &mut [u8], &mut [u8]) {
        self.reserve(n);
        self.len = n;
        let padded = Self::padded(n);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.buf);
        let (q, rest) = bytes[..3 * padded].split_at_mut(padded);
        let (u, a) = rest.split_at_mut(padded);
        (bytemuck::cast_slice_mut(q), u, a)
    }

    fn padded(n: usize) -> usize {
        n.div_ceil(64) * 64
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// `sx = max|x| / 127` (0 for an all-zero vector).
    pub fn scale(&self) -> f32 {
        self.scale
    }
    /// The quantized values.
    pub fn q(&self) -> &[i8] {
        &self.q_padded()[..self.len]
    }
    /// Bytes reserved.
    pub fn capacity(&self) -> usize {
        self.buf.len() * 64
    }

    fn region(&self, i: usize) -> &[u8] {
        let p = Self::padded(self.len);
        &bytemuck::cast_slice(&self.buf)[i * p..(i + 1) * p]
    }
    /// `q`, zero-padded to whole cache lines.
    fn q_padded(&self) -> &[i8] {
        bytemuck::cast_slice(self.region(0))
    }
    /// What the packed AVX-512 kernels read of it.
    #[cfg(target_arch = "x86_64")]
    fn packed_act(&self) -> x86::PackedAct<'_> {
        x86::PackedAct {
            q: self.q_padded(),
            sum: self.sum,
            scale: self.scale,
        }
    }
    /// `q + 128` as u8, padded to whole cache lines.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn offset(&self) -> &[u8] {
        self.region(1)
    }
    /// `|q|`, zero-padded to whole cache lines.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn abs(&self) -> &[u8] {
        self.region(2)
    }
}

/// [`quantize_activation`] of one kernel set.
pub type QuantizeFn = fn(x: &[f32], q: &mut [i8]) -> f32;

/// Quantize `x` into `q` with the selected kernels; returns the scale
/// `max|x| / 127` (0, and all `q` 0, when `x` is all zeros). Results for
/// NaN or infinite inputs are unspecified (but memory-safe). Every set is
/// bit-identical to [`quantize_activation_ref`].
pub fn quantize_activation(x: &[f32], q: &mut [i8]) -> f32 {
    (crate::selected().int8.quantize)(x, q)
}

/// The int8 kernels of one instruction set.
#[derive(Clone, Copy)]
pub struct Int8Kernels {
    /// [`quantize_activation`].
    pub quantize: QuantizeFn,
    /// The single-activation row kernel ([`matvec`]).
    pub rows: RowsFn,
    /// The several-activation row kernel ([`matvec_multi`]).
    pub rows_multi: RowsMultiFn,
    /// The pairs-of-activations row kernel ([`matvec_pairs`]).
    pub rows_pairs: RowsPairsFn,
    /// The offset and absolute forms of a quantized vector, and its sum
    /// ([`RegionsFn`]).
    pub regions: RegionsFn,
    /// What the first quantization of a pair leaves over ([`ResidualFn`]).
    pub residual: ResidualFn,
    /// Both quantizations of a pair ([`QuantizePairFn`]).
    pub quantize_pair: QuantizePairFn,
    /// Whether [`I8Matrix::new`] makes the packed copy (the AVX-512
    /// kernels read it; the others read the rows in place).
    pub pack: bool,
}

/// The kernels of every set: their SIMD ones on AVX-512 and AVX2, the
/// scalar twins elsewhere (NEON has none yet).
pub(crate) const KERNELS: PerIsa<Int8Kernels> = {
    let k = PerIsa::new(Int8Kernels {
        quantize: quantize_activation_ref,
        rows: matvec_rows_ref,
        rows_multi: matvec_rows_multi_ref,
        rows_pairs: matvec_rows_pairs_ref,
        regions: regions_ref,
        residual: residual_ref,
        quantize_pair: quantize_pair_ref,
        pack: false,
    });
    #[cfg(target_arch = "x86_64")]
    let k = k
        .avx2(Int8Kernels {
            quantize: quantize_avx2,
            rows: matvec_rows_avx2,
            rows_multi: matvec_rows_multi_avx2,
            rows_pairs: matvec_rows_pairs_avx2,
            regions: regions_avx2,
            residual: residual_avx2,
            quantize_pair: quantize_pair_avx2,
            pack: false,
        })
        .avx512(Int8Kernels {
            quantize: quantize_avx512,
            rows: matvec_rows_vnni,
            rows_multi: matvec_rows_multi_vnni,
            rows_pairs: matvec_rows_pairs_vnni,
            regions: regions_avx512,
            residual: residual_avx512,
            quantize_pair: quantize_pair_avx512,
            pack: true,
        });
    k
};

// The SAFETY of the x86 kernels below: each is reachable only through
// `PerIsa::get` for its set (`KERNELS`), whose caller guarantees the CPU
// supports it; what else each kernel needs is checked in its wrapper.

#[cfg(target_arch = "x86_64")]
fn quantize_avx512(x: &[f32], q: &mut [i8]) -> f32 {
    assert_eq!(x.len(), q.len(), "quantize_activation: lengths differ");
    // SAFETY: AVX-512 (see above); equal lengths (asserted).
    unsafe { x86::quantize_avx512(x, q) }
}

#[cfg(target_arch = "x86_64")]
fn quantize_avx2(x: &[f32], q: &mut [i8]) -> f32 {
    assert_eq!(x.len(), q.len(), "quantize_activation: lengths differ");
    // SAFETY: AVX2 (see above); equal lengths (asserted).
    unsafe { x86::quantize_avx2(x, q) }
}

/// The reference quantizer: `scale = max|x| / 127`, `q = round(x / scale)`
/// with halves away from zero, clamped to −127..=127.
pub fn quantize_activation_ref(x: &[f32], q: &mut [i8]) -> f32 {
    assert_eq!(x.len(), q.len(), "quantize_activation: lengths differ");
    let amax = x.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    let scale = amax / 127.0;
    if scale == 0.0 {
        q.fill(0);
        return 0.0;
    }
    for (q, &v) in q.iter_mut().zip(x) {
        *q = quantize_one(v, scale);
    }
    scale
}

/// One element, as every kernel computes it.
#[inline]
fn quantize_one(v: f32, scale: f32) -> i8 {
    (v / scale).round().clamp(-127.0, 127.0) as i8
}

/// `offset[i] = q[i] + 128` as u8 and `abs[i] = |q[i]|` for the whole
/// (padded) vector; returns `Σ q`. `q`'s length is a multiple of 64 and
/// the outputs are as long.
pub type RegionsFn = fn(q: &[i8], offset: &mut [u8], abs: &mut [u8]) -> i32;

/// Check what every [`RegionsFn`] relies on.
fn check_regions(q: &[i8], offset: &[u8], abs: &[u8]) {
    assert!(
        q.len().is_multiple_of(64) && offset.len() == q.len() && abs.len() == q.len(),
        "int8 regions: {} values (a multiple of 64 wanted), outputs of {} and {}",
        q.len(),
        offset.len(),
        abs.len()
    );
}

/// The scalar twin of the regions kernels.
pub fn regions_ref(q: &[i8], offset: &mut [u8], abs: &mut [u8]) -> i32 {
    check_regions(q, offset, abs);
    for ((&qi, ui), ai) in q.iter().zip(offset.iter_mut()).zip(abs.iter_mut()) {
        *ui = (qi as u8) ^ 0x80;
        *ai = qi.unsigned_abs();
    }
    q.iter().map(|&v| v as i32).sum()
}

#[cfg(target_arch = "x86_64")]
fn regions_avx512(q: &[i8], offset: &mut [u8], abs: &mut [u8]) -> i32 {
    check_regions(q, offset, abs);
    // SAFETY: AVX-512 (see above); three slices of the same multiple of
    // 64 bytes (checked).
    unsafe { x86::regions_avx512(q, offset, abs) }
}

#[cfg(target_arch = "x86_64")]
fn regions_avx2(q: &[i8], offset: &mut [u8], abs: &mut [u8]) -> i32 {
    check_regions(q, offset, abs);
    // SAFETY: AVX2 (see above); three slices of the same multiple of 64
    // bytes (checked).
    unsafe { x86::regions_avx2(q, offset, abs) }
}

/// `rest[i] = x[i] - scale · q[i]` (a product, then a difference, each
/// rounded: no fused multiply-add, so every set gives the same bits).
pub type ResidualFn = fn(x: &[f32], q: &[i8], scale: f32, rest: &mut [f32]);

fn check_residual(x: &[f32], q: &[i8], rest: &[f32]) {
    assert!(
        q.len() == x.len() && rest.len() == x.len(),
        "int8 residual: {} values, {} quantized, {} outputs",
        x.len(),
        q.len(),
        rest.len()
    );
}

/// The scalar twin of the residual kernels.
pub fn residual_ref(x: &[f32], q: &[i8], scale: f32, rest: &mut [f32]) {
    check_residual(x, q, rest);
    for ((r, &xv), &qv) in rest.iter_mut().zip(x).zip(q) {
        *r = xv - scale * qv as f32;
    }
}

#[cfg(target_arch = "x86_64")]
fn residual_avx512(x: &[f32], q: &[i8], scale: f32, rest: &mut [f32]) {
    check_residual(x, q, rest);
    // SAFETY: AVX-512 (see above); equal lengths (checked).
    unsafe { x86::residual_avx512(x, q, scale, rest) }
}

#[cfg(target_arch = "x86_64")]
fn residual_avx2(x: &[f32], q: &[i8], scale: f32, rest: &mut [f32]) {
    check_residual(x, q, rest);
    // SAFETY: AVX2 (see above); equal lengths (checked).
    unsafe { x86::residual_avx2(x, q, scale, rest) }
}

/// `x` quantized into `hi` and what that leaves over (`rest = x −
/// s_hi·hi`, as [`ResidualFn`]) into `lo`, each as
/// [`quantize_activation`]; returns `(s_hi, s_lo)`. All four slices have
/// the same length.
pub type QuantizePairFn =
    fn(x: &[f32], hi: &mut [i8], lo: &mut [i8], rest: &mut [f32]) -> (f32, f32);

fn check_pair(x: &[f32], hi: &[i8], lo: &[i8], rest: &[f32]) {
    assert!(
        hi.len() == x.len() && lo.len() == x.len() && rest.len() == x.len(),
        "quantize_pair: {} values, outputs of {}, {} and {}",
        x.len(),
        hi.len(),
        lo.len(),
        rest.len()
    );
}

/// The scalar twin of the pair quantizers: quantize, residual, quantize.
pub fn quantize_pair_ref(x: &[f32], hi: &mut [i8], lo: &mut [i8], rest: &mut [f32]) -> (f32, f32) {
    check_pair(x, hi, lo, rest);
    let s_hi = quantize_activation_ref(x, hi);
    residual_ref(x, hi, s_hi, rest);
    (s_hi, quantize_activation_ref(rest, lo))
}

#[cfg(target_arch = "x86_64")]
fn quantize_pair_avx2(x: &[f32], hi: &mut [i8], lo: &mut [i8], rest: &mut [f32]) -> (f32, f32) {
    check_pair(x, hi, lo, rest);
    let s_hi = quantize_avx2(x, hi);
    residual_avx2(x, hi, s_hi, rest);
    (s_hi, quantize_avx2(rest, lo))
}

#[cfg(target_arch = "x86_64")]
fn quantize_pair_avx512(x: &[f32], hi: &mut [i8], lo: &mut [i8], rest: &mut [f32]) -> (f32, f32) {
    check_pair(x, hi, lo, rest);
    // SAFETY: AVX-512 (see above); equal lengths (checked).
    unsafe { x86::quantize_pair_avx512(x, hi, lo, rest) }
}

/// `x` as a pair of int8 vectors, `x ≈ hi.scale·hi.q + lo.scale·lo.q`:
/// `hi` the usual quantization of `x`, `lo` that of what it leaves over
/// (`rest`, at least `x.len()` floats of scratch), with the selected
/// kernels. About 15 bits per value from two exact integer products.
pub fn quantize_pair(x: &[f32], hi: &mut I8Vector, lo: &mut I8Vector, rest: &mut [f32]) {
    quantize_pair_with(&crate::selected().int8, x, hi, lo, rest)
}

/// [`quantize_pair`] with a given set's kernels (every set gives the same
/// bytes, scales and sums).
pub fn quantize_pair_with(
    k: &Int8Kernels,
    x: &[f32],
    hi: &mut I8Vector,
    lo: &mut I8Vector,
    rest: &mut [f32],
) {
    let n = x.len();
    assert!(
        rest.len() >= n,
        "quantize_pair: {} floats of scratch for {n} values",
        rest.len(),
    );
    let ((qh, uh, ah), (ql, ul, al)) = (hi.regions_mut(n), lo.regions_mut(n));
    let (s_hi, s_lo) = (k.quantize_pair)(x, &mut qh[..n], &mut ql[..n], &mut rest[..n]);
    qh[n..].fill(0);
    ql[n..].fill(0);
    let (sum_hi, sum_lo) = ((k.regions)(qh, uh, ah), (k.regions)(ql, ul, al));
    (hi.scale, hi.sum, lo.scale, lo.sum) = (s_hi, sum_hi, s_lo, sum_lo);
}

/// `y[i] = m.row(row0 + i) · x` for `i < y.len()`, as in the module docs.
pub type RowsFn = fn(m: &I8Matrix<'_>, x: &I8Vector, row0: usize, y: &mut [f32]);

/// Check what every kernel relies on.
fn check(m: &I8Matrix<'_>, x: &I8Vector, row0: usize, y: &[f32]) {
    assert_eq!(
        x.len(),
        m.cols,
        "int8 matvec: x has {} elements, the matrix {} columns",
        x.len(),
        m.cols
    );
    assert!(
        row0 <= m.rows && y.len() <= m.rows - row0,
        "int8 matvec: rows {row0}..{} of {}",
        row0 + y.len(),
        m.rows
    );
}

/// The float part every kernel shares.
#[inline]
fn finish(sum: i32, scale: f32, sx: f32) -> f32 {
    sum as f32 * (scale * sx)
}

/// The scalar twin: the reference every SIMD kernel must equal bit for bit.
pub fn matvec_rows_ref(m: &I8Matrix<'_>, x: &I8Vector, row0: usize, y: &mut [f32]) {
    check(m, x, row0, y);
    let xq = x.q();
    for (i, yr) in y.iter_mut().enumerate() {
        let r = row0 + i;
        let sum: i32 = m
            .row(r)
            .iter()
            .zip(xq)
            .map(|(&w, &v)| w as i32 * v as i32)
            .sum();
        *yr = finish(sum, m.scales[r], x.scale);
    }
}

#[cfg(target_arch = "x86_64")]
fn matvec_rows_avx2(m: &I8Matrix<'_>, x: &I8Vector, row0: usize, y: &mut [f32]) {
    check(m, x, row0, y);
    if m.cols < 32 {
        return matvec_rows_ref(m, x, row0, y);
    }
    // SAFETY: AVX2 and FMA (see `KERNELS`); `check` and the `I8Matrix`/`I8Vector` invariants give what
    // the kernel needs: cols ≥ 32 (tested above), the rows in range, the
    // weights −127..=127, `q`/`|q|` at least `cols` long.
    unsafe {
        x86::rows_avx2(
            m.q,
            m.cols,
            m.scales,
            x.q_padded(),
            x.abs(),
            x.scale,
            row0,
            y,
        )
    }
}

#[cfg(target_arch = "x86_64")]
fn matvec_rows_vnni(m: &I8Matrix<'_>, x: &I8Vector, row0: usize, y: &mut [f32]) {
    check(m, x, row0, y);
    if let Some(p) = &m.packed {
        // SAFETY: the AVX-512 set with VNNI (see `KERNELS`); `pack` laid out whole blocks of 16
        // rows × `packed_block_bytes(cols)` for every row, `check` keeps
        // the rows in range, and the activation is zero-padded to whole
        // 64-byte lines (≥ cols rounded up to 4).
        return unsafe {
            x86::rows_vnni_packed(
                bytemuck::cast_slice(p),
                m.cols,
                m.scales,
                x.q_padded(),
                x.sum,
                x.scale,
                row0,
                y,
            )
        };
    }
    // SAFETY: the AVX-512 set with VNNI (see `KERNELS`); `check` and the invariants of the types give
    // the rows in range, one scale and row sum per row, and the offset
    // activation padded to whole 64-byte lines.
    unsafe {
        x86::rows_vnni(
            m.q,
            m.cols,
            m.scales,
            &m.row_sums,
            x.offset(),
            x.scale,
            row0,
            y,
        )
    }
}

/// `ys[a][i] = m.row(row0 + i) · xs[a]`, scaled as in [`RowsFn`], for
/// `i < ys[a].len()` (the same for every `a`): several activations against
/// one matrix, its weights read once for several of them where the kernel
/// can. Every output equals the single-activation kernel's, bit for bit.
pub type RowsMultiFn = fn(m: &I8Matrix<'_>, xs: &[&I8Vector], row0: usize, ys: &mut [&mut [f32]]);

/// Activations one [`matvec_multi`] call takes at most.
pub const MAX_MULTI: usize = 16;

/// Check what every multi kernel relies on; returns the row count.
fn check_multi(m: &I8Matrix<'_>, xs: &[&I8Vector], row0: usize, ys: &[&mut [f32]]) -> usize {
    assert!(
        !xs.is_empty() && xs.len() == ys.len(),
        "int8 matvec_multi: {} activations, {} outputs",
        xs.len(),
        ys.len()
    );
    let n = ys[0].len();
    for (x, y) in xs.iter().zip(ys) {
        assert_eq!(
            y.len(),
            n,
            "int8 matvec_multi: outputs of different lengths"
        );
        check(m, x, row0, y);
    }
    n
}

/// A multi kernel from a single-activation one: each activation in turn,
/// 64 rows at a time (so those rows' weights are still in L1 for the next).
fn each_activation(
    single: RowsFn,
    m: &I8Matrix<'_>,
    xs: &[&I8Vector],
    row0: usize,
    ys: &mut [&mut [f32]],
) {
    let n = check_multi(m, xs, row0, ys);
    for i0 in (0..n).step_by(64) {
        let i1 = (i0 + 64).min(n);
        for (x, y) in xs.iter().zip(ys.iter_mut()) {
            single(m, x, row0 + i0, &mut y[i0..i1]);
        }
    }
}

/// The scalar twin of the multi kernels: [`matvec_rows_ref`] per
/// activation.
pub fn matvec_rows_multi_ref(
    m: &I8Matrix<'_>,
    xs: &[&I8Vector],
    row0: usize,
    ys: &mut [&mut [f32]],
) {
    each_activation(matvec_rows_ref, m, xs, row0, ys)
}

#[cfg(target_arch = "x86_64")]
fn matvec_rows_multi_avx2(m: &I8Matrix<'_>, xs: &[&I8Vector], row0: usize, ys: &mut [&mut [f32]]) {
    each_activation(matvec_rows_avx2, m, xs, row0, ys)
}

#[cfg(target_arch = "x86_64")]
fn matvec_rows_multi_vnni(m: &I8Matrix<'_>, xs: &[&I8Vector], row0: usize, ys: &mut [&mut [f32]]) {
    let Some(p) = &m.packed else {
        return each_activation(matvec_rows_vnni, m, xs, row0, ys);
    };
    let n = check_multi(m, xs, row0, ys);
    vnni_packed_multi(p, m, xs, row0, n, ys, false);
}

/// `ys[p][i] = m.row(row0 + i) · xs[2p] + m.row(row0 + i) · xs[2p + 1]`,
/// each product scaled as in [`RowsFn`] and then the two added: pairs of
/// activations ([`quantize_pair`]'s hi and lo halves) against one matrix,
/// its weights read once for all of them where the kernel can. Every
/// output equals the sum of the two single-activation kernels' outputs,
/// bit for bit.
pub type RowsPairsFn = fn(m: &I8Matrix<'_>, xs: &[&I8Vector], row0: usize, ys: &mut [&mut [f32]]);

/// Check what every pairs kernel relies on; returns the row count.
fn check_pairs(m: &I8Matrix<'_>, xs: &[&I8Vector], row0: usize, ys: &[&mut [f32]]) -> usize {
    assert!(
        !ys.is_empty() && xs.len() == 2 * ys.len(),
        "int8 matvec_pairs: {} activations for {} outputs (two each)",
        xs.len(),
        ys.len()
    );
    let n = ys[0].len();
    for (pair, y) in xs.chunks_exact(2).zip(ys) {
        assert_eq!(
            y.len(),
            n,
            "int8 matvec_pairs: outputs of different lengths"
        );
        check(m, pair[0], row0, y);
        check(m, pair[1], row0, y);
    }
    n
}

/// A pairs kernel from a single-activation one: 64 rows at a time, both
/// halves of each pair into scratch, then their sum.
fn each_pair(
    single: RowsFn,
    m: &I8Matrix<'_>,
    xs: &[&I8Vector],
    row0: usize,
    ys: &mut [&mut [f32]],
) {
    let n = check_pairs(m, xs, row0, ys);
    let (mut a, mut b) = ([0.0f32; 64], [0.0f32; 64]);
    for i0 in (0..n).step_by(64) {
        let i1 = (i0 + 64).min(n);
        let (a, b) = (&mut a[..i1 - i0], &mut b[..i1 - i0]);
        for (pair, y) in xs.chunks_exact(2).zip(ys.iter_mut()) {
            single(m, pair[0], row0 + i0, a);
            single(m, pair[1], row0 + i0, b);
            for ((o, &u), &v) in y[i0..i1].iter_mut().zip(&*a).zip(&*b) {
                *o = u + v;
            }
        }
    }
}

/// The scalar twin of the pairs kernels: [`matvec_rows_ref`] per
/// activation, each pair's two outputs added.
pub fn matvec_rows_pairs_ref(
    m: &I8Matrix<'_>,
    xs: &[&I8Vector],
    row0: usize,
    ys: &mut [&mut [f32]],
) {
    each_pair(matvec_rows_ref, m, xs, row0, ys)
}

#[cfg(target_arch = "x86_64")]
fn matvec_rows_pairs_avx2(m: &I8Matrix<'_>, xs: &[&I8Vector], row0: usize, ys: &mut [&mut [f32]]) {
    each_pair(matvec_rows_avx2, m, xs, row0, ys)
}

#[cfg(target_arch = "x86_64")]
fn matvec_rows_pairs_vnni(m: &I8Matrix<'_>, xs: &[&I8Vector], row0: usize, ys: &mut [&mut [f32]]) {
    let Some(p) = &m.packed else {
        return each_pair(matvec_rows_vnni, m, xs, row0, ys);
    };
    let n = check_pairs(m, xs, row0, ys);
    if let ([hi, lo], [y]) = (xs, &mut *ys) {
        // SAFETY: as in `vnni_packed_multi` for one pair: the packed blocks
        // cover the `n` rows from `row0` that `check_pairs` checked, both
        // halves are zero-padded to whole 64-byte lines, and `y` holds `n`
        // floats.
        return unsafe {
            x86::rows_vnni_packed_pair(
                bytemuck::cast_slice(p),
                m.cols,
                m.scales,
                hi.packed_act(),
                lo.packed_act(),
                row0,
                n,
                y,
            )
        };
    }
    vnni_packed_multi(p, m, xs, row0, n, ys, true);
}

/// Runs of the packed multi kernel over `xs`, [`x86::MULTI_ACTS`] at a
/// time (a whole number of pairs when `pairs`).
#[cfg(target_arch = "x86_64")]
fn vnni_packed_multi(
    p: &[Line],
    m: &I8Matrix<'_>,
    xs: &[&I8Vector],
    row0: usize,
    n: usize,
    ys: &mut [&mut [f32]],
    pairs: bool,
) {
    let mut acts = [x86::PackedAct {
        q: &[],
        sum: 0,
        scale: 0.0,
    }; x86::MULTI_ACTS];
    let per_out = if pairs { 2 } else { 1 };
    for (xc, yc) in xs
        .chunks(x86::MULTI_ACTS)
        .zip(ys.chunks_mut(x86::MULTI_ACTS / per_out))
    {
        for (a, x) in acts.iter_mut().zip(xc) {
            *a = x.packed_act();
        }
        // SAFETY: as in `matvec_rows_vnni` for each activation: the packed
        // blocks cover the `n` rows from `row0` that the caller checked,
        // each activation is zero-padded to whole 64-byte lines, and each
        // output holds `n` floats (one per activation, or per pair of
        // them when `pairs`: chunks of MULTI_ACTS, an even number, keep
        // pairs whole).
        unsafe {
            x86::rows_vnni_packed_multi(
                bytemuck::cast_slice(p),
                m.cols,
                m.scales,
                &acts[..xc.len()],
                row0,
                n,
                yc,
                pairs,
            )
        };
    }
}

/// Matrices with fewer multiply-adds run on the calling thread: below
/// this, a pool run costs more than it saves.
pub const PARALLEL_FROM: usize = 1 << 18;

/// `y = m · x` with the kernels `m` was bound with, rows split over the
/// pool when the matrix is large enough ([`PARALLEL_FROM`]) and the pool
/// has threads.
pub fn matvec(pool: &ThreadPool, m: &I8Matrix<'_>, x: &I8Vector, y: &mut [f32]) {
    matvec_with(pool, m.kernels.rows, m, x, y)
}

/// `ys = (m · xs[0], m · xs[1], …)`: `ys[a·rows..(a + 1)·rows] = m ·
/// xs[a]`, each bit-identical to [`matvec`]'s, the weights read once for
/// several activations. At most [`MAX_MULTI`] activations; rows split
/// over the pool as [`matvec`] splits them.
pub fn matvec_multi(pool: &ThreadPool, m: &I8Matrix<'_>, xs: &[&I8Vector], ys: &mut [f32]) {
    matvec_multi_with(pool, m.kernels.rows_multi, m, xs, ys)
}

/// [`matvec_multi`] with a given kernel (a set's [`Int8Kernels::rows_multi`]).
pub fn matvec_multi_with(
    pool: &ThreadPool,
    kernel: RowsMultiFn,
    m: &I8Matrix<'_>,
    xs: &[&I8Vector],
    ys: &mut [f32],
) {
    let k = xs.len();
    assert!(
        k <= MAX_MULTI,
        "int8 matvec_multi: {k} activations, at most {MAX_MULTI}"
    );
    split_rows(pool, m, k, ys, |row0, parts| kernel(m, xs, row0, parts));
}

/// `ys = (m·xs[0] + m·xs[1], m·xs[2] + m·xs[3], …)`: `ys[p·rows..(p +
/// 1)·rows]` the sum of pair `p`'s two products, each product and the sum
/// bit-identical to [`matvec`]'s outputs added, the weights read once for
/// several pairs. For [`quantize_pair`]'s halves. At most [`MAX_MULTI`]
/// activations (an even number); rows split over the pool as [`matvec`]
/// splits them.
pub fn matvec_pairs(pool: &ThreadPool, m: &I8Matrix<'_>, xs: &[&I8Vector], ys: &mut [f32]) {
    matvec_pairs_with(pool, m.kernels.rows_pairs, m, xs, ys)
}

/// [`matvec_pairs`] with a given kernel (a set's [`Int8Kernels::rows_pairs`]).
pub fn matvec_pairs_with(
    pool: &ThreadPool,
    kernel: RowsPairsFn,
    m: &I8Matrix<'_>,
    xs: &[&I8Vector],
    ys: &mut [f32],
) {
    let k = xs.len();
    assert!(
        k <= MAX_MULTI && k.is_multiple_of(2),
        "int8 matvec_pairs: {k} activations, an even number up to {MAX_MULTI} wanted"
    );
    split_rows(pool, m, k / 2, ys, |row0, parts| kernel(m, xs, row0, parts));
}

/// Run `kernel(row0, outputs)` over the rows of `m` for `k` outputs of
/// `m.rows` each (`ys`, `(k, rows)`): on the calling thread for small
/// matrices ([`PARALLEL_FROM`]) or a one-thread pool, else in chunks of
/// whole 16-row blocks over the pool.
fn split_rows(
    pool: &ThreadPool,
    m: &I8Matrix<'_>,
    k: usize,
    ys: &mut [f32],
    kernel: impl Fn(usize, &mut [&mut [f32]]) + Sync,
) {
    let rows = m.rows;
    assert!(
        k <= MAX_MULTI,
        "int8 matvec: {k} outputs, at most {MAX_MULTI}"
    );
    assert_eq!(
        ys.len(),
        rows * k,
        "int8 matvec_multi: ys has {} elements, want {k} × {rows} rows",
        ys.len(),
    );
    if k == 0 || rows == 0 {
        return;
    }
    let n = pool.n_threads();
    if n == 1 || rows * m.cols < PARALLEL_FROM {
        let mut parts: [&mut [f32]; MAX_MULTI] = Default::default();
        for (p, y) in parts.iter_mut().zip(ys.chunks_exact_mut(rows)) {
            *p = y;
        }
        return kernel(0, &mut parts[..k]);
    }
    let chunk = rows.div_ceil(4 * n).next_multiple_of(PACK_ROWS);
    let out = SharedOut(ys.as_mut_ptr());
    pool.for_each_chunk(rows, chunk, |r, _| {
        assert!(r.end <= rows);
        let mut parts: [&mut [f32]; MAX_MULTI] = Default::default();
        for (a, p) in parts.iter_mut().take(k).enumerate() {
            // SAFETY: `ys` holds k·rows floats (checked above), is
            // exclusively borrowed for this call and outlives the pool run;
            // this slice is rows `r` of output `a`, and the chunks' row
            // ranges are disjoint, so no two live slices overlap.
            *p = unsafe {
                std::slice::from_raw_parts_mut(out.get().add(a * rows + r.start), r.len())
            };
        }
        kernel(r.start, &mut parts[..k]);
    });
}

/// The output pointer of [`split_rows`], shared with the pool's
/// threads, which write disjoint row ranges of it.
struct SharedOut(*mut f32);

impl SharedOut {
    // A method, so closures capture the wrapper and not the raw field.
    fn get(&self) -> *mut f32 {
        self.0
    }
}

// SAFETY: see `split_rows`: each element is written through exactly
// one slice, and nothing else reads or writes `ys` during the run.
unsafe impl Sync for SharedOut {}

/// [`matvec`] with a given row kernel (a set's [`Int8Kernels::rows`]).
pub fn matvec_with(
    pool: &ThreadPool,
    kernel: RowsFn,
    m: &I8Matrix<'_>,
    x: &I8Vector,
    y: &mut [f32],
) {
    assert_eq!(
        y.len(),
        m.rows,
        "int8 matvec: y has {} elements, the matrix {} rows",
        y.len(),
        m.rows
    );
    let n = pool.n_threads();
    if n == 1 || m.rows * m.cols < PARALLEL_FROM {
        return kernel(m, x, 0, y);
    }
    // A few chunks per thread (whole blocks of sixteen rows) so a thread
    // slowed by the OS gets help; each row is computed the same way
    // whoever takes it.
    let chunk = m.rows.div_ceil(4 * n).next_multiple_of(PACK_ROWS);
    pool.for_each_chunk_mut(y, chunk, |start, ys, _| kernel(m, x, start, ys));
}
