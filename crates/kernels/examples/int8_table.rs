//! Int8 row kernels per instruction set at the `cachefit` model's shapes,
//! as one markdown table: time per matvec (activation already quantized),
//! GMAC/s and GB/s of weights, plus the activation quantizer's time.
//!
//! ```text
//! cargo run --release -p cachefit-kernels --example int8_table -- \
//!     [--shapes 144x144,396x144] [--threads 1,2] [--min-time 0.3]
//! ```
//!
//! Defaults: rows×cols 144×144 (conv gate/out, attention output), 396×144
//! (ffn gate/up), 144×396 (ffn down), 180×144 (qkv), 4096×144 (tied
//! embedding as the output head); 1 thread per kernel set, then the
//! selected set through `int8::matvec` on each thread count.

use kernels::bandwidth::time_passes;
use kernels::int8::{matvec, I8Matrix, I8Vector};
use kernels::pool::ThreadPool;
use kernels::Isa;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

const SHAPES: [(usize, usize); 5] = [(144, 144), (396, 144), (144, 396), (180, 144), (4096, 144)];

struct Args {
    shapes: Vec<(usize, usize)>,
    threads: Vec<usize>,
    min_time: Duration,
}

fn list<T>(s: &str, parse: impl Fn(&str) -> Option<T>) -> Vec<T> {
    s.split(',')
        .map(|v| parse(v.trim()).unwrap_or_else(|| panic!("cannot parse {v:?}")))
        .collect()
}

fn parse_args() -> Args {
    let mut a = Args {
        shapes: SHAPES.to_vec(),
        threads: vec![1, 2],
        min_time: Duration::from_millis(300),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let val = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
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
            _ => panic!("unknown flag {flag}"),
        }
    }
    a
}

fn main() {
    let args = parse_args();
    let mut rng = StdRng::seed_from_u64(42);
    println!(
        "selected kernels: {}, best of passes of at least {:?}\n",
        kernels::selected().isa().name(),
        args.min_time
    );
    println!("| shape (rows×cols) | kernels | threads | ns/matvec | GMAC/s | GB/s | quantize ns |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for &(rows, cols) in &args.shapes {
        let w: Vec<i8> = (0..rows * cols)
            .map(|_| rng.gen_range(-127..=127))
            .collect();
        let s: Vec<f32> = (0..rows).map(|_| rng.gen_range(1e-3f32..1e-2)).collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let m = I8Matrix::new(rows, cols, &w, &s).expect("valid matrix");
        let mut y = vec![0.0f32; rows];
        let mut xv = I8Vector::new();
        let macs = rows * cols;
        // Enough calls per pass that a pass takes ~1 ms or more.
        let calls = (8usize << 20).div_ceil(macs).max(1);
        let row = |isa: &str, t: usize, secs_per_call: f64, q_ns: Option<f64>| {
            println!(
                "| {rows}×{cols} | {isa} | {t} | {:.0} | {:.1} | {:.1} | {} |",
                secs_per_call * 1e9,
                macs as f64 / secs_per_call / 1e9,
                m.bytes() as f64 / secs_per_call / 1e9,
                q_ns.map_or("".into(), |q| format!("{q:.0}"))
            );
        };
        for isa in Isa::supported() {
            let k = kernels::table(isa).expect("a supported set").int8;
            xv.quantize_with(k.quantize, &x);
            let kernel = k.rows;
            let t = time_passes(calls, args.min_time, || {
                for _ in 0..calls {
                    kernel(&m, black_box(&xv), 0, &mut y);
                }
                black_box(&mut y);
            });
            let mut q = vec![0i8; cols];
            let qcalls = calls * 4;
            let qt = time_passes(qcalls, args.min_time / 4, || {
                for _ in 0..qcalls {
                    black_box((k.quantize)(black_box(&x), &mut q));
                }
            });
            // `time_passes` reports "bytes" per second: here, calls.
            row(
                isa.name(),
                1,
                1.0 / (t.best_gbps * 1e9),
                Some(1e9 / (qt.best_gbps * 1e9)),
            );
        }
        xv.quantize(&x);
        for &n in &args.threads {
            let pool = ThreadPool::new(n);
            let t = time_passes(calls, args.min_time, || {
                for _ in 0..calls {
                    matvec(&pool, &m, black_box(&xv), &mut y);
                }
                black_box(&mut y);
            });
            row("matvec", n, 1.0 / (t.best_gbps * 1e9), None);
        }
    }
}
