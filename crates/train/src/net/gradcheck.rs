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
    }
}

fn total_loss(c: &NetConfig, l: &Layout, p: &[f32], tokens: &[u16], acts: &mut Acts) -> f64 {
    score(c, l, p, tokens, acts)
        .iter()
        .map(|(nll, _)| nll)
        .sum()
}

fn check(c: &NetConfig) {
    let l = Layout::new(c);
    // Larger weights than training's init, so every path carries signal.
    let mut p = init_params(c, &l, 7);
    let mut rng = Rng::new(99);
    for t in &l.tensors {
        for v in &mut p[t.range()] {
            *v = if t.name.ends_with("_norm") {
                1.0 + 0.3 * normal(&mut rng)
            } else {
                0.25 * normal(&mut rng)
            };
        }
    }
    let tokens: Vec<u16> = [1u16, 5, 3, 9, 3, 10, 0, 4, 7].to_vec();
    let n = tokens.len() - 1;
    let mut acts = Acts::new(c, n);
    let mut grad = vec![0.0f32; l.len];
    forward(c, &l, &p, &tokens[..n], &mut acts);
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
    for t in &l.tensors {
        for i in t.range() {
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
    assert!(
        worst.0 < 1e-2,
        "worst relative error {:.4} at {}",
        worst.0,
        worst.1
    );
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
    fake_quantize(&l, &p, &mut fq);
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
