//! Matrix-vector products over whole quantized matrices: the decode step.
//!
//! `y = W x` with `W` a row-major matrix of quantized rows, borrowed in place
//! (e.g. from a memory map). The activation `x` is quantized once into the
//! weight type's `vec_dot_type` (into a reusable [`MatvecScratch`], so the
//! token loop allocates nothing), then the rows are split over the pool in
//! chunks of a few to a few tens of KB of weights and each `y[r]` is one
//! `vec_dot(row r, xq)`. Every `y[r]` is computed by one call on whole rows,
//! so the result does not depend on the number of threads.

use crate::isa::Isa;
use crate::pool::ThreadPool;
use crate::traits::{activation_quantizer, traits, FromFloatFn, TypeTraits, VecDotFn};
use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use std::fmt;

/// Alignment [`QMatrix::new`] asks of the weight bytes: the largest field of
/// any block struct is 4 bytes (Q8_K's `f32` scale), and the block wrappers
/// cast bytes to structs. GGUF aligns tensor data to 32 bytes.
pub const DATA_ALIGN: usize = 4;

/// Why a byte slice cannot be viewed as a matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatrixError {
    /// No kernels for this weight type.
    Unsupported { ty: GgmlType },
    /// The weight type has kernels but its activation type does not.
    UnsupportedActivation {
        ty: GgmlType,
        vec_dot_type: GgmlType,
    },
    /// A row is not a whole number of blocks (of the weight or activation
    /// type).
    RaggedRow {
        ty: GgmlType,
        cols: usize,
        block_size: usize,
    },
    /// `rows × row bytes` does not fit in memory.
    TooLarge {
        ty: GgmlType,
        rows: usize,
        cols: usize,
    },
    /// The data is not `rows × row bytes` long.
    DataLength {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        expected: usize,
        actual: usize,
    },
    /// The data does not start on a [`DATA_ALIGN`] boundary.
    Misaligned { ty: GgmlType, addr: usize },
    /// Row tiles ([`QMatrix::with_tiles`]) for a type without tile kernels,
    /// or of the wrong length.
    Tiles {
        ty: GgmlType,
        expected: Option<usize>,
        actual: usize,
    },
}

impl fmt::Display for MatrixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatrixError::Unsupported { ty } => write!(f, "no kernels for weight type {ty}"),
            MatrixError::UnsupportedActivation { ty, vec_dot_type } => {
                write!(
                    f,
                    "weight type {ty} dots against {vec_dot_type}, which has no kernels"
                )
            }
            MatrixError::RaggedRow {
                ty,
                cols,
                block_size,
            } => write!(
                f,
                "{ty} rows of {cols} columns are not a whole number of {block_size}-element blocks"
            ),
            MatrixError::TooLarge { ty, rows, cols } => {
                write!(f, "{ty} matrix of {rows}×{cols} is too large to address")
            }
            MatrixError::DataLength {
                ty,
                rows,
                cols,
                expected,
                actual,
            } => write!(
                f,
                "{ty} matrix of {rows}×{cols} needs {expected} bytes, got {actual}"
            ),
            MatrixError::Misaligned { ty, addr } => write!(
                f,
                "{ty} matrix data at {addr:#x} is not {DATA_ALIGN}-byte aligned"
            ),
            MatrixError::Tiles {
                ty, expected: None, ..
            } => write!(f, "no row-tile kernels for weight type {ty}"),
            MatrixError::Tiles {
                ty,
                expected: Some(e),
                actual,
            } => write!(f, "{ty} row tiles need {e} bytes, got {actual}"),
        }
    }
}

impl std::error::Error for MatrixError {}

