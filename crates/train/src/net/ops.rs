//! The trainer's building blocks, each a forward function and its
//! backward twin over row-major `f32` slices (`T` rows of one width).
//! Backward functions *add* into their gradient outputs, so a tensor used
//! twice (the tied embedding) collects both contributions.

/// `c = beta·c + a·b` for row-major views given by (row stride, column
/// stride), `a` m×k, `b` k×n, `c` m×n with row stride `ldc`.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    (a_rs, a_cs): (usize, usize),
    b: &[f32],
    (b_rs, b_cs): (usize, usize),
    accumulate: bool,
    c: &mut [f32],
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(0.0);
            }
        }
        return;
    }
    assert!(last(m, k, a_rs, a_cs) < a.len(), "gemm: a out of bounds");
    assert!(last(k, n, b_rs, b_cs) < b.len(), "gemm: b out of bounds");
    assert!(last(m, n, ldc, 1) < c.len(), "gemm: c out of bounds");
    // SAFETY: the three asserts above put every element the views address
    // inside its slice; `c` is borrowed mutably, so it aliases neither
    // input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// `y = x·Wᵀ`: `x` T×in, `w` out×in, `y` T×out.
pub fn linear(x: &[f32], w: &[f32], t: usize, n_in: usize, n_out: usize, y: &mut [f32]) {
    gemm(t, n_in, n_out, x, (n_in, 1), w, (1, n_in), false, y, n_out);
}

/// Backward of [`linear`]: `dx += dy·W`, `dw += dyᵀ·x`.
#[allow(clippy::too_many_arguments)]
pub fn linear_backward(
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    t: usize,
    n_in: usize,
    n_out: usize,
    dx: &mut [f32],
    dw: &mut [f32],
) {
    gemm(t, n_out, n_in, dy, (n_out, 1), w, (n_in, 1), true, dx, n_in);
    gemm(n_out, t, n_in, dy, (1, n_out), x, (n_in, 1), true, dw, n_in);
}

/// `y = x / sqrt(mean(x²) + eps) ⊙ w` per row; keeps `1/rms` per row.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32], rinv: &mut [f32]) {
    let d = w.len();
    for ((xr, yr), r) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).zip(rinv) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        *r = 1.0 / (ss + eps).sqrt();
        for ((yv, xv), wv) in yr.iter_mut().zip(xr).zip(w) {
            *yv = xv * *r * wv;
        }
    }
}

/// Backward of [`rmsnorm`]: `dx += …`, `dw += …`.
pub fn rmsnorm_backward(
    x: &[f32],
    w: &[f32],
    rinv: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    dw: &mut [f32],
) {
    let d = w.len();
    for (((xr, dyr), dxr), &r) in x
        .chunks_exact(d)
        .zip(dy.chunks_exact(d))
        .zip(dx.chunks_exact_mut(d))
        .zip(rinv)
    {
        let mut dot = 0.0f32;
        for i in 0..d {
            dot += dyr[i] * w[i] * xr[i];
            dw[i] += dyr[i] * xr[i] * r;
        }
        let k = dot * r * r * r / d as f32;
        for i in 0..d {
            dxr[i] += dyr[i] * w[i] * r - xr[i] * k;
        }
    }
}

pub fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

pub fn silu(z: f32) -> f32 {
    z * sigmoid(z)
}

/// `out = SiLU(a) ⊙ b`.
pub fn swiglu(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, &av), &bv) in out.iter_mut().zip(a).zip(b) {
        *o = silu(av) * bv;
    }
}

/// Backward of [`swiglu`]: writes (not adds) `da` and `db`.
pub fn swiglu_backward(a: &[f32], b: &[f32], dout: &[f32], da: &mut [f32], db: &mut [f32]) {
    for i in 0..a.len() {
        let s = sigmoid(a[i]);
        let sl = a[i] * s;
        db[i] = dout[i] * sl;
        da[i] = dout[i] * b[i] * s * (1.0 + a[i] * (1.0 - s));
    }
}

