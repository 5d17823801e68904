//! Matrix-matrix products for a batch of activations: the prefill step.
//!
//! `Y = X Wᵀ` for `n` activation rows `X` `(n, cols)` and a quantized weight
//! matrix `W` `(rows, cols)`, giving `Y` `(n, rows)`. Each activation row is
//! quantized once into the weight type's `vec_dot_type`; then the weight
//! rows are split over the pool and each weight row, once loaded, is dotted
//! with all `n` quantized activations while it sits in L1. Decode streams
//! the weights once per token; this streams them once per batch.
//!
//! Every `Y[t][r]` is the same `vec_dot(row r, xq_t)` call [`crate::matvec`]
//! makes, so a batch gives bit-identical results to `n` matvecs, whatever
//! the batch size or thread count.

use crate::isa::Isa;
use crate::matvec::QMatrix;
use crate::pool::ThreadPool;
use crate::quant::tiles::{self, TILE_ROWS};
use crate::traits::{FromFloatFn, MultiDot, VecDotFn};
use bytemuck::{Pod, Zeroable};

/// A cache line: keeps each quantized activation row aligned for the block
/// casts and SIMD loads.
#[repr(C, align(64))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Line([u8; 64]);

/// Reusable buffers for [`matmul`]: the quantized activations and the
/// transposed output. They grow to the largest batch seen, then stay.
#[derive(Default)]
pub struct MatmulScratch {
    xq: Vec<Line>,
    yt: Vec<f32>,
}

impl MatmulScratch {
    pub fn new() -> MatmulScratch {
        MatmulScratch::default()
    }

    /// Bytes currently reserved.
    pub fn capacity(&self) -> usize {
        self.xq.len() * 64 + self.yt.len() * 4
    }

    /// Grow to hold `n` activation rows for `m` (so a later call of that
    /// size allocates nothing).
    pub fn reserve(&mut self, m: &QMatrix<'_>, n: usize) {
        let stride = act_stride(m);
        let lines = (n * stride) / 64;
        if self.xq.len() < lines {
            self.xq.resize(lines, Line::zeroed());
        }
        if n > 1 && self.yt.len() < n * m.rows() {
            self.yt.resize(n * m.rows(), 0.0);
        }
    }
}

/// An activation layout: how one is prepared, and its bytes for `cols`.
type ActLayout = (FromFloatFn, fn(usize) -> usize);

/// How an activation is prepared for `m`'s kernel, when not just quantized
/// to its `vec_dot_type`: for row tiles or the type's multi-dot.
fn act_layout(m: &QMatrix<'_>) -> Option<ActLayout> {
    if m.tiles().is_some() {
        return Some((tiles::prepare, tiles::prepared_bytes));
    }
    m.traits().multi.map(|k| (k.prepare, k.prepared_bytes))
}

/// Bytes of one quantized activation row: in the layout of `m`'s kernel.
fn act_bytes(m: &QMatrix<'_>) -> usize {
    match act_layout(m) {
        Some((_, bytes)) => bytes(m.cols()),
        None => m.activation_bytes(),
    }
}

/// Bytes between quantized activation rows: whole cache lines.
fn act_stride(m: &QMatrix<'_>) -> usize {
    act_bytes(m).div_ceil(64).max(1) * 64
}

/// Weight bytes per chunk of rows handed to a thread in a batch: small
/// enough that a chunk stays in L2 while all its activations pass by, large
/// enough that the chunk count stays low.
const CHUNK_BYTES: usize = 16 << 10;

/// `ys = xs · mᵀ` with the kernels this process selected: `xs` is `n` rows of
/// `m.cols()`, `ys` is `n` rows of `m.rows()`.
pub fn matmul(
    pool: &ThreadPool,
    m: &QMatrix<'_>,
    xs: &[f32],
    ys: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    matmul_isa(pool, crate::isa::selected(), m, xs, ys, scratch)
}

