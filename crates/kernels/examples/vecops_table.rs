//! Time of the `vecops` kernels per instruction set at the `cachefit`
//! model's sizes: attention of 8 query heads on one KV head of 18 at
//! several depths, SwiGLU over 396, the soft cap over a 4096 vocabulary.
//!
//! ```text
//! cargo run --release -p cachefit-kernels --example vecops_table
//! ```

use half::f16;
use kernels::bandwidth::time_passes;
use kernels::vecops::Attention;
use kernels::Isa;
use std::hint::black_box;
use std::time::Duration;

fn main() {
    let t = Duration::from_millis(200);
    let per_call = |calls: usize, mut f: Box<dyn FnMut() + '_>| {
        let b = time_passes(calls, t, || {
            for _ in 0..calls {
                f();
            }
        });
        1e9 / (b.best_gbps * 1e9) // ns per call
    };
    let (nh, hd, ctx) = (8, 18, 1024);
    let v = |n: usize, s: f32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 * s - s / 2.0)
            .collect()
    };
    let (q, keys, values) = (v(nh * hd, 2.0), v(hd * ctx, 2.0), v(hd * ctx, 2.0));
    let keys16: Vec<f16> = keys.iter().map(|&x| f16::from_f32(x)).collect();
    let values16: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
    let mut scores = vec![0.0; nh * kernels::vecops::scores_len(ctx)];
    let mut out = vec![0.0; nh * hd];
    let mut st = vec![0.0; 2 * nh];
    println!("| op | size | kernels | ns/call |");
    println!("|---|---|---|---:|");
    for isa in Isa::supported() {
        let k = kernels::table(isa).expect("a supported set").vecops;
        for n_pos in [64, 544, 1024] {
            let a = Attention {
                q: &q,
                head_dim: hd,
                keys: &keys,
                values: &values,
                stride: ctx,
                first: 0,
                n_pos,
                head_pos: &[],
                scale: 0.2357,
                softcap: 0.0,
            };
            let ns = per_call(
                200,
                Box::new(|| (k.attend)(black_box(&a), &mut scores, &mut out, &mut st)),
            );
            println!(
                "| attend {nh}×{hd}, f32 K/V | {n_pos} positions | {} | {ns:.0} |",
                isa.name()
            );
            let a = Attention {
                q: &q,
                head_dim: hd,
                keys: &keys16,
                values: &values16,
                stride: ctx,
                first: 0,
                n_pos,
                head_pos: &[],
                scale: 0.2357,
                softcap: 0.0,
            };
            let ns = per_call(
                200,
                Box::new(|| (k.attend_f16)(black_box(&a), &mut scores, &mut out, &mut st)),
            );
            println!(
                "| attend {nh}×{hd}, f16 K/V | {n_pos} positions | {} | {ns:.0} |",
                isa.name()
            );
        }
        let (mut g, u) = (v(396, 8.0), v(396, 2.0));
        let ns = per_call(2000, Box::new(|| (k.swiglu)(black_box(&mut g), &u)));
        println!("| swiglu | 396 | {} | {ns:.0} |", isa.name());
        let mut l = v(4096, 60.0);
        let ns = per_call(500, Box::new(|| (k.softcap)(black_box(&mut l), 30.0)));
        println!("| softcap | 4096 | {} | {ns:.0} |", isa.name());
    }
}
