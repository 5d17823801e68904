//! Element-wise and row operations of the forward pass: RMSNorm, RoPE,
//! softmax, SiLU/SwiGLU, add.
//!
//! Each is a plain loop over `f32` slices written so the compiler can
//! vectorize it (no early exits, independent lanes), following ggml's
//! reference semantics: the reductions (sum of squares, softmax sum) run in
//! `f64` as ggml's `ggml_float` does, so results track llama.cpp closely.
//! They are a small share of decode time next to the matvecs, so they have
//! no hand-written SIMD; the exception is attention's loops over cached
//! positions ([`dot_rows`], [`axpy_rows`]), which dominate decode at depth.

mod rope;
mod rows;

pub use rope::{rope, rope_freqs, RopeLayout, RopeParams, Yarn};
pub(crate) use rows::ROW_KERNELS;
pub use rows::{
    axpy_rows, axpy_rows_ref, dot_rows, dot_rows_ref, AxpyRowsFn, DotRowsFn, RowKernels,
};

/// `out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i]` (ggml `rms_norm`
/// followed by `mul`).
pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    assert_eq!(out.len(), x.len(), "rmsnorm: out and x lengths differ");
    assert_eq!(
        weight.len(),
        x.len(),
        "rmsnorm: weight and x lengths differ"
    );
    let scale = rms_scale(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// [`rmsnorm`] of each row of `x` (rows of `weight.len()`) into `out`, the
/// same bits row by row; four rows' square sums run side by side, so the
/// f64 additions (in order, like ggml's) overlap instead of waiting on
/// each other.
pub fn rmsnorm_rows(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    assert!(
        dim > 0 && out.len() == x.len() && x.len().is_multiple_of(dim),
        "rmsnorm_rows: x and out must be whole rows of the weight's length"
    );
    let mut outs = out.chunks_exact_mut(4 * dim);
    let mut xs = x.chunks_exact(4 * dim);
    for (o4, x4) in (&mut outs).zip(&mut xs) {
        let mut sum = [0.0f64; 4];
        for i in 0..dim {
            for (r, s) in sum.iter_mut().enumerate() {
                let v = x4[r * dim + i];
                *s += (v * v) as f64;
            }
        }
        for (r, s) in sum.iter().enumerate() {
            let mean = (s / dim as f64) as f32;
            let scale = 1.0 / (mean + eps).sqrt();
            let (o, xr) = (&mut o4[r * dim..][..dim], &x4[r * dim..][..dim]);
            for ((o, &v), &w) in o.iter_mut().zip(xr).zip(weight) {
                *o = v * scale * w;
            }
        }
    }
    let rest = outs.into_remainder().chunks_exact_mut(dim);
    for (o, xr) in rest.zip(xs.remainder().chunks_exact(dim)) {
        rmsnorm(o, xr, weight, eps);
    }
}

/// [`rmsnorm`] in place.
pub fn rmsnorm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    assert_eq!(
        weight.len(),
        x.len(),
        "rmsnorm: weight and x lengths differ"
    );
    let scale = rms_scale(x, eps);
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = *v * scale * w;
    }
}

/// `1 / sqrt(mean(x²) + eps)`, the square sum in f64 like ggml.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    if x.is_empty() {
        return 0.0;
    }
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// In-place softmax: `x[i] = exp(x[i] - max) / Σ exp(x[j] - max)`.
pub fn softmax(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// In-place SiLU.
pub fn silu_inplace(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = silu(*v);
    }
}

/// SwiGLU in place: `gate[i] = silu(gate[i]) * up[i]`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up lengths differ");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// GELU, tanh approximation, as ggml's CPU backend computes it:
/// `0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))` of `x` rounded to f16,
/// the result rounded to f16 (ggml reads it from a table indexed by the
/// f16 input, and so do we: [`gelu_tanh`] is a lookup); exactly `0` below
/// −10 and `x` above 10. The rounding moves Gemma 3's perplexity: in f32
/// throughout, Gemma 3 270M scored 0.4% below llama.cpp at 1024 positions,
/// with it 0.04%.
pub fn gelu_tanh_direct(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let h = half::f16::from_f32(x).to_f32();
        let g = 0.5 * h * (1.0 + (SQRT_2_OVER_PI * h * (1.0 + 0.044715 * h * h)).tanh());
        half::f16::from_f32(g).to_f32()
    }
}

