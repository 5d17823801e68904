//! The forward pass, llama2.c style: every buffer carries its shape, the
//! loop reads top to bottom. A call takes a batch of `n` tokens at
//! consecutive positions (prefill) or one (decode); every row below is
//! `(n, ·)`.
//!
//! ```text
//! x = embed(tokens)                                       (n, dim)
//! for each layer:
//!     xb = rmsnorm(x) · attn_norm
//!     q, k, v = xb·Wqᵀ (+bq), xb·Wkᵀ (+bk), xb·Wvᵀ (+bv)    qwen2 biases
//!     q, k = per-head rmsnorm(q), rmsnorm(k)              qwen3
//!     q, k = rope(q, pos), rope(k, pos)
//!     cache[layer][pos] = k, v                            f16 or q8_0
//!     per token t, head h (kv head h / group):
//!         softmax(q·Kᵀ/√d over positions ≤ pos_t)·V
//!     x += att·Woᵀ
//!     xb = rmsnorm(x) · ffn_norm
//!     x += (silu(xb·Wgateᵀ) ⊙ xb·Wupᵀ)·Wdownᵀ
//! logits = (rmsnorm(x) · output_norm)·Woutᵀ               last row, or all
//! ```
//!
//! The matrix products run over the pool ([`kernels::matmul`]: a weight row
//! is loaded once per batch), and so do the attention heads once there is
//! enough work; element-wise ops stay on the calling thread. Every output
//! element is computed the same way whatever the batch size or thread count,
//! so a prompt evaluated in one batch gives bit-identical logits to one
//! token at a time. All buffers are allocated in [`State::new`]; a call
//! allocates nothing.
//!
//! [`State`] and the public `forward*` functions serve every architecture:
//! a `State` wraps the state of the architecture its weights belong to, and
//! [`forward_tokens`] dispatches on the [`Weights`] variant, to the llama
//! pass below or to [`crate::cachefit`]'s. The batch checks (token, sequence
//! and position ranges, logit rows) are shared, so both fail the same way.

use crate::cachefit::{attention, CachefitState};
use crate::config::ModelConfig;
use crate::kv_cache::{Columns, KvCache, KvType};
use crate::weights::{LlamaWeights, Weights};
use crate::Error;
use kernels::matmul::{matmul, matmul_each, MatmulScratch};
use kernels::matrix::QMatrix;
use kernels::ops;
use kernels::pool::ThreadPool;
use kernels::vecops;

/// Attention work (token-heads × positions) from which it is split over the
/// pool's threads; below it, a pool run per layer costs more than the work.
const PARALLEL_ATTENTION_FROM: usize = 128 * 9;

/// Cached positions from which widening K and V is split over the pool.
const PARALLEL_WIDEN_FROM: usize = 512;

/// Tokens per forward call when not set: enough that a weight row loaded
/// from memory serves many tokens, few enough that the activations stay in
/// L2.
pub const DEFAULT_BATCH: usize = 32;

/// How a [`State`] is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateOptions {
    /// Positions the KV cache holds.
    pub n_ctx: usize,
    /// Most tokens per [`forward_batch`] call.
    pub n_batch: usize,
    pub kv_type: KvType,
    /// Keep logits for every token of a batch ([`Logits::All`]), not just
    /// the last (perplexity needs them; generation does not).
    pub all_logits: bool,
    /// Sequences (server slots), each with its own KV cache of `n_ctx`
    /// positions, that one [`forward_tokens`] call may mix.
    pub n_seq: usize,
}

impl StateOptions {
    pub fn new(n_ctx: usize) -> StateOptions {
        StateOptions {
            n_ctx,
            n_batch: DEFAULT_BATCH,
            kv_type: KvType::F16,
            all_logits: false,
            n_seq: 1,
        }
    }

    /// Rows of logits a call can return.
    pub(crate) fn logit_rows(&self) -> usize {
        if self.all_logits {
            self.n_batch.max(1)
        } else {
            self.n_seq.max(1).min(self.n_batch.max(1))
        }
    }
}

