//! Forward and backward pass over one sequence, with every activation the
//! backward pass needs kept in [`Acts`] (allocated once per worker for the
//! longest sequence, reused every step).

use super::config::{BlockKind, Layout, NetConfig};
use super::ops::{self, AttnShape};

/// One block's saved activations (`t` rows each).
#[derive(Default)]
struct BlockActs {
    x_in: Vec<f32>,  // t×d residual entering the block
    h: Vec<f32>,     // t×d normed
    hq: Vec<f32>,    // t×d h as the conv gate's quantized input (ternary QAT)
    rinv1: Vec<f32>, // t
    // conv
    g: Vec<f32>, // t×d gate pre-activation
    c: Vec<f32>, // t×d conv output
    u: Vec<f32>, // t×d SiLU(g)⊙c
    // attention
    qkv: Vec<f32>,   // t×qkv (q, k after RoPE)
    probs: Vec<f32>, // heads×t×t
    ao: Vec<f32>,    // t×q_dim
    // MLP
    x_mid: Vec<f32>, // t×d
    h2: Vec<f32>,
    rinv2: Vec<f32>,
    a: Vec<f32>, // t×f gate
    b: Vec<f32>, // t×f up
    m: Vec<f32>, // t×f SiLU(a)⊙b
}

/// Activations and scratch for sequences up to `max_t` tokens.
pub struct Acts {
    max_t: usize,
    t: usize,
    /// Quantize the inputs of ternary matrices as the runtime does (Q8_K,
    /// straight-through gradient): on with fake-quantized weights.
    pub quantize_inputs: bool,
    /// Quantize them as a Q8_K pair (the runtime's ~15-bit form,
    /// [`super::q8k_pair_round_trip`]) instead of one Q8_K round trip (what
    /// training uses).
    pub input_pairs: bool,
    /// For the gradient checks: record what quantization added to each
    /// input (`Some(empty)`), or add recorded offsets instead of
    /// quantizing (`Some(full)` with `replay`), which makes the
    /// straight-through estimator's surrogate `x + const` differentiable.
    pub offsets: Option<Vec<Vec<f32>>>,
    pub replay: bool,
    codes: Vec<f32>,  // t×bits: the tokens' ±1 codes
    dcodes: Vec<f32>, // t×bits: scratch (their gradient is not used)
    blocks: Vec<BlockActs>,
    x: Vec<f32>,       // t×d residual
    x_final: Vec<f32>, // t×d
    hf: Vec<f32>,
    rinvf: Vec<f32>,
    /// t×vocab: capped logits after [`forward`], their gradient after
    /// [`backward`] starts.
    pub logits: Vec<f32>,
    rope: Vec<(f32, f32)>,
    // backward scratch
    dx: Vec<f32>,
    dh: Vec<f32>,
    dmix: Vec<f32>, // t×max(d, qkv)
    dmix2: Vec<f32>,
    df1: Vec<f32>, // t×max(f, d)
    df2: Vec<f32>,
    df3: Vec<f32>,
    dtt: Vec<f32>, // t×t
}

impl Acts {
    pub fn new(c: &NetConfig, max_t: usize) -> Acts {
        let (d, f, t) = (c.d, c.ffn, max_t);
        let z = |n: usize| vec![0.0f32; n];
        let blocks = c
            .pattern
            .iter()
            .map(|k| {
                let conv = *k == BlockKind::Conv;
                let attn = !conv;
                BlockActs {
                    x_in: z(t * d),
                    h: z(t * d),
                    hq: z(if conv && c.weights.is_ternary() {
                        t * d
                    } else {
                        0
                    }),
                    rinv1: z(t),
                    g: z(if conv { t * d } else { 0 }),
                    c: z(if conv { t * d } else { 0 }),
                    u: z(if conv { t * d } else { 0 }),
                    qkv: z(if attn { t * c.qkv_dim() } else { 0 }),
                    probs: z(if attn { c.n_heads * t * t } else { 0 }),
                    ao: z(if attn { t * c.q_dim() } else { 0 }),
                    x_mid: z(t * d),
                    h2: z(t * d),
                    rinv2: z(t),
                    a: z(t * f),
                    b: z(t * f),
                    m: z(t * f),
                }
            })
            .collect();
        let wide = d.max(c.qkv_dim()).max(c.q_dim());
        let bits = c.token_code_bits;
        Acts {
            max_t,
            t: 0,
            quantize_inputs: false,
            input_pairs: false,
            offsets: None,
            replay: false,
            codes: z(t * bits),
            dcodes: z(t * bits),
            blocks,
            x: z(t * d),
            x_final: z(t * d),
            hf: z(t * d),
            rinvf: z(t),
            logits: z(t * c.vocab),
            rope: ops::rope_table(t, c.head_dim, c.rope_base),
            dx: z(t * d),
            dh: z(t * d),
            dmix: z(t * wide),
            dmix2: z(t * wide),
            df1: z(t * f.max(d)),
            df2: z(t * f.max(d)),
            df3: z(t * f.max(d)),
            dtt: z(t * t),
        }
    }