/// Causal depthwise convolution along time: `c[t][j] = Σ_k taps[j][k] ·
/// h[t-(K-1)+k][j]`, zero before the first row. `taps` is d×K.
pub fn causal_conv(h: &[f32], taps: &[f32], d: usize, kk: usize, c: &mut [f32]) {
    let t_len = h.len() / d;
    for t in 0..t_len {
        let cr = &mut c[t * d..(t + 1) * d];
        cr.fill(0.0);
        for k in 0..kk {
            let Some(src) = (t + k + 1).checked_sub(kk) else {
                continue;
            };
            let hr = &h[src * d..(src + 1) * d];
            for j in 0..d {
                cr[j] += taps[j * kk + k] * hr[j];
            }
        }
    }
}

/// Backward of [`causal_conv`]: `dh += …`, `dtaps += …`.
pub fn causal_conv_backward(
    h: &[f32],
    taps: &[f32],
    dc: &[f32],
    d: usize,
    kk: usize,
    dh: &mut [f32],
    dtaps: &mut [f32],
) {
    let t_len = h.len() / d;
    for t in 0..t_len {
        let dcr = &dc[t * d..(t + 1) * d];
        for k in 0..kk {
            let Some(src) = (t + k + 1).checked_sub(kk) else {
                continue;
            };
            for j in 0..d {
                dh[src * d + j] += taps[j * kk + k] * dcr[j];
                dtaps[j * kk + k] += h[src * d + j] * dcr[j];
            }
        }
    }
}

/// RoPE angles' (cos, sin) for positions `0..t_len`, pairs `i < hd/2`:
/// `pos · base^(-2i/hd)`, computed in f64 so the table is exact to f32.
pub fn rope_table(t_len: usize, hd: usize, base: f32) -> Vec<(f32, f32)> {
    let half = hd / 2;
    let mut table = Vec::with_capacity(t_len * half);
    for pos in 0..t_len {
        for i in 0..half {
            let freq = (base as f64).powf(-2.0 * i as f64 / hd as f64);
            let a = pos as f64 * freq;
            table.push((a.cos() as f32, a.sin() as f32));
        }
    }
    table
}

/// Rotate-half RoPE in place on `n_heads` heads of width `hd` starting at
/// column `col0` of rows of width `width`; `inverse` rotates back (the
/// backward pass of a rotation is its inverse).
pub fn rope(
    rows: &mut [f32],
    width: usize,
    col0: usize,
    n_heads: usize,
    hd: usize,
    table: &[(f32, f32)],
    inverse: bool,
) {
    let half = hd / 2;
    for (t, row) in rows.chunks_exact_mut(width).enumerate() {
        for h in 0..n_heads {
            let head = &mut row[col0 + h * hd..col0 + (h + 1) * hd];
            for i in 0..half {
                let (c, mut s) = table[t * half + i];
                if inverse {
                    s = -s;
                }
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c - b * s;
                head[i + half] = a * s + b * c;
            }
        }
    }
}

/// Shapes of one attention layer's rows: `qkv` rows hold q (all heads),
/// then k, then v, for `t` positions.
#[derive(Clone, Copy)]
pub struct AttnShape {
    pub t: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub hd: usize,
}

impl AttnShape {
    pub fn width(&self) -> usize {
        (self.n_heads + 2 * self.n_kv_heads) * self.hd
    }
    fn q_col(&self, h: usize) -> usize {
        h * self.hd
    }
    fn k_col(&self, h: usize) -> usize {
        let group = self.n_heads / self.n_kv_heads;
        (self.n_heads + h / group) * self.hd
    }
    fn v_col(&self, h: usize) -> usize {
        let group = self.n_heads / self.n_kv_heads;
        (self.n_heads + self.n_kv_heads + h / group) * self.hd
    }
}

/// Causal softmax attention. `probs` (n_heads × t × t) keeps each head's
/// probabilities for the backward pass; `out` is t × (n_heads·hd).
pub fn attention(qkv: &[f32], s: AttnShape, probs: &mut [f32], out: &mut [f32]) {
    let (t, hd, w) = (s.t, s.hd, s.width());
    let scale = 1.0 / (hd as f32).sqrt();
    let od = s.n_heads * hd;
    for h in 0..s.n_heads {
        let p = &mut probs[h * t * t..(h + 1) * t * t];
        let (q, k, v) = (&qkv[s.q_col(h)..], &qkv[s.k_col(h)..], &qkv[s.v_col(h)..]);
        gemm(t, hd, t, q, (w, 1), k, (1, w), false, p, t);
        for i in 0..t {
            let row = &mut p[i * t..(i + 1) * t];
            let mut max = f32::NEG_INFINITY;
            for v in &mut row[..=i] {
                *v *= scale;
                max = max.max(*v);
            }
            let mut sum = 0.0;
            for v in &mut row[..=i] {
                *v = (*v - max).exp();
                sum += *v;
            }
            let inv = 1.0 / sum;
            for v in &mut row[..=i] {
                *v *= inv;
            }
            row[i + 1..].fill(0.0);
        }
        gemm(
            t,
            t,
            hd,
            p,
            (t, 1),
            v,
            (w, 1),
            false,
            &mut out[h * hd..],
            od,
        );
    }
}