/// A row-major matrix of `rows` rows of `cols` elements of type `ty`, each
/// row `row_bytes` bytes of whole blocks, borrowed from `data`.
#[derive(Clone, Copy)]
pub struct QMatrix<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: &'a [u8],
    /// The same rows repacked into row tiles ([`crate::quant::tiles`]),
    /// which the products then read instead of `data`.
    tiles: Option<&'a [u8]>,
    traits: &'static TypeTraits,
    act: &'static TypeTraits,
    /// How `x` is quantized to `act`'s type.
    act_from_float: FromFloatFn,
}

impl<'a> QMatrix<'a> {
    /// View `data` as a matrix, checking type, shape, length and alignment.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, MatrixError> {
        let tr = traits(ty).ok_or(MatrixError::Unsupported { ty })?;
        let vec_dot_type = tr.vec_dot_type;
        let act =
            traits(vec_dot_type).ok_or(MatrixError::UnsupportedActivation { ty, vec_dot_type })?;
        for block_size in [ty.block_size(), vec_dot_type.block_size()] {
            if !cols.is_multiple_of(block_size) {
                return Err(MatrixError::RaggedRow {
                    ty,
                    cols,
                    block_size,
                });
            }
        }
        let row_bytes = (cols / ty.block_size())
            .checked_mul(ty.type_size())
            .ok_or(MatrixError::TooLarge { ty, rows, cols })?;
        let expected =
            rows.checked_mul(row_bytes)
                .ok_or(MatrixError::TooLarge { ty, rows, cols })?;
        if data.len() != expected {
            return Err(MatrixError::DataLength {
                ty,
                rows,
                cols,
                expected,
                actual: data.len(),
            });
        }
        let addr = data.as_ptr() as usize;
        if !addr.is_multiple_of(DATA_ALIGN) && !data.is_empty() {
            return Err(MatrixError::Misaligned { ty, addr });
        }
        Ok(QMatrix {
            ty,
            rows,
            cols,
            row_bytes,
            data,
            tiles: None,
            traits: tr,
            act,
            act_from_float: activation_quantizer(vec_dot_type)
                .expect("the activation type has traits, checked above"),
        })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }
    /// All weight bytes (what one matvec streams).
    pub fn data(&self) -> &'a [u8] {
        self.data
    }
    pub fn traits(&self) -> &'static TypeTraits {
        self.traits
    }
    /// The type `x` is quantized to.
    pub fn vec_dot_type(&self) -> GgmlType {
        self.traits.vec_dot_type
    }
    /// Quantize an activation row `x` (`cols` elements) to
    /// [`QMatrix::vec_dot_type`] into `dst` ([`QMatrix::activation_bytes`]).
    pub fn quantize_activation(&self, x: &[f32], dst: &mut [u8]) {
        (self.act_from_float)(x, dst)
    }
    /// Bytes of `x` quantized to [`QMatrix::vec_dot_type`].
    pub fn activation_bytes(&self) -> usize {
        self.act.row_bytes(self.cols)
    }
    /// Row `r`'s blocks.
    pub fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Bytes of this matrix repacked into row tiles, if its type has tile
    /// kernels.
    pub fn tiles_bytes(&self) -> Option<usize> {
        let td = crate::quant::tiles::tile_dot(self.ty)?;
        Some(crate::quant::tiles::tiles(self.rows) * (td.tile_bytes)(self.cols))
    }

    /// Repack the rows into row tiles in `dst` ([`QMatrix::tiles_bytes`]
    /// long), for [`QMatrix::with_tiles`].
    pub fn pack_tiles(&self, dst: &mut [u8]) -> Result<(), MatrixError> {
        let expected = self.tiles_bytes();
        match crate::quant::tiles::tile_dot(self.ty) {
            Some(td) if expected == Some(dst.len()) => {
                (td.pack)(self.data, self.rows, self.cols, dst);
                Ok(())
            }
            _ => Err(MatrixError::Tiles {
                ty: self.ty,
                expected,
                actual: dst.len(),
            }),
        }
    }

    /// The same matrix with its rows also in row tiles (made by
    /// [`QMatrix::pack_tiles`] from this matrix), which every product then
    /// reads instead of the rows.
    pub fn with_tiles(self, tiles: &'a [u8]) -> Result<QMatrix<'a>, MatrixError> {
        let expected = self.tiles_bytes();
        if expected != Some(tiles.len()) {
            return Err(MatrixError::Tiles {
                ty: self.ty,
                expected,
                actual: tiles.len(),
            });
        }
        Ok(QMatrix {
            tiles: Some(tiles),
            ..self
        })
    }

    /// The row tiles, if the matrix has them.
    pub fn tiles(&self) -> Option<&'a [u8]> {
        self.tiles
    }
}