    pub fn max_t(&self) -> usize {
        self.max_t
    }
}

/// Run the network over `tokens`; leaves the capped logits (t × vocab) in
/// `acts.logits`.
pub fn forward(c: &NetConfig, l: &Layout, p: &[f32], tokens: &[u16], acts: &mut Acts) {
    let t = tokens.len();
    assert!(
        t <= acts.max_t,
        "sequence of {t} longer than the buffers ({})",
        acts.max_t
    );
    acts.t = t;
    let (d, f) = (c.d, c.ffn);
    let embd = l.get(p, l.embd);
    if l.code_bits > 0 {
        // x = P · code(token), one product for the whole sequence.
        let bits = l.code_bits;
        for (row, &tok) in acts.codes[..t * bits].chunks_exact_mut(bits).zip(tokens) {
            model::token_codes::code_signs(c.token_code_seed, tok as u32, row);
        }
        ops::linear(
            &acts.codes[..t * bits],
            embd,
            t,
            bits,
            d,
            &mut acts.x[..t * d],
        );
    } else {
        for (row, &tok) in acts.x[..t * d].chunks_exact_mut(d).zip(tokens) {
            row.copy_from_slice(&embd[tok as usize * d..(tok as usize + 1) * d]);
        }
    }
    // Inputs of ternary matrices as the runtime quantizes them.
    let qin = acts.quantize_inputs && c.weights.is_ternary();
    let mut site = 0;
    let offsets = &mut acts.offsets;
    let replay = acts.replay;
    let round_trip = if acts.input_pairs {
        super::q8k_pair_round_trip
    } else {
        super::q8k_round_trip
    };
    let mut quant = |x: &mut [f32]| {
        if !qin {
            return;
        }
        match offsets {
            Some(log) if replay => {
                for (v, o) in x.iter_mut().zip(&log[site]) {
                    *v += o;
                }
            }
            Some(log) => {
                let before = x.to_vec();
                round_trip(x);
                log.push(x.iter().zip(&before).map(|(q, v)| q - v).collect());
            }
            None => round_trip(x),
        }
        site += 1;
    };
    let td = t * d;
    for (bp, ba) in l.blocks.iter().zip(&mut acts.blocks) {
        ba.x_in[..td].copy_from_slice(&acts.x[..td]);
        ops::rmsnorm(
            &acts.x[..td],
            l.get(p, bp.attn_norm),
            c.eps,
            &mut ba.h[..td],
            &mut ba.rinv1[..t],
        );
        // The mixer's output lands in `dh` (free in the forward pass).
        let mixed = &mut acts.dh[..td];
        match bp.kind {
            BlockKind::Conv => {
                let [gate, taps, out] = bp.mix;
                // The convolution reads h unquantized; the gate's input may be.
                let gate_in = if qin {
                    ba.hq[..td].copy_from_slice(&ba.h[..td]);
                    quant(&mut ba.hq[..td]);
                    &ba.hq[..td]
                } else {
                    &ba.h[..td]
                };
                ops::linear(gate_in, l.get(p, gate), t, d, d, &mut ba.g[..td]);
                ops::causal_conv(
                    &ba.h[..td],
                    l.get(p, taps),
                    d,
                    c.conv_kernel,
                    &mut ba.c[..td],
                );
                ops::swiglu(&ba.g[..td], &ba.c[..td], &mut ba.u[..td]);
                quant(&mut ba.u[..td]);
                ops::linear(&ba.u[..td], l.get(p, out), t, d, d, mixed);
            }
            BlockKind::Attn => {
                let [qkv_w, out, _] = bp.mix;
                let s = shape(c, t);
                let w = s.width();
                let qkv = &mut ba.qkv[..t * w];
                quant(&mut ba.h[..td]); // only the qkv product reads h here
                ops::linear(&ba.h[..td], l.get(p, qkv_w), t, d, w, qkv);
                ops::rope(qkv, w, 0, c.n_heads, c.head_dim, &acts.rope, false);
                ops::rope(
                    qkv,
                    w,
                    c.q_dim(),
                    c.n_kv_heads,
                    c.head_dim,
                    &acts.rope,
                    false,
                );
                let probs = &mut ba.probs[..c.n_heads * t * t];
                // probs is laid out heads × t × t for this t.
                ops::attention(qkv, s, probs, &mut ba.ao[..t * c.q_dim()]);
                quant(&mut ba.ao[..t * c.q_dim()]);
                ops::linear(
                    &ba.ao[..t * c.q_dim()],
                    l.get(p, out),
                    t,
                    c.q_dim(),
                    d,
                    mixed,
                );
            }
        }
        for (xv, mv) in acts.x[..td].iter_mut().zip(mixed.iter()) {
            *xv += mv;
        }
        ba.x_mid[..td].copy_from_slice(&acts.x[..td]);
        ops::rmsnorm(
            &acts.x[..td],
            l.get(p, bp.ffn_norm),
            c.eps,
            &mut ba.h2[..td],
            &mut ba.rinv2[..t],
        );
        quant(&mut ba.h2[..td]);
        let tf = t * f;
        ops::linear(
            &ba.h2[..td],
            l.get(p, bp.ffn_gate),
            t,
            d,
            f,
            &mut ba.a[..tf],
        );
        ops::linear(&ba.h2[..td], l.get(p, bp.ffn_up), t, d, f, &mut ba.b[..tf]);
        ops::swiglu(&ba.a[..tf], &ba.b[..tf], &mut ba.m[..tf]);
        quant(&mut ba.m[..tf]);
        let down = &mut acts.dh[..td];
        ops::linear(&ba.m[..tf], l.get(p, bp.ffn_down), t, f, d, down);
        for (xv, mv) in acts.x[..td].iter_mut().zip(down.iter()) {
            *xv += mv;
        }
    }
    acts.x_final[..td].copy_from_slice(&acts.x[..td]);
    ops::rmsnorm(
        &acts.x[..td],
        l.get(p, l.output_norm),
        c.eps,
        &mut acts.hf[..td],
        &mut acts.rinvf[..t],
    );
    let logits = &mut acts.logits[..t * c.vocab];
    ops::linear(&acts.hf[..td], l.get(p, l.head), t, d, c.vocab, logits);
    ops::softcap(logits, c.softcap);
}