/// [`matmul`] with the kernels for `isa` (scalar where `isa` is not
/// available).
pub fn matmul_isa(
    pool: &ThreadPool,
    isa: Isa,
    m: &QMatrix<'_>,
    xs: &[f32],
    ys: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    let (rows, cols) = (m.rows(), m.cols());
    assert!(
        cols > 0 && xs.len().is_multiple_of(cols),
        "matmul: x has {} elements, not a whole number of rows of {cols}",
        xs.len()
    );
    let n = xs.len() / cols;
    assert_eq!(
        ys.len(),
        n * rows,
        "matmul: y has {} elements, expected {n} × {rows}",
        ys.len()
    );
    if n == 0 {
        return;
    }
    scratch.reserve(m, n);
    let stride = act_stride(m);
    if m.tiles().is_some() {
        prepare_layout(m, tiles::prepare, xs, scratch);
        let xq: &[u8] = &bytemuck::cast_slice(&scratch.xq)[..n * stride];
        return run_tiles(pool, isa, m, xq, stride, n, ys);
    }
    if let Some(multi) = m.traits().multi {
        return matmul_multi(pool, isa, m, multi, xs, ys, scratch);
    }
    let qbytes = m.activation_bytes();
    let xq: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut scratch.xq)[..n * stride];
    for (x, q) in xs.chunks_exact(cols).zip(xq.chunks_exact_mut(stride)) {
        m.quantize_activation(x, &mut q[..qbytes]);
    }
    let xq: &[u8] = xq;
    let dot: VecDotFn = (m.traits().vec_dot_for)(isa);
    let rb = m.row_bytes();
    let data = m.data();

    if n == 1 {
        // One token: the output row is already in the right layout.
        let chunk = (CHUNK_BYTES / rb.max(1)).max(1);
        pool.for_each_chunk_mut(ys, chunk, |start, out, _| {
            for (i, y) in out.iter_mut().enumerate() {
                *y = dot(&data[(start + i) * rb..(start + i + 1) * rb], &xq[..qbytes]);
            }
        });
        return;
    }

    // yt is (rows, n): a thread owns whole weight rows, so it writes
    // contiguous output; transposed into ys afterwards.
    let yt = &mut scratch.yt[..n * rows];
    let rows_per_chunk = (CHUNK_BYTES / rb.max(1)).max(1);
    pool.for_each_chunk_mut(yt, rows_per_chunk * n, |start, out, _| {
        let r0 = start / n;
        for (i, yr) in out.chunks_exact_mut(n).enumerate() {
            let row = &data[(r0 + i) * rb..(r0 + i + 1) * rb];
            for (t, y) in yr.iter_mut().enumerate() {
                *y = dot(row, &xq[t * stride..t * stride + qbytes]);
            }
        }
    });
    for (r, yr) in yt.chunks_exact(n).enumerate() {
        for (t, &y) in yr.iter().enumerate() {
            ys[t * rows + r] = y;
        }
    }
}

/// [`matmul_isa`] through the type's multi-activation dot: a thread takes a
/// chunk of weight rows and runs each against every activation, in one
/// kernel call per chunk.
fn matmul_multi(
    pool: &ThreadPool,
    isa: Isa,
    m: &QMatrix<'_>,
    multi: &MultiDot,
    xs: &[f32],
    ys: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    let n = xs.len() / m.cols();
    prepare_layout(m, multi.prepare, xs, scratch);
    run_multi(pool, isa, m, multi, n, ys, scratch);
}

/// Quantize the `n` rows of `xs` into `scratch.xq` with `prepare` (the
/// preparation of `m`'s kernel).
fn prepare_layout(m: &QMatrix<'_>, prepare: FromFloatFn, xs: &[f32], scratch: &mut MatmulScratch) {
    let cols = m.cols();
    let n = xs.len() / cols;
    let (stride, qbytes) = (act_stride(m), act_bytes(m));
    let xq: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut scratch.xq)[..n * stride];
    for (x, q) in xs.chunks_exact(cols).zip(xq.chunks_exact_mut(stride)) {
        prepare(x, &mut q[..qbytes]);
    }
}

