//! Prints one markdown table of matvec throughput per type, shape and thread
//! count, next to the read bandwidth of a buffer of the same size.
//!
//! ```text
//! cargo run --release -p cachefit-kernels --example matvec_table -- \
//!     [--types q4_0,q8_0] [--shapes 576x576,1536x576] [--threads 1,2] [--min-time 0.5] \
//!     [--kernels scalar|avx2|avx512|neon]
//! ```
//!
//! Defaults: every computable type, SmolLM2-135M's shapes (rows×cols:
//! attention 576×576, gate/up 1536×576, down 576×1536, output head
//! 49152×576), 1 and 2 threads, 0.3 s per measurement, the best kernel set
//! the CPU supports. Both columns are the best pass (see
//! `kernels::bandwidth`). Matrices are timed row-wise (no row tiles).

use kernels::bandwidth::{measure_read, time_passes};
use kernels::matmul::{matvec, MatmulScratch};
use kernels::matrix::{MatrixError, QMatrix};
use kernels::pool::ThreadPool;
use kernels::traits::{computable_types, traits};
use kernels::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::time::Duration;

const SMOLLM2_135M: [(usize, usize); 4] = [(576, 576), (1536, 576), (576, 1536), (49152, 576)];

struct Args {
    types: Vec<GgmlType>,
    shapes: Vec<(usize, usize)>,
    threads: Vec<usize>,
    min_time: Duration,
    kernels: kernels::Isa,
}

fn list<T>(s: &str, parse: impl Fn(&str) -> Option<T>) -> Vec<T> {
    s.split(',')
        .map(|v| parse(v.trim()).unwrap_or_else(|| panic!("cannot parse {v:?}")))
        .collect()
}

fn parse_args() -> Args {
    let mut a = Args {
        types: computable_types(),
        shapes: SMOLLM2_135M.to_vec(),
        threads: vec![1, 2],
        min_time: Duration::from_millis(300),
        kernels: kernels::Isa::detect(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let val = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--types" => a.types = list(&val, |v| GgmlType::from_name(&v.to_uppercase())),
            "--shapes" => {
                a.shapes = list(&val, |v| {
                    let (r, c) = v.split_once('x')?;
                    Some((r.parse().ok()?, c.parse().ok()?))
                })
            }
            "--threads" => a.threads = list(&val, |v| v.parse().ok()),
            "--min-time" => {
                a.min_time = Duration::from_secs_f64(val.parse().expect("--min-time seconds"))
            }
            "--kernels" => {
                a.kernels = kernels::isa::resolve(Some(&val)).unwrap_or_else(|e| panic!("{e}"))
            }
            _ => panic!("unknown flag {flag}"),
        }
    }
    a
}

/// `rows×cols` weights quantized to `ty`, in a buffer aligned for the block
/// casts.
fn quantized(ty: GgmlType, rows: usize, cols: usize, w: &[f32]) -> Result<Vec<u64>, MatrixError> {
    let tr = traits(ty).ok_or(MatrixError::Unsupported { ty })?;
    // Validate the shape first (ragged rows are an error, not a panic).
    QMatrix::new(ty, 0, cols, &[])?;
    let rb = tr.row_bytes(cols);
    let mut buf = vec![0u64; (rows * rb).div_ceil(8)];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
    for (r, row) in bytes[..rows * rb].chunks_exact_mut(rb).enumerate() {
        (tr.from_float)(&w[r * cols..(r + 1) * cols], row);
    }
    Ok(buf)
}

fn main() {
    let args = parse_args();
    let isa = kernels::configure(kernels::Config {
        isa: args.kernels,
        tiles: false,
    })
    .expect("nothing chose kernels before")
    .isa();
    let pools: HashMap<usize, ThreadPool> = args
        .threads
        .iter()
        .map(|&t| (t, ThreadPool::new(t)))
        .collect();
    let mut rng = StdRng::seed_from_u64(42);
    let mut scratch = MatmulScratch::new();
    let mut skipped = Vec::new();

    println!(
        "kernels: {}, best of passes of at least {:?}\n",
        isa.name(),
        args.min_time
    );
    println!("| type | shape (rows×cols) | MiB | threads | µs | GB/s | read GB/s | % of read |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for &(rows, cols) in &args.shapes {
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| (0..4).map(|_| rng.gen_range(-1.0f32..1.0)).sum::<f32>() * 0.5)
            .collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut y = vec![0.0f32; rows];
        for &ty in &args.types {
            let buf = match quantized(ty, rows, cols, &w) {
                Ok(b) => b,
                Err(e) => {
                    skipped.push(format!("{ty} {rows}×{cols}: {e}"));
                    continue;
                }
            };
            let n = rows * traits(ty).unwrap().row_bytes(cols);
            let m = QMatrix::new(ty, rows, cols, &bytemuck::cast_slice(&buf)[..n])
                .expect("validated above");
            for &t in &args.threads {
                let pool = &pools[&t];
                // Enough calls per pass that a pass takes ~1 ms or more.
                let calls = (4usize << 20).div_ceil(n).max(1);
                let mv = time_passes(n * calls, args.min_time, || {
                    for _ in 0..calls {
                        matvec(pool, &m, &x, &mut y, &mut scratch);
                    }
                    std::hint::black_box(&mut y);
                });
                let rd = measure_read(pool, n, args.min_time);
                let us = n as f64 / (mv.best_gbps * 1e9) * 1e6;
                println!(
                    "| {ty} | {rows}×{cols} | {:.2} | {t} | {us:.1} | {:.1} | {:.1} | {:.0}% |",
                    n as f64 / (1 << 20) as f64,
                    mv.best_gbps,
                    rd.best_gbps,
                    100.0 * mv.best_gbps / rd.best_gbps
                );
            }
        }
    }
    if !skipped.is_empty() {
        println!("\nNot run:");
        for s in skipped {
            println!("- {s}");
        }
    }
}