/// One token of a [`forward_tokens`] batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    pub id: u32,
    /// Which sequence's KV cache it belongs to.
    pub seq: usize,
    /// Its position in that sequence.
    pub pos: usize,
    /// Return the logits that follow it.
    pub logits: bool,
}

/// Which logits a [`forward_batch`] call computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// The last token's, `(vocab,)`.
    Last,
    /// Every token's, `(n, vocab)` (needs [`StateOptions::all_logits`]).
    All,
}

/// Activations, caches and scratch for up to `n_seq` sequences of up to
/// `n_ctx` tokens each, evaluated in batches of up to `n_batch`, for the
/// architecture of the weights it was made for.
pub struct State {
    inner: StateKind,
}

enum StateKind {
    Llama(Box<LlamaState>),
    Cachefit(Box<CachefitState>),
}

/// Forward a call to the architecture's state.
macro_rules! each {
    ($s:expr, $st:ident => $e:expr) => {
        match $s {
            StateKind::Llama($st) => $e,
            StateKind::Cachefit($st) => $e,
        }
    };
}

impl State {
    /// An f16 cache of `n_ctx` positions, batches of [`DEFAULT_BATCH`].
    ///
    /// Panics only if the f16 cache cannot be laid out, which it always can.
    pub fn new(cfg: &ModelConfig, weights: &Weights<'_>, n_ctx: usize) -> State {
        State::with_options(cfg, weights, &StateOptions::new(n_ctx))
            .expect("an f16 cache fits any head size")
    }

    /// Allocate everything (and size the scratch for these weights, so the
    /// first call allocates nothing either). Errors if the cache type cannot
    /// store this model's heads.
    pub fn with_options(
        cfg: &ModelConfig,
        weights: &Weights<'_>,
        o: &StateOptions,
    ) -> Result<State, Error> {
        let inner = match weights {
            Weights::Llama(w) => StateKind::Llama(Box::new(LlamaState::with_options(cfg, w, o)?)),
            Weights::Cachefit(w) => {
                StateKind::Cachefit(Box::new(CachefitState::with_options(cfg, w, o)?))
            }
        };
        Ok(State { inner })
    }

    pub fn n_ctx(&self) -> usize {
        each!(&self.inner, s => s.n_ctx())
    }

    pub fn n_batch(&self) -> usize {
        each!(&self.inner, s => s.n_batch())
    }

    pub fn n_seq(&self) -> usize {
        each!(&self.inner, s => s.n_seq())
    }

    pub fn kv_type(&self) -> KvType {
        each!(&self.inner, s => s.kv_type())
    }

    /// Bytes of the per-sequence caches (KV, and a cachefit model's
    /// convolution inputs).
    pub fn kv_bytes(&self) -> usize {
        each!(&self.inner, s => s.kv_bytes())
    }

    /// The logits of the last call: `(vocab,)` after [`Logits::Last`],
    /// `(n, vocab)` after [`Logits::All`], one row per token that asked
    /// after [`forward_tokens`].
    pub fn logits(&self) -> &[f32] {
        each!(&self.inner, s => s.logits())
    }

    /// The same, for samplers that modify them in place.
    pub fn logits_mut(&mut self) -> &mut [f32] {
        each!(&mut self.inner, s => s.logits_mut())
    }
}

/// Activations, KV cache and scratch of the llama family.
pub(crate) struct LlamaState {
    n_ctx: usize,
    n_batch: usize,
    x: Vec<f32>,          // (n_batch, dim) residual stream
    xb: Vec<f32>,         // (n_batch, dim) normed input of a block
    q: Vec<f32>,          // (n_batch, q_dim)
    k: Vec<f32>,          // (n_batch, kv_dim)
    v: Vec<f32>,          // (n_batch, kv_dim)
    att_out: Vec<f32>,    // (n_batch, q_dim) heads' weighted values
    proj: Vec<f32>,       // (n_batch, dim) output of Wo / Wdown
    heads: Vec<f32>,      // (n_batch, attention_floats) per head: scores, output
    hb: Vec<f32>,         // (n_batch, ffn_dim) gate, then silu(gate)·up
    hb2: Vec<f32>,        // (n_batch, ffn_dim) up
    cos: Vec<f32>,        // (n_batch, n_rot/2)
    sin: Vec<f32>,        // (n_batch, n_rot/2)
    logits: Vec<f32>,     // (logit rows, vocab)
    n_logits: usize,      // floats of `logits` the last call filled
    caches: Vec<KvCache>, // one per sequence
    rows: Vec<usize>,     // tokens of the last call whose logits were asked for
    kf: Vec<f32>, // (n_ctx, kv_dim) q8_0 only: one layer\'s keys widened, for a group of sequences
    vf: Vec<f32>, // (n_ctx, kv_dim) ... and values
    seq_last: Vec<usize>, // (n_seq,) last position of each sequence in this call, or usize::MAX
    seq_base: Vec<usize>, // (n_seq,) first row of its widened K/V in kf/vf, or usize::MAX
    scratch: MatmulScratch,
}