impl fmt::Debug for QMatrix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QMatrix")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("bytes", &self.data.len())
            .field("tiles", &self.tiles.is_some())
            .finish()
    }
}

/// A cache line of scratch bytes: keeps the quantized activation aligned
/// for the block casts and SIMD loads.
#[repr(C, align(64))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Line([u8; 64]);

/// Reusable buffer for the quantized activation. It grows to the largest
/// `x` seen and is then reused, so steady-state decode allocates nothing.
#[derive(Default)]
pub struct MatvecScratch {
    buf: Vec<Line>,
}

impl MatvecScratch {
    pub fn new() -> MatvecScratch {
        MatvecScratch::default()
    }

    /// Bytes currently reserved.
    pub fn capacity(&self) -> usize {
        self.buf.len() * 64
    }

    fn bytes(&mut self, n: usize) -> &mut [u8] {
        let lines = n.div_ceil(64);
        if self.buf.len() < lines {
            self.buf.resize(lines, Line::zeroed());
        }
        &mut bytemuck::cast_slice_mut(&mut self.buf)[..n]
    }

    /// Quantize `x` into `m`'s activation type; the result feeds
    /// [`matvec_quantized`], e.g. to reuse one quantized input for the
    /// several matrices that read it (q/k/v, gate/up).
    pub fn quantize(&mut self, m: &QMatrix<'_>, x: &[f32]) -> &[u8] {
        assert_eq!(
            x.len(),
            m.cols,
            "matvec: x has {} elements, the matrix {} columns",
            x.len(),
            m.cols
        );
        let xq = self.bytes(m.activation_bytes());
        (m.act_from_float)(x, xq);
        xq
    }
}

/// Weight bytes per chunk of rows handed to a thread: at least this much so
/// the per-chunk cost (one atomic, a broken prefetch stream) stays small...
const MIN_CHUNK_BYTES: usize = 8 << 10;
/// ...at most this much so a slow thread's leftover can be stolen...
const MAX_CHUNK_BYTES: usize = 64 << 10;
/// ...and otherwise about this many chunks per thread.
const CHUNKS_PER_THREAD: usize = 16;

fn rows_per_chunk(m: &QMatrix<'_>, n_threads: usize) -> usize {
    let row_bytes = m.row_bytes.max(1);
    if n_threads == 1 {
        return m.rows.max(1);
    }
    let target =
        (m.data.len() / (n_threads * CHUNKS_PER_THREAD)).clamp(MIN_CHUNK_BYTES, MAX_CHUNK_BYTES);
    (target / row_bytes).max(1)
}

/// `y = m · x` with the kernels this process selected ([`crate::isa::selected`]).
pub fn matvec(
    pool: &ThreadPool,
    m: &QMatrix<'_>,
    x: &[f32],
    y: &mut [f32],
    scratch: &mut MatvecScratch,
) {
    matvec_isa(pool, crate::isa::selected(), m, x, y, scratch)
}