fn shape(c: &NetConfig, t: usize) -> AttnShape {
    AttnShape {
        t,
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        hd: c.head_dim,
    }
}

/// Cross-entropy of the logits [`forward`] left against `targets` (one
/// per token), then the backward pass: adds `scale · ∂Σloss/∂p` into
/// `grad`. Returns `Σ loss` over the sequence.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    c: &NetConfig,
    l: &Layout,
    p: &[f32],
    tokens: &[u16],
    targets: &[u16],
    scale: f32,
    acts: &mut Acts,
    grad: &mut [f32],
) -> f64 {
    let t = acts.t;
    assert_eq!(
        tokens.len(),
        t,
        "backward: tokens differ from the forward pass"
    );
    assert_eq!(targets.len(), t, "backward: one target per token");
    let (d, f) = (c.d, c.ffn);
    let td = t * d;
    let qin = acts.quantize_inputs && c.weights.is_ternary();
    let loss = ops::cross_entropy_backward(
        &mut acts.logits[..t * c.vocab],
        targets,
        c.vocab,
        c.softcap,
        scale,
    );
    let embd_range = l.tensors[l.embd].range();
    let head_range = l.tensors[l.head].range();
    // Output head (the embedding when tied): dhf = dz·H, dH += dzᵀ·hf.
    let dhf = &mut acts.dh[..td];
    dhf.fill(0.0);
    ops::linear_backward(
        &acts.hf[..td],
        &p[head_range.clone()],
        &acts.logits[..t * c.vocab],
        t,
        d,
        c.vocab,
        dhf,
        &mut grad[head_range],
    );
    let dx = &mut acts.dx[..td];
    dx.fill(0.0);
    let on = l.tensors[l.output_norm].range();
    {
        let (gp, gr) = (&p[on.clone()], &mut grad[on]);
        ops::rmsnorm_backward(&acts.x_final[..td], gp, &acts.rinvf[..t], dhf, dx, gr);
    }
    for (bp, ba) in l.blocks.iter().zip(&acts.blocks).rev() {
        // MLP: x_out = x_mid + m·W3ᵀ; dx carries ∂/∂x_out.
        let tf = t * f;
        let dm = &mut acts.df3[..tf];
        dm.fill(0.0);
        let r = l.tensors[bp.ffn_down].range();
        ops::linear_backward(&ba.m[..tf], &p[r.clone()], dx, t, f, d, dm, &mut grad[r]);
        let (da, db) = (&mut acts.df1[..tf], &mut acts.df2[..tf]);
        ops::swiglu_backward(&ba.a[..tf], &ba.b[..tf], dm, da, db);
        let dh2 = &mut acts.dh[..td];
        dh2.fill(0.0);
        let r = l.tensors[bp.ffn_gate].range();
        ops::linear_backward(&ba.h2[..td], &p[r.clone()], da, t, d, f, dh2, &mut grad[r]);
        let r = l.tensors[bp.ffn_up].range();
        ops::linear_backward(&ba.h2[..td], &p[r.clone()], db, t, d, f, dh2, &mut grad[r]);
        let r = l.tensors[bp.ffn_norm].range();
        ops::rmsnorm_backward(
            &ba.x_mid[..td],
            &p[r.clone()],
            &ba.rinv2[..t],
            dh2,
            dx,
            &mut grad[r],
        );

        // Mixer: x_mid = x_in + mix(h).
        let dh = &mut acts.dh[..td];
        dh.fill(0.0);
        match bp.kind {
            BlockKind::Conv => {
                let [gate, taps, out] = bp.mix;
                let du = &mut acts.dmix[..td];
                du.fill(0.0);
                let r = l.tensors[out].range();
                ops::linear_backward(&ba.u[..td], &p[r.clone()], dx, t, d, d, du, &mut grad[r]);
                let (dg, dc) = (&mut acts.dmix2[..td], &mut acts.df1[..td]);
                ops::swiglu_backward(&ba.g[..td], &ba.c[..td], du, dg, dc);
                let r = l.tensors[gate].range();
                // The gate read the quantized copy of h when there was one.
                let gate_in = if qin { &ba.hq[..td] } else { &ba.h[..td] };
                ops::linear_backward(gate_in, &p[r.clone()], dg, t, d, d, dh, &mut grad[r]);
                let r = l.tensors[taps].range();
                ops::causal_conv_backward(
                    &ba.h[..td],
                    &p[r.clone()],
                    dc,
                    d,
                    c.conv_kernel,
                    dh,
                    &mut grad[r],
                );
            }
            BlockKind::Attn => {
                let [qkv_w, out, _] = bp.mix;
                let s = shape(c, t);
                let (w, qd) = (s.width(), c.q_dim());
                let dao = &mut acts.dmix[..t * qd];
                dao.fill(0.0);
                let r = l.tensors[out].range();
                ops::linear_backward(
                    &ba.ao[..t * qd],
                    &p[r.clone()],
                    dx,
                    t,
                    qd,
                    d,
                    dao,
                    &mut grad[r],
                );
                let dqkv = &mut acts.dmix2[..t * w];
                dqkv.fill(0.0);
                ops::attention_backward(
                    &ba.qkv[..t * w],
                    s,
                    &ba.probs[..c.n_heads * t * t],
                    dao,
                    dqkv,
                    &mut acts.dtt[..t * t],
                );
                ops::rope(dqkv, w, 0, c.n_heads, c.head_dim, &acts.rope, true);
                ops::rope(dqkv, w, qd, c.n_kv_heads, c.head_dim, &acts.rope, true);
                let r = l.tensors[qkv_w].range();
                ops::linear_backward(&ba.h[..td], &p[r.clone()], dqkv, t, d, w, dh, &mut grad[r]);
            }
        }
        let r = l.tensors[bp.attn_norm].range();
        ops::rmsnorm_backward(
            &ba.x_in[..td],
            &p[r.clone()],
            &ba.rinv1[..t],
            dh,
            dx,
            &mut grad[r],
        );
    }
    if l.code_bits > 0 {
        // x = P · code: dP += dxᵀ · codes.
        let bits = l.code_bits;
        let (ge, pe) = (&mut grad[embd_range.clone()], &p[embd_range]);
        let dcodes = &mut acts.dcodes[..t * bits];
        ops::linear_backward(&acts.codes[..t * bits], pe, dx, t, bits, d, dcodes, ge);
        return loss;
    }
    // Embedding lookup.
    let ge = &mut grad[embd_range];
    for (row, &tok) in dx.chunks_exact(d).zip(tokens) {
        let dst = &mut ge[tok as usize * d..(tok as usize + 1) * d];
        for (g, v) in dst.iter_mut().zip(row) {
            *g += v;
        }
    }
    loss
}