/// `ys = xs · mᵀ` through `m`'s row tiles for the `n` activations prepared
/// in `xq` (`stride` bytes apart). A thread takes a chunk of tiles and runs
/// each against every activation while it sits in L1, writing its rows of
/// every output row.
pub(crate) fn run_tiles(
    pool: &ThreadPool,
    isa: Isa,
    m: &QMatrix<'_>,
    xq: &[u8],
    stride: usize,
    n: usize,
    ys: &mut [f32],
) {
    let (rows, cols) = (m.rows(), m.cols());
    let td = tiles::tile_dot(m.ty()).expect("a matrix with tiles has tile kernels");
    let data = m.tiles().expect("run_tiles on a matrix with tiles");
    let tb = (td.tile_bytes)(cols);
    let nb = cols / 32;
    let dot = (td.dot_for)(isa);
    assert_eq!(ys.len(), n * rows);
    let tiles_per_chunk = (CHUNK_BYTES / tb.max(1)).max(1);
    // Activations per kernel call: the output fits on the stack.
    const GROUP: usize = 8;
    if n == 1 {
        // One token: the output is ys itself, in whole tiles.
        pool.for_each_chunk_mut(ys, tiles_per_chunk * TILE_ROWS, |r0, out, _| {
            let mut buf = [0.0f32; TILE_ROWS];
            for (i, o) in out.chunks_mut(TILE_ROWS).enumerate() {
                let t = r0 / TILE_ROWS + i;
                dot(&data[t * tb..(t + 1) * tb], nb, xq, stride, 1, &mut buf);
                o.copy_from_slice(&buf[..o.len()]);
            }
        });
        return;
    }
    let ys_len = ys.len();
    let out = OutRows(ys.as_mut_ptr());
    pool.for_each_chunk(tiles::tiles(rows), tiles_per_chunk, |range, _| {
        let mut buf = [0.0f32; TILE_ROWS * GROUP];
        for t in range {
            let tile = &data[t * tb..(t + 1) * tb];
            let r0 = t * TILE_ROWS;
            let valid = TILE_ROWS.min(rows - r0);
            for c0 in (0..n).step_by(GROUP) {
                let k = GROUP.min(n - c0);
                dot(
                    tile,
                    nb,
                    &xq[c0 * stride..],
                    stride,
                    k,
                    &mut buf[..TILE_ROWS * k],
                );
                for (c, o) in buf[..TILE_ROWS * k].chunks_exact(TILE_ROWS).enumerate() {
                    let i = (c0 + c) * rows + r0;
                    assert!(i + valid <= ys_len);
                    // SAFETY: `ys` is exclusively borrowed for this call and
                    // outlives the run; the range is in bounds (checked);
                    // rows r0..r0 + valid belong to tile t alone, and each
                    // tile goes to one thread, so no two threads write the
                    // same element.
                    unsafe { std::ptr::copy_nonoverlapping(o.as_ptr(), out.get().add(i), valid) };
                }
            }
        }
    });
}

/// `ys = xs · mᵀ` for the `n` activations [`prepare_multi`] left in
/// `scratch.xq`.
fn run_multi(
    pool: &ThreadPool,
    isa: Isa,
    m: &QMatrix<'_>,
    multi: &MultiDot,
    n: usize,
    ys: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    let rows = m.rows();
    let stride = act_stride(m);
    let xq: &[u8] = &bytemuck::cast_slice(&scratch.xq)[..n * stride];
    let dot = (multi.dot_for)(isa);
    let rb = m.row_bytes();
    let data = m.data();
    let rows_per_chunk = (CHUNK_BYTES / rb.max(1)).max(1);
    if n == 1 {
        // One token: the (rows, 1) output is already ys.
        pool.for_each_chunk_mut(ys, rows_per_chunk, |r0, out, _| {
            dot(
                &data[r0 * rb..(r0 + out.len()) * rb],
                rb,
                xq,
                stride,
                1,
                out,
            );
        });
        return;
    }
    // The kernel writes (rows, n) into a thread's chunk of yt, which the
    // same thread then transposes into its rows of ys (n, rows) while the
    // chunk is in L1: no serial transpose after the run.
    let ys_len = ys.len();
    let out = OutRows(ys.as_mut_ptr());
    pool.for_each_chunk_mut(
        &mut scratch.yt[..n * rows],
        rows_per_chunk * n,
        |start, yt, _| {
            let r0 = start / n;
            let r1 = r0 + yt.len() / n;
            dot(&data[r0 * rb..r1 * rb], rb, xq, stride, n, yt);
            for (r, yr) in (r0..r1).zip(yt.chunks_exact(n)) {
                for (t, &y) in yr.iter().enumerate() {
                    let i = t * rows + r;
                    assert!(i < ys_len);
                    // SAFETY: `ys` is exclusively borrowed for this call and
                    // outlives the run; `i` is in bounds (checked); the chunks
                    // of yt cover disjoint row ranges r0..r1, and element
                    // (t, r) of ys is written only by the chunk holding row r,
                    // so no two threads write the same element.
                    unsafe { *out.get().add(i) = y };
                }
            }
        },
    );
}

