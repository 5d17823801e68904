//! The `cachefit` forward pass, token by token within a batch (the model is
//! small: its matrices stay in L2, so a batch gains little from sharing a
//! weight load and a plain loop keeps every token's arithmetic identical
//! whatever the batch, sequence mix or thread count).
//!
//! ```text
//! x = E[token]                                            (dim,)
//! for each block:
//!     h = rmsnorm(x) · attn_norm                          (dim,)
//!     C: hist[seq][pos] = h
//!        g = Wgate·h                                      (dim,)
//!        c[j] = Σ_k taps[k][j] · hist[seq][pos-K+1+k][j]  zeros before 0
//!        x += Wout·(silu(g) ⊙ c)
//!     A: q | k | v = Wqkv·h; rope(q, k)                   (nh·hd | nkv·hd | nkv·hd)
//!        cache[seq][pos] = k, v
//!        per query head: softmax(q·Kᵀ/√hd over 0..=pos)·V (kv head = head / group)
//!        x += Wo·heads
//!     h = rmsnorm(x) · ffn_norm
//!     x += Wdown·(silu(Wgate·h) ⊙ Wup·h)
//! logits = cap·tanh(E·(rmsnorm(x) · output_norm) / cap)   rows asked for
//! ```
//!
//! Int8 matrices read the activation quantized once per vector, as a
//! pair of int8 vectors ([`Activations`], up to
//! [`TOKENS_PER_PASS`] tokens against each weight read). Exp, SiLU, tanh and attention use [`kernels::vecops`].
//!
//! A sequence's tokens run on one thread: a token costs ~60 µs in all, the
//! largest matrix (the 4096-row output head) ~6 µs, and splitting matrices
//! over a second thread cost more in wake-ups than it saved (decode 2.7×
//! slower with 2 threads on the 2-core test machine). When a call holds
//! tokens of several sequences (a server's slots) and the pool has two or
//! more threads, the sequences are split into two groups of about equal
//! token counts, each run by one thread in its own [`Lane`] of buffers: one
//! pool run per call, no synchronisation inside it. Every token's
//! arithmetic is the same either way, so the thread count cannot change a
//! bit of the result.

use super::config::BlockKind;
use super::weights::{Activations, CachefitWeights, Matrix, Mixer, TOKENS_PER_PASS};
use crate::config::ModelConfig;
use crate::forward::{check_batch, StateOptions, Token};
use crate::kv_cache::KvType;
use crate::Error;
use half::f16;
use kernels::matmul::MatmulScratch;
use kernels::ops;
use kernels::pool::ThreadPool;
use kernels::vecops::{self, Attention, KvElement};

