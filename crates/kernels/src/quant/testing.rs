//! Shared helpers for the kernel tests: seeded random data with the shapes
//! that break SIMD code (odd block counts, extreme values) and error metrics.

use crate::isa::Isa;
use crate::traits::VecDotFn;
use gguf::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The dot of weight type `ty` in the table of `isa`, a set this CPU
/// supports (tests loop over [`Isa::supported`]).
pub fn vec_dot(isa: Isa, ty: GgmlType) -> VecDotFn {
    crate::table(isa)
        .expect("a set this CPU supports")
        .vec_dot(ty)
        .expect("a type with kernels")
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Values like a weight row: roughly normal, with a few large outliers.
pub fn weights(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let g: f32 = (0..4).map(|_| rng.gen_range(-1.0f32..1.0)).sum::<f32>() * 0.5;
            if rng.gen_ratio(1, 64) {
                g * 8.0
            } else {
                g
            }
        })
        .collect()
}

/// Rows that stress quantizers: all zeros, constant, one huge value, tiny
/// values, alternating signs at the range limits.
pub fn extreme_rows(n: usize) -> Vec<Vec<f32>> {
    vec![
        vec![0.0; n],
        vec![1.0; n],
        vec![-3.5; n],
        (0..n)
            .map(|i| if i == n / 2 { 1e4 } else { 1e-3 })
            .collect(),
        (0..n)
            .map(|i| if i % 2 == 0 { 65000.0 } else { -65000.0 })
            .collect(),
        (0..n).map(|i| (i as f32) * 1e-7).collect(),
        (0..n)
            .map(|i| if i % 7 == 0 { -1.0 } else { 0.25 })
            .collect(),
    ]
}

/// Block counts that exercise SIMD main loops and their tails.
pub const BLOCK_COUNTS: [usize; 7] = [1, 2, 3, 5, 8, 13, 24];

pub fn rmse(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let s: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    (s / a.len() as f64).sqrt() as f32
}

/// ggml's test-quantize-fns metric for dot products: |a-b| / n.
pub fn dot_err(a: f32, b: f32, n: usize) -> f32 {
    (a - b).abs() / n as f32
}
