//! The trainer's network: the `cachefit` architecture
//! (`docs/CACHEFIT-FORMAT.md`) with a hand-written forward and backward
//! pass in `f32` over one sequence at a time ([`forward`]), its
//! parameters in one flat vector ([`config::Layout`]).
//!
//! This forward pass is also the *float reference* the int8 runtime is
//! measured against (`docs/gates.json`).

pub mod config;
pub mod forward;
pub mod ops;

pub use config::{BlockKind, Layout, NetConfig, WeightFormat, TERNARY_BLOCK};
pub use forward::{backward, forward, Acts};

use crate::rng::Rng;

/// Standard normal from two uniforms (Box–Muller); our own so a seed gives
/// the same weights with any version of any dependency.
fn normal(rng: &mut Rng) -> f32 {
    let u1 = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// GPT-2 style initialization: matrices N(0, 0.02), the projections that
/// write into the residual stream scaled by 1/√(2·blocks), norms 1, conv
/// taps uniform in ±1/√K (PyTorch's default for a depthwise conv).
pub fn init_params(c: &NetConfig, l: &Layout, seed: u64) -> Vec<f32> {
    let mut p = vec![0.0f32; l.len];
    let mut rng = Rng::stream(seed, 0x1417);
    let resid_scale = 1.0 / (2.0 * c.pattern.len() as f32).sqrt();
    for t in &l.tensors {
        let dst = &mut p[t.range()];
        if t.name.ends_with("_norm") {
            dst.fill(1.0);
        } else if t.name.ends_with("conv_taps") {
            let bound = 1.0 / (c.conv_kernel as f32).sqrt();
            for v in dst {
                let u = (rng.next_u64() >> 11) as f32 / (1u64 << 53) as f32;
                *v = (2.0 * u - 1.0) * bound;
            }
        } else {
            let out_proj = ["conv_out", "attn_output", "ffn_down"]
                .iter()
                .any(|s| t.name.ends_with(s));
            let std = 0.02 * if out_proj { resid_scale } else { 1.0 };
            for v in dst {
                *v = normal(&mut rng) * std;
            }
        }
    }
    p
}

/// Int8 quantization of one row: `scale = max|w| / 127`, `q = round(w /
/// scale)` (half away from zero), all-zero row → scale 0. The exporter
/// and the fake quantization of QAT both use this, so the trained
/// weights and the exported ones are the same numbers.
pub fn quantize_row(row: &[f32], q: &mut [i8]) -> f32 {
    let amax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let scale = amax / 127.0;
    for (qv, &v) in q.iter_mut().zip(row) {
        *qv = (v / scale).round().clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// Ternary quantization of one row (BitNet b1.58's absmean rule): each run
/// of `block` weights (the whole row when 0) gets `s = mean|w|` rounded to
/// f16 (as TQ2_0 stores it), then `t = round(w / s)` clamped to −1..=1.
/// Writes `t · s` to `out`: the values the runtime computes with.
pub fn ternary_round_trip(row: &[f32], block: usize, out: &mut [f32]) {
    let block = if block == 0 { row.len() } else { block };
    for (src, dst) in row.chunks(block).zip(out.chunks_mut(block)) {
        let mean = src.iter().map(|v| v.abs() as f64).sum::<f64>() / src.len() as f64;
        let s = half::f16::from_f32(mean as f32).to_f32();
        if s == 0.0 {
            dst.fill(0.0);
            continue;
        }
        for (d, &w) in dst.iter_mut().zip(src) {
            let t = (w / s).round().clamp(-1.0, 1.0);
            // +0 for a zero trit (not −0): what the file gives back.
            *d = if t == 0.0 { 0.0 } else { t * s };
        }
    }
}

/// Replace every matrix row by its round trip through the storage the
/// export writes (int8 per row, or ternary for block matrices of a ternary
/// network); other tensors are copied. `out` = what the runtime will
/// compute with.
pub fn fake_quantize(c: &NetConfig, l: &Layout, params: &[f32], out: &mut [f32]) {
    let mut q = Vec::new();
    for t in &l.tensors {
        let (src, dst) = (&params[t.range()], &mut out[t.range()]);
        if !t.matrix {
            dst.copy_from_slice(src);
            continue;
        }
        if t.ternary {
            let WeightFormat::Ternary { block } = c.weights else {
                unreachable!("a ternary tensor in a {} network", c.weights.name())
            };
            for (s, d) in src.chunks_exact(t.cols).zip(dst.chunks_exact_mut(t.cols)) {
                ternary_round_trip(s, block, d);
            }
            continue;
        }
        q.resize(t.cols, 0i8);
        for (s, d) in src.chunks_exact(t.cols).zip(dst.chunks_exact_mut(t.cols)) {
            let scale = quantize_row(s, &mut q);
            for (dv, &qv) in d.iter_mut().zip(&q) {
                *dv = qv as f32 * scale;
            }
        }
    }
}

/// Replace each run of [`TERNARY_BLOCK`] values of `x` by its Q8_K round
/// trip, with the runtime's own quantizer: the inputs of ternary matrices
/// as the runtime's `TQ2_0 × Q8_K` kernels see them. `x.len()` must be a
/// multiple of the block.
pub fn q8k_round_trip(x: &mut [f32]) {
    use kernels::quant::q8_k::{dequantize_row, quantize_row, BlockQ8K};
    let mut b = [<BlockQ8K as bytemuck::Zeroable>::zeroed()];
    for chunk in x.chunks_exact_mut(TERNARY_BLOCK) {
        quantize_row(chunk, &mut b);
        dequantize_row(&b, chunk);
    }
}

/// [`q8k_round_trip`] as a pair: the Q8_K round trip of `x` plus that of
/// what it leaves over, about 15 bits per value. What the runtime reads
/// for the inputs of ternary matrices (`crates/model`, `Activations`):
/// with 8 bits a tiny float difference upstream can move a value across a
/// rounding step, and greedy choices then part at ~0.4% of steps.
pub fn q8k_pair_round_trip(x: &mut [f32]) {
    let mut rest = vec![0.0f32; TERNARY_BLOCK];
    for chunk in x.chunks_exact_mut(TERNARY_BLOCK) {
        rest.copy_from_slice(chunk);
        q8k_round_trip(chunk);
        for (r, &h) in rest.iter_mut().zip(chunk.iter()) {
            *r -= h;
        }
        q8k_round_trip(&mut rest);
        for (h, &r) in chunk.iter_mut().zip(&rest) {
            *h += r;
        }
    }
}

/// Negative log-likelihood of each next token of `tokens` (positions
/// `1..len`), and whether the argmax at each position was that token.
/// Runs [`forward`] on `tokens[..len-1]`.
pub fn score(
    c: &NetConfig,
    l: &Layout,
    p: &[f32],
    tokens: &[u16],
    acts: &mut Acts,
) -> Vec<(f64, usize)> {
    let n = tokens.len().saturating_sub(1);
    if n == 0 {
        return Vec::new();
    }
    forward(c, l, p, &tokens[..n], acts);
    acts.logits[..n * c.vocab]
        .chunks_exact(c.vocab)
        .zip(&tokens[1..])
        .map(|(row, &tgt)| {
            let (lse, best) = ops::log_sum_exp(row);
            (lse - row[tgt as usize] as f64, best)
        })
        .collect()
}

#[cfg(test)]
mod gradcheck;