/// Keys and values of one sequence: `(attn blocks, 2, n_kv_heads,
/// head_dim, n_ctx)`, keys before values, each (head, dim) a row over
/// positions.
enum KvStore {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

/// The caches of one sequence.
struct Sequence {
    /// `(conv blocks, n_ctx, dim)`: each conv block's normed input by
    /// position.
    conv: Vec<f32>,
    kv: KvStore,
}

/// The buffers one thread runs a group of tokens in.
struct Lane {
    x: Vec<f32>,      // (n_batch, dim) residual stream
    h: Vec<f32>,      // (n_batch, dim) normed input of a block
    g: Vec<f32>,      // (n_batch, max(dim, ffn_dim)) conv gate, ffn gate
    up: Vec<f32>,     // (n_batch, max(dim, ffn_dim)) conv product c, ffn up
    qkv: Vec<f32>,    // (n_batch, q_dim + 2·kv_dim)
    heads: Vec<f32>,  // (n_batch, q_dim) attention output
    proj: Vec<f32>,   // (n_batch, dim) output of conv_out / attn_output / ffn_down
    scores: Vec<f32>, // (heads per kv head, n_ctx rounded up to 16) scores
    xq: Activations,
    scratch: MatmulScratch,
    /// A one-thread pool (no workers: runs inline) for the float matrices.
    serial: ThreadPool,
    toks: Vec<usize>, // the call's tokens this lane runs, ascending
    logits: Vec<f32>, // (its logit rows, vocab)
    out: Vec<usize>,  // for each of its logit rows: the row of the call's output
}

/// Two lanes: at most two groups of sequences run at once.
const LANES: usize = 2;

/// Activations, per-sequence caches and scratch of a `cachefit` model.
pub struct CachefitState {
    n_ctx: usize,
    n_batch: usize,
    kv_type: KvType,
    cos: Vec<f32>, // (n_ctx, head_dim/2) RoPE table
    sin: Vec<f32>, // (n_ctx, head_dim/2)
    lanes: Vec<Lane>,
    seq_tokens: Vec<usize>, // (n_seq,) tokens of each sequence in a call
    logits: Vec<f32>,       // (logit rows, vocab)
    n_logits: usize,
    rows: Vec<usize>, // tokens of the last call whose logits were asked for
    seqs: Vec<Sequence>,
}

impl CachefitState {
    pub(crate) fn with_options(
        cfg: &ModelConfig,
        w: &CachefitWeights<'_>,
        o: &StateOptions,
    ) -> Result<CachefitState, Error> {
        let cf = cfg.cachefit.as_ref().expect("a cachefit config");
        let (n_ctx, nb) = (o.n_ctx, o.n_batch.max(1));
        let (d, hd) = (cfg.dim, cfg.head_dim);
        let wide = d.max(cfg.ffn_dim);
        let kv_len = cf.n_attn() * 2 * cfg.kv_dim() * n_ctx;
        let seq = || -> Result<Sequence, Error> {
            Ok(Sequence {
                conv: vec![0.0; cf.n_conv() * n_ctx * d],
                kv: match o.kv_type {
                    KvType::F16 => KvStore::F16(vec![f16::ZERO; kv_len]),
                    KvType::F32 => KvStore::F32(vec![0.0; kv_len]),
                    KvType::Q8_0 => {
                        return Err(Error::BadValue {
                            key: "cache type".into(),
                            problem: format!(
                                "q8_0 is not supported by the cachefit architecture (its heads \
                                 of {hd} values are stored per position, not in 32-value \
                                 blocks); use f16 or f32"
                            ),
                        })
                    }
                },
            })
        };
        let seqs = (0..o.n_seq.max(1))
            .map(|_| seq())
            .collect::<Result<_, _>>()?;
        let half = hd / 2;
        let (mut cos, mut sin) = (vec![0.0; n_ctx * half], vec![0.0; n_ctx * half]);
        if half > 0 {
            for (p, (c, s)) in cos
                .chunks_exact_mut(half)
                .zip(sin.chunks_exact_mut(half))
                .enumerate()
            {
                ops::rope_freqs(&cfg.rope, p, None, c, s);
            }
        }
        let lane = || Lane {
            x: vec![0.0; nb * d],
            h: vec![0.0; nb * d],
            g: vec![0.0; nb * wide],
            up: vec![0.0; nb * wide],
            qkv: vec![0.0; nb * (cfg.q_dim() + 2 * cfg.kv_dim())],
            heads: vec![0.0; nb * cfg.q_dim()],
            proj: vec![0.0; nb * d],
            scores: vec![0.0; cfg.n_heads / cfg.n_kv_heads * vecops::scores_len(n_ctx)],
            xq: Activations::with_capacity(
                wide.max(cfg.q_dim()),
                wide.max(cfg.q_dim() + 2 * cfg.kv_dim()).max(cfg.vocab_size),
            ),
            scratch: MatmulScratch::new(),
            serial: ThreadPool::new(1),
            toks: Vec::with_capacity(nb),
            logits: vec![0.0; o.logit_rows() * cfg.vocab_size],
            out: Vec::with_capacity(o.logit_rows()),
        };
        let mut st = CachefitState {
            n_ctx,
            n_batch: nb,
            kv_type: o.kv_type,
            cos,
            sin,
            lanes: (0..LANES).map(|_| lane()).collect(),
            seq_tokens: vec![0; o.n_seq.max(1)],
            logits: vec![0.0; o.logit_rows() * cfg.vocab_size],
            n_logits: 0,
            rows: Vec::with_capacity(nb),
            seqs,
        };
        // Size the float matrices' activation scratch now, so the first
        // call allocates nothing either.
        for lane in &mut st.lanes {
            let mut float = |m: &Matrix<'_>| {
                if let Matrix::Float(q) = m {
                    lane.scratch.reserve(q, 1);
                }
            };
            float(&w.token_embd);
            for b in &w.blocks {
                let (m0, m1) = match &b.mixer {
                    Mixer::Conv { gate, out, .. } => (gate, out),
                    Mixer::Attn { qkv, out } => (qkv, out),
                };
                for m in [m0, m1, &b.ffn_gate, &b.ffn_up, &b.ffn_down] {
                    float(m);
                }
            }
        }
        Ok(st)
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    pub fn n_seq(&self) -> usize {
        self.seqs.len()
    }

    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Bytes of the per-sequence caches: keys and values, and the
    /// convolution blocks' inputs.
    pub fn kv_bytes(&self) -> usize {
        self.seqs
            .iter()
            .map(|s| {
                4 * s.conv.len()
                    + match &s.kv {
                        KvStore::F16(v) => 2 * v.len(),
                        KvStore::F32(v) => 4 * v.len(),
                    }
            })
            .sum()
    }

