//! Binding a file's tensors by name, with every shape checked and errors
//! naming the tensor: matrices as [`QMatrix`] views of the file's bytes (no
//! copy; repacked into row tiles where the kernels want them), vectors as
//! `f32` copies.
//!
//! The binder also keeps the ledger of where the weights will live: bytes
//! it made (tiles, copies), parts of the file read in place every token,
//! embedding tables read by row. [`Binder::finish`] turns that into a
//! [`WeightsResidency`] and releases every other page of the file map, so
//! what the model holds resident is what the ledger says. A planning
//! binder ([`Binder::plan`]) walks the same code without repacking, so
//! `cachefit info` prints the budget `run` will have.

use crate::memory::WeightsResidency;
use crate::Error;
use gguf::file::MapUse;
use gguf::{GgmlType, GgufFile};
use kernels::matrix::QMatrix;
use std::borrow::Cow;
use std::cell::RefCell;

/// Looks tensors up by name and checks them, with errors naming the tensor.
pub(crate) struct Binder<'a> {
    pub(crate) file: &'a GgufFile,
    /// Size what binding makes instead of making it.
    plan: bool,
    ledger: RefCell<Ledger<'a>>,
}

/// Where the bound weights live, kept while binding.
#[derive(Default)]
struct Ledger<'a> {
    /// Bytes of buffers made: row tiles, aligned copies, f32 vectors.
    made: u64,
    /// Parts of the file map read in place every token: every tensor handed
    /// out, less what was copied or repacked from it since.
    in_place: Vec<&'a [u8]>,
    /// Embedding tables, read a row per token.
    by_row: Vec<&'a [u8]>,
}

impl<'a> Ledger<'a> {
    /// `part` is read whole every token (no longer only by row).
    fn every_token(&mut self, part: &'a [u8]) {
        self.by_row.retain(|b| !std::ptr::eq(*b, part));
        self.in_place.push(part);
    }

    /// `gone` is no longer read in place: cut it out of every part.
    fn forget(&mut self, gone: &[u8]) {
        let (g0, g1) = (gone.as_ptr() as usize, gone.as_ptr() as usize + gone.len());
        let mut kept = Vec::with_capacity(self.in_place.len() + 1);
        for part in self.in_place.drain(..) {
            let p0 = part.as_ptr() as usize;
            let p1 = p0 + part.len();
            if g1 <= p0 || g0 >= p1 || gone.is_empty() {
                kept.push(part);
                continue;
            }
            if g0 > p0 {
                kept.push(&part[..g0 - p0]);
            }
            if g1 < p1 {
                kept.push(&part[g1 - p0..]);
            }
        }
        self.in_place = kept;
    }
}

