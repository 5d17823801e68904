//! Binding a file's tensors by name, with every shape checked and errors
//! naming the tensor: matrices as [`QMatrix`] views of the file's bytes (no
//! copy; repacked into row tiles where the kernels want them), vectors as
//! `f32` slices (borrowed when stored as F32, dequantized once otherwise).

use crate::Error;
use gguf::{GgmlType, GgufFile};
use kernels::matrix::QMatrix;
use std::borrow::Cow;

/// Looks tensors up by name and checks them, with errors naming the tensor.
pub(crate) struct Binder<'a> {
    pub(crate) file: &'a GgufFile,
}

impl<'a> Binder<'a> {
    pub(crate) fn tensor(&self, name: &str) -> Result<(&'a gguf::TensorInfo, &'a [u8]), Error> {
        self.file.tensor(name).map_err(|_| Error::Tensor {
            name: name.to_string(),
            problem: "missing from the file".into(),
        })
    }

    /// A `rows × cols` matrix (ggml dims `[cols, rows]`).
    pub(crate) fn matrix(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<QMatrix<'a>, Error> {
        let (info, data) = self.tensor(name)?;
        let bad = |problem: String| Error::Tensor {
            name: name.to_string(),
            problem,
        };
        if info.dims != [cols as u64, rows as u64] {
            return Err(bad(format!(
                "shape {:?}, expected [{cols}, {rows}]",
                info.dims
            )));
        }
        QMatrix::new(info.ty, rows, cols, data).map_err(|e| bad(e.to_string()))
    }

    /// [`Binder::matrix`] in row tiles where they pay ([`Binder::tiled`]).
    pub(crate) fn weight(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<QMatrix<'a>, Error> {
        self.tiled(name, self.matrix(name, rows, cols)?)
    }

    /// `m` repacked into row tiles where they pay ([`kernels::quant::tiles`]),
    /// its rows as stored then released from memory (they come back from
    /// the file if read). Unchanged for types without tile kernels.
    pub(crate) fn tiled(&self, name: &str, m: QMatrix<'a>) -> Result<QMatrix<'a>, Error> {
        let Some(len) = m.tiles_bytes().filter(|_| kernels::quant::tiles::wanted()) else {
            return Ok(m);
        };
        let mut packed = Ok(());
        let tiles = self
            .file
            .keep_derived(len, |buf| packed = m.pack_tiles(buf))?;
        let bad = |e: kernels::matrix::MatrixError| Error::Tensor {
            name: name.to_string(),
            problem: e.to_string(),
        };
        packed.map_err(bad)?;
        let t = m.with_tiles(tiles).map_err(bad)?;
        self.file.release(m.data());
        Ok(t)
    }

    /// Rows `from..from + n` of `m` (a fused tensor named `name`) as a
    /// matrix of their own: a view of the same bytes, or a copy where the
    /// view would start off the kernels' alignment.
    pub(crate) fn rows(
        &self,
        name: &str,
        m: &QMatrix<'a>,
        from: usize,
        n: usize,
    ) -> Result<QMatrix<'a>, Error> {
        let rb = m.row_bytes();
        let bytes = self.aligned(&m.data()[from * rb..(from + n) * rb])?;
        QMatrix::new(m.ty(), n, m.cols(), bytes).map_err(|e| Error::Tensor {
            name: name.to_string(),
            problem: format!("rows {from}..{}: {e}", from + n),
        })
    }

    /// `bytes` where a matrix may start: in place, or copied to a buffer
    /// that lives as long as the file.
    fn aligned(&self, bytes: &'a [u8]) -> Result<&'a [u8], Error> {
        if (bytes.as_ptr() as usize).is_multiple_of(kernels::matrix::DATA_ALIGN) {
            return Ok(bytes);
        }
        Ok(self
            .file
            .keep_derived(bytes.len(), |buf| buf.copy_from_slice(bytes))?)
    }

    /// The `count` matrices `rows × cols` of a 3-D expert tensor (ggml
    /// dims `[cols, rows, count]`), each in row tiles where they pay.
    pub(crate) fn experts(
        &self,
        name: &str,
        count: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<QMatrix<'a>>, Error> {
        let (info, data) = self.tensor(name)?;
        let bad = |problem: String| Error::Tensor {
            name: name.to_string(),
            problem,
        };
        if info.dims != [cols as u64, rows as u64, count as u64] {
            return Err(bad(format!(
                "shape {:?}, expected [{cols}, {rows}, {count}]",
                info.dims
            )));
        }
        let per = data.len() / count;
        (0..count)
            .map(|e| {
                let bytes = self.aligned(&data[e * per..(e + 1) * per])?;
                let m = QMatrix::new(info.ty, rows, cols, bytes)
                    .map_err(|err| bad(format!("expert {e}: {err}")))?;
                self.tiled(name, m)
            })
            .collect()
    }

    /// A vector of `len` elements as f32: borrowed if stored as F32.
    pub(crate) fn vector(&self, name: &str, len: usize) -> Result<Cow<'a, [f32]>, Error> {
        let (info, data) = self.tensor(name)?;
        let bad = |problem: String| Error::Tensor {
            name: name.to_string(),
            problem,
        };
        if info.n_elements() != len as u64 || info.dims.iter().skip(1).any(|&d| d != 1) {
            return Err(bad(format!("shape {:?}, expected [{len}]", info.dims)));
        }
        if info.ty == GgmlType::F32 {
            return bytemuck::try_cast_slice(data)
                .map(Cow::Borrowed)
                .map_err(|e| bad(format!("F32 data not castable: {e}")));
        }
        let tr = kernels::traits(info.ty)
            .filter(|_| len.is_multiple_of(info.ty.block_size()))
            .ok_or_else(|| bad(format!("type {} is not supported for a vector", info.ty)))?;
        let mut out = vec![0.0; len];
        (tr.to_float)(data, &mut out);
        Ok(Cow::Owned(out))
    }
}