impl LlamaState {
    fn with_options(
        cfg: &ModelConfig,
        weights: &LlamaWeights<'_>,
        o: &StateOptions,
    ) -> Result<LlamaState, Error> {
        let (n_ctx, nb) = (o.n_ctx, o.n_batch.max(1));
        let caches = (0..o.n_seq.max(1))
            .map(|_| KvCache::new(o.kv_type, cfg.n_layers, n_ctx, cfg.n_kv_heads, cfg.head_dim))
            .collect::<Result<Vec<_>, _>>()?;
        let logit_rows = o.logit_rows();
        let mut s = LlamaState {
            n_ctx,
            n_batch: nb,
            x: vec![0.0; nb * cfg.dim],
            xb: vec![0.0; nb * cfg.dim],
            q: vec![0.0; nb * cfg.q_dim()],
            k: vec![0.0; nb * cfg.kv_dim()],
            v: vec![0.0; nb * cfg.kv_dim()],
            att_out: vec![0.0; nb * cfg.q_dim()],
            proj: vec![0.0; nb * cfg.dim],
            heads: vec![0.0; nb * attention_floats(cfg, n_ctx)],
            hb: vec![0.0; nb * cfg.ffn_dim],
            hb2: vec![0.0; nb * cfg.ffn_dim],
            cos: vec![0.0; nb * cfg.rope.n_rot / 2],
            sin: vec![0.0; nb * cfg.rope.n_rot / 2],
            logits: vec![0.0; logit_rows * cfg.vocab_size],
            n_logits: 0,
            caches,
            rows: Vec::with_capacity(nb),
            kf: vec![0.0; widened_kv(cfg, o)],
            vf: vec![0.0; widened_kv(cfg, o)],
            seq_last: vec![usize::MAX; o.n_seq.max(1)],
            seq_base: vec![usize::MAX; o.n_seq.max(1)],
            scratch: MatmulScratch::new(),
        };
        let mut ms: Vec<&QMatrix<'_>> = vec![&weights.output];
        for l in &weights.layers {
            ms.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        }
        for m in ms {
            let n = if std::ptr::eq(m, &weights.output) {
                logit_rows
            } else {
                nb
            };
            s.scratch.reserve(m, n);
        }
        Ok(s)
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    pub fn n_seq(&self) -> usize {
        self.caches.len()
    }

    pub fn kv_type(&self) -> KvType {
        self.caches[0].ty()
    }

    pub fn kv_bytes(&self) -> usize {
        self.caches.iter().map(KvCache::bytes).sum()
    }

    pub fn logits(&self) -> &[f32] {
        &self.logits[..self.n_logits]
    }

    pub fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits[..self.n_logits]
    }
}

/// Floats of one layer's keys (or values) widened to f32, for a cache
/// stored by rows (q8_0); other caches are read in place.
pub(crate) fn widened_kv(cfg: &ModelConfig, o: &StateOptions) -> usize {
    match o.kv_type {
        KvType::Q8_0 => o.n_ctx * cfg.kv_dim(),
        KvType::F16 | KvType::F32 => 0,
    }
}

/// Floats per (token, head) work area of attention over a cache stored by
/// rows: scores over the context, the head's output.
fn head_stride(cfg: &ModelConfig, n_ctx: usize) -> usize {
    n_ctx + cfg.head_dim
}

