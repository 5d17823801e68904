//! Matvec throughput per computable type at SmolLM2-135M's shapes, with 1
//! and 2 threads, in GB/s of weight bytes streamed; next to each shape, the
//! read bandwidth of a buffer of the same size (`read/…`), and the cost of
//! an empty pool run (`pool/…`). Types with row tiles run a second time
//! repacked (`Q4_1_tiles/…`), as the models' decode runs them, and at the
//! layer shapes a third time with 64 activations, as a prompt runs them
//! (`Q4_1_tiles_x64/…`, in multiply-adds per second).
//!
//! ```text
//! cargo bench -p cachefit-kernels --bench matvec                 # everything
//! cargo bench -p cachefit-kernels --bench matvec -- 'Q4_0/'      # one type
//! cargo bench -p cachefit-kernels --bench matvec -- '576x576/'   # one shape
//! ```
//!
//! For a markdown table instead: `cargo run --release -p cachefit-kernels
//! --example matvec_table`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kernels::bandwidth::{read_buffer, read_pass};
use kernels::matmul::{matmul, matvec, MatmulScratch};
use kernels::matrix::QMatrix;
use kernels::pool::ThreadPool;
use kernels::traits::{computable_types, traits};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

/// (rows, cols): attention projections, gate/up, down, output head.
const SHAPES: [(usize, usize); 4] = [(576, 576), (1536, 576), (576, 1536), (49152, 576)];
const THREADS: [usize; 2] = [1, 2];
/// Activations of a prompt's pass (`…_tiles_x64`).
const BATCH: usize = 64;

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

fn bench_matvec(c: &mut Criterion) {
    let pools: Vec<ThreadPool> = THREADS.iter().map(|&t| ThreadPool::new(t)).collect();
    let mut rng = StdRng::seed_from_u64(7);
    let mut scratch = MatmulScratch::new();

    let mut g = c.benchmark_group("pool");
    for pool in &pools {
        g.bench_function(BenchmarkId::new("empty_run", pool.n_threads()), |b| {
            b.iter(|| {
                pool.run(|ctx| {
                    let _ = black_box(ctx.thread_index);
                })
            })
        });
    }
    g.finish();

    for (rows, cols) in SHAPES {
        let mut g = c.benchmark_group(format!("{rows}x{cols}"));
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut y = vec![0.0f32; rows];
        let mut read_sizes = std::collections::HashSet::new();
        for ty in computable_types() {
            let tr = traits(ty).unwrap();
            // K-quants cannot hold 576-element rows; skip what does not fit.
            if QMatrix::new(ty, 0, cols, &[]).is_err() {
                continue;
            }
            let n = rows * tr.row_bytes(cols);
            let mut buf = vec![0u64; n.div_ceil(8)];
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
            for (r, row) in bytes[..n].chunks_exact_mut(tr.row_bytes(cols)).enumerate() {
                (tr.from_float)(&w[r * cols..(r + 1) * cols], row);
            }
            let m = QMatrix::new(ty, rows, cols, &bytemuck::cast_slice(&buf)[..n]).unwrap();
            g.throughput(Throughput::Bytes(n as u64));
            for pool in &pools {
                g.bench_function(BenchmarkId::new(ty.name(), pool.n_threads()), |b| {
                    b.iter(|| matvec(pool, &m, black_box(&x), &mut y, &mut scratch))
                });
            }
            // The same number of bytes, just read (once per distinct size).
            // As the models run it: repacked into row tiles (decode's
            // one-activation tile pass), where the type has them.
            if let Some(tb) = m.tiles_bytes() {
                let mut tbuf = vec![0u64; tb.div_ceil(8)];
                let tiles: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut tbuf)[..tb];
                m.pack_tiles(tiles).unwrap();
                let tm = m.with_tiles(&bytemuck::cast_slice(&tbuf)[..tb]).unwrap();
                for pool in &pools {
                    g.bench_function(
                        BenchmarkId::new(format!("{}_tiles", ty.name()), pool.n_threads()),
                        |b| b.iter(|| matvec(pool, &tm, black_box(&x), &mut y, &mut scratch)),
                    );
                }
                // A prompt's pass: BATCH activations through the tiles,
                // throughput in multiply-adds (the layer shapes only).
                if rows <= 1536 {
                    g.throughput(Throughput::Elements((rows * cols * BATCH) as u64));
                    let xs: Vec<f32> = (0..cols * BATCH)
                        .map(|_| rng.gen_range(-1.0f32..1.0))
                        .collect();
                    let mut ys = vec![0.0f32; rows * BATCH];
                    for pool in &pools {
                        g.bench_function(
                            BenchmarkId::new(
                                format!("{}_tiles_x{BATCH}", ty.name()),
                                pool.n_threads(),
                            ),
                            |b| b.iter(|| matmul(pool, &tm, black_box(&xs), &mut ys, &mut scratch)),
                        );
                    }
                    g.throughput(Throughput::Bytes(n as u64));
                }
            }
            if !read_sizes.insert(n) {
                continue;
            }
            let rb = read_buffer(n);
            for pool in &pools {
                g.bench_function(
                    BenchmarkId::new(format!("read_{n}B"), pool.n_threads()),
                    |b| b.iter(|| read_pass(pool, &rb)),
                );
            }
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_matvec
}
criterion_main!(benches);
