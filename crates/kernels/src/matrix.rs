//! A quantized weight matrix bound for products: [`QMatrix`].
//!
//! Binding checks the bytes (type, shape, length, alignment) and chooses,
//! once, how every product with the matrix will run (`Product`): from
//! its row tiles ([`crate::quant::tiles`]) when it has them, else with the
//! type's several-activation dot ([`crate::traits::MultiDot`]) when it has
//! one, else one `vec_dot` per row and activation. The kernel comes from
//! the selected table ([`crate::selected`]), or from a given set's with
//! [`QMatrix::with_kernels`]; [`crate::matmul`] only runs what the matrix
//! holds.

use crate::dispatch::Kernels;
use crate::quant::tiles::{self, TileDotFn};
use crate::traits::{activation_quantizer, traits, FromFloatFn, MultiDotFn, TypeTraits, VecDotFn};
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

/// How products with a matrix run: the kernel chosen when it was bound.
#[derive(Clone, Copy)]
pub(crate) enum Product<'a> {
    /// 16 rows at a time from the row tiles, which are read instead of
    /// the rows.
    Tiles { tiles: &'a [u8], dot: TileDotFn },
    /// One row against several activations per call.
    Multi { dot: MultiDotFn },
    /// One row against one activation per call.
    Rows { dot: VecDotFn },
}

/// A row-major matrix of `rows` rows of `cols` elements of type `ty`, each
/// row `row_bytes` bytes of whole blocks, borrowed from `data`, with the
/// kernel its products run.
#[derive(Clone, Copy)]
pub struct QMatrix<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: &'a [u8],
    traits: &'static TypeTraits,
    act: &'static TypeTraits,
    layout: Layout<'a>,
}

/// The part of a [`QMatrix`] chosen with its kernels: the product, and how
/// an activation row is prepared for its kernel (and its bytes once
/// prepared).
#[derive(Clone, Copy)]
struct Layout<'a> {
    kernels: &'static Kernels,
    product: Product<'a>,
    prepare: FromFloatFn,
    prepared_bytes: usize,
}

impl<'a> Layout<'a> {
    /// Tiles if given, else the multi-activation dot if the type has one,
    /// else the row-by-row dot; each from `kernels`.
    fn choose(
        kernels: &'static Kernels,
        tr: &'static TypeTraits,
        act: &'static TypeTraits,
        cols: usize,
        tiles: Option<&'a [u8]>,
    ) -> Layout<'a> {
        let ty = tr.ty;
        let (product, prepare, prepared_bytes) = match (tiles, tr.multi) {
            (Some(tiles), _) => {
                let td =
                    tiles::tile_dot(ty).expect("tiles are only taken for types with tile kernels");
                (
                    Product::Tiles {
                        tiles,
                        dot: kernels
                            .tile_dot(ty)
                            .expect("tiles are only taken for types with tile kernels"),
                    },
                    td.prepare,
                    (td.prepared_bytes)(cols),
                )
            }
            (None, Some(multi)) => (
                Product::Multi {
                    dot: kernels
                        .multi_dot(ty)
                        .expect("a type with a multi dot has one in every table"),
                },
                multi.prepare,
                (multi.prepared_bytes)(cols),
            ),
            (None, None) => (
                Product::Rows {
                    dot: kernels
                        .vec_dot(ty)
                        .expect("a type with traits has a dot in every table"),
                },
                activation_quantizer(act.ty).expect("the activation type has traits"),
                act.row_bytes(cols),
            ),
        };
        Layout {
            kernels,
            product,
            prepare,
            prepared_bytes,
        }
    }
}