/// Backward of [`attention`]: `dqkv += …` (gradients of the q/k/v rows as
/// they entered, i.e. after RoPE). `scratch` holds t × t.
pub fn attention_backward(
    qkv: &[f32],
    s: AttnShape,
    probs: &[f32],
    dout: &[f32],
    dqkv: &mut [f32],
    scratch: &mut [f32],
) {
    let (t, hd, w) = (s.t, s.hd, s.width());
    let scale = 1.0 / (hd as f32).sqrt();
    let od = s.n_heads * hd;
    for h in 0..s.n_heads {
        let p = &probs[h * t * t..(h + 1) * t * t];
        let dh = &dout[h * hd..];
        // dP = dO · Vᵀ
        gemm(
            t,
            hd,
            t,
            dh,
            (od, 1),
            &qkv[s.v_col(h)..],
            (1, w),
            false,
            scratch,
            t,
        );
        // dV += Pᵀ · dO
        gemm(
            t,
            t,
            hd,
            p,
            (1, t),
            dh,
            (od, 1),
            true,
            &mut dqkv[s.v_col(h)..],
            w,
        );
        // dS = P ⊙ (dP − Σ dP⊙P), times the score scale
        for i in 0..t {
            let pr = &p[i * t..(i + 1) * t];
            let dr = &mut scratch[i * t..(i + 1) * t];
            let dot: f32 = pr[..=i].iter().zip(&dr[..=i]).map(|(a, b)| a * b).sum();
            for j in 0..=i {
                dr[j] = pr[j] * (dr[j] - dot) * scale;
            }
            dr[i + 1..].fill(0.0);
        }
        // dQ += dS · K ; dK += dSᵀ · Q
        gemm(
            t,
            t,
            hd,
            scratch,
            (t, 1),
            &qkv[s.k_col(h)..],
            (w, 1),
            true,
            &mut dqkv[s.q_col(h)..],
            w,
        );
        gemm(
            t,
            t,
            hd,
            scratch,
            (1, t),
            &qkv[s.q_col(h)..],
            (w, 1),
            true,
            &mut dqkv[s.k_col(h)..],
            w,
        );
    }
}

/// Soft cap `cap·tanh(z/cap)` in place (no-op for cap ≤ 0).
pub fn softcap(z: &mut [f32], cap: f32) {
    if cap > 0.0 {
        for v in z {
            *v = cap * (*v / cap).tanh();
        }
    }
}

/// Cross-entropy of capped logits (rows of width `vocab`, already capped
/// by [`softcap`]) against `targets`; replaces the logits by the gradient
/// of `scale · Σ loss` with respect to the *uncapped* logits. Returns
/// `Σ loss` (natural log) in f64.
pub fn cross_entropy_backward(
    logits: &mut [f32],
    targets: &[u16],
    vocab: usize,
    cap: f32,
    scale: f32,
) -> f64 {
    let mut total = 0.0f64;
    for (row, &tgt) in logits.chunks_exact_mut(vocab).zip(targets) {
        let (lse, _) = log_sum_exp(row);
        total += lse - row[tgt as usize] as f64;
        for (j, v) in row.iter_mut().enumerate() {
            let capped = *v;
            let p = ((capped as f64) - lse).exp() as f32;
            let mut g = p - if j == tgt as usize { 1.0 } else { 0.0 };
            if cap > 0.0 {
                let th = capped / cap;
                g *= 1.0 - th * th;
            }
            *v = g * scale;
        }
    }
    total
}

/// `(log Σ exp(row), argmax)`, the sum in f64.
pub fn log_sum_exp(row: &[f32]) -> (f64, usize) {
    let mut best = 0;
    for (j, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = j;
        }
    }
    let max = row[best] as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    (max + sum.ln(), best)
}
