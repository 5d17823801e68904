//! Rotary position embedding, as ggml's `rope` computes it.
//!
//! For pair `i` of the first `n_rot` dimensions of a head, the angle at
//! position `p` is `θ_i = p · freq_scale · base^(-2i/n_rot) / ff_i`, where
//! `freq_scale` is `1 / factor` for linear scaling and `ff` the optional
//! per-pair frequency factors (Llama 3's `rope_freqs.weight`, Phi-3's long
//! or short factors). The powers are built by repeated multiplication in f32
//! like ggml, so angles match its bit for bit. Dimensions past `n_rot` pass
//! through unchanged.
//!
//! YaRN ([`Yarn`]) mixes the scaled and unscaled angle per pair with a ramp
//! over the pairs between two "correction dimensions", and both YaRN and
//! Phi-3's LongRoPE scale cos and sin by a magnitude ([`RopeParams::mscale`]),
//! which multiplies the attention scores by its square.
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
    /// `1 / scaling factor` (1.0 when unscaled).
    pub freq_scale: f32,
    pub layout: RopeLayout,
    /// Multiplies cos and sin (ggml's `attn_factor`; 1.0 for plain RoPE).
    pub mscale: f32,
    /// YaRN's ramp between scaled and unscaled angles, if any.
    pub yarn: Option<Yarn>,
}

/// YaRN's extrapolation mix (ggml's `ext_factor`, `beta_fast`, `beta_slow`
/// and the original context).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// Context the model was trained for before scaling.
    pub n_ctx_orig: usize,
    /// Weight of the unscaled angle at the ramp's full end (1.0).
    pub ext_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

impl RopeParams {
    /// Plain RoPE (no magnitude scaling, no YaRN).
    pub fn new(n_rot: usize, freq_base: f32, freq_scale: f32, layout: RopeLayout) -> RopeParams {
        RopeParams {
            n_rot,
            freq_base,
            freq_scale,
            layout,
            mscale: 1.0,
            yarn: None,
        }
    }
}

impl Yarn {
    /// The pair range `[low, high]` over which the ramp falls from
    /// extrapolation to interpolation (ggml's `ggml_rope_yarn_corr_dims`).
    pub fn corr_dims(&self, n_rot: usize, freq_base: f32) -> [f32; 2] {
        let dim = |n_rotations: f32| {
            n_rot as f32
                * (self.n_ctx_orig as f32 / (n_rotations * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * freq_base.ln())
        };
        let start = dim(self.beta_fast).floor();
        let end = dim(self.beta_slow).ceil();
        [start.max(0.0), end.min(n_rot as f32 - 1.0)]
    }
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
    let mut mscale = p.mscale;
    // ggml's `rope_yarn`: the ramp is 1 below `low`, 0 above `high`.
    let yarn = p.yarn.filter(|y| y.ext_factor != 0.0).map(|y| {
        mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
        (y.corr_dims(p.n_rot, p.freq_base), y.ext_factor)
    });
    for i in 0..half {
        let ff = freq_factors.map_or(1.0, |f| f[i]);
        let extrap = theta / ff;
        let interp = p.freq_scale * extrap;
        let t = match yarn {
            None => interp,
            Some(([low, high], ext)) => {
                let y = (i as f32 - low) / (high - low).max(0.001);
                let mix = (1.0 - y.clamp(0.0, 1.0)) * ext;
                interp * (1.0 - mix) + extrap * mix
            }
        };
        cos[i] = t.cos() * mscale;
        sin[i] = t.sin() * mscale;
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
                            let p = RopeParams::new(n_rot, base, scale, layout);
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

    /// YaRN against its formula (ggml's `rope_yarn`), in f64: the ramp
    /// mixes interpolated and extrapolated angles and cos/sin carry the
    /// magnitude `mscale · (1 + 0.1 ln factor)`.
    #[test]
    fn yarn_matches_formula() {
        for (n_rot, base, factor, orig) in [(64, 10000.0, 4.0, 4096), (128, 1e6, 8.0, 4096)] {
            let y = Yarn {
                n_ctx_orig: orig,
                ext_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
            };
            let p = RopeParams {
                mscale: 0.9,
                yarn: Some(y),
                ..RopeParams::new(n_rot, base, 1.0 / factor, RopeLayout::NeoX)
            };
            let corr = |beta: f64| {
                n_rot as f64 * (orig as f64 / (beta * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * (base as f64).ln())
            };
            let (low, high) = (
                corr(32.0).floor().max(0.0),
                corr(1.0).ceil().min(n_rot as f64 - 1.0),
            );
            assert!(
                low > 0.0 && high < (n_rot / 2) as f64,
                "the ramp must bite: {low} {high}"
            );
            let m = 0.9 * (1.0 + 0.1 * (factor as f64).ln());
            for pos in [1usize, 9, 300] {
                let (mut c, mut s) = (vec![0.0; n_rot / 2], vec![0.0; n_rot / 2]);
                rope_freqs(&p, pos, None, &mut c, &mut s);
                for i in 0..n_rot / 2 {
                    let extrap = pos as f64 * (base as f64).powf(-2.0 * i as f64 / n_rot as f64);
                    let interp = extrap / factor as f64;
                    let ramp = 1.0 - ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                    let t = interp * (1.0 - ramp) + extrap * ramp;
                    let tol = 2e-4 * (1.0 + extrap);
                    assert!(
                        (c[i] as f64 - m * t.cos()).abs() < tol,
                        "pos {pos} pair {i}"
                    );
                    assert!(
                        (s[i] as f64 - m * t.sin()).abs() < tol,
                        "pos {pos} pair {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn position_zero_is_identity() {
        let p = RopeParams::new(8, 10000.0, 1.0, RopeLayout::Normal);
        let (mut c, mut s) = ([0.0; 4], [0.0; 4]);
        rope_freqs(&p, 0, None, &mut c, &mut s);
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let mut y = x;
        rope(&mut y, &c, &s, RopeLayout::NeoX);
        assert_eq!(x, y);
    }
}