impl<'a> Binder<'a> {
    /// A binder that repacks and releases: for a model that will run.
    pub(crate) fn new(file: &'a GgufFile) -> Binder<'a> {
        Binder {
            file,
            plan: false,
            ledger: RefCell::default(),
        }
    }

    /// A binder that only sizes: every shape is checked and the ledger
    /// kept as [`Binder::new`]'s would be, but nothing is repacked, the
    /// matrices it returns are plain views (vectors zeros), and nothing is
    /// released. Not for running.
    pub(crate) fn plan(file: &'a GgufFile) -> Binder<'a> {
        Binder {
            plan: true,
            ..Binder::new(file)
        }
    }

    /// What the bound weights hold resident. A running binder first
    /// releases every page of the file map that no bound weight reads in
    /// place every token ([`GgufFile::release_unused`]).
    pub(crate) fn finish(self) -> WeightsResidency {
        let ledger = self.ledger.into_inner();
        if !self.file.is_file_backed() {
            // Read into memory (or built in): all of it stays, nothing is
            // released.
            return WeightsResidency {
                made: ledger.made,
                file_copy: self.file.file_len(),
                ..WeightsResidency::default()
            };
        }
        if !self.plan {
            let used: Vec<(&[u8], MapUse)> = (ledger.in_place.iter())
                .map(|&b| (b, MapUse::EveryToken))
                .chain(ledger.by_row.iter().map(|&b| (b, MapUse::ByRow)))
                .collect();
            self.file.release_unused(&used);
        }
        WeightsResidency {
            made: ledger.made,
            in_place: self.file.pages_touched(&ledger.in_place),
            by_row: self.file.pages_touched(&ledger.by_row),
            file_copy: 0,
        }
    }

    /// A tensor's info and bytes, counted as read in place until something
    /// copies or repacks it.
    pub(crate) fn tensor(&self, name: &str) -> Result<(&'a gguf::TensorInfo, &'a [u8]), Error> {
        let (info, data) = self.file.tensor(name).map_err(|_| Error::Tensor {
            name: name.to_string(),
            problem: "missing from the file".into(),
        })?;
        self.ledger.borrow_mut().in_place.push(data);
        Ok((info, data))
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

    /// An embedding table `rows × cols`, read a row per token in place: its
    /// pages come back from the file as rows are read, never all at once
    /// (unless it is also the output matrix and has no row tiles).
    pub(crate) fn embedding(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<QMatrix<'a>, Error> {
        let m = self.matrix(name, rows, cols)?;
        let mut ledger = self.ledger.borrow_mut();
        ledger.forget(m.data());
        ledger.by_row.push(m.data());
        Ok(m)
    }

    /// `m`, a TQ2_0 matrix, repacked for the ternary kernels
    /// ([`kernels::ternary`]), its rows as stored then released from
    /// memory. `None` when planning (the ledger counts the copy all the
    /// same).
    pub(crate) fn ternary(
        &self,
        name: &str,
        m: &QMatrix<'a>,
    ) -> Result<Option<kernels::ternary::TernaryMatrix>, Error> {
        use kernels::ternary::{TernaryMatrix, TILE_BLOCK_BYTES, TILE_ROWS};
        let bad = |problem: String| Error::Tensor {
            name: name.to_string(),
            problem,
        };
        if m.ty() != GgmlType::TQ2_0 {
            return Err(bad(format!("type {}, expected TQ2_0", m.ty())));
        }
        let (rows, blocks) = (m.rows(), m.cols() / gguf::QK_K);
        let made = rows.div_ceil(TILE_ROWS) * blocks * (TILE_BLOCK_BYTES + 4 * TILE_ROWS);
        {
            let mut ledger = self.ledger.borrow_mut();
            ledger.made += made as u64;
            ledger.forget(m.data());
        }
        if self.plan {
            return Ok(None);
        }
        let w: &[kernels::quant::tq2_0::BlockTQ2_0] = bytemuck::try_cast_slice(m.data())
            .map_err(|e| bad(format!("TQ2_0 data not castable: {e}")))?;
        let t = TernaryMatrix::new(rows, m.cols(), w).map_err(|e| bad(e.to_string()))?;
        self.file.release(m.data());
        Ok(Some(t))
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
            // Read in place every token, an embedding table that is also
            // the output included.
            self.ledger.borrow_mut().every_token(m.data());
            return Ok(m);
        };
        {
            let mut ledger = self.ledger.borrow_mut();
            ledger.made += len as u64;
            ledger.forget(m.data());
        }
        if self.plan {
            return Ok(m);
        }
        let mut packed = Ok(());
        let tiles = self
            .file
            .keep_derived(len, |buf| packed = self.pack_releasing(&m, buf))?;
        let bad = |e: kernels::matrix::MatrixError| Error::Tensor {
            name: name.to_string(),
            problem: e.to_string(),
        };
        packed.map_err(bad)?;
        let t = m.with_tiles(tiles).map_err(bad)?;
        self.file.release(m.data());
        Ok(t)
    }

    /// Pack `m` into `dst` a few MiB of rows at a time, releasing each
    /// stretch of the file once packed: the peak never holds a large
    /// tensor (a 140 MiB embedding table) both mapped and repacked.
    fn pack_releasing(
        &self,
        m: &QMatrix<'a>,
        dst: &mut [u8],
    ) -> Result<(), kernels::matrix::MatrixError> {
        use kernels::quant::tiles::{tiles, TILE_ROWS};
        const STRETCH_BYTES: usize = 4 << 20;
        let (rows, rb) = (m.rows(), m.row_bytes());
        let tile_bytes = dst.len() / tiles(rows).max(1);
        // Whole tiles per stretch, so each starts a tile in `dst`.
        let step = (STRETCH_BYTES / (rb * TILE_ROWS).max(1)).max(1) * TILE_ROWS;
        if step >= rows {
            return m.pack_tiles(dst);
        }
        for r0 in (0..rows).step_by(step) {
            let n = step.min(rows - r0);
            let src = &m.data()[r0 * rb..(r0 + n) * rb];
            let part = QMatrix::new(m.ty(), n, m.cols(), src)?;
            let t0 = r0 / TILE_ROWS * tile_bytes;
            part.pack_tiles(&mut dst[t0..t0 + tiles(n) * tile_bytes])?;
            self.file.release(src);
        }
        Ok(())
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
    /// that lives as long as the file (also when planning: there is no
    /// aligned view to hand out otherwise, and such tensors are rare).
    fn aligned(&self, bytes: &'a [u8]) -> Result<&'a [u8], Error> {
        if (bytes.as_ptr() as usize).is_multiple_of(kernels::matrix::DATA_ALIGN) {
            return Ok(bytes);
        }
        {
            let mut ledger = self.ledger.borrow_mut();
            ledger.made += bytes.len() as u64;
            ledger.forget(bytes);
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

    /// A vector of `len` elements as f32, always copied out of the file:
    /// a norm read through the map every token would keep its page, and
    /// with it the page-cache folio around it, resident.
    pub(crate) fn vector(&self, name: &str, len: usize) -> Result<Cow<'a, [f32]>, Error> {
        let (info, data) = self.tensor(name)?;
        let bad = |problem: String| Error::Tensor {
            name: name.to_string(),
            problem,
        };
        if info.n_elements() != len as u64 || info.dims.iter().skip(1).any(|&d| d != 1) {
            return Err(bad(format!("shape {:?}, expected [{len}]", info.dims)));
        }
        {
            let mut ledger = self.ledger.borrow_mut();
            ledger.made += 4 * len as u64;
            ledger.forget(data);
        }
        let mut out = vec![0.0; len];
        if info.ty == GgmlType::F32 {
            let f: &[f32] = bytemuck::try_cast_slice(data)
                .map_err(|e| bad(format!("F32 data not castable: {e}")))?;
            if !self.plan {
                out.copy_from_slice(f);
            }
            return Ok(Cow::Owned(out));
        }
        let tr = kernels::traits(info.ty)
            .filter(|_| len.is_multiple_of(info.ty.block_size()))
            .ok_or_else(|| bad(format!("type {} is not supported for a vector", info.ty)))?;
        if !self.plan {
            (tr.to_float)(data, &mut out);
        }
        Ok(Cow::Owned(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgetting_cuts_parts_and_keeps_the_rest() {
        let bytes = [0u8; 100];
        let mut l = Ledger::default();
        l.in_place.push(&bytes[..60]);
        l.in_place.push(&bytes[70..]);
        l.forget(&bytes[10..20]);
        l.forget(&bytes[50..80]);
        l.forget(&bytes[0..0]);
        let spans: Vec<(usize, usize)> = (l.in_place.iter())
            .map(|p| {
                let s = p.as_ptr() as usize - bytes.as_ptr() as usize;
                (s, s + p.len())
            })
            .collect();
        assert_eq!(spans, [(0, 10), (20, 50), (80, 100)]);
        l.forget(&bytes[..]);
        assert!(l.in_place.is_empty());
    }
}