/// Floats of attention work area per token, for either cache layout: per
/// head, scores over the context (rounded up for the column kernel) and
/// the head's output.
pub(crate) fn attention_floats(cfg: &ModelConfig, n_ctx: usize) -> usize {
    cfg.n_heads * (vecops::scores_len(n_ctx) + cfg.head_dim)
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
    forward_batch(cfg, w, s, pool, &[token], pos, Logits::Last)
}

/// Run `tokens` at positions `pos0..pos0 + n` of sequence 0 (positions
/// before `pos0` must already be in the cache) and return the logits
/// `which` asks for.
///
/// Panics if the batch is empty or larger than `n_batch`, runs past
/// `n_ctx`, holds a token outside the vocabulary, or asks for all logits of
/// a state made without them (callers check).
pub fn forward_batch<'s>(
    cfg: &ModelConfig,
    w: &Weights<'_>,
    s: &'s mut State,
    pool: &ThreadPool,
    tokens: &[u32],
    pos0: usize,
    which: Logits,
) -> &'s [f32] {
    let n = tokens.len();
    let token = |i: usize| Token {
        id: tokens[i],
        seq: 0,
        pos: pos0 + i,
        logits: which == Logits::All || i + 1 == n,
    };
    forward_with(cfg, w, s, pool, n, &token)
}

/// Run a batch of tokens from any of the state's sequences and return one
/// row of logits `(vocab,)` per token whose `logits` is set, in order. A
/// token at `(seq, pos)` attends to positions `0..=pos` of its sequence;
/// earlier positions must already be in that sequence's cache, and tokens
/// of one sequence in a batch must have distinct positions. This is how a
/// server decodes its slots in one pass: every matrix row is loaded once
/// for all of them.
///
/// Panics on an empty batch, more than `n_batch` tokens, more logit rows
/// than the state keeps, or a token, sequence or position out of range
/// (callers check).
pub fn forward_tokens<'s>(
    cfg: &ModelConfig,
    w: &Weights<'_>,
    s: &'s mut State,
    pool: &ThreadPool,
    tokens: &[Token],
) -> &'s [f32] {
    forward_with(cfg, w, s, pool, tokens.len(), &|i| tokens[i])
}

/// The forward pass over `n` tokens described by `token(i)`, for the
/// weights' architecture.
fn forward_with<'s>(
    cfg: &ModelConfig,
    w: &Weights<'_>,
    s: &'s mut State,
    pool: &ThreadPool,
    n: usize,
    token: &(dyn Fn(usize) -> Token + Sync),
) -> &'s [f32] {
    match (w, &mut s.inner) {
        (Weights::Llama(w), StateKind::Llama(s)) => llama_forward(cfg, w, s, pool, n, token),
        (Weights::Cachefit(w), StateKind::Cachefit(s)) => {
            crate::cachefit::forward(cfg, w, s, pool, n, token)
        }
        _ => panic!("the state was made for weights of another architecture"),
    }
}

/// Check a batch of `n` tokens against a state's limits and collect into
/// `rows` the tokens whose logits are asked for. Panics (callers check
/// first) on an empty or oversized batch, a token outside the vocabulary,
/// a sequence or position out of range, or more logit rows than the state
/// keeps.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_batch(
    cfg: &ModelConfig,
    n: usize,
    n_batch: usize,
    n_seq: usize,
    n_ctx: usize,
    logit_floats: usize,
    token: &dyn Fn(usize) -> Token,
    rows: &mut Vec<usize>,
) {
    assert!(
        n >= 1 && n <= n_batch,
        "batch of {n} tokens, the state takes 1..={n_batch}"
    );
    rows.clear();
    for i in 0..n {
        let t = token(i);
        assert!(
            (t.id as usize) < cfg.vocab_size,
            "token {} outside the vocabulary of {}",
            t.id,
            cfg.vocab_size
        );
        assert!(t.seq < n_seq, "sequence {} of {n_seq}", t.seq);
        assert!(
            t.pos < n_ctx,
            "position {} outside the context of {n_ctx}",
            t.pos
        );
        if t.logits {
            rows.push(i);
        }
    }
    assert!(
        rows.len() * cfg.vocab_size <= logit_floats,
        "{} rows of logits asked of a state that keeps {} (all_logits / n_seq)",
        rows.len(),
        logit_floats / cfg.vocab_size.max(1)
    );
}

