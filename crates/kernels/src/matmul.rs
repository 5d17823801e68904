//! Products of a quantized weight matrix with activation rows: `Y = X Wᵀ`
//! for `n` rows `X` `(n, cols)` and a [`QMatrix`] `W` `(rows, cols)`,
//! giving `Y` `(n, rows)`. Decode is the `n = 1` case ([`matvec`]), prefill
//! and batched decode the others.
//!
//! Each activation row is prepared once for the matrix's kernel (quantized
//! to its layout); then the weight rows are split over the pool and each
//! weight row (or tile of 16 rows), once loaded, is dotted with all `n`
//! prepared activations while it sits in L1. Decode streams the weights
//! once per token; this streams them once per batch. The kernel was chosen
//! when the matrix was bound ([`crate::matrix`]): nothing is looked up here.
//!
//! Every `Y[t][r]` is computed the same way whatever `n`, the other rows
//! or the thread count (each kernel runs the same operations per
//! activation), so a batch gives bit-identical results to `n` products of
//! one row.

use crate::matrix::{Product, QMatrix};
use crate::pool::ThreadPool;
use crate::quant::tiles::{self, TileDotFn, TILE_ROWS};
use crate::traits::{MultiDotFn, VecDotFn};
use bytemuck::{Pod, Zeroable};

/// A cache line: keeps each prepared activation row aligned for the block
/// casts and SIMD loads.
#[repr(C, align(64))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Line([u8; 64]);

/// Reusable buffers for [`matmul`]: the prepared activations and the
/// transposed output. They grow to the largest batch seen, then stay, so
/// steady-state decode allocates nothing.
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

/// Bytes between prepared activation rows: whole cache lines.
fn act_stride(m: &QMatrix<'_>) -> usize {
    m.prepared_bytes().div_ceil(64).max(1) * 64
}

/// Weight bytes per chunk of rows handed to a thread: small enough that a
/// chunk stays in L2 while all its activations pass by, large enough that
/// the chunk count stays low.
const CHUNK_BYTES: usize = 16 << 10;

/// `ys = xs · mᵀ`: `xs` is `n` rows of `m.cols()`, `ys` is `n` rows of
/// `m.rows()`.
pub fn matmul(
    pool: &ThreadPool,
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
    prepare(pool, m, xs, scratch);
    run(pool, m, n, ys, scratch);
}

/// `y = m · x` for one activation row: [`matmul`] with `n = 1`.
pub fn matvec(
    pool: &ThreadPool,
    m: &QMatrix<'_>,
    x: &[f32],
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    assert_eq!(
        x.len(),
        m.cols(),
        "matvec: x has {} elements, the matrix {} columns",
        x.len(),
        m.cols()
    );
    assert_eq!(
        y.len(),
        m.rows(),
        "matvec: y has {} elements, the matrix {} rows",
        y.len(),
        m.rows()
    );
    if m.cols() == 0 {
        // Empty sums (matmul cannot tell how many rows an empty x holds).
        y.fill(0.0);
        return;
    }
    matmul(pool, m, x, y, scratch)
}

/// Activation rows from which preparing them is split over the pool: a
/// prompt's batch (serial, it was 5% of a prompt's time on two threads).
const PARALLEL_PREPARE_FROM: usize = 4;

/// Prepare the `n` rows of `xs` for `m`'s kernel into `scratch.xq`, one
/// every [`act_stride`] bytes.
fn prepare(pool: &ThreadPool, m: &QMatrix<'_>, xs: &[f32], scratch: &mut MatmulScratch) {
    let cols = m.cols();
    let n = xs.len() / cols;
    let (stride, bytes, prepare) = (act_stride(m), m.prepared_bytes(), m.prepare());
    let xq: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut scratch.xq)[..n * stride];
    let rows = |start: usize, xq: &mut [u8], _thread: usize| {
        let xs = &xs[start / stride * cols..];
        for (x, q) in xs.chunks_exact(cols).zip(xq.chunks_exact_mut(stride)) {
            prepare(x, &mut q[..bytes]);
        }
    };
    if pool.n_threads() > 1 && n >= PARALLEL_PREPARE_FROM {
        let per_chunk = n.div_ceil(2 * pool.n_threads());
        pool.for_each_chunk_mut(xq, per_chunk * stride, rows);
    } else {
        rows(0, xq, 0);
    }
}