    pub fn logits(&self) -> &[f32] {
        &self.logits[..self.n_logits]
    }

    pub fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits[..self.n_logits]
    }
}

/// Query heads `q` over positions `0..=pos` of one kv head's `(hd,
/// n_ctx)` keys and values (both architectures store f16/f32 caches so).
pub(crate) fn attention<'a, T: KvElement>(
    q: &'a [f32],
    hd: usize,
    keys: &'a [T],
    values: &'a [T],
    n_ctx: usize,
    pos: usize,
    scale: f32,
) -> Attention<'a, T> {
    Attention {
        q,
        head_dim: hd,
        keys,
        values,
        stride: n_ctx,
        n_pos: pos + 1,
        scale,
    }
}

/// `y_t = M·x_t` for the `n` rows of `xs` (`(n, cols)` → `(n, rows)`),
/// [`TOKENS_PER_PASS`] tokens per pass over the weights.
fn project(
    pool: &ThreadPool,
    m: &Matrix<'_>,
    xs: &[f32],
    ys: &mut [f32],
    xq: &mut Activations,
    scratch: &mut MatmulScratch,
) {
    let (rows, cols) = (m.rows(), m.cols());
    for (x, y) in xs
        .chunks(TOKENS_PER_PASS * cols)
        .zip(ys.chunks_mut(TOKENS_PER_PASS * rows))
    {
        xq.quantize(x, cols);
        m.matvecs(pool, x, xq, y, scratch);
    }
}

/// The forward pass over `n` tokens described by `token(i)`; see the
/// module docs (the caller's pool runs two groups of sequences at once
/// when it has the threads). Panics as [`crate::forward_tokens`] documents.
pub(crate) fn forward<'s>(
    cfg: &ModelConfig,
    w: &CachefitWeights<'_>,
    s: &'s mut CachefitState,
    pool: &ThreadPool,
    n: usize,
    token: &(dyn Fn(usize) -> Token + Sync),
) -> &'s [f32] {
    check_batch(
        cfg,
        n,
        s.n_batch,
        s.seqs.len(),
        s.n_ctx,
        s.logits.len(),
        token,
        &mut s.rows,
    );
    // Split the sequences at `mid` so both groups get about half the
    // tokens, when there are two threads and two sequences to split.
    s.seq_tokens.fill(0);
    for t in 0..n {
        s.seq_tokens[token(t).seq] += 1;
    }
    let active = s.seq_tokens.iter().filter(|&&c| c > 0).count();
    let mid = (pool.n_threads() >= 2 && active >= 2).then(|| {
        let (mut before, mut mid) = (0, 0);
        // The first index past half the tokens, leaving tokens after it.
        while mid < s.seq_tokens.len() && (before == 0 || before + s.seq_tokens[mid] <= n / 2) {
            before += s.seq_tokens[mid];
            mid += 1;
        }
        mid
    });
    let ctx = Shared {
        cos: &s.cos,
        sin: &s.sin,
        n_ctx: s.n_ctx,
        rows: &s.rows,
        token,
    };
    match mid {
        None => {
            let lane = &mut s.lanes[0];
            lane.toks.clear();
            lane.toks.extend(0..n);
            run_lane(cfg, w, lane, &mut s.seqs, 0, &ctx);
        }
        Some(mid) => {
            for lane in &mut s.lanes {
                lane.toks.clear();
            }
            for t in 0..n {
                s.lanes[usize::from(token(t).seq >= mid)].toks.push(t);
            }
            let (lo, hi) = s.seqs.split_at_mut(mid);
            let (l0, l1) = s.lanes.split_at_mut(1);
            let mut jobs = [(&mut l0[0], lo, 0), (&mut l1[0], hi, mid)];
            pool.for_each_chunk_mut(&mut jobs, 1, |_, job, _| {
                let (lane, seqs, first) = &mut job[0];
                run_lane(cfg, w, lane, seqs, *first, &ctx);
            });
        }
    }
    // Each lane's logit rows into the call's output rows.
    let v = cfg.vocab_size;
    s.n_logits = s.rows.len() * v;
    for lane in &s.lanes[..if mid.is_some() { LANES } else { 1 }] {
        for (k, &row) in lane.out.iter().enumerate() {
            s.logits[row * v..(row + 1) * v].copy_from_slice(&lane.logits[k * v..(k + 1) * v]);
        }
    }
    &s.logits[..s.n_logits]
}

