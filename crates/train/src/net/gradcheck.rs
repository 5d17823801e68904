//! The backward pass against finite differences of the loss, for every
//! parameter of small networks (both block kinds, grouped KV heads, soft
//! cap on and off).

use super::*;

fn tiny(pattern: &str, n_kv_heads: usize, softcap: f32) -> NetConfig {
    NetConfig {
        vocab: 11,
        d: 8,
        ffn: 12,
        pattern: config::parse_pattern(pattern).unwrap(),
        n_heads: 4,
        n_kv_heads,
        head_dim: 4,
        context: 16,
        conv_kernel: 3,
        softcap,
        eps: 1e-5,
        rope_base: 100.0,
        weights: WeightFormat::Int8,
        token_code_bits: 0,
        token_code_seed: 0,
    }
}

fn total_loss(c: &NetConfig, l: &Layout, p: &[f32], tokens: &[u16], acts: &mut Acts) -> f64 {
    score(c, l, p, tokens, acts)
        .iter()
        .map(|(nll, _)| nll)
        .sum()
}

fn check(c: &NetConfig) {
    check_sampled(c, usize::MAX, false);
}

/// Finite differences for `every`-th parameter (all when 1); with
/// `quantized`, at the fake-quantized weights with quantized inputs, the
/// quantization's offsets frozen (the straight-through surrogate).
fn check_sampled(c: &NetConfig, sample: usize, quantized: bool) {
    let l = Layout::new(c);
    // Larger weights than training's init, so every path carries signal.
    let mut p = init_params(c, &l, 7);
    let mut rng = Rng::new(99);
    for t in &l.tensors {
        for v in &mut p[t.range()] {
            *v = if t.name.ends_with("_norm") {
                1.0 + 0.3 * normal(&mut rng)
            } else if t.matrix && t.cols > 8 {
                // Products of order 1 at any width (0.25 at the tiny widths).
                0.7 / (t.cols as f32).sqrt() * normal(&mut rng)
            } else {
                0.25 * normal(&mut rng)
            };
        }
    }
    if quantized {
        let latent = p.clone();
        fake_quantize(c, &l, &latent, &mut p);
    }
    let tokens: Vec<u16> = [1u16, 5, 3, 9, 3, 10, 0, 4, 7].to_vec();
    let n = tokens.len() - 1;
    let mut acts = Acts::new(c, n);
    if quantized {
        acts.quantize_inputs = true;
        acts.offsets = Some(Vec::new());
    }
    let mut grad = vec![0.0f32; l.len];
    forward(c, &l, &p, &tokens[..n], &mut acts);
    if quantized {
        let log = acts.offsets.as_ref().unwrap();
        // conv gate, conv out / qkv, attn out; MLP in and down: per block.
        assert!(
            log.len() >= 3 * c.pattern.len(),
            "{} inputs quantized",
            log.len()
        );
        assert!(
            log.iter().all(|o| o.iter().any(|&v| v != 0.0)),
            "quantization changed nothing"
        );
        acts.replay = true;
    }
    let loss = backward(
        c,
        &l,
        &p,
        &tokens[..n],
        &tokens[1..],
        1.0,
        &mut acts,
        &mut grad,
    );
    let loss_again = total_loss(c, &l, &p, &tokens, &mut acts);
    assert!((loss - loss_again).abs() < 1e-9, "{loss} vs {loss_again}");

    // Central differences of an f32 loss: a step small enough that the
    // curvature term is negligible, with an absolute floor for the f32
    // rounding of the loss (≈ 1e-6 · |loss| / step).
    let eps = 3e-3f32;
    let mut worst = (0.0f64, String::new());
    let mut checked = 0;
    for t in &l.tensors {
        // Every parameter, or a stride through each tensor (always its first).
        let stride = if sample == usize::MAX {
            1
        } else {
            (t.len() / sample).max(1)
        };
        for i in t.range().step_by(stride) {
            checked += 1;
            let orig = p[i];
            p[i] = orig + eps;
            let up = total_loss(c, &l, &p, &tokens, &mut acts);
            p[i] = orig - eps;
            let down = total_loss(c, &l, &p, &tokens, &mut acts);
            p[i] = orig;
            let numeric = (up - down) / (2.0 * eps as f64);
            let analytic = grad[i] as f64;
            let err = (numeric - analytic).abs() / (0.1 + numeric.abs().max(analytic.abs()));
            if err > worst.0 {
                worst = (
                    err,
                    format!(
                        "{}[{}]: numeric {numeric:.6} analytic {analytic:.6}",
                        t.name,
                        i - t.offset
                    ),
                );
            }
        }
    }
    assert!(checked > 0);
    assert!(
        worst.0 < 1e-2,
        "worst relative error {:.4} at {}",
        worst.0,
        worst.1
    );
}