/// `ys`'s pointer, shared with the pool's threads by [`run_multi`], which
/// gives each thread a disjoint set of its elements.
struct OutRows(*mut f32);

impl OutRows {
    // A method, so closures capture the wrapper and not the raw field.
    fn get(&self) -> *mut f32 {
        self.0
    }
}

// SAFETY: see the writes in `run_multi`: each element is written by at
// most one thread, and nothing reads `ys` during the run.
unsafe impl Sync for OutRows {}

/// `ys[i] = xs · ms[i]ᵀ` for matrices that read the same input (q/k/v,
/// gate/up). Where they share a multi-dot activation layout, `xs` is
/// quantized once for all of them; the results are those of separate
/// [`matmul`] calls either way.
pub fn matmul_each(
    pool: &ThreadPool,
    ms: &[&QMatrix<'_>],
    xs: &[f32],
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) {
    assert_eq!(ms.len(), ys.len(), "matmul_each: one output per matrix");
    let shared = ms.first().and_then(|m0| {
        let (p0, b0) = act_layout(m0)?;
        ms.iter()
            .all(|m| {
                m.cols() == m0.cols()
                    && act_layout(m).is_some_and(|(p, b)| {
                        std::ptr::fn_addr_eq(p, p0) && std::ptr::fn_addr_eq(b, b0)
                    })
            })
            .then_some(p0)
    });
    let Some(p0) = shared else {
        for (m, y) in ms.iter().zip(ys.iter_mut()) {
            matmul(pool, m, xs, y, scratch);
        }
        return;
    };
    let cols = ms[0].cols();
    assert!(
        cols > 0 && xs.len().is_multiple_of(cols),
        "matmul: x has {} elements, not a whole number of rows of {cols}",
        xs.len()
    );
    let n = xs.len() / cols;
    for (m, y) in ms.iter().zip(ys.iter()) {
        assert_eq!(
            y.len(),
            n * m.rows(),
            "matmul: y has {} elements, expected {n} × {}",
            y.len(),
            m.rows()
        );
        scratch.reserve(m, n);
    }
    if n == 0 {
        return;
    }
    let isa = crate::isa::selected();
    prepare_layout(ms[0], p0, xs, scratch);
    for (m, y) in ms.iter().zip(ys.iter_mut()) {
        if m.tiles().is_some() {
            let stride = act_stride(m);
            let xq: &[u8] = &bytemuck::cast_slice(&scratch.xq)[..n * stride];
            run_tiles(pool, isa, m, xq, stride, n, y);
        } else {
            let multi = m.traits().multi.expect("checked above");
            run_multi(pool, isa, m, multi, n, y, scratch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matvec::{matvec_isa, MatvecScratch};
    use crate::quant::testing::{rng, weights};
    use crate::traits::{computable_types, traits};
    use gguf::GgmlType;

    /// A random `rows × cols` matrix of `ty`, in cache-line-aligned storage.
    fn matrix_bytes(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<Line> {
        let tr = traits(ty).unwrap();
        let rb = tr.row_bytes(cols);
        let mut data = vec![Line::zeroed(); (rows * rb).div_ceil(64)];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut data);
        let mut r = rng(seed);
        for row in bytes[..rows * rb].chunks_exact_mut(rb) {
            (tr.from_float)(&weights(&mut r, cols), row);
        }
        data
    }

    fn view(ty: GgmlType, rows: usize, cols: usize, data: &[Line]) -> QMatrix<'_> {
        let n = rows * traits(ty).unwrap().row_bytes(cols);
        QMatrix::new(ty, rows, cols, &bytemuck::cast_slice(data)[..n]).unwrap()
    }

    /// For every type with kernels, a batch equals `n` matvecs bit for bit,
    /// for odd shapes, batch sizes and thread counts.
    #[test]
    fn batch_equals_matvecs() {
        let pools: Vec<ThreadPool> = (1..=3).map(ThreadPool::new).collect();
        for ty in computable_types() {
            let tr = traits(ty).unwrap();
            if traits(tr.vec_dot_type).is_none() {
                continue;
            }
            let bs = ty.block_size().max(tr.vec_dot_type.block_size());
            for (i, &(rows, blocks, n)) in [(1, 1, 1), (3, 2, 5), (17, 3, 2), (70, 1, 9), (5, 4, 1)]
                .iter()
                .enumerate()
            {
                let cols = bs * blocks;
                let data = matrix_bytes(ty, rows, cols, i as u64);
                let m = view(ty, rows, cols, &data);
                let xs = weights(&mut rng(100 + i as u64), n * cols);
                for pool in &pools {
                    for isa in Isa::supported() {
                        let mut ys = vec![f32::NAN; n * rows];
                        matmul_isa(pool, isa, &m, &xs, &mut ys, &mut MatmulScratch::new());
                        let mut y1 = vec![0.0; rows];
                        let mut vs = MatvecScratch::new();
                        for t in 0..n {
                            let x = &xs[t * cols..(t + 1) * cols];
                            matvec_isa(pool, isa, &m, x, &mut y1, &mut vs);
                            assert_eq!(
                                &ys[t * rows..(t + 1) * rows],
                                &y1[..],
                                "{ty:?} {isa:?} rows {rows} cols {cols} n {n} t {t} threads {}",
                                pool.n_threads()
                            );
                        }
                    }
                }
            }
        }
    }

    /// A matrix in row tiles: a batch equals `n` matvecs bit for bit at
    /// any thread count and kernel set, and both stay within rounding of
    /// the row-wise products (tiles add the same integer sums in another
    /// float order).
    #[test]
    fn tiled_batch_equals_matvecs() {
        let pools: Vec<ThreadPool> = (1..=3).map(ThreadPool::new).collect();
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
        ] {
            for (i, &(rows, blocks, n)) in
                [(1, 1, 1), (17, 3, 2), (70, 2, 9), (33, 18, 20), (16, 4, 1)]
                    .iter()
                    .enumerate()
            {
                let cols = 32 * blocks;
                let data = matrix_bytes(ty, rows, cols, 40 + i as u64);
                let plain = view(ty, rows, cols, &data);
                let mut tiles = vec![0u8; plain.tiles_bytes().unwrap()];
                plain.pack_tiles(&mut tiles).unwrap();
                let m = plain.with_tiles(&tiles).unwrap();
                let xs = weights(&mut rng(200 + i as u64), n * cols);
                let mut rowwise = vec![0.0; n * rows];
                matmul(
                    &pools[0],
                    &plain,
                    &xs,
                    &mut rowwise,
                    &mut MatmulScratch::new(),
                );
                for pool in &pools {
                    for isa in Isa::supported() {
                        let mut ys = vec![f32::NAN; n * rows];
                        matmul_isa(pool, isa, &m, &xs, &mut ys, &mut MatmulScratch::new());
                        let mut y1 = vec![0.0; rows];
                        let mut vs = MatvecScratch::new();
                        for t in 0..n {
                            let x = &xs[t * cols..(t + 1) * cols];
                            matvec_isa(pool, isa, &m, x, &mut y1, &mut vs);
                            assert_eq!(
                                &ys[t * rows..(t + 1) * rows],
                                &y1[..],
                                "{ty:?} {isa:?} rows {rows} cols {cols} n {n} t {t} threads {}",
                                pool.n_threads()
                            );
                        }
                        for (a, b) in ys.iter().zip(&rowwise) {
                            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{ty:?} {a} vs {b}");
                        }
                    }
                }
            }
        }
    }

    /// Tiles of the wrong length or for a type without tile kernels are
    /// refused.
    #[test]
    fn bad_tiles_are_refused() {
        let data = matrix_bytes(GgmlType::Q8_0, 4, 64, 1);
        let m = view(GgmlType::Q8_0, 4, 64, &data);
        let n = m.tiles_bytes().unwrap();
        let buf = vec![0u8; n + 1];
        assert!(m.with_tiles(&buf[..n - 1]).is_err());
        assert!(m.pack_tiles(&mut vec![0u8; n + 1]).is_err());
        let data = matrix_bytes(GgmlType::Q6_K, 4, 256, 1);
        let k = view(GgmlType::Q6_K, 4, 256, &data);
        assert_eq!(k.tiles_bytes(), None);
        assert!(k
            .with_tiles(&buf)
            .unwrap_err()
            .to_string()
            .contains("no row-tile kernels"));
    }

    /// Matrices sharing an input give what separate calls give, whether
    /// or not their types share an activation layout.
    #[test]
    fn each_equals_separate_calls() {
        let pool = ThreadPool::new(2);
        for (tiled, types) in [
            (false, [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0]),
            (true, [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0]),
            (false, [GgmlType::Q4_1, GgmlType::Q6_K, GgmlType::F32]),
        ] {
            let cols = 256 * 2;
            let shapes = [7, 3, 12];
            let data: Vec<Vec<Line>> = (0..3)
                .map(|i| matrix_bytes(types[i], shapes[i], cols, i as u64))
                .collect();
            let plain: Vec<QMatrix<'_>> = (0..3)
                .map(|i| view(types[i], shapes[i], cols, &data[i]))
                .collect();
            let tiles: Vec<Vec<u8>> = plain
                .iter()
                .map(|m| {
                    let mut t = vec![0u8; m.tiles_bytes().unwrap_or(0)];
                    if tiled {
                        m.pack_tiles(&mut t).unwrap();
                    }
                    t
                })
                .collect();
            let ms: Vec<QMatrix<'_>> = plain
                .iter()
                .zip(&tiles)
                .map(|(m, t)| if tiled { m.with_tiles(t).unwrap() } else { *m })
                .collect();
            for n in [1, 3, 5] {
                let xs = weights(&mut rng(7 + n as u64), n * cols);
                let mut want: Vec<Vec<f32>> = shapes.iter().map(|r| vec![0.0; n * r]).collect();
                for (m, y) in ms.iter().zip(want.iter_mut()) {
                    matmul(&pool, m, &xs, y, &mut MatmulScratch::new());
                }
                let mut got: Vec<Vec<f32>> = shapes.iter().map(|r| vec![f32::NAN; n * r]).collect();
                let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|v| v.as_mut_slice()).collect();
                let refs: Vec<&QMatrix<'_>> = ms.iter().collect();
                matmul_each(&pool, &refs, &xs, &mut outs, &mut MatmulScratch::new());
                assert_eq!(got, want, "{types:?} n {n}");
            }
        }
    }

    #[test]
    fn empty_batch_is_a_no_op() {
        let data = matrix_bytes(GgmlType::Q8_0, 4, 32, 1);
        let m = view(GgmlType::Q8_0, 4, 32, &data);
        let mut ys: Vec<f32> = vec![];
        matmul(
            &ThreadPool::new(2),
            &m,
            &[],
            &mut ys,
            &mut MatmulScratch::new(),
        );
    }

    #[test]
    #[should_panic(expected = "whole number of rows")]
    fn ragged_input_is_refused() {
        let data = matrix_bytes(GgmlType::Q8_0, 4, 32, 1);
        let m = view(GgmlType::Q8_0, 4, 32, &data);
        let mut ys = vec![0.0; 4];
        matmul(
            &ThreadPool::new(1),
            &m,
            &[0.0; 33],
            &mut ys,
            &mut MatmulScratch::new(),
        );
    }
}
