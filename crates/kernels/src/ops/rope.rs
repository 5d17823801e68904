//! Rotary position embedding, as ggml's `rope` computes it (without YaRN).
//!
//! For pair `i` of the first `n_rot` dimensions of a head, the angle at
//! position `p` is `θ_i = p · freq_scale · base^(-2i/n_rot) / ff_i`, where
//! `freq_scale` is `1 / factor` for linear scaling and `ff` the optional
//! per-pair frequency factors (Llama 3's `rope_freqs.weight`). The powers are
//! built by repeated multiplication in f32 like ggml, so angles match its
//! bit for bit. Dimensions past `n_rot` pass through unchanged.
//!
//! Layouts: [`RopeLayout::Normal`] rotates adjacent pairs `(2i, 2i+1)`
//! (ggml's default, used for `llama`: the GGUF converter permutes Q/K rows
//! so that Hugging Face's half-split rotation becomes adjacent pairs);
//! [`RopeLayout::NeoX`] rotates `(i, i + n_rot/2)` (Qwen2/3, GPT-NeoX).

/// Which dimensions form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// `(2i, 2i+1)`.
    Normal,
    /// `(i, i + n_rot/2)`.
    NeoX,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Rotated dimensions per head (even, ≤ head size).
    pub n_rot: usize,
    pub freq_base: f32,
    /// `1 / linear scaling factor` (1.0 when unscaled).
    pub freq_scale: f32,
    pub layout: RopeLayout,
}

/// Fill `cos`/`sin` (`n_rot / 2` each) for position `pos`; `freq_factors`,
/// when given, holds one divisor per pair.
pub fn rope_freqs(
    p: &RopeParams,
    pos: usize,
    freq_factors: Option<&[f32]>,
    cos: &mut [f32],
    sin: &mut [f32],
) {
    let half = p.n_rot / 2;
    assert!(
        cos.len() == half && sin.len() == half,
        "rope: cos/sin need n_rot/2 = {half} elements"
    );
    if let Some(ff) = freq_factors {
        assert_eq!(ff.len(), half, "rope: freq_factors need n_rot/2 = {half}");
    }
    let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
    let mut theta = pos as f32;
    for i in 0..half {
        let ff = freq_factors.map_or(1.0, |f| f[i]);
        let t = p.freq_scale * (theta / ff);
        cos[i] = t.cos();
        sin[i] = t.sin();
        theta *= theta_scale;
    }
}

/// Rotate one head `x` (head size ≥ `n_rot`) by the angles from
/// [`rope_freqs`].
pub fn rope(x: &mut [f32], cos: &[f32], sin: &[f32], layout: RopeLayout) {
    let half = cos.len();
    assert_eq!(sin.len(), half, "rope: cos and sin lengths differ");
    assert!(
        x.len() >= 2 * half,
        "rope: head of {} < n_rot {}",
        x.len(),
        2 * half
    );
    match layout {
        RopeLayout::Normal => {
            for (i, pair) in x[..2 * half].chunks_exact_mut(2).enumerate() {
                let (x0, x1) = (pair[0], pair[1]);
                pair[0] = x0 * cos[i] - x1 * sin[i];
                pair[1] = x0 * sin[i] + x1 * cos[i];
            }
        }
        RopeLayout::NeoX => {
            let (a, b) = x[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (x0, x1) = (a[i], b[i]);
                a[i] = x0 * cos[i] - x1 * sin[i];
                b[i] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Straight from the formula, in f64, pairs picked by layout.
    fn reference(x: &[f32], p: &RopeParams, pos: usize, ff: Option<&[f32]>) -> Vec<f32> {
        let mut out = x.to_vec();
        let half = p.n_rot / 2;
        for i in 0..half {
            let f = ff.map_or(1.0, |f| f[i] as f64);
            let t = pos as f64 * (p.freq_base as f64).powf(-2.0 * i as f64 / p.n_rot as f64) / f
                * p.freq_scale as f64;
            let (a, b) = match p.layout {
                RopeLayout::Normal => (2 * i, 2 * i + 1),
                RopeLayout::NeoX => (i, i + half),
            };
            let (x0, x1) = (x[a] as f64, x[b] as f64);
            out[a] = (x0 * t.cos() - x1 * t.sin()) as f32;
            out[b] = (x0 * t.sin() + x1 * t.cos()) as f32;
        }
        out
    }

    #[test]
    fn matches_formula_both_layouts_partial_and_scaled() {
        let mut r = rand::rngs::StdRng::seed_from_u64(5);
        for layout in [RopeLayout::Normal, RopeLayout::NeoX] {
            for (head, n_rot) in [(2, 2), (64, 64), (80, 32), (6, 4), (128, 128)] {
                for (base, scale) in [(10000.0, 1.0), (500000.0, 0.25), (1e6, 1.0)] {
                    let ff: Vec<f32> = (0..n_rot / 2).map(|_| r.gen_range(1.0..8.0)).collect();
                    for ffo in [None, Some(&ff[..])] {
                        for pos in [0, 1, 7, 100, 3000] {
                            let p = RopeParams {
                                n_rot,
                                freq_base: base,
                                freq_scale: scale,
                                layout,
                            };
                            let x: Vec<f32> = (0..head).map(|_| r.gen_range(-2.0..2.0)).collect();
                            let mut cos = vec![0.0; n_rot / 2];
                            let mut sin = vec![0.0; n_rot / 2];
                            rope_freqs(&p, pos, ffo, &mut cos, &mut sin);
                            let mut y = x.clone();
                            rope(&mut y, &cos, &sin, layout);
                            let want = reference(&x, &p, pos, ffo);
                            for i in 0..head {
                                // f32 angles of up to ~3000 rad: a few 1e-4.
                                assert!(
                                    (y[i] - want[i]).abs() < 2e-3,
                                    "{layout:?} head={head} n_rot={n_rot} pos={pos} i={i}: {} vs {}",
                                    y[i],
                                    want[i]
                                );
                            }
                            assert_eq!(&y[n_rot..], &x[n_rot..], "pass-through dims");
                            // A rotation keeps the norm.
                            let n0: f32 = x.iter().map(|v| v * v).sum();
                            let n1: f32 = y.iter().map(|v| v * v).sum();
                            assert!((n0 - n1).abs() < 1e-4 * (1.0 + n0));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn position_zero_is_identity() {
        let p = RopeParams {
            n_rot: 8,
            freq_base: 10000.0,
            freq_scale: 1.0,
            layout: RopeLayout::Normal,
        };
        let (mut c, mut s) = ([0.0; 4], [0.0; 4]);
        rope_freqs(&p, 0, None, &mut c, &mut s);
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let mut y = x;
        rope(&mut y, &c, &s, RopeLayout::NeoX);
        assert_eq!(x, y);
    }
}
