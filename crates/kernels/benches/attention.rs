//! One token's attention over an f16 cache (`kernels::vecops::attend_f16`,
//! the selected instruction set), one thread, at the shapes of the models
//! we measure: a query group of H heads over one key/value head of `hd`
//! dimensions and `n` positions. Throughput in GB/s of keys and values
//! read (2 · hd · n · 2 bytes per call).
//!
//! `smollm2-prompt` is a prompt's call: 8 consecutive tokens' groups
//! (24 heads) sharing each key and value load.
//!
//! - `hot/…`: the same cache every call (it stays in L2: what attention
//!   costs when the data are near);
//! - `cold/…`: a different cache each call, cycling through 96 MiB of them
//!   (what a decode step at depth sees: every layer's cache from DRAM).
//!
//! ```text
//! cargo bench -p cachefit-kernels --bench attention
//! cargo bench -p cachefit-kernels --bench attention -- 'cold/'
//! ```

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use half::f16;
use kernels::vecops::{self, Attention};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

/// (name, query heads per kv head, head dim).
const GROUPS: [(&str, usize, usize); 5] = [
    ("smollm2", 3, 64),
    // A prompt's batch: 8 tokens' groups in one call.
    ("smollm2-prompt", 24, 64),
    ("qwen2.5-0.5b", 7, 64),
    ("cachefit", 8, 32),
    ("cachefit-int8", 8, 18),
];
const POSITIONS: [usize; 3] = [128, 1024, 4096];
const COLD_BYTES: usize = 96 << 20;

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

fn cache(rng: &mut StdRng, len: usize) -> Vec<f16> {
    (0..len)
        .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(1);
    let mut g = c.benchmark_group("attention");
    for (name, heads, hd) in GROUPS {
        for n in POSITIONS {
            let kv_len = hd * n;
            let q: Vec<f32> = (0..heads * hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let mut scores = vec![0.0f32; heads * vecops::scores_len(n)];
            let mut out = vec![0.0f32; heads * hd];
            let mut st = vec![0.0f32; 2 * heads];
            let copies = (COLD_BYTES / (2 * kv_len * 2)).max(2);
            // One allocation, as a model's cache is: keys and values of
            // each copy side by side.
            let all = cache(&mut rng, copies * 2 * kv_len);
            let caches: Vec<(&[f16], &[f16])> = all
                .chunks_exact(2 * kv_len)
                .map(|c| c.split_at(kv_len))
                .collect();
            fn attention<'a>(
                q: &'a [f32],
                &(k, v): &(&'a [f16], &'a [f16]),
                hd: usize,
                n: usize,
            ) -> Attention<'a, f16> {
                Attention {
                    q,
                    head_dim: hd,
                    keys: k,
                    values: v,
                    stride: n,
                    first: 0,
                    n_pos: n,
                    head_pos: &[],
                    scale: 1.0 / (hd as f32).sqrt(),
                    softcap: 0.0,
                }
            }
            g.throughput(Throughput::Bytes((2 * kv_len * 2) as u64));
            let id = format!("{name}/h{heads}xd{hd}");
            g.bench_function(BenchmarkId::new(format!("hot/{id}"), n), |b| {
                b.iter(|| {
                    vecops::attend_f16(
                        &attention(&q, &caches[0], hd, n),
                        &mut scores,
                        &mut out,
                        &mut st,
                    )
                });
                black_box(&out);
            });
            let mut next = 0;
            g.bench_function(BenchmarkId::new(format!("cold/{id}"), n), |b| {
                b.iter(|| {
                    next = (next + 1) % caches.len();
                    vecops::attend_f16(
                        &attention(&q, &caches[next], hd, n),
                        &mut scores,
                        &mut out,
                        &mut st,
                    )
                });
                black_box(&out);
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