/// `ys = xs · mᵀ` for the `n` activations [`prepare`] left in
/// `scratch.xq`, with the kernel `m` was bound with.
fn run(pool: &ThreadPool, m: &QMatrix<'_>, n: usize, ys: &mut [f32], scratch: &mut MatmulScratch) {
    let stride = act_stride(m);
    let MatmulScratch { xq, yt } = scratch;
    let xq: &[u8] = &bytemuck::cast_slice(xq)[..n * stride];
    if n == 1 {
        return run_one(pool, &[m], xq, &mut [ys]);
    }
    let acts = Acts { xq, stride, n };
    match m.product() {
        Product::Tiles { tiles, dot } => run_tiles(pool, m, tiles, dot, acts, ys),
        Product::Multi { dot } => run_multi(pool, m, dot, acts, ys, yt),
        Product::Rows { dot } => run_rows(pool, m, dot, acts, ys, yt),
    }
}

/// Most matrices [`run_one`] takes in one run (q, k and v are three).
const MAX_ONE: usize = 4;

/// How [`run_one`] splits `m` for one activation: weight rows per chunk
/// (whole tiles, or [`CHUNK_BYTES`] of rows) and the bytes of a tile (0
/// without tiles), worked out once per matrix, not per chunk.
fn one_layout(m: &QMatrix<'_>) -> (usize, usize) {
    match m.product() {
        Product::Tiles { .. } => {
            let td = tiles::tile_dot(m.ty()).expect("a matrix with tiles has tile kernels");
            let tb = (td.tile_bytes)(m.cols());
            ((CHUNK_BYTES / tb.max(1)).max(1) * TILE_ROWS, tb)
        }
        Product::Multi { .. } | Product::Rows { .. } => {
            ((CHUNK_BYTES / m.row_bytes().max(1)).max(1), 0)
        }
    }
}

/// Rows `r0..r0 + out.len()` of `y = m · x` for the one activation
/// prepared in `xq` (a chunk of [`one_layout`]'s, or the last, shorter
/// one); `tb` is the tile bytes [`one_layout`] gave.
fn one_chunk(m: &QMatrix<'_>, tb: usize, xq: &[u8], r0: usize, out: &mut [f32]) {
    let (rb, data, stride) = (m.row_bytes(), m.data(), act_stride(m));
    match m.product() {
        Product::Tiles { tiles, dot } => {
            let nb = m.cols() / 32;
            let tile = |i: usize| &tiles[(r0 / TILE_ROWS + i) * tb..][..tb];
            // Whole tiles write their rows in place (through a buffer,
            // the copy was a memcpy call: 2.5% of a token at one thread);
            // a last partial tile goes through one.
            let n_whole = out.len() / TILE_ROWS;
            let mut whole = out.chunks_exact_mut(TILE_ROWS);
            for (i, o) in (&mut whole).enumerate() {
                dot(tile(i), nb, xq, stride, 1, o);
            }
            let rest = whole.into_remainder();
            if !rest.is_empty() {
                let mut buf = [0.0f32; TILE_ROWS];
                dot(tile(n_whole), nb, xq, stride, 1, &mut buf);
                rest.copy_from_slice(&buf[..rest.len()]);
            }
        }
        Product::Multi { dot } => dot(
            &data[r0 * rb..(r0 + out.len()) * rb],
            rb,
            xq,
            stride,
            1,
            out,
        ),
        Product::Rows { dot } => {
            let qbytes = m.prepared_bytes();
            for (i, y) in out.iter_mut().enumerate() {
                *y = dot(&data[(r0 + i) * rb..(r0 + i + 1) * rb], &xq[..qbytes]);
            }
        }
    }
}

