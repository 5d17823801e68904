//! Ternary (TQ2_0) matrix × one activation at the cachefit ternary model's
//! shapes, one thread, every kernel side by side; throughput in GB/s of
//! TQ2_0 weight bytes (66 per 256 weights), whatever the kernel reads.
//!
//! - `tq2_0_matvec`: the generic path the runtime uses today
//!   (`kernels::matmul::matvec` on a TQ2_0 `QMatrix`), Q8_K quantization of
//!   the activation included;
//! - `q8k_quantize`: that quantization alone; `q8k_quantize_simd`: the
//!   same bytes from `kernels::ternary::quantize_activation`;
//! - `tq2_0_rowdots`: the selected set's TQ2_0 × Q8_K dot, row by row, on a
//!   quantized activation;
//! - `interleaved/SET`, `lut/SET`: [`kernels::ternary::TernaryMatrix`] on a
//!   quantized activation (LUT: table building included);
//! - `two_pass/interleaved/SET`, `pair/interleaved/SET`: the runtime's
//!   activation pair (`hi = Q8_K(x)`, `lo = Q8_K(x − hi)`) as two
//!   `matvec`s added, and as one `matvec_pair` (the same bits).
//!
//! ```text
//! cargo bench -p cachefit-kernels --bench ternary
//! cargo bench -p cachefit-kernels --bench ternary -- '256x768/'
//! ```

use bytemuck::Zeroable;
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use kernels::isa::Isa;
use kernels::matmul::{matvec, MatmulScratch};
use kernels::matrix::QMatrix;
use kernels::pool::ThreadPool;
use kernels::quant::q8_k::{self, BlockQ8K};
use kernels::quant::tq2_0::{self, BlockTQ2_0};
use kernels::ternary::{TernaryKernel, TernaryMatrix};
use kernels::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

/// (rows, cols): attention projections, their wider variant, up, down.
const SHAPES: [(usize, usize); 4] = [(256, 256), (320, 256), (768, 256), (256, 768)];

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30)
}

/// Row-major TQ2_0 weights of a ternary-trained look (about a third zeros).
fn ternary_weights(rng: &mut StdRng, rows: usize, cols: usize) -> Vec<BlockTQ2_0> {
    let w: Vec<f32> = (0..rows * cols)
        .map(|_| [-1.0f32, 0.0, 1.0][rng.gen_range(0..3)] * 0.02)
        .collect();
    let mut q = vec![BlockTQ2_0::zeroed(); rows * cols / 256];
    tq2_0::quantize_row(&w, &mut q);
    q
}

/// One shape's data: the weights as TQ2_0 and in every kernel's layout, an
/// activation as f32 and as Q8_K.
struct Shape {
    rows: usize,
    cols: usize,
    w: Vec<BlockTQ2_0>,
    /// The TQ2_0 bytes at a 64-byte aligned offset (`QMatrix` wants it).
    aligned: Vec<u64>,
    off: usize,
    x: Vec<f32>,
    xq: Vec<BlockQ8K>,
    /// The residual of `xq`, quantized: the pair's `lo`.
    xq_lo: Vec<BlockQ8K>,
    ternary: Vec<(String, TernaryMatrix)>,
}