impl<'a> QMatrix<'a> {
    /// View `data` as a matrix, checking type, shape, length and alignment,
    /// with the selected kernels.
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
            traits: tr,
            act,
            layout: Layout::choose(crate::selected(), tr, act, cols, None),
        })
    }

    /// The same matrix with another set's kernels (tests hold each set to
    /// the others).
    pub fn with_kernels(self, kernels: &'static Kernels) -> QMatrix<'a> {
        let layout = Layout::choose(kernels, self.traits, self.act, self.cols, self.tiles());
        QMatrix { layout, ..self }
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
    /// All weight bytes as stored (what a row-wise product streams).
    pub fn data(&self) -> &'a [u8] {
        self.data
    }
    pub fn traits(&self) -> &'static TypeTraits {
        self.traits
    }
    /// The kernel set the products run.
    pub fn kernels(&self) -> &'static Kernels {
        self.layout.kernels
    }
    /// The type activations are quantized to for the row-by-row dot.
    pub fn vec_dot_type(&self) -> GgmlType {
        self.traits.vec_dot_type
    }
    /// Bytes of an activation row quantized to [`QMatrix::vec_dot_type`].
    pub fn activation_bytes(&self) -> usize {
        self.act.row_bytes(self.cols)
    }
    /// Row `r`'s blocks.
    pub fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    pub(crate) fn product(&self) -> Product<'a> {
        self.layout.product
    }
    /// Prepare an activation row (`cols` elements) for the product's kernel
    /// into `dst` ([`QMatrix::prepared_bytes`] bytes, 4-aligned).
    pub(crate) fn prepare(&self) -> FromFloatFn {
        self.layout.prepare
    }
    /// Bytes of one prepared activation row.
    pub(crate) fn prepared_bytes(&self) -> usize {
        self.layout.prepared_bytes
    }

    /// Bytes of this matrix repacked into row tiles, if its type has tile
    /// kernels.
    pub fn tiles_bytes(&self) -> Option<usize> {
        let td = tiles::tile_dot(self.ty)?;
        Some(tiles::tiles(self.rows) * (td.tile_bytes)(self.cols))
    }

    /// Repack the rows into row tiles in `dst` ([`QMatrix::tiles_bytes`]
    /// long), for [`QMatrix::with_tiles`].
    pub fn pack_tiles(&self, dst: &mut [u8]) -> Result<(), MatrixError> {
        let expected = self.tiles_bytes();
        match tiles::tile_dot(self.ty) {
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
        let layout = Layout::choose(
            self.layout.kernels,
            self.traits,
            self.act,
            self.cols,
            Some(tiles),
        );
        Ok(QMatrix { layout, ..self })
    }

    /// The row tiles, if the matrix has them.
    pub fn tiles(&self) -> Option<&'a [u8]> {
        match self.layout.product {
            Product::Tiles { tiles, .. } => Some(tiles),
            _ => None,
        }
    }
}

impl fmt::Debug for QMatrix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let product = match self.layout.product {
            Product::Tiles { .. } => "tiles",
            Product::Multi { .. } => "multi",
            Product::Rows { .. } => "rows",
        };
        f.debug_struct("QMatrix")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("bytes", &self.data.len())
            .field("tiles", &self.tiles().is_some())
            .field("product", &product)
            .field("kernels", &self.layout.kernels.isa().name())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;

    /// `n` zeroed bytes starting on a cache line.
    fn aligned(n: usize) -> Vec<u64> {
        vec![0u64; n.div_ceil(8)]
    }

    /// Types whose activation type is registered too.
    fn types() -> Vec<GgmlType> {
        crate::traits::computable_types()
            .into_iter()
            .filter(|&t| traits(traits(t).unwrap().vec_dot_type).is_some())
            .collect()
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

    /// Binding chooses the product once: tiles when given, else the multi
    /// dot where the type has one, else rows; with the selected kernels
    /// unless others are given, and the choice follows a change of set.
    #[test]
    fn binding_chooses_the_product_and_its_kernels() {
        let buf = aligned(1 << 14);
        let bytes: &[u8] = bytemuck::cast_slice(&buf);
        for ty in types() {
            let bs = ty
                .block_size()
                .max(traits(ty).unwrap().vec_dot_type.block_size());
            let (rows, cols) = (3, 2 * bs);
            let n = rows * traits(ty).unwrap().row_bytes(cols);
            let m = QMatrix::new(ty, rows, cols, &bytes[..n]).unwrap();
            assert!(std::ptr::eq(m.kernels(), crate::selected()));
            let want_multi = traits(ty).unwrap().multi.is_some();
            assert!(matches!(
                (m.product(), want_multi),
                (Product::Multi { .. }, true) | (Product::Rows { .. }, false)
            ));
            for isa in Isa::supported() {
                let k = crate::table(isa).unwrap();
                let m = m.with_kernels(k);
                assert_eq!(m.kernels().isa(), isa);
                match m.product() {
                    Product::Multi { dot } => {
                        assert_eq!(dot as usize, k.multi_dot(ty).unwrap() as usize)
                    }
                    Product::Rows { dot } => {
                        assert_eq!(dot as usize, k.vec_dot(ty).unwrap() as usize)
                    }
                    Product::Tiles { .. } => panic!("{ty}: tiles without tiles"),
                }
                if let Some(len) = m.tiles_bytes() {
                    let mut t = vec![0u8; len];
                    m.pack_tiles(&mut t).unwrap();
                    let tiled = m.with_tiles(&t).unwrap();
                    assert!(tiled.tiles().is_some());
                    match tiled.product() {
                        Product::Tiles { dot, .. } => {
                            assert_eq!(dot as usize, k.tile_dot(ty).unwrap() as usize)
                        }
                        _ => panic!("{ty}: no tile product"),
                    }
                    assert_eq!(
                        tiled.prepared_bytes(),
                        (tiles::tile_dot(ty).unwrap().prepared_bytes)(cols)
                    );
                    // Another set keeps the tiles.
                    let other = tiled.with_kernels(crate::table(Isa::Scalar).unwrap());
                    assert!(other.tiles().is_some());
                }
            }
        }
    }
}
