//! The forward pass for one token, llama2.c style: every buffer carries its
//! shape, the loop reads top to bottom.
//!
//! ```text
//! x = embed(token)
//! for each layer:
//!     xb = rmsnorm(x) · attn_norm
//!     q, k, v = Wq·xb (+bq), Wk·xb (+bk), Wv·xb (+bv)     qwen2 biases
//!     q, k = per-head rmsnorm(q), rmsnorm(k)             qwen3
//!     q, k = rope(q, pos), rope(k, pos)
//!     cache[layer][pos] = k, v                           f16
//!     per head h (kv head h / group): softmax(q·Kᵀ/√d)·V
//!     x += Wo·att
//!     xb = rmsnorm(x) · ffn_norm
//!     x += Wdown·(silu(Wgate·xb) ⊙ Wup·xb)
//! logits = Wout·(rmsnorm(x) · output_norm)
//! ```
//!
//! The matvecs run over the pool, and so do the attention heads once the
//! context is long enough to pay for it; the element-wise ops stay on the
//! calling thread. Each output element is
//! computed the same way whatever the thread count, so results do not
//! depend on it. All buffers are allocated in [`State::new`]; a token
//! allocates nothing.

use crate::config::ModelConfig;
use crate::weights::Weights;
use half::f16;
use kernels::matvec::{matvec, MatvecScratch, QMatrix};
use kernels::ops;
use kernels::pool::ThreadPool;
use kernels::quant::f16::{f16_to_f32_row, f32_to_f16_row};

/// Position from which attention is split over the pool's threads (below
/// it, one pool run per layer costs more than the attention itself).
const PARALLEL_ATTENTION_FROM: usize = 128;

/// Activations, KV cache and scratch for one sequence of up to `n_ctx`
/// tokens.
pub struct State {
    n_ctx: usize,
    x: Vec<f32>,           // (dim,) residual stream
    xb: Vec<f32>,          // (dim,) normed input of a block
    q: Vec<f32>,           // (q_dim,)
    k: Vec<f32>,           // (kv_dim,)
    v: Vec<f32>,           // (kv_dim,)
    att_out: Vec<f32>,     // (q_dim,) heads' weighted values
    proj: Vec<f32>,        // (dim,) output of Wo / Wdown
    heads: Vec<f32>, // (n_heads, n_ctx + 2·head_dim) per head: scores, output, a widened K/V row
    hb: Vec<f32>,    // (ffn_dim,) gate, then silu(gate)·up
    hb2: Vec<f32>,   // (ffn_dim,) up
    cos: Vec<f32>,   // (n_rot/2,)
    sin: Vec<f32>,   // (n_rot/2,)
    logits: Vec<f32>, // (vocab,)
    key_cache: Vec<f16>, // (n_layers, n_ctx, kv_dim)
    value_cache: Vec<f16>, // (n_layers, n_ctx, kv_dim)
    scratch: MatvecScratch,
}

impl State {
    /// Allocate everything for `n_ctx` positions (and size the matvec
    /// scratch for these weights, so the first token allocates nothing
    /// either).
    pub fn new(cfg: &ModelConfig, weights: &Weights<'_>, n_ctx: usize) -> State {
        let kv = cfg.n_layers * n_ctx * cfg.kv_dim();
        let mut s = State {
            n_ctx,
            x: vec![0.0; cfg.dim],
            xb: vec![0.0; cfg.dim],
            q: vec![0.0; cfg.q_dim()],
            k: vec![0.0; cfg.kv_dim()],
            v: vec![0.0; cfg.kv_dim()],
            att_out: vec![0.0; cfg.q_dim()],
            proj: vec![0.0; cfg.dim],
            heads: vec![0.0; cfg.n_heads * (n_ctx + 2 * cfg.head_dim)],
            hb: vec![0.0; cfg.ffn_dim],
            hb2: vec![0.0; cfg.ffn_dim],
            cos: vec![0.0; cfg.rope.n_rot / 2],
            sin: vec![0.0; cfg.rope.n_rot / 2],
            logits: vec![0.0; cfg.vocab_size],
            key_cache: vec![f16::ZERO; kv],
            value_cache: vec![f16::ZERO; kv],
            scratch: MatvecScratch::new(),
        };
        let widest = [cfg.dim, cfg.q_dim(), cfg.ffn_dim]
            .into_iter()
            .max()
            .unwrap_or(0);
        let zeros = vec![0.0; widest];
        let mut ms: Vec<&QMatrix<'_>> = vec![&weights.output];
        for l in &weights.layers {
            ms.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        }
        for m in ms {
            s.scratch.quantize(m, &zeros[..m.cols()]);
        }
        s
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// The logits of the last [`forward`] call.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// The same, for samplers that modify them in place.
    pub fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits
    }
}

