//! Helpers shared by the model's integration tests (each test binary
//! uses some of them).
#![allow(dead_code)]

use model::{KvCache, ModelConfig, State};
use std::ops::Range;

/// Sequence `seq`'s KV cache, whatever the architecture.
pub fn cache<'s>(state: &'s State<'_>, seq: usize) -> &'s KvCache {
    match state {
        State::Llama(s) => s.cache(seq),
        State::Cachefit(s) => s.cache(seq),
    }
}

/// The keys a cache holds for `positions` of its layer `layer`, with RoPE
/// undone (rotated back by the same angles), `(positions, kv_dim)`.
pub fn unroped_keys(
    cfg: &ModelConfig,
    cache: &KvCache,
    layer: usize,
    positions: Range<usize>,
) -> Vec<f32> {
    let half = cfg.rope.n_rot / 2;
    let (mut cos, mut sin) = (vec![0.0; half], vec![0.0; half]);
    let mut head = vec![0.0; cfg.head_dim];
    let mut out = Vec::new();
    for p in positions {
        kernels::ops::rope_freqs(&cfg.rope, p, None, &mut cos, &mut sin);
        let back: Vec<f32> = sin.iter().map(|s| -s).collect();
        for h in 0..cfg.n_kv_heads {
            cache.layer(layer).key(p, h, &mut head);
            kernels::ops::rope(&mut head, &cos, &back, cfg.rope.layout);
            out.extend_from_slice(&head);
        }
    }
    out
}

/// Largest |a − b| over the largest |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    err / scale
}

pub fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}