#[test]
fn gradients_match_finite_differences_token_codes() {
    let mut c = tiny("CA", 1, 5.0);
    c.token_code_bits = 64;
    c.token_code_seed = 3;
    check(&c);
}

/// Widths of whole TQ2_0 blocks, so inputs really are quantized.
fn ternary_net(block: usize) -> NetConfig {
    NetConfig {
        vocab: 11,
        d: 256,
        ffn: 256,
        pattern: config::parse_pattern("CA").unwrap(),
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 64,
        context: 16,
        conv_kernel: 3,
        softcap: 5.0,
        eps: 1e-5,
        rope_base: 100.0,
        weights: WeightFormat::Ternary { block },
        token_code_bits: 128,
        token_code_seed: 9,
    }
}

/// The straight-through estimator: the gradient the trainer applies to the
/// latent weights is the loss's gradient with respect to the ternary
/// weights, through inputs whose quantization is an added constant.
#[test]
fn straight_through_gradients_match_finite_differences() {
    let c = ternary_net(256);
    c.validate().unwrap();
    check_sampled(&c, 24, true);
}

#[test]
fn ternary_round_trip_is_absmean_ternary() {
    let c = ternary_net(0);
    let l = Layout::new(&c);
    let p = init_params(&c, &l, 5);
    let mut fq = vec![0.0; l.len];
    for block in [0, 256, 64] {
        let c = NetConfig {
            weights: WeightFormat::Ternary { block },
            ..c.clone()
        };
        fake_quantize(&c, &l, &p, &mut fq);
        for t in &l.tensors {
            let (src, dst) = (&p[t.range()], &fq[t.range()]);
            if !t.ternary {
                continue;
            }
            let run = if block == 0 { t.cols } else { block };
            for (s, d) in src.chunks_exact(run).zip(dst.chunks_exact(run)) {
                let mean = s.iter().map(|v| v.abs() as f64).sum::<f64>() / run as f64;
                let scale = half::f16::from_f32(mean as f32).to_f32();
                for (&w, &q) in s.iter().zip(d) {
                    let want = (w / scale).round().clamp(-1.0, 1.0) * scale;
                    assert_eq!(q, want, "{} block {block}", t.name);
                    assert!(q != 0.0 || q.is_sign_positive(), "a zero is +0");
                }
                assert!(d.iter().any(|&q| q != 0.0));
            }
        }
        // Edge matrices stay int8.
        assert!(l.tensors.iter().any(|t| t.matrix && !t.ternary));
    }
}

#[test]
fn gradients_match_finite_differences_conv_and_attention() {
    check(&tiny("CAC", 2, 5.0));
}

#[test]
fn gradients_match_finite_differences_one_kv_head_no_cap() {
    check(&tiny("AC", 1, 0.0));
}

#[test]
fn gradients_match_finite_differences_multi_head_attention() {
    check(&tiny("A", 4, 3.0));
}

#[test]
fn fake_quantize_is_what_quantize_row_gives() {
    let c = tiny("CA", 1, 5.0);
    let l = Layout::new(&c);
    let p = init_params(&c, &l, 3);
    let mut fq = vec![0.0; l.len];
    fake_quantize(&c, &l, &p, &mut fq);
    let mut q = vec![0i8; l.tensors.iter().map(|t| t.cols).max().unwrap()];
    for t in &l.tensors {
        if !t.matrix {
            assert_eq!(&fq[t.range()], &p[t.range()], "{}", t.name);
            continue;
        }
        for (r, row) in p[t.range()].chunks_exact(t.cols).enumerate() {
            let s = quantize_row(row, &mut q[..t.cols]);
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(q[..t.cols].iter().all(|&v| v != -128));
            assert!(
                q[..t.cols].iter().any(|&v| v.abs() == 127),
                "absmax maps to ±127"
            );
            for (j, &v) in row.iter().enumerate() {
                assert!((fq[t.offset + r * t.cols + j] - v).abs() <= amax / 254.0 * 1.0001);
            }
            assert_eq!(s, amax / 127.0);
        }
    }
    assert_eq!(quantize_row(&[0.0, 0.0], &mut q[..2]), 0.0);
}