/// Run `token` at position `pos` (all earlier positions must already be in
/// the cache) and return the logits for the next token, `(vocab,)`.
///
/// Panics if `pos >= n_ctx` or `token >= vocab_size` (callers check).
pub fn forward<'s>(
    cfg: &ModelConfig,
    w: &Weights<'_>,
    s: &'s mut State,
    pool: &ThreadPool,
    token: u32,
    pos: usize,
) -> &'s [f32] {
    let (dim, hd, kv_dim) = (cfg.dim, cfg.head_dim, cfg.kv_dim());
    let group = cfg.n_heads / cfg.n_kv_heads;
    assert!(
        pos < s.n_ctx,
        "position {pos} outside the context of {}",
        s.n_ctx
    );
    assert!(
        (token as usize) < cfg.vocab_size,
        "token {token} outside the vocabulary of {}",
        cfg.vocab_size
    );

    // x = embedding row of the token, (dim,)
    let emb = &w.token_embd;
    (emb.traits().to_float)(emb.row(token as usize), &mut s.x);

    // cos/sin of this position, shared by every layer and head.
    ops::rope_freqs(
        &cfg.rope,
        pos,
        w.rope_freqs.as_deref(),
        &mut s.cos,
        &mut s.sin,
    );
    let scale = 1.0 / (hd as f32).sqrt();

    for (li, l) in w.layers.iter().enumerate() {
        // --- attention ---
        ops::rmsnorm(&mut s.xb, &s.x, &l.attn_norm, cfg.norm_eps);
        matvec(pool, &l.wq, &s.xb, &mut s.q, &mut s.scratch); // (q_dim,)
        matvec(pool, &l.wk, &s.xb, &mut s.k, &mut s.scratch); // (kv_dim,)
        matvec(pool, &l.wv, &s.xb, &mut s.v, &mut s.scratch); // (kv_dim,)
        if let (Some(bq), Some(bk), Some(bv)) = (&l.bq, &l.bk, &l.bv) {
            ops::add_inplace(&mut s.q, bq);
            ops::add_inplace(&mut s.k, bk);
            ops::add_inplace(&mut s.v, bv);
        }
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            for h in s.q.chunks_exact_mut(hd) {
                ops::rmsnorm_inplace(h, qn, cfg.norm_eps);
            }
            for h in s.k.chunks_exact_mut(hd) {
                ops::rmsnorm_inplace(h, kn, cfg.norm_eps);
            }
        }
        for h in s.q.chunks_exact_mut(hd) {
            ops::rope(h, &s.cos, &s.sin, cfg.rope.layout);
        }
        for h in s.k.chunks_exact_mut(hd) {
            ops::rope(h, &s.cos, &s.sin, cfg.rope.layout);
        }

        // cache[li][pos] = k, v (f16)
        let layer_off = li * s.n_ctx * kv_dim;
        let row = layer_off + pos * kv_dim;
        f32_to_f16_row(&s.k, &mut s.key_cache[row..row + kv_dim]);
        f32_to_f16_row(&s.v, &mut s.value_cache[row..row + kv_dim]);

        // Per query head: scores over positions 0..=pos, softmax, weighted
        // sum of values. Query head h reads kv head h / group (GQA). Cached
        // rows are widened to f32 and dotted with the f32 query (rounding the
        // query to f16 too, as ggml's f16 path does, doubled the logit
        // difference to llama.cpp's f32-cache reference).
        let keys = &s.key_cache[layer_off..layer_off + (pos + 1) * kv_dim];
        let values = &s.value_cache[layer_off..layer_off + (pos + 1) * kv_dim];
        let q = &s.q;
        let stride = s.n_ctx + 2 * hd;
        // One head per chunk of `heads`: (scores, output, widened row).
        let head = |start: usize, buf: &mut [f32], _thread: usize| {
            let h = start / stride;
            let kvh = h / group;
            let q_h = &q[h * hd..(h + 1) * hd]; // (head_dim,)
            let (scores, rest) = buf.split_at_mut(s.n_ctx);
            let (out, row) = rest.split_at_mut(hd); // (head_dim,) each
            let att = &mut scores[..=pos]; // (pos + 1,)
            for (t, a) in att.iter_mut().enumerate() {
                let k_t = &keys[t * kv_dim + kvh * hd..t * kv_dim + (kvh + 1) * hd];
                f16_to_f32_row(k_t, row);
                *a = ops::dot(q_h, row) * scale;
            }
            ops::softmax(att);
            out.fill(0.0);
            for (t, &a) in att.iter().enumerate() {
                let v_t = &values[t * kv_dim + kvh * hd..t * kv_dim + (kvh + 1) * hd];
                f16_to_f32_row(v_t, row);
                ops::axpy(out, a, row);
            }
        };
        // Spread heads over the pool once the context makes it worth a run;
        // each head is computed the same way either way.
        if pool.n_threads() > 1 && pos >= PARALLEL_ATTENTION_FROM {
            pool.for_each_chunk_mut(&mut s.heads, stride, head);
        } else {
            for (h, buf) in s.heads.chunks_exact_mut(stride).enumerate() {
                head(h * stride, buf, 0);
            }
        }
        for (h, buf) in s.heads.chunks_exact(stride).enumerate() {
            s.att_out[h * hd..(h + 1) * hd].copy_from_slice(&buf[s.n_ctx..s.n_ctx + hd]);
        }
        matvec(pool, &l.wo, &s.att_out, &mut s.proj, &mut s.scratch); // (dim,)
        ops::add_inplace(&mut s.x, &s.proj);

        // --- MLP ---
        ops::rmsnorm(&mut s.xb, &s.x, &l.ffn_norm, cfg.norm_eps);
        matvec(pool, &l.w_gate, &s.xb, &mut s.hb, &mut s.scratch); // (ffn_dim,)
        matvec(pool, &l.w_up, &s.xb, &mut s.hb2, &mut s.scratch); // (ffn_dim,)
        ops::swiglu(&mut s.hb, &s.hb2);
        matvec(pool, &l.w_down, &s.hb, &mut s.proj, &mut s.scratch); // (dim,)
        ops::add_inplace(&mut s.x, &s.proj);
    }
    debug_assert_eq!(s.x.len(), dim);

    // logits = Wout · rmsnorm(x), (vocab,)
    ops::rmsnorm(&mut s.xb, &s.x, &w.output_norm, cfg.norm_eps);
    matvec(pool, &w.output, &s.xb, &mut s.logits, &mut s.scratch);
    &s.logits
}