/// [`gelu_tanh_direct`] by table: GELU of every f16 value, as f16 bits,
/// built on first use (65,536 entries, 128 KiB). The tanh per element
/// was 17% of Gemma 3's prompt time.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let table = TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let h = half::f16::from_bits(bits).to_f32();
                let g = if h.is_finite() {
                    gelu_tanh_direct(h)
                } else {
                    h
                };
                half::f16::from_f32(g).to_bits()
            })
            .collect()
    });
    let i = half::f16::from_f32(x).to_bits() as usize;
    half::f16::from_bits(table[i]).to_f32()
}

/// GeGLU in place: `gate[i] = gelu_tanh(gate[i]) * up[i]` (Gemma's MLP).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "geglu: gate and up lengths differ");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_tanh(*g) * u;
    }
}

/// `x[i] *= s`.
pub fn scale_inplace(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// `acc[i] += x[i]` (the residual connection).
pub fn add_inplace(acc: &mut [f32], x: &[f32]) {
    assert_eq!(acc.len(), x.len(), "add: lengths differ");
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// `Σ a[i]·b[i]` in f32 with eight independent accumulators, so it
/// vectorizes without reassociation flags; deterministic for given inputs.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: lengths differ");
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `acc[i] += w * x[i]`.
pub fn axpy(acc: &mut [f32], w: f32, x: &[f32]) {
    assert_eq!(acc.len(), x.len(), "axpy: lengths differ");
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += w * b;
    }
}

/// Index of the largest value (the first one on ties; NaN never wins).
pub fn argmax(x: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in x.iter().enumerate() {
        let better = match best {
            None => !v.is_nan(),
            Some((_, b)) => v > b,
        };
        if better {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| r.gen_range(-3.0..3.0)).collect()
    }

    fn close(a: f32, b: f32, tol: f32) -> bool {
        (a - b).abs() <= tol * (1.0 + b.abs())
    }

    /// Rows side by side give each row's [`rmsnorm`] bits, for every
    /// count of rows around the groups of four.
    #[test]
    fn rmsnorm_rows_equals_rmsnorm() {
        for (rows, dim) in [(1, 5), (3, 64), (4, 576), (7, 33), (9, 1)] {
            let x = random(rows * dim, rows as u64);
            let w = random(dim, 99);
            let mut got = vec![f32::NAN; rows * dim];
            rmsnorm_rows(&mut got, &x, &w, 1e-5);
            for r in 0..rows {
                let mut want = vec![0.0; dim];
                rmsnorm(&mut want, &x[r * dim..][..dim], &w, 1e-5);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got[r * dim..][..dim]),
                    bits(&want),
                    "{rows} x {dim}, row {r}"
                );
            }
        }
    }

    /// The table equals the direct formula on every f16 input in range.
    #[test]
    fn gelu_table_equals_direct() {
        for bits in 0..=u16::MAX {
            let x = half::f16::from_bits(bits).to_f32();
            if x.is_finite() {
                let (t, d) = (gelu_tanh(x), gelu_tanh_direct(x));
                assert!(t.to_bits() == d.to_bits(), "{bits:#06x} {x}: {t} vs {d}");
            }
        }
    }

    /// GeGLU against GELU's tanh form in f64 (on and to f16, as ggml's
    /// table), including the clamped tails.
    #[test]
    fn geglu_matches_f64_reference() {
        let gelu = |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        };
        for n in [1, 5, 64, 257] {
            let mut g: Vec<f32> = random(n, 7 + n as u64).iter().map(|v| v * 4.0).collect();
            g[0] = -11.0;
            let u = random(n, 9 + n as u64);
            let want: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&x, &y)| {
                    // ggml's table: input and output rounded to f16.
                    let h = half::f16::from_f32(x).to_f32() as f64;
                    let a = if x <= -10.0 {
                        0.0
                    } else if x >= 10.0 {
                        x as f64
                    } else {
                        half::f16::from_f64(gelu(h)).to_f64()
                    };
                    a * y as f64
                })
                .collect();
            geglu(&mut g, &u);
            for i in 0..n {
                // One f16 step where the f32 and f64 tanh round apart.
                assert!(
                    close(g[i], want[i] as f32, 1e-3),
                    "{i}: {} vs {}",
                    g[i],
                    want[i]
                );
            }
        }
    }

    #[test]
    fn rmsnorm_matches_f64_reference() {
        for n in [1, 3, 7, 64, 129, 576, 1001] {
            let x = random(n, n as u64);
            let w = random(n, 100 + n as u64);
            let mean: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
            let s = 1.0 / (mean + 1e-5).sqrt();
            let mut out = vec![0.0; n];
            rmsnorm(&mut out, &x, &w, 1e-5);
            let mut inplace = x.clone();
            rmsnorm_inplace(&mut inplace, &w, 1e-5);
            assert_eq!(out, inplace);
            for i in 0..n {
                let want = (x[i] as f64 * s * w[i] as f64) as f32;
                assert!(
                    close(out[i], want, 1e-5),
                    "n={n} i={i}: {} vs {want}",
                    out[i]
                );
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_orders() {
        for n in [1, 2, 5, 31, 100, 1000] {
            let mut x = random(n, 7 + n as u64);
            x[0] = 50.0; // large values must not overflow
            let orig = x.clone();
            softmax(&mut x);
            let sum: f64 = x.iter().map(|&v| v as f64).sum();
            assert!((sum - 1.0).abs() < 1e-5, "n={n} sum={sum}");
            let m = orig
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
            let z: f64 = orig.iter().map(|&v| (v as f64 - m).exp()).sum();
            for i in 0..n {
                let want = ((orig[i] as f64 - m).exp() / z) as f32;
                assert!((x[i] - want).abs() < 1e-6, "n={n} i={i}");
            }
        }
        let mut empty: [f32; 0] = [];
        softmax(&mut empty);
    }

    #[test]
    fn silu_swiglu_add_axpy_dot() {
        for n in [1, 9, 17, 1536] {
            let g = random(n, n as u64);
            let u = random(n, 3 * n as u64);
            let mut s = g.clone();
            swiglu(&mut s, &u);
            let mut si = g.clone();
            silu_inplace(&mut si);
            for i in 0..n {
                let x = g[i] as f64;
                let want = x / (1.0 + (-x).exp()) * u[i] as f64;
                assert!(close(s[i], want as f32, 1e-5));
                assert!(close(si[i], (x / (1.0 + (-x).exp())) as f32, 1e-6));
            }
            let mut a = g.clone();
            add_inplace(&mut a, &u);
            let mut b = g.clone();
            axpy(&mut b, 1.0, &u);
            assert_eq!(a, b);
            for i in 0..n {
                assert_eq!(a[i], g[i] + u[i]);
            }
            let want: f64 = g.iter().zip(&u).map(|(&x, &y)| x as f64 * y as f64).sum();
            let mag: f64 = g
                .iter()
                .zip(&u)
                .map(|(&x, &y)| (x as f64 * y as f64).abs())
                .sum();
            assert!((dot(&g, &u) as f64 - want).abs() <= 1e-5 * mag + 1e-6);
        }
        assert_eq!(silu(0.0), 0.0);
    }

    #[test]
    fn argmax_first_max_and_nan() {
        assert_eq!(argmax(&[]), None);
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, -1.0, f32::NAN]), Some(1));
        assert_eq!(argmax(&[f32::NAN]), None);
    }
}