/// `y = m · x` with the kernels for `isa` (the scalar ones where `isa` is
/// not supported by this CPU or the type has none for it).
pub fn matvec_isa(
    pool: &ThreadPool,
    isa: Isa,
    m: &QMatrix<'_>,
    x: &[f32],
    y: &mut [f32],
    scratch: &mut MatvecScratch,
) {
    if m.tiles.is_some() {
        // The tile kernel with one activation: the numbers a batch gives.
        assert_eq!(
            x.len(),
            m.cols,
            "matvec: x has {} elements, the matrix {} columns",
            x.len(),
            m.cols
        );
        assert_eq!(
            y.len(),
            m.rows,
            "matvec: y has {} elements, the matrix {} rows",
            y.len(),
            m.rows
        );
        let xq = scratch.bytes(crate::quant::tiles::prepared_bytes(m.cols));
        crate::quant::tiles::prepare(x, xq);
        crate::matmul::run_tiles(pool, isa, m, xq, 0, 1, y);
        return;
    }
    if let Some(multi) = m.traits.multi {
        // The type's multi-activation dot with one activation: the same
        // numbers a batch gives (see [`crate::matmul`]).
        assert_eq!(
            x.len(),
            m.cols,
            "matvec: x has {} elements, the matrix {} columns",
            x.len(),
            m.cols
        );
        assert_eq!(
            y.len(),
            m.rows,
            "matvec: y has {} elements, the matrix {} rows",
            y.len(),
            m.rows
        );
        let bytes = (multi.prepared_bytes)(m.cols);
        let xq = scratch.bytes(bytes);
        (multi.prepare)(x, xq);
        let xq: &[u8] = xq;
        let dot = (multi.dot_for)(isa);
        let rb = m.row_bytes;
        pool.for_each_chunk_mut(y, rows_per_chunk(m, pool.n_threads()), |start, ys, _| {
            dot(
                &m.data[start * rb..(start + ys.len()) * rb],
                rb,
                xq,
                bytes,
                1,
                ys,
            );
        });
        return;
    }
    let xq = scratch.quantize(m, x);
    matvec_quantized(pool, (m.traits.vec_dot_for)(isa), m, xq, y)
}

