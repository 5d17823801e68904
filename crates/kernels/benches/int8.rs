//! One token's int8 matrices of the built-in `cachefit` model (6 blocks
//! "CCACCA" at dim 144, FFN 396, and the 4096-row output head: 1.85 MiB,
//! more than one core's L2), each against one activation pair, in the
//! order a token reads them, one thread, every kernel set side by side;
//! throughput in GB/s of int8 weight bytes.
//!
//! - `token/SET`: the set's pairs kernel (`Int8Kernels::rows_pairs`), one
//!   pair per matrix, as decode runs it;
//! - `token_two_pairs/SET`: two pairs per matrix (the multi kernel's path,
//!   as a short prompt runs it), per token.
//!
//! ```text
//! cargo bench -p cachefit-kernels --bench int8
//! ```

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use kernels::int8::{matvec_pairs_with, quantize_pair, I8Matrix, I8Vector};
use kernels::isa::Isa;
use kernels::pool::ThreadPool;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30)
}

/// (rows, cols) of every int8 matrix a token reads, in order.
fn shapes() -> Vec<(usize, usize)> {
    let conv = [(144, 144), (144, 144), (396, 144), (396, 144), (144, 396)];
    let attn = [(216, 144), (144, 144), (396, 144), (396, 144), (144, 396)];
    let mut v = Vec::new();
    for block in "CCACCA".chars() {
        v.extend_from_slice(if block == 'C' { &conv } else { &attn });
    }
    v.push((4096, 144));
    v
}

/// `k` activation pairs of `cols` elements.
fn pairs(rng: &mut StdRng, cols: usize, k: usize) -> Vec<I8Vector> {
    let mut rest = vec![0.0; cols];
    let mut out = Vec::new();
    for _ in 0..k {
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let (mut hi, mut lo) = (I8Vector::new(), I8Vector::new());
        quantize_pair(&x, &mut hi, &mut lo, &mut rest);
        out.push(hi);
        out.push(lo);
    }
    out
}

fn bench_token(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(7);
    let data: Vec<(usize, usize, Vec<i8>, Vec<f32>)> = shapes()
        .into_iter()
        .map(|(r, cols)| {
            let q = (0..r * cols).map(|_| rng.gen_range(-127..=127)).collect();
            let s = (0..r).map(|_| rng.gen_range(0.001..0.01)).collect();
            (r, cols, q, s)
        })
        .collect();
    let ms: Vec<I8Matrix> = data
        .iter()
        .map(|(r, cols, q, s)| I8Matrix::new(*r, *cols, q, s).unwrap())
        .collect();
    let bytes: usize = data.iter().map(|(r, cols, ..)| r * cols).sum();
    let acts: Vec<(usize, Vec<I8Vector>)> = [144, 396]
        .into_iter()
        .map(|cols| (cols, pairs(&mut rng, cols, 2)))
        .collect();
    // Per matrix, its activations as the kernel takes them.
    let xs: Vec<Vec<&I8Vector>> = ms
        .iter()
        .map(|m| {
            acts.iter()
                .find(|a| a.0 == m.cols())
                .unwrap()
                .1
                .iter()
                .collect()
        })
        .collect();
    let pool = ThreadPool::new(1);
    let mut y = vec![0.0f32; 2 * 4096];
    let mut g = c.benchmark_group("int8");
    g.throughput(Throughput::Bytes(bytes as u64));
    for isa in [Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Scalar] {
        let Some(table) = kernels::table(isa) else {
            continue;
        };
        let kernel = table.int8.rows_pairs;
        for (name, k) in [("token", 1), ("token_two_pairs", 2)] {
            g.bench_function(BenchmarkId::new(name, isa.name()), |b| {
                b.iter(|| {
                    for (m, xs) in ms.iter().zip(&xs) {
                        let y = &mut y[..k * m.rows()];
                        matvec_pairs_with(&pool, kernel, m, &xs[..2 * k], y);
                    }
                    black_box(&y);
                })
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_token
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