/// `ys[i] = ms[i] · x` for the one activation prepared in `xq` (the same
/// preparation for every matrix), in one pool run: the matrices' chunks
/// of rows are numbered one after another and split over the threads as
/// one run's. A decode step's q, k and v (or gate and up) then wait for
/// the slowest thread once, not once each: at two threads the end of a
/// run cost the caller ~1 µs, and a token made 211 of them.
fn run_one(pool: &ThreadPool, ms: &[&QMatrix<'_>], xq: &[u8], ys: &mut [&mut [f32]]) {
    assert!(ms.len() == ys.len() && ms.len() <= MAX_ONE);
    // Matrix i owns chunks first[i]..first[i + 1] of the run.
    let (mut per_chunk, mut tb) = ([0usize; MAX_ONE], [0usize; MAX_ONE]);
    let mut first = [0usize; MAX_ONE + 1];
    let mut outs = [(OutRows(std::ptr::null_mut()), 0usize); MAX_ONE];
    for (i, (m, y)) in ms.iter().zip(ys.iter_mut()).enumerate() {
        assert_eq!(
            y.len(),
            m.rows(),
            "matmul: y has {} elements, the matrix {} rows",
            y.len(),
            m.rows()
        );
        (per_chunk[i], tb[i]) = one_layout(m);
        first[i + 1] = first[i] + m.rows().div_ceil(per_chunk[i]);
        outs[i] = (OutRows(y.as_mut_ptr()), y.len());
    }
    let n_chunks = first[ms.len()];
    let chunk = |c: usize| {
        let i = first[1..=ms.len()].partition_point(|&f| f <= c);
        let r0 = (c - first[i]) * per_chunk[i];
        let (out, len) = &outs[i];
        let r1 = (r0 + per_chunk[i]).min(*len);
        // SAFETY: `ys[i]` is exclusively borrowed for this call and
        // outlives the run; r0 < r1 ≤ len (chunk c is one of matrix i's);
        // each chunk index goes to one thread, and chunks of one matrix
        // cover disjoint rows, so no two threads touch the same element
        // and nothing else reads `ys` during the run.
        let out = unsafe { std::slice::from_raw_parts_mut(out.get().add(r0), r1 - r0) };
        one_chunk(ms[i], tb[i], xq, r0, out);
    };
    pool.run(|ctx| {
        for r in ctx.chunks(n_chunks, 1) {
            chunk(r.start);
        }
    });
}

/// `n` prepared activations, `stride` bytes apart in `xq`.
#[derive(Clone, Copy)]
struct Acts<'a> {
    xq: &'a [u8],
    stride: usize,
    n: usize,
}

/// Row by row: each weight row against every activation, one `vec_dot`
/// each.
fn run_rows(
    pool: &ThreadPool,
    m: &QMatrix<'_>,
    dot: VecDotFn,
    acts: Acts<'_>,
    ys: &mut [f32],
    yt: &mut [f32],
) {
    let Acts { xq, stride, n } = acts;
    let (rows, rb, data) = (m.rows(), m.row_bytes(), m.data());
    let qbytes = m.prepared_bytes();
    let rows_per_chunk = (CHUNK_BYTES / rb.max(1)).max(1);
    // yt is (rows, n): a thread owns whole weight rows, so it writes
    // contiguous output; transposed into ys afterwards.
    let yt = &mut yt[..n * rows];
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

/// Through the row tiles: a thread takes a chunk of tiles and runs each
/// against every activation while it sits in L1, writing its rows of every
/// output row.
fn run_tiles(
    pool: &ThreadPool,
    m: &QMatrix<'_>,
    data: &[u8],
    dot: TileDotFn,
    acts: Acts<'_>,
    ys: &mut [f32],
) {
    let Acts { xq, stride, n } = acts;
    let (rows, cols) = (m.rows(), m.cols());
    let td = tiles::tile_dot(m.ty()).expect("a matrix with tiles has tile kernels");
    let tb = (td.tile_bytes)(cols);
    let nb = cols / 32;
    assert_eq!(ys.len(), n * rows);
    let tiles_per_chunk = (CHUNK_BYTES / tb.max(1)).max(1);
    // Activations per kernel call: the output fits on the stack (2 KiB),
    // and a 5-bit tile unpacked once per call on AVX2 serves 32 of them
    // (criterion's Q5_0 prompt pass: 1.15-1.23x unpacked at 8 a call,
    // 1.24-1.32x at 32).
    const GROUP: usize = 32;
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
                    unsafe {
                        let dst = out.get().add(i);
                        if valid == TILE_ROWS {
                            // A whole tile: one fixed-size copy, inlined
                            // (a memcpy call per 64 bytes was 2% of a
                            // prompt).
                            dst.cast::<[f32; TILE_ROWS]>()
                                .write_unaligned(o.as_ptr().cast::<[f32; TILE_ROWS]>().read());
                        } else {
                            std::ptr::copy_nonoverlapping(o.as_ptr(), dst, valid);
                        }
                    }
                }
            }
        }
    });
}

