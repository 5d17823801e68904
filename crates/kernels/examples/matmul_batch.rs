//! Time of one batched product `Y = X Wᵀ` per batch size, against the same
//! matrix: how much a token costs when `n` share a pass over the weights.
//! `cargo run --release -p cachefit-kernels --example matmul_batch [THREADS] [tiles]`
//! (`tiles`: the matrices repacked into row tiles first.)
use gguf::GgmlType;
use kernels::matmul::{matmul, MatmulScratch};
use kernels::matrix::QMatrix;
use kernels::pool::ThreadPool;
use kernels::traits::traits;
use std::hint::black_box;
use std::time::{Duration, Instant};

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .map_or(1, |t| t.parse().expect("threads"));
    let pool = ThreadPool::new(threads);
    let tiled = std::env::args().nth(2).as_deref() == Some("tiles");
    println!("| type | shape | n | µs per call | µs per token | vs n = 1 |");
    println!("|---|---|---:|---:|---:|---:|");
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        for (rows, cols) in [(1536, 576), (576, 1536), (49152, 576)] {
            let tr = traits(ty).unwrap();
            let rb = tr.row_bytes(cols);
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut buf = vec![0u64; (rows * rb).div_ceil(8)];
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
            for (r, row) in bytes[..rows * rb].chunks_exact_mut(rb).enumerate() {
                (tr.from_float)(&w[r * cols..(r + 1) * cols], row);
            }
            let bytes: &[u8] = bytemuck::cast_slice(&buf);
            let m = QMatrix::new(ty, rows, cols, &bytes[..rows * rb]).unwrap();
            let mut tiles = vec![0u64; m.tiles_bytes().unwrap_or(0).div_ceil(8)];
            let m = if tiled {
                let t: &mut [u8] = bytemuck::cast_slice_mut(&mut tiles);
                let t = &mut t[..m.tiles_bytes().unwrap()];
                m.pack_tiles(t).unwrap();
                m.with_tiles(t).unwrap()
            } else {
                m
            };
            let mut base = 0.0;
            for n in [1, 2, 4, 8, 16] {
                let xs: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 31) % 97) as f32 / 48.0 - 1.0)
                    .collect();
                let mut ys = vec![0.0; n * rows];
                let mut scratch = MatmulScratch::new();
                let mut best = f64::MAX;
                let end = Instant::now() + Duration::from_millis(300);
                while Instant::now() < end {
                    let t0 = Instant::now();
                    matmul(&pool, &m, black_box(&xs), &mut ys, &mut scratch);
                    best = best.min(t0.elapsed().as_secs_f64() * 1e6);
                }
                if n == 1 {
                    base = best;
                }
                println!(
                    "| {ty} | {rows}×{cols} | {n} | {best:.1} | {:.1} | {:.2}× |",
                    best / n as f64,
                    best / base
                );
            }
        }
    }
}