/// `y = m · xq` for an activation already quantized by
/// [`MatvecScratch::quantize`] and a dot from `m.traits().vec_dot_for`.
pub fn matvec_quantized(
    pool: &ThreadPool,
    dot: VecDotFn,
    m: &QMatrix<'_>,
    xq: &[u8],
    y: &mut [f32],
) {
    assert_eq!(
        y.len(),
        m.rows,
        "matvec: y has {} elements, the matrix {} rows",
        y.len(),
        m.rows
    );
    assert_eq!(
        xq.len(),
        m.activation_bytes(),
        "matvec: quantized x has the wrong length"
    );
    if m.cols == 0 {
        y.fill(0.0);
        return;
    }
    let rb = m.row_bytes;
    pool.for_each_chunk_mut(y, rows_per_chunk(m, pool.n_threads()), |start, ys, _| {
        let rows = &m.data[start * rb..(start + ys.len()) * rb];
        for (yr, row) in ys.iter_mut().zip(rows.chunks_exact(rb)) {
            *yr = dot(row, xq);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::{rng, weights};
    use crate::traits::computable_types;

    /// `n` zeroed bytes starting on a cache line.
    fn aligned(n: usize) -> Vec<Line> {
        vec![Line::zeroed(); n.div_ceil(64)]
    }

    struct Case {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: Vec<Line>,
        x: Vec<f32>,
    }

    impl Case {
        fn new(ty: GgmlType, rows: usize, blocks: usize, seed: u64) -> Case {
            let tr = traits(ty).unwrap();
            let cols = blocks * ty.block_size().max(tr.vec_dot_type.block_size());
            let mut r = rng(seed);
            let mut data = aligned(rows * tr.row_bytes(cols));
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut data);
            for row in
                bytes[..rows * tr.row_bytes(cols)].chunks_exact_mut(tr.row_bytes(cols).max(1))
            {
                (tr.from_float)(&weights(&mut r, cols), row);
            }
            let x = weights(&mut r, cols);
            Case {
                ty,
                rows,
                cols,
                data,
                x,
            }
        }

        fn matrix(&self) -> QMatrix<'_> {
            let n = self.rows * traits(self.ty).unwrap().row_bytes(self.cols);
            QMatrix::new(
                self.ty,
                self.rows,
                self.cols,
                &bytemuck::cast_slice(&self.data)[..n],
            )
            .unwrap()
        }
    }

    /// Types whose activation type is registered too (others are still
    /// being added while this runs).
    fn types() -> Vec<GgmlType> {
        computable_types()
            .into_iter()
            .filter(|&t| traits(traits(t).unwrap().vec_dot_type).is_some())
            .collect()
    }

    #[test]
    fn matches_row_by_row_reference() {
        let types = types();
        assert!(types.contains(&GgmlType::F32));
        let pools: Vec<ThreadPool> = (1..=4).map(ThreadPool::new).collect();
        let mut scratch = MatvecScratch::new();
        for (i, &ty) in types.iter().enumerate() {
            let tr = traits(ty).unwrap();
            for (rows, blocks) in [(1, 1), (7, 3), (33, 2), (67, 5)] {
                let case = Case::new(ty, rows, blocks, 1000 + i as u64 * 10 + rows as u64);
                let m = case.matrix();
                // Reference: the scalar dot on each row, and the size of the
                // terms for the tolerance.
                let n = m.activation_bytes();
                let mut xq_lines = aligned(n);
                (m.act.from_float)(&case.x, &mut bytemuck::cast_slice_mut(&mut xq_lines)[..n]);
                let xq: &[u8] = &bytemuck::cast_slice(&xq_lines)[..n];
                let mut xd = vec![0.0; case.cols];
                (m.act.to_float)(xq, &mut xd);
                let mut wd = vec![0.0; case.cols];
                let want: Vec<(f32, f32)> = (0..rows)
                    .map(|r| {
                        (tr.to_float)(m.row(r), &mut wd);
                        let mag: f32 = wd.iter().zip(&xd).map(|(a, b)| (a * b).abs()).sum();
                        ((tr.vec_dot_ref)(m.row(r), xq), mag)
                    })
                    .collect();
                for &isa in &Isa::supported() {
                    let dot = (tr.vec_dot_for)(isa);
                    for pool in &pools {
                        let mut y = vec![f32::NAN; rows];
                        matvec_isa(pool, isa, &m, &case.x, &mut y, &mut scratch);
                        for r in 0..rows {
                            let what = format!(
                                "{ty} {rows}x{} {} threads={} row {r}",
                                case.cols,
                                isa.name(),
                                pool.n_threads()
                            );
                            // The same kernel on the same bytes: identical.
                            let same = match tr.multi {
                                Some(k) => {
                                    let mut p = vec![0u32; (k.prepared_bytes)(case.cols) / 4];
                                    let p: &mut [u8] = bytemuck::cast_slice_mut(&mut p);
                                    (k.prepare)(&case.x, p);
                                    let mut o = [0.0];
                                    let rb = m.row_bytes();
                                    (k.dot_for)(isa)(m.row(r), rb, p, p.len(), 1, &mut o);
                                    o[0]
                                }
                                None => dot(m.row(r), xq),
                            };
                            assert_eq!(y[r].to_bits(), same.to_bits(), "{what}");
                            let (w, mag) = want[r];
                            assert!(
                                (y[r] - w).abs() <= 1e-5 * mag + 1e-6,
                                "{what}: {} vs ref {w}",
                                y[r]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn many_chunks_and_default_isa() {
        // Enough rows for many chunks per thread, an odd count.
        let case = Case::new(GgmlType::F32, 2049, 64, 7);
        let m = case.matrix();
        let mut scratch = MatvecScratch::new();
        let mut want = vec![0.0; m.rows()];
        matvec(&ThreadPool::new(1), &m, &case.x, &mut want, &mut scratch);
        assert!(rows_per_chunk(&m, 2) < m.rows() / 4);
        for t in 2..=4 {
            let mut y = vec![f32::NAN; m.rows()];
            matvec(&ThreadPool::new(t), &m, &case.x, &mut y, &mut scratch);
            assert_eq!(y, want, "threads={t}");
        }
        let mut y = vec![f32::NAN; m.rows()];
        matvec_isa(
            &ThreadPool::new(2),
            crate::isa::selected(),
            &m,
            &case.x,
            &mut y,
            &mut scratch,
        );
        assert_eq!(y, want);
    }

    #[test]
    fn scratch_is_reused() {
        let case = Case::new(GgmlType::F32, 5, 8, 3);
        let m = case.matrix();
        let pool = ThreadPool::new(2);
        let mut scratch = MatvecScratch::new();
        let mut y = vec![0.0; 5];
        matvec(&pool, &m, &case.x, &mut y, &mut scratch);
        let (cap, ptr) = (scratch.capacity(), scratch.buf.as_ptr());
        assert!(cap >= m.activation_bytes());
        for _ in 0..3 {
            matvec(&pool, &m, &case.x, &mut y, &mut scratch);
        }
        assert_eq!((scratch.capacity(), scratch.buf.as_ptr()), (cap, ptr));
    }

    #[test]
    fn empty_shapes() {
        let pool = ThreadPool::new(2);
        let mut scratch = MatvecScratch::new();
        let m = QMatrix::new(GgmlType::F32, 0, 16, &[]).unwrap();
        matvec(&pool, &m, &[1.0; 16], &mut [], &mut scratch);
        let m = QMatrix::new(GgmlType::F32, 3, 0, &[]).unwrap();
        let mut y = [f32::NAN; 3];
        matvec(&pool, &m, &[], &mut y, &mut scratch);
        assert_eq!(y, [0.0; 3]);
    }

    #[test]
    fn constructor_rejects_bad_shapes() {
        let buf = aligned(1 << 12);
        let bytes: &[u8] = bytemuck::cast_slice(&buf);
        use MatrixError::*;
        if let Some(&ty) = GgmlType::ALL.iter().find(|&&t| traits(t).is_none()) {
            assert_eq!(
                QMatrix::new(ty, 1, 32, bytes).unwrap_err(),
                Unsupported { ty }
            );
        }
        let f32 = GgmlType::F32;
        assert!(matches!(
            QMatrix::new(f32, 2, 3, &bytes[..23]),
            Err(DataLength {
                expected: 24,
                actual: 23,
                ..
            })
        ));
        assert!(matches!(
            QMatrix::new(f32, usize::MAX, 2, bytes),
            Err(TooLarge { .. })
        ));
        assert!(matches!(
            QMatrix::new(f32, 1, 2, &bytes[1..9]),
            Err(Misaligned { .. })
        ));
        assert!(QMatrix::new(f32, 2, 3, &bytes[..24]).is_ok());
        for ty in types().into_iter().filter(|t| t.block_size() > 1) {
            let bs = ty.block_size();
            let err = QMatrix::new(ty, 1, bs + 1, bytes).unwrap_err();
            assert!(matches!(err, RaggedRow { .. }), "{ty}: {err}");
            let rb = ty.type_size();
            assert!(matches!(
                QMatrix::new(ty, 2, bs, &bytes[..2 * rb - 1]),
                Err(DataLength { .. })
            ));
            assert!(matches!(
                QMatrix::new(ty, usize::MAX / 2, bs, bytes),
                Err(TooLarge { .. })
            ));
            let m = QMatrix::new(ty, 2, bs, &bytes[..2 * rb]).unwrap();
            assert_eq!(
                (m.rows(), m.cols(), m.row_bytes(), m.row(1).len()),
                (2, bs, rb, rb)
            );
            // Messages name the type.
            assert!(err.to_string().contains(ty.name()));
        }
    }
}