impl Shape {
    fn new(rng: &mut StdRng, rows: usize, cols: usize) -> Shape {
        let w = ternary_weights(rng, rows, cols);
        let bytes: &[u8] = bytemuck::cast_slice(&w);
        let mut aligned = vec![0u64; bytes.len().div_ceil(8) + 8];
        let off = aligned.as_ptr().align_offset(64) * 8;
        let buf: &mut [u8] = bytemuck::cast_slice_mut(&mut aligned);
        buf[off..off + bytes.len()].copy_from_slice(bytes);
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut xq = vec![BlockQ8K::zeroed(); cols / 256];
        q8_k::quantize_row(&x, &mut xq);
        let mut hi = vec![0.0f32; cols];
        q8_k::dequantize_row(&xq, &mut hi);
        let residual: Vec<f32> = x.iter().zip(&hi).map(|(a, b)| a - b).collect();
        let mut xq_lo = vec![BlockQ8K::zeroed(); cols / 256];
        q8_k::quantize_row(&residual, &mut xq_lo);
        let mut ternary = Vec::new();
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Scalar] {
            let Some(table) = kernels::table(isa) else {
                continue;
            };
            for kernel in TernaryKernel::ALL {
                let t = TernaryMatrix::with_kernel(rows, cols, &w, kernel, table).unwrap();
                ternary.push((format!("{}/{}", kernel.name(), isa.name()), t));
            }
        }
        Shape {
            rows,
            cols,
            w,
            aligned,
            off,
            x,
            xq,
            xq_lo,
            ternary,
        }
    }

    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.w)
    }

    fn qmatrix(&self) -> QMatrix<'_> {
        let n = self.bytes().len();
        let buf: &[u8] = bytemuck::cast_slice(&self.aligned);
        QMatrix::new(
            GgmlType::TQ2_0,
            self.rows,
            self.cols,
            &buf[self.off..self.off + n],
        )
        .unwrap()
    }

    /// Every variant as (name, one product).
    fn variants<'a>(&'a self, pool: &'a ThreadPool) -> Vec<(String, Box<dyn FnMut() + 'a>)> {
        let mut v: Vec<(String, Box<dyn FnMut() + 'a>)> = Vec::new();
        let m = self.qmatrix();
        let (mut y, mut scratch) = (vec![0.0f32; self.rows], MatmulScratch::new());
        v.push((
            "tq2_0_matvec".into(),
            Box::new(move || matvec(pool, &m, black_box(&self.x), &mut y, &mut scratch)),
        ));
        let mut xq = self.xq.clone();
        v.push((
            "q8k_quantize".into(),
            Box::new(move || q8_k::quantize_row(black_box(&self.x), &mut xq)),
        ));
        let mut xq = self.xq.clone();
        v.push((
            "q8k_quantize_simd".into(),
            Box::new(move || kernels::ternary::quantize_activation(black_box(&self.x), &mut xq)),
        ));
        let dot = kernels::selected().vec_dot(GgmlType::TQ2_0).unwrap();
        let row_bytes = self.bytes().len() / self.rows;
        let mut y = vec![0.0f32; self.rows];
        v.push((
            "tq2_0_rowdots".into(),
            Box::new(move || {
                let xq: &[u8] = bytemuck::cast_slice(&self.xq);
                for (yr, row) in y.iter_mut().zip(self.bytes().chunks_exact(row_bytes)) {
                    *yr = dot(row, black_box(xq));
                }
            }),
        ));
        for (name, t) in &self.ternary {
            let mut y = vec![0.0f32; self.rows];
            v.push((
                name.clone(),
                Box::new(move || t.matvec(pool, black_box(&self.xq), &mut y)),
            ));
        }
        for (name, t) in &self.ternary {
            if t.kernel() != TernaryKernel::Interleaved {
                continue;
            }
            let (mut y, mut y_lo) = (vec![0.0f32; self.rows], vec![0.0f32; self.rows]);
            v.push((
                format!("two_pass/{name}"),
                Box::new(move || {
                    t.matvec(pool, black_box(&self.xq), &mut y);
                    t.matvec(pool, black_box(&self.xq_lo), &mut y_lo);
                    for (a, b) in y.iter_mut().zip(&y_lo) {
                        *a += b;
                    }
                }),
            ));
            let mut y = vec![0.0f32; self.rows];
            v.push((
                format!("pair/{name}"),
                Box::new(move || {
                    t.matvec_pair(pool, black_box(&self.xq), black_box(&self.xq_lo), &mut y)
                }),
            ));
        }
        v
    }
}

fn shapes() -> Vec<Shape> {
    let mut rng = StdRng::seed_from_u64(24);
    SHAPES
        .iter()
        .map(|&(rows, cols)| Shape::new(&mut rng, rows, cols))
        .collect()
}

fn bench_ternary(c: &mut Criterion) {
    let pool = ThreadPool::new(1);
    for shape in shapes() {
        let mut g = c.benchmark_group(format!("{}x{}", shape.rows, shape.cols));
        g.throughput(Throughput::Bytes(shape.bytes().len() as u64));
        for (name, mut f) in shape.variants(&pool) {
            g.bench_function(BenchmarkId::from_parameter(name), |b| b.iter(&mut f));
        }
        g.finish();
    }
}

/// `--min-table [ROUNDS]`: a markdown table of each variant's fastest
/// time per product over ROUNDS rounds (default 30) of 200 products, the
/// variants taking turns so a busy machine slows them alike; the minimum
/// is what the kernel costs when it gets the core.
fn min_table(rounds: usize) {
    let pool = ThreadPool::new(1);
    println!("| shape | variant | min ns | GB/s (TQ2_0 bytes) | × tq2_0_matvec |");
    println!("|---|---|---:|---:|---:|");
    for shape in shapes() {
        let mut variants = shape.variants(&pool);
        let mut best = vec![f64::INFINITY; variants.len()];
        for _ in 0..rounds {
            for ((_, f), best) in variants.iter_mut().zip(&mut best) {
                let t = std::time::Instant::now();
                for _ in 0..200 {
                    f();
                }
                *best = best.min(t.elapsed().as_nanos() as f64 / 200.0);
            }
        }
        for ((name, _), ns) in variants.iter().zip(&best) {
            println!(
                "| {}x{} | {name} | {ns:.0} | {:.1} | {:.2} |",
                shape.rows,
                shape.cols,
                shape.bytes().len() as f64 / ns,
                best[0] / ns
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_ternary
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--min-table") {
        let rounds = args.get(i + 1).and_then(|r| r.parse().ok()).unwrap_or(30);
        min_table(rounds);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