/// The llama family's forward pass.
fn llama_forward<'s>(
    cfg: &ModelConfig,
    w: &LlamaWeights<'_>,
    s: &'s mut LlamaState,
    pool: &ThreadPool,
    n: usize,
    token: &(dyn Fn(usize) -> Token + Sync),
) -> &'s [f32] {
    let (dim, hd, q_dim, kv_dim, ffn) = (
        cfg.dim,
        cfg.head_dim,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.ffn_dim,
    );
    let group = cfg.n_heads / cfg.n_kv_heads;
    let half = cfg.rope.n_rot / 2;
    check_batch(
        cfg,
        n,
        s.n_batch,
        s.caches.len(),
        s.n_ctx,
        s.logits.len(),
        token,
        &mut s.rows,
    );
    let n_out = s.rows.len();

    let x = &mut s.x[..n * dim];
    let xb = &mut s.xb[..n * dim];
    let q = &mut s.q[..n * q_dim];
    let k = &mut s.k[..n * kv_dim];
    let v = &mut s.v[..n * kv_dim];
    let att_out = &mut s.att_out[..n * q_dim];
    let proj = &mut s.proj[..n * dim];
    let hb = &mut s.hb[..n * ffn];
    let hb2 = &mut s.hb2[..n * ffn];
    let scratch = &mut s.scratch;

    // x = embedding rows of the tokens, (n, dim)
    let emb = &w.token_embd;
    for (i, xt) in x.chunks_exact_mut(dim).enumerate() {
        (emb.traits().to_float)(emb.row(token(i).id as usize), xt);
    }

    // cos/sin per position, (n, n_rot/2), shared by every layer and head.
    for (t, (c, sn)) in s
        .cos
        .chunks_exact_mut(half.max(1))
        .zip(s.sin.chunks_exact_mut(half.max(1)))
        .take(n)
        .enumerate()
    {
        if half > 0 {
            ops::rope_freqs(&cfg.rope, token(t).pos, w.rope_freqs.as_deref(), c, sn);
        }
    }
    let (cos, sin) = (&s.cos[..n * half], &s.sin[..n * half]);
    let scale = 1.0 / (hd as f32).sqrt();

    // The last position of each sequence in this call: its attention span.
    s.seq_last.fill(usize::MAX);
    for t in (0..n).map(token) {
        let last = &mut s.seq_last[t.seq];
        *last = if *last == usize::MAX {
            t.pos
        } else {
            (*last).max(t.pos)
        };
    }

    for (li, l) in w.layers.iter().enumerate() {
        // --- attention ---
        for (o, xt) in xb.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
            ops::rmsnorm(o, xt, &l.attn_norm, cfg.norm_eps);
        }
        // q (n, q_dim), k and v (n, kv_dim): one quantized input for all three.
        matmul_each(
            pool,
            &[&l.wq, &l.wk, &l.wv],
            xb,
            &mut [&mut *q, &mut *k, &mut *v],
            scratch,
        );
        for t in 0..n {
            let (qt, kt, vt) = (
                &mut q[t * q_dim..(t + 1) * q_dim],
                &mut k[t * kv_dim..(t + 1) * kv_dim],
                &mut v[t * kv_dim..(t + 1) * kv_dim],
            );
            if let (Some(bq), Some(bk), Some(bv)) = (&l.bq, &l.bk, &l.bv) {
                ops::add_inplace(qt, bq);
                ops::add_inplace(kt, bk);
                ops::add_inplace(vt, bv);
            }
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                for h in qt.chunks_exact_mut(hd) {
                    ops::rmsnorm_inplace(h, qn, cfg.norm_eps);
                }
                for h in kt.chunks_exact_mut(hd) {
                    ops::rmsnorm_inplace(h, kn, cfg.norm_eps);
                }
            }
            let (c, sn) = (
                &cos[t * half..(t + 1) * half],
                &sin[t * half..(t + 1) * half],
            );
            for h in qt.chunks_exact_mut(hd) {
                ops::rope(h, c, sn, cfg.rope.layout);
            }
            for h in kt.chunks_exact_mut(hd) {
                ops::rope(h, c, sn, cfg.rope.layout);
            }
            // cache[li][pos] = k, v
            let tok = token(t);
            s.caches[tok.seq].store(li, tok.pos, kt, vt);
        }

        // Per (token t, kv head g): the query heads g·group.. that share
        // kv head g (GQA) attend over positions 0..=pos_t. Queries stay f32
        // (rounding them to f16 too, as ggml's f16 path does, doubled the
        // logit difference to llama.cpp's f32-cache reference).
        let q = &*q;
        let n_ctx = s.n_ctx;
        if s.caches[0].layer(li).columns().is_some() {
            // f16/f32 caches, stored by columns: the multi-head kernel reads
            // them in place, one key load serving the whole group.
            let caches = &*s.caches;
            let sl = vecops::scores_len(n_ctx);
            let item = group * (sl + hd); // the group's scores, then its output
            let items = &mut s.heads[..n * cfg.n_kv_heads * item];
            let attend = |start: usize, buf: &mut [f32], _thread: usize| {
                let ti = start / item; // token · n_kv_heads + kv head
                let (t, g) = (ti / cfg.n_kv_heads, ti % cfg.n_kv_heads);
                let tok = token(t);
                let (scores, out) = buf.split_at_mut(group * sl);
                let qg = &q[t * q_dim + g * group * hd..][..group * hd]; // (group, head_dim)
                let span = g * hd * n_ctx..(g + 1) * hd * n_ctx; // (head_dim, n_ctx)
                let cols = caches[tok.seq].layer(li).columns();
                match cols.expect("every cache of a state has the same type") {
                    Columns::F16 { keys, values } => {
                        let (k, v) = (&keys[span.clone()], &values[span]);
                        let a = attention(qg, hd, k, v, n_ctx, tok.pos, scale);
                        vecops::attend_f16(&a, scores, out)
                    }
                    Columns::F32 { keys, values } => {
                        let (k, v) = (&keys[span.clone()], &values[span]);
                        let a = attention(qg, hd, k, v, n_ctx, tok.pos, scale);
                        vecops::attend(&a, scores, out)
                    }
                }
            };
            let work: usize = (0..n).map(|t| cfg.n_heads * (token(t).pos + 1)).sum();
            if pool.n_threads() > 1 && work >= PARALLEL_ATTENTION_FROM {
                pool.for_each_chunk_mut(items, item, attend);
            } else {
                for (i, buf) in items.chunks_exact_mut(item).enumerate() {
                    attend(i * item, buf, 0);
                }
            }
            for (o, buf) in att_out
                .chunks_exact_mut(group * hd)
                .zip(items.chunks_exact(item))
            {
                o.copy_from_slice(&buf[group * sl..]);
            }
        } else {
            // A q8_0 cache, stored by rows: per sequence, widen this layer's
            // K and V to f32 once (one block conversion, split over the pool
            // when long), then per (token, query head) scores, softmax and
            // the weighted sum of values. Sequences are taken in groups
            // whose widened K/V fit the n_ctx rows of `kf`/`vf`, each group
            // in one pass over the pool, so several short sequences share
            // one dispatch.
            let stride = head_stride(cfg, n_ctx);
            let heads = &mut s.heads[..n * cfg.n_heads * stride];
            let n_seq = s.caches.len();
            let mut next = 0;
            while next < n_seq {
                s.seq_base.fill(usize::MAX);
                let mut used = 0; // widened positions in this group
                while next < n_seq {
                    let last = s.seq_last[next];
                    if last == usize::MAX {
                        next += 1;
                        continue;
                    }
                    let n_pos = last + 1;
                    if used > 0 && used + n_pos > n_ctx {
                        break;
                    }
                    s.seq_base[next] = used;
                    let kv = s.caches[next].layer(li);
                    let span = used * kv_dim..(used + n_pos) * kv_dim;
                    let (kf, vf) = (&mut s.kf[span.clone()], &mut s.vf[span]);
                    if pool.n_threads() > 1 && n_pos >= PARALLEL_WIDEN_FROM {
                        let rows = (n_pos / (4 * pool.n_threads())).max(64) * kv_dim;
                        pool.for_each_chunk_mut(kf, rows, |start, out, _| {
                            let p = start / kv_dim;
                            kv.widen_keys(p..p + out.len() / kv_dim, out);
                        });
                        pool.for_each_chunk_mut(vf, rows, |start, out, _| {
                            let p = start / kv_dim;
                            kv.widen_values(p..p + out.len() / kv_dim, out);
                        });
                    } else {
                        kv.widen_keys(0..n_pos, kf);
                        kv.widen_values(0..n_pos, vf);
                    }
                    used += n_pos;
                    next += 1;
                }
                if used == 0 {
                    break;
                }
                let (kf, vf) = (&*s.kf, &*s.vf); // (used, kv_dim) each
                let base = &*s.seq_base;
                // One (token, head) per chunk of `heads`: scores, then output.
                let head = |start: usize, buf: &mut [f32], _thread: usize| {
                    let th = start / stride; // token · n_heads + head
                    let (t, h) = (th / cfg.n_heads, th % cfg.n_heads);
                    let tok = token(t);
                    let b = base[tok.seq];
                    if b == usize::MAX {
                        return; // not in this group
                    }
                    let (kf, vf) = (&kf[b * kv_dim..], &vf[b * kv_dim..]);
                    let kvh = h / group;
                    let q_h = &q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd]; // (head_dim,)
                    let (scores, rest) = buf.split_at_mut(n_ctx);
                    let out = &mut rest[..hd]; // (head_dim,)
                    let att = &mut scores[..=tok.pos]; // (pos + 1,)
                                                       // Key/value row p of this kv head: kf[p·kv_dim + kvh·hd..][..hd].
                    ops::dot_rows(q_h, &kf[kvh * hd..], kv_dim, att);
                    for a in att.iter_mut() {
                        *a *= scale;
                    }
                    ops::softmax(att);
                    out.fill(0.0);
                    ops::axpy_rows(out, att, &vf[kvh * hd..], kv_dim);
                };
                // Spread (token, head) pairs over the pool once there is enough
                // work; each is computed the same way either way.
                let work: usize = (0..n)
                    .map(token)
                    .filter(|t| base[t.seq] != usize::MAX)
                    .map(|t| cfg.n_heads * (t.pos + 1))
                    .sum();
                if pool.n_threads() > 1 && work >= PARALLEL_ATTENTION_FROM {
                    pool.for_each_chunk_mut(heads, stride, head);
                } else {
                    for (i, buf) in heads.chunks_exact_mut(stride).enumerate() {
                        head(i * stride, buf, 0);
                    }
                }
            }
            for (i, buf) in heads.chunks_exact(stride).enumerate() {
                att_out[i * hd..(i + 1) * hd].copy_from_slice(&buf[n_ctx..n_ctx + hd]);
            }
        }
        matmul(pool, &l.wo, att_out, proj, scratch); // (n, dim)
        ops::add_inplace(x, proj);

        // --- MLP ---
        for (o, xt) in xb.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
            ops::rmsnorm(o, xt, &l.ffn_norm, cfg.norm_eps);
        }
        // gate and up (n, ffn_dim) each, from one quantized input.
        matmul_each(
            pool,
            &[&l.w_gate, &l.w_up],
            xb,
            &mut [&mut *hb, &mut *hb2],
            scratch,
        );
        ops::swiglu(hb, hb2);
        matmul(pool, &l.w_down, hb, proj, scratch); // (n, dim)
        ops::add_inplace(x, proj);
    }

    // logits = rmsnorm(x) · Woutᵀ, for the rows asked for, (n_out, vocab)
    let xb = &mut xb[..n_out * dim];
    for (o, &r) in xb.chunks_exact_mut(dim).zip(&s.rows) {
        let xt = &x[r * dim..(r + 1) * dim];
        ops::rmsnorm(o, xt, &w.output_norm, cfg.norm_eps);
    }
    s.n_logits = n_out * cfg.vocab_size;
    matmul(pool, &w.output, xb, &mut s.logits[..s.n_logits], scratch);
    &s.logits[..s.n_logits]
}
