//! Time per token of the sampling chain on a Qwen2-sized vocabulary:
//! `cargo run --release -p cachefit-engine --example sample_bench`.
//! Reports the minimum and mean of 200 calls (the machine may be shared).

use engine::{Sampler, SamplerConfig};

fn main() {
    let vocab = 151_936;
    let mut x: u64 = 5;
    let logits: Vec<f32> = (0..vocab)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 24.0 - 12.0
        })
        .collect();
    for (name, cfg) in [
        ("greedy", SamplerConfig::greedy()),
        (
            "default",
            SamplerConfig {
                seed: Some(1),
                ..SamplerConfig::default()
            },
        ),
        (
            "top_k=0,top_p=.95",
            SamplerConfig {
                seed: Some(1),
                top_k: 0,
                ..SamplerConfig::default()
            },
        ),
        (
            "top_k=0 top_p=1 min_p=0.05",
            SamplerConfig {
                seed: Some(1),
                top_k: 0,
                top_p: 1.0,
                ..SamplerConfig::default()
            },
        ),
    ] {
        let mut s = Sampler::new(cfg);
        let mut buf = logits.clone();
        let n = 200;
        let mut best = std::time::Duration::MAX;
        let mut total = std::time::Duration::ZERO;
        for _ in 0..n {
            buf.copy_from_slice(&logits);
            let c = std::time::Instant::now();
            let t = s.sample(&mut buf);
            let e = c.elapsed();
            best = best.min(e);
            total += e;
            s.accept(t);
        }
        println!("{name}: min {best:?}, mean {:?} per token", total / n);
    }
}