/// Through the type's multi-activation dot: a thread takes a chunk of
/// weight rows and runs each against every activation, in one kernel call
/// per chunk.
fn run_multi(
    pool: &ThreadPool,
    m: &QMatrix<'_>,
    dot: MultiDotFn,
    acts: Acts<'_>,
    ys: &mut [f32],
    yt: &mut [f32],
) {
    let Acts { xq, stride, n } = acts;
    let (rows, rb, data) = (m.rows(), m.row_bytes(), m.data());
    let rows_per_chunk = (CHUNK_BYTES / rb.max(1)).max(1);
    // The kernel writes (rows, n) into a thread's chunk of yt, which the
    // same thread then transposes into its rows of ys (n, rows) while the
    // chunk is in L1: no serial transpose after the run.
    let ys_len = ys.len();
    let out = OutRows(ys.as_mut_ptr());
    pool.for_each_chunk_mut(&mut yt[..n * rows], rows_per_chunk * n, |start, yt, _| {
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
    });
}

/// `ys`'s pointer, shared with the pool's threads by [`run_tiles`],
/// [`run_multi`] and [`run_one`], which give each thread a disjoint set
/// of its elements.
#[derive(Clone, Copy)]
struct OutRows(*mut f32);

impl OutRows {
    // A method, so closures capture the wrapper and not the raw field.
    fn get(&self) -> *mut f32 {
        self.0
    }
}

// SAFETY: see the writes in `run_tiles`, `run_multi` and `run_one`: each element is
// written by at most one thread, and nothing reads `ys` during the run.
unsafe impl Sync for OutRows {}

