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
use crate::traits::{MultiDot, VecDotFn};
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

/// Bytes of one quantized activation row: in the type's multi-dot layout
/// where it has one, else its `vec_dot_type`.
fn act_bytes(m: &QMatrix<'_>) -> usize {
    match m.traits().multi {
        Some(k) => (k.prepared_bytes)(m.cols()),
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
    prepare_multi(m, multi, xs, scratch);
    run_multi(pool, isa, m, multi, n, ys, scratch);
}

/// Quantize the `n` rows of `xs` into `scratch.xq` in `multi`'s layout.
fn prepare_multi(m: &QMatrix<'_>, multi: &MultiDot, xs: &[f32], scratch: &mut MatmulScratch) {
    let cols = m.cols();
    let n = xs.len() / cols;
    let (stride, qbytes) = (act_stride(m), act_bytes(m));
    let xq: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut scratch.xq)[..n * stride];
    for (x, q) in xs.chunks_exact(cols).zip(xq.chunks_exact_mut(stride)) {
        (multi.prepare)(x, &mut q[..qbytes]);
    }
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
        let k0 = m0.traits().multi?;
        ms.iter()
            .all(|m| {
                m.cols() == m0.cols()
                    && m.traits().multi.is_some_and(|k| {
                        std::ptr::fn_addr_eq(k.prepare, k0.prepare)
                            && std::ptr::fn_addr_eq(k.prepared_bytes, k0.prepared_bytes)
                    })
            })
            .then_some(k0)
    });
    let Some(k0) = shared else {
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
    prepare_multi(ms[0], k0, xs, scratch);
    for (m, y) in ms.iter().zip(ys.iter_mut()) {
        let multi = m.traits().multi.expect("checked above");
        run_multi(pool, isa, m, multi, n, y, scratch);
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

    /// Matrices sharing an input give what separate calls give, whether
    /// or not their types share an activation layout.
    #[test]
    fn each_equals_separate_calls() {
        let pool = ThreadPool::new(2);
        for types in [
            [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0],
            [GgmlType::Q4_1, GgmlType::Q6_K, GgmlType::F32],
        ] {
            let cols = 256 * 2;
            let shapes = [7, 3, 12];
            let data: Vec<Vec<Line>> = (0..3)
                .map(|i| matrix_bytes(types[i], shapes[i], cols, i as u64))
                .collect();
            let ms: Vec<QMatrix<'_>> = (0..3)
                .map(|i| view(types[i], shapes[i], cols, &data[i]))
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