/// What every lane of a call reads.
struct Shared<'a> {
    cos: &'a [f32],
    sin: &'a [f32],
    n_ctx: usize,
    rows: &'a [usize],
    token: &'a (dyn Fn(usize) -> Token + Sync),
}

/// The forward pass over the call's tokens `lane.toks`, whose sequences
/// are `seqs` (sequence `first + i` is `seqs[i]`).
fn run_lane(
    cfg: &ModelConfig,
    w: &CachefitWeights<'_>,
    lane: &mut Lane,
    seqs: &mut [Sequence],
    first: usize,
    ctx: &Shared<'_>,
) {
    let cf = cfg.cachefit.as_ref().expect("a cachefit config");
    let Lane {
        x,
        h,
        g: g_buf,
        up: up_buf,
        qkv: qkv_all,
        heads: heads_all,
        proj,
        scores,
        xq,
        scratch,
        serial: pool,
        toks,
        logits,
        out,
    } = lane;
    let n = toks.len();
    let token = |i: usize| {
        let t = (ctx.token)(toks[i]);
        Token {
            seq: t.seq - first,
            ..t
        }
    };
    let (d, ff, hd, n_ctx) = (cfg.dim, cfg.ffn_dim, cfg.head_dim, ctx.n_ctx);
    let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());
    let qkv_dim = q_dim + 2 * kv_dim;
    let (nkv, group, half, k_taps) = (
        cfg.n_kv_heads,
        cfg.n_heads / cfg.n_kv_heads,
        hd / 2,
        cf.conv_kernel,
    );
    let scale = 1.0 / (hd as f32).sqrt();
    let eps = cfg.norm_eps;

    let x = &mut x[..n * d];
    let h = &mut h[..n * d];
    let proj = &mut proj[..n * d];
    let pool = &*pool;

    // x = embedding rows, (n, dim)
    for (i, xt) in x.chunks_exact_mut(d).enumerate() {
        w.token_embd.row(token(i).id as usize, xt);
    }

    let (mut ci, mut ai) = (0, 0); // index among conv / attention blocks
    for (block, kind) in w.blocks.iter().zip(&cf.blocks) {
        for (o, xt) in h.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
            ops::rmsnorm(o, xt, &block.attn_norm, eps);
        }
        match (&block.mixer, kind) {
            (Mixer::Conv { gate, taps, out }, BlockKind::Conv) => {
                let hist_len = n_ctx * d;
                // Every token's input first: a later token of the batch
                // reads the earlier ones'.
                for (t, ht) in h.chunks_exact(d).enumerate() {
                    let tok = token(t);
                    let hist = &mut seqs[tok.seq].conv[ci * hist_len..(ci + 1) * hist_len];
                    hist[tok.pos * d..(tok.pos + 1) * d].copy_from_slice(ht);
                }
                let g = &mut g_buf[..n * d];
                let c = &mut up_buf[..n * d];
                project(pool, gate, h, g, xq, scratch); // (n, dim)
                for (t, ct) in c.chunks_exact_mut(d).enumerate() {
                    let tok = token(t);
                    let hist = &seqs[tok.seq].conv[ci * hist_len..(ci + 1) * hist_len];
                    ct.fill(0.0);
                    // Tap k reads position pos - (K-1) + k (zero before 0).
                    for (k, tap) in taps.chunks_exact(d).enumerate() {
                        let Some(p) = (tok.pos + k).checked_sub(k_taps - 1) else {
                            continue;
                        };
                        let hp = &hist[p * d..(p + 1) * d];
                        for ((cj, &tj), &hj) in ct.iter_mut().zip(tap).zip(hp) {
                            *cj += tj * hj;
                        }
                    }
                }
                for (gt, ct) in g.chunks_exact_mut(d).zip(c.chunks_exact(d)) {
                    vecops::swiglu(gt, ct); // silu(g) ⊙ c
                }
                project(pool, out, g, proj, xq, scratch); // (n, dim)
                ci += 1;
            }
            (Mixer::Attn { qkv, out }, BlockKind::Attn) => {
                let qkv_buf = &mut qkv_all[..n * qkv_dim];
                project(pool, qkv, h, qkv_buf, xq, scratch); // (n, q_dim + 2·kv_dim)
                for (t, row) in qkv_buf.chunks_exact_mut(qkv_dim).enumerate() {
                    let tok = token(t);
                    let (c, sn) = (
                        &ctx.cos[tok.pos * half..(tok.pos + 1) * half],
                        &ctx.sin[tok.pos * half..(tok.pos + 1) * half],
                    );
                    let (qk, v) = row.split_at_mut(q_dim + kv_dim);
                    for head in qk.chunks_exact_mut(hd) {
                        ops::rope(head, c, sn, cfg.rope.layout);
                    }
                    // cache[seq][pos] = k, v (transposed: one value per row)
                    let k = &qk[q_dim..];
                    let base = ai * 2 * kv_dim * n_ctx;
                    let (koff, voff) = (base, base + kv_dim * n_ctx);
                    match &mut seqs[tok.seq].kv {
                        KvStore::F16(kv) => {
                            for (r, (&kr, &vr)) in k.iter().zip(v.iter()).enumerate() {
                                kv[koff + r * n_ctx + tok.pos] = f16::from_f32(kr);
                                kv[voff + r * n_ctx + tok.pos] = f16::from_f32(vr);
                            }
                        }
                        KvStore::F32(kv) => {
                            for (r, (&kr, &vr)) in k.iter().zip(v.iter()).enumerate() {
                                kv[koff + r * n_ctx + tok.pos] = kr;
                                kv[voff + r * n_ctx + tok.pos] = vr;
                            }
                        }
                    }
                }
                let heads = &mut heads_all[..n * q_dim];
                let base = ai * 2 * kv_dim * n_ctx; // this block's keys, then values
                for (t, o) in heads.chunks_exact_mut(q_dim).enumerate() {
                    let tok = token(t);
                    let q = &qkv_buf[t * qkv_dim..t * qkv_dim + q_dim];
                    // Query heads g·group.. share kv head g, whose rows
                    // (hd of n_ctx positions) start at g·hd·n_ctx.
                    for (g, (qg, og)) in q
                        .chunks_exact(group * hd)
                        .zip(o.chunks_exact_mut(group * hd))
                        .enumerate()
                        .take(nkv)
                    {
                        let k0 = base + g * hd * n_ctx;
                        let v0 = k0 + kv_dim * n_ctx;
                        let (k, v) = (k0..k0 + hd * n_ctx, v0..v0 + hd * n_ctx);
                        match &seqs[tok.seq].kv {
                            KvStore::F16(kv) => {
                                let a = attention(qg, hd, &kv[k], &kv[v], n_ctx, tok.pos, scale);
                                vecops::attend_f16(&a, scores, og)
                            }
                            KvStore::F32(kv) => {
                                let a = attention(qg, hd, &kv[k], &kv[v], n_ctx, tok.pos, scale);
                                vecops::attend(&a, scores, og)
                            }
                        }
                    }
                }
                project(pool, out, heads, proj, xq, scratch); // (n, dim)
                ai += 1;
            }
            _ => unreachable!("weights bound from this config"),
        }
        ops::add_inplace(x, proj);

        // --- MLP ---
        for (o, xt) in h.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
            ops::rmsnorm(o, xt, &block.ffn_norm, eps);
        }
        let g = &mut g_buf[..n * ff];
        let up = &mut up_buf[..n * ff];
        for ((ht, gt), ut) in h
            .chunks(TOKENS_PER_PASS * d)
            .zip(g.chunks_mut(TOKENS_PER_PASS * ff))
            .zip(up.chunks_mut(TOKENS_PER_PASS * ff))
        {
            xq.quantize(ht, d); // once for gate and up
            block.ffn_gate.matvecs(pool, ht, xq, gt, scratch);
            block.ffn_up.matvecs(pool, ht, xq, ut, scratch);
        }
        for (gt, ut) in g.chunks_exact_mut(ff).zip(up.chunks_exact(ff)) {
            vecops::swiglu(gt, ut);
        }
        project(pool, &block.ffn_down, g, proj, xq, scratch); // (n, dim)
        ops::add_inplace(x, proj);
    }

    // logits = softcap(E · rmsnorm(x)), for the call's rows asked for that
    // this lane ran, (its rows, vocab)
    let v = cfg.vocab_size;
    out.clear();
    for (row, &t) in ctx.rows.iter().enumerate() {
        let Ok(i) = toks.binary_search(&t) else {
            continue; // the other lane's
        };
        let k = out.len();
        ops::rmsnorm(
            &mut h[k * d..(k + 1) * d],
            &x[i * d..(i + 1) * d],
            &w.output_norm,
            eps,
        );
        out.push(row);
    }
    // The rows through the embedding (the largest matrix) several per read
    // of it, as every other matrix; each row's result is the same bits as
    // alone.
    let m = out.len();
    project(
        pool,
        &w.token_embd,
        &h[..m * d],
        &mut logits[..m * v],
        xq,
        scratch,
    );
    if cf.softcap > 0.0 {
        for lt in logits[..m * v].chunks_exact_mut(v) {
            vecops::softcap(lt, cf.softcap);
        }
    }
}