/// `ys[i] = xs · ms[i]ᵀ` for matrices that read the same input (q/k/v,
/// gate/up). Where they prepare activations the same way, `xs` is
/// prepared once for all of them; the results are those of separate
/// [`matmul`] calls either way.
pub fn matmul_each(
    pool: &ThreadPool,
    ms: &[&QMatrix<'_>],
    xs: &[f32],
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) {
    assert_eq!(ms.len(), ys.len(), "matmul_each: one output per matrix");
    let shared = ms.first().is_some_and(|m0| {
        ms.iter().all(|m| {
            m.cols() == m0.cols()
                && m.prepared_bytes() == m0.prepared_bytes()
                && std::ptr::fn_addr_eq(m.prepare(), m0.prepare())
        })
    });
    if !shared {
        for (m, y) in ms.iter().zip(ys.iter_mut()) {
            matmul(pool, m, xs, y, scratch);
        }
        return;
    }
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
    prepare(pool, ms[0], xs, scratch);
    if n == 1 && ms.len() <= MAX_ONE {
        let xq: &[u8] = &bytemuck::cast_slice(&scratch.xq)[..act_stride(ms[0])];
        return run_one(pool, ms, xq, ys);
    }
    for (m, y) in ms.iter().zip(ys.iter_mut()) {
        run(pool, m, n, y, scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::quant::testing::{rng, weights};
    use crate::traits::{computable_types, traits};
    use gguf::GgmlType;

    /// `m` with the kernels of `isa`, a set this CPU supports.
    fn on<'a>(isa: Isa, m: &QMatrix<'a>) -> QMatrix<'a> {
        m.with_kernels(crate::table(isa).unwrap())
    }

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
                        let m = on(isa, &m);
                        let mut ys = vec![f32::NAN; n * rows];
                        matmul(pool, &m, &xs, &mut ys, &mut MatmulScratch::new());
                        let mut y1 = vec![0.0; rows];
                        let mut vs = MatmulScratch::new();
                        for t in 0..n {
                            let x = &xs[t * cols..(t + 1) * cols];
                            matvec(pool, &m, x, &mut y1, &mut vs);
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
                        let m = on(isa, &m);
                        let mut ys = vec![f32::NAN; n * rows];
                        matmul(pool, &m, &xs, &mut ys, &mut MatmulScratch::new());
                        let mut y1 = vec![0.0; rows];
                        let mut vs = MatmulScratch::new();
                        for t in 0..n {
                            let x = &xs[t * cols..(t + 1) * cols];
                            matvec(pool, &m, x, &mut y1, &mut vs);
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
        let data = matrix_bytes(GgmlType::Q3_K, 4, 256, 1);
        let k = view(GgmlType::Q3_K, 4, 256, &data);
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
            (true, [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q6_K]),
            (true, [GgmlType::Q5_K, GgmlType::Q4_K, GgmlType::Q6_K]),
            (false, [GgmlType::Q4_1, GgmlType::Q6_K, GgmlType::F32]),
        ] {
            // Small matrices take one chunk each; large ones several
            // (ending in a partial tile), so one run's chunks span them.
            for shapes in [[7, 3, 12], [300, 45, 161]] {
                let cols = 256 * 2;
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
                    let mut got: Vec<Vec<f32>> =
                        shapes.iter().map(|r| vec![f32::NAN; n * r]).collect();
                    let mut outs: Vec<&mut [f32]> =
                        got.iter_mut().map(|v| v.as_mut_slice()).collect();
                    let refs: Vec<&QMatrix<'_>> = ms.iter().collect();
                    matmul_each(&pool, &refs, &xs, &mut outs, &mut MatmulScratch::new());
                    assert_eq!(got, want, "{types:?} {shapes:?} n {n}");
                }
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

    /// A random matrix and activation row for the one-row tests.
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
            let data = matrix_bytes(ty, rows, cols, seed);
            let x = weights(&mut rng(seed + 1), cols);
            Case {
                ty,
                rows,
                cols,
                data,
                x,
            }
        }

        fn matrix(&self) -> QMatrix<'_> {
            view(self.ty, self.rows, self.cols, &self.data)
        }
    }

    /// Types whose activation type is registered too.
    fn types() -> Vec<GgmlType> {
        computable_types()
            .into_iter()
            .filter(|&t| traits(traits(t).unwrap().vec_dot_type).is_some())
            .collect()
    }

    /// One row through every set and thread count: each output is the
    /// set's own kernel on that row (bit for bit), and within rounding of
    /// the scalar reference dot.
    #[test]
    fn matches_row_by_row_reference() {
        let types = types();
        assert!(types.contains(&GgmlType::F32));
        let pools: Vec<ThreadPool> = (1..=4).map(ThreadPool::new).collect();
        let mut scratch = MatmulScratch::new();
        for (i, &ty) in types.iter().enumerate() {
            let tr = traits(ty).unwrap();
            let act = traits(tr.vec_dot_type).unwrap();
            for (rows, blocks) in [(1, 1), (7, 3), (33, 2), (67, 5)] {
                let case = Case::new(ty, rows, blocks, 1000 + i as u64 * 10 + rows as u64);
                let m = case.matrix();
                // Reference: the scalar dot on each row, and the size of the
                // terms for the tolerance.
                let n = m.activation_bytes();
                let mut xq_lines = vec![Line::zeroed(); n.div_ceil(64)];
                (act.from_float)(&case.x, &mut bytemuck::cast_slice_mut(&mut xq_lines)[..n]);
                let xq: &[u8] = &bytemuck::cast_slice(&xq_lines)[..n];
                let mut xd = vec![0.0; case.cols];
                (act.to_float)(xq, &mut xd);
                let mut wd = vec![0.0; case.cols];
                let want: Vec<(f32, f32)> = (0..rows)
                    .map(|r| {
                        (tr.to_float)(m.row(r), &mut wd);
                        let mag: f32 = wd.iter().zip(&xd).map(|(a, b)| (a * b).abs()).sum();
                        ((tr.vec_dot_ref)(m.row(r), xq), mag)
                    })
                    .collect();
                for &isa in &Isa::supported() {
                    let k = crate::table(isa).unwrap();
                    let m = on(isa, &m);
                    for pool in &pools {
                        let mut y = vec![f32::NAN; rows];
                        matvec(pool, &m, &case.x, &mut y, &mut scratch);
                        for r in 0..rows {
                            let what = format!(
                                "{ty} {rows}x{} {} threads={} row {r}",
                                case.cols,
                                isa.name(),
                                pool.n_threads()
                            );
                            // The same kernel on the same bytes: identical.
                            let same = match tr.multi {
                                Some(multi) => {
                                    let mut p = vec![0u32; (multi.prepared_bytes)(case.cols) / 4];
                                    let p: &mut [u8] = bytemuck::cast_slice_mut(&mut p);
                                    (multi.prepare)(&case.x, p);
                                    let mut o = [0.0];
                                    let rb = m.row_bytes();
                                    let dot = k.multi_dot(ty).unwrap();
                                    dot(m.row(r), rb, p, p.len(), 1, &mut o);
                                    o[0]
                                }
                                None => k.vec_dot(ty).unwrap()(m.row(r), xq),
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
    fn many_chunks_and_default_kernels() {
        // Enough rows for many chunks per thread, an odd count.
        let case = Case::new(GgmlType::F32, 2049, 64, 7);
        let m = case.matrix();
        let mut scratch = MatmulScratch::new();
        let mut want = vec![0.0; m.rows()];
        matvec(&ThreadPool::new(1), &m, &case.x, &mut want, &mut scratch);
        assert!(CHUNK_BYTES / m.row_bytes() < m.rows() / 4);
        for t in 2..=4 {
            let mut y = vec![f32::NAN; m.rows()];
            matvec(&ThreadPool::new(t), &m, &case.x, &mut y, &mut scratch);
            assert_eq!(y, want, "threads={t}");
        }
        // A matrix is bound with the selected kernels.
        let mut y = vec![f32::NAN; m.rows()];
        let selected = on(crate::selected().isa(), &m);
        matvec(
            &ThreadPool::new(2),
            &selected,
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
        let mut scratch = MatmulScratch::new();
        let mut y = vec![0.0; 5];
        matvec(&pool, &m, &case.x, &mut y, &mut scratch);
        let (cap, ptr) = (scratch.capacity(), scratch.xq.as_ptr());
        assert!(cap >= m.prepared_bytes());
        for _ in 0..3 {
            matvec(&pool, &m, &case.x, &mut y, &mut scratch);
        }
        assert_eq!((scratch.capacity(), scratch.xq.as_ptr()), (cap, ptr));
    }

    #[test]
    fn empty_shapes() {
        let pool = ThreadPool::new(2);
        let mut scratch = MatmulScratch::new();
        let m = QMatrix::new(GgmlType::F32, 0, 16, &[]).unwrap();
        matvec(&pool, &m, &[1.0; 16], &mut [], &mut scratch);
        let m = QMatrix::new(GgmlType::F32, 3, 0, &[]).unwrap();
        let mut y = [f32::NAN; 3];
        matvec(&pool, &m, &[], &mut y, &mut scratch);
        assert_eq!(y, [0.0; 3]);
    }
}
