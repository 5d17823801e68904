//! The llama family's forward pass, llama2.c style: every buffer carries
//! its shape, and [`Pass::forward`] reads top to bottom as the steps below.
//! A call takes a batch of `n` tokens (a prompt, one decode token, or one
//! token per server slot); every row below is `(n, ·)`.
//!
//! ```text
//! x = embed(tokens)                                       (n, dim)       embed
//! for each layer:
//!     xb = rmsnorm(x) · attn_norm                                        qkv
//!     q, k, v = xb·Wqᵀ (+bq), xb·Wkᵀ (+bk), xb·Wvᵀ (+bv)    qwen2 biases
//!     q, k = per-head rmsnorm(q), rmsnorm(k)              qwen3
//!     (captured layers keep q and k here, before RoPE)
//!     q, k = rope(q, pos), rope(k, pos)
//!     cache[layer][pos] = k, v                            f16, f32 or q8_0
//!     per token t, head h (kv head h / group):                           attend
//!         softmax(q·Kᵀ/√d over positions ≤ pos_t)·V
//!     x += att·Woᵀ
//!     xb = rmsnorm(x) · ffn_norm                                         mlp
//!     x += (silu(xb·Wgateᵀ) ⊙ xb·Wupᵀ)·Wdownᵀ
//! logits = (rmsnorm(x) · output_norm)·Woutᵀ               rows asked for head
//! ```
//!
//! The matrix products run over the pool ([`kernels::matmul`]: a weight row
//! is loaded once per batch), and so do the attention heads once there is
//! enough work; element-wise ops stay on the calling thread. Every output
//! element is computed the same way whatever the batch size or thread count,
//! so a prompt evaluated in one batch gives bit-identical logits to one
//! token at a time. All buffers are allocated in [`State::new`]; a call
//! allocates nothing.

use super::weights::{Ffn, Weights};
use crate::attention::{segments, work_floats, Heads, Scale, MAX_HEADS, SEGMENT};
use crate::batch::{check_batch, Batch, StateOptions};
use crate::config::{Activation, ModelConfig};
use crate::kv_cache::{KvCache, KvType};
use crate::memory::MemoryEstimate;
use crate::pass::{Outputs, Pass};
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

/// Activations, KV caches and scratch of the llama family, for the
/// weights they were made for.
pub struct State<'m> {
    cfg: &'m ModelConfig,
    w: &'m Weights<'m>,
    n_ctx: usize,
    n_batch: usize,
    x: Vec<f32>,               // (n_batch, dim) residual stream
    xb: Vec<f32>,              // (n_batch, dim) normed input of a block
    q: Vec<f32>,               // (n_batch, q_dim)
    k: Vec<f32>,               // (n_batch, kv_dim)
    v: Vec<f32>,               // (n_batch, kv_dim)
    att_out: Vec<f32>,         // (n_batch, q_dim) heads' weighted values
    proj: Vec<f32>,            // (n_batch, dim) output of Wo / Wdown
    heads: Vec<f32>,           // (n_batch, attention_floats) per head: scores, output
    runs: Vec<(usize, usize)>, // attention's runs of tokens: (first, count)
    att_tmp: Vec<f32>,         // attention's gathered outputs and statistics of one run
    hb: Vec<f32>,              // (n_batch, ffn_dim) gate, then silu(gate)·up
    hb2: Vec<f32>,             // (n_batch, ffn_dim) up
    cos: Vec<f32>,             // (n_batch, n_rot/2)
    sin: Vec<f32>,             // (n_batch, n_rot/2)
    cos_swa: Vec<f32>,         // (n_batch, n_rot/2) sliding-window layers' RoPE, if any
    sin_swa: Vec<f32>,         // (n_batch, n_rot/2)
    /// RoPE frequency factors: Llama 3's, or Phi-3's long or short ones
    /// for this state's context.
    rope_factors: Option<&'m [f32]>,
    moe: Option<MoeBuffers>,
    caches: Vec<KvCache>, // one per sequence
    kf: Vec<f32>, // (n_ctx, kv_dim) q8_0 only: one layer's keys widened, for a group of sequences
    vf: Vec<f32>, // (n_ctx, kv_dim) ... and values
    seq_last: Vec<usize>, // (n_seq,) last position of each sequence in this call, or usize::MAX
    seq_base: Vec<usize>, // (n_seq,) first row of its widened K/V in kf/vf, or usize::MAX
    scratch: MatmulScratch,
    out: Outputs,
}

impl<'m> State<'m> {
    /// Allocate everything (and size the scratch for these weights, so the
    /// first call allocates nothing either). Errors if the cache type cannot
    /// store this model's heads.
    pub(crate) fn new(
        cfg: &'m ModelConfig,
        w: &'m Weights<'m>,
        o: &StateOptions,
    ) -> Result<State<'m>, Error> {
        let (n_ctx, nb) = (o.n_ctx, o.n_batch.max(1));
        let caches = (0..o.n_seq.max(1))
            .map(|_| KvCache::new(o.kv_type, cfg.n_layers, n_ctx, cfg.n_kv_heads, cfg.head_dim))
            .collect::<Result<Vec<_>, _>>()?;
        let mut s = State {
            cfg,
            w,
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
            runs: Vec::with_capacity(nb),
            att_tmp: vec![0.0; gathered_floats(cfg)],
            hb: vec![0.0; nb * ffn_width(cfg)],
            hb2: vec![0.0; nb * ffn_width(cfg)],
            cos: vec![0.0; nb * cfg.rope.n_rot / 2],
            sin: vec![0.0; nb * cfg.rope.n_rot / 2],
            cos_swa: vec![0.0; swa_rows(cfg, nb) * cfg.rope.n_rot / 2],
            sin_swa: vec![0.0; swa_rows(cfg, nb) * cfg.rope.n_rot / 2],
            rope_factors: match (
                &w.rope_freqs,
                &w.rope_long_short,
                cfg.variant.long_rope_above,
            ) {
                (Some(f), _, _) => Some(&**f),
                // llama.cpp's `get_rope_factors`: long ones for a context
                // beyond the original one.
                (None, Some(f), Some(above)) => {
                    Some(if n_ctx > above { &*f.long } else { &*f.short })
                }
                _ => None,
            },
            moe: cfg
                .variant
                .experts
                .map(|e| MoeBuffers::new(cfg.dim, &e, nb)),
            caches,
            kf: vec![0.0; widened_kv(cfg, o)],
            vf: vec![0.0; widened_kv(cfg, o)],
            seq_last: vec![usize::MAX; o.n_seq.max(1)],
            seq_base: vec![usize::MAX; o.n_seq.max(1)],
            scratch: MatmulScratch::new(),
            out: Outputs::new(cfg, o),
        };
        s.scratch.reserve(&w.output, o.logit_rows());
        for l in &w.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo]
                .into_iter()
                .chain(l.ffn.matrices())
            {
                s.scratch.reserve(m, nb);
            }
        }
        Ok(s)
    }

    /// The config the state was made for.
    pub fn config(&self) -> &ModelConfig {
        self.cfg
    }

    /// Sequence `seq`'s KV cache (keys after RoPE).
    pub fn cache(&self, seq: usize) -> &KvCache {
        &self.caches[seq]
    }

    /// x = embedding rows of the tokens, `(n, dim)`.
    fn embed(&mut self, batch: &Batch<'_>) {
        let (dim, emb) = (self.cfg.dim, &self.w.token_embd);
        let scale = self.cfg.variant.embed_scale;
        for (i, xt) in self.x[..batch.n * dim].chunks_exact_mut(dim).enumerate() {
            (emb.traits().to_float)(emb.row(batch.get(i).id as usize), xt);
            if scale != 1.0 {
                ops::scale_inplace(xt, scale); // Gemma: √dim
            }
        }
    }

    /// cos/sin per token, `(n, n_rot/2)`, shared by every layer and head;
    /// and the last position of each sequence in the call (its attention
    /// span).
    fn positions(&mut self, batch: &Batch<'_>) {
        let half = self.cfg.rope.n_rot / 2;
        if half > 0 {
            let rows = self
                .cos
                .chunks_exact_mut(half)
                .zip(self.sin.chunks_exact_mut(half));
            for (t, (c, s)) in rows.take(batch.n).enumerate() {
                let freqs = self.rope_factors;
                ops::rope_freqs(&self.cfg.rope, batch.get(t).pos, freqs, c, s);
            }
            if let Some(swa) = &self.cfg.variant.swa {
                let rows =
                    (self.cos_swa.chunks_exact_mut(half)).zip(self.sin_swa.chunks_exact_mut(half));
                for (t, (c, s)) in rows.take(batch.n).enumerate() {
                    ops::rope_freqs(&swa.rope, batch.get(t).pos, None, c, s);
                }
            }
        }
        self.seq_last.fill(usize::MAX);
        for t in batch.iter() {
            let last = &mut self.seq_last[t.seq];
            *last = if *last == usize::MAX {
                t.pos
            } else {
                (*last).max(t.pos)
            };
        }
    }

    /// xb = rmsnorm(x); q, k, v with qwen2's biases and qwen3's norms; the
    /// captured rows kept; RoPE; k and v into each token's cache.
    fn qkv(&mut self, pool: &ThreadPool, li: usize, batch: &Batch<'_>) {
        let (cfg, l) = (self.cfg, &self.w.layers[li]);
        let (n, dim, hd, half) = (batch.n, cfg.dim, cfg.head_dim, cfg.rope.n_rot / 2);
        let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());
        let xb = &mut self.xb[..n * dim];
        norm_rows(pool, xb, &self.x[..n * dim], &l.attn_norm, cfg.norm_eps);
        let q = &mut self.q[..n * q_dim];
        let k = &mut self.k[..n * kv_dim];
        let v = &mut self.v[..n * kv_dim];
        // One quantized input for all three.
        let outs = &mut [&mut *q, &mut *k, &mut *v];
        matmul_each(pool, &[&l.wq, &l.wk, &l.wv], xb, outs, &mut self.scratch);
        let slot = self.out.capture.slot(li);
        let rows = q.chunks_exact_mut(q_dim).zip(k.chunks_exact_mut(kv_dim));
        for (t, ((qt, kt), vt)) in rows.zip(v.chunks_exact_mut(kv_dim)).enumerate() {
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
            if let Some(s) = slot {
                self.out.capture.store(s, t, qt, kt);
            }
            let windowed = cfg.variant.swa.as_ref().is_some_and(|w| w.layers[li]);
            let (cos, sin) = if windowed {
                (&self.cos_swa, &self.sin_swa)
            } else {
                (&self.cos, &self.sin)
            };
            let (c, sn) = (&cos[t * half..][..half], &sin[t * half..][..half]);
            for h in qt.chunks_exact_mut(hd).chain(kt.chunks_exact_mut(hd)) {
                ops::rope(h, c, sn, cfg.rope.layout);
            }
            let tok = batch.get(t);
            self.caches[tok.seq].store(li, tok.pos, kt, vt);
        }
    }

    /// Per (token t, kv head g): the query heads g·group.. that share kv
    /// head g (GQA) attend over positions 0..=pos_t; then x += att·Woᵀ.
    /// Queries stay f32 (rounding them to f16 too, as ggml's f16 path does,
    /// doubled the logit difference to llama.cpp's f32-cache reference).
    fn attend(&mut self, pool: &ThreadPool, li: usize, batch: &Batch<'_>) {
        if self.caches[0].layer(li).columns().is_some() {
            self.attend_columns(pool, li, batch);
        } else {
            self.attend_rows(pool, li, batch);
        }
        let (n, dim, q_dim) = (batch.n, self.cfg.dim, self.cfg.q_dim());
        let (wo, proj) = (&self.w.layers[li].wo, &mut self.proj[..n * dim]);
        matmul(
            pool,
            wo,
            &self.att_out[..n * q_dim],
            proj,
            &mut self.scratch,
        ); // (n, dim)
        if let Some(w) = &self.w.layers[li].post_attn_norm {
            for p in proj.chunks_exact_mut(dim) {
                ops::rmsnorm_inplace(p, w, self.cfg.norm_eps);
            }
        }
        ops::add_inplace(&mut self.x[..n * dim], proj);
    }

    /// How this model scales attention scores.
    fn scale(&self) -> Scale {
        Scale {
            scale: self.cfg.variant.attn_scale,
            softcap: self.cfg.variant.attn_softcap,
        }
    }

    /// f16/f32 caches (keys in blocks of 16 positions, values by columns):
    /// the multi-head kernel reads them in place, one key load serving the
    /// whole group, and the group of every token in a run of consecutive
    /// positions of one sequence (a prompt's batch: up to
    /// [`MAX_HEADS`] heads a call). The work items are (kv head, run,
    /// segment of the context), so one token's few kv heads over a long
    /// context still split evenly over the pool; the segments are folded
    /// in order after it.
    fn attend_columns(&mut self, pool: &ThreadPool, li: usize, batch: &Batch<'_>) {
        let cfg = self.cfg;
        let (n, hd, q_dim, nkv) = (batch.n, cfg.head_dim, cfg.q_dim(), cfg.n_kv_heads);
        let group = cfg.n_heads / nkv;
        let scale = self.scale();
        let stride = self.caches[0].layer(li).stride();
        let n_seg = stride.div_ceil(SEGMENT);
        // Per (token, kv head, segment): the group's queries, then the work.
        let qf = group * hd;
        let item = qf + work_floats(group, hd, stride);
        // Runs: (first token, tokens) of one sequence at consecutive
        // positions with one window start and the same segments.
        let max_run = (MAX_HEADS / group).max(1);
        let runs = &mut self.runs;
        runs.clear();
        let mut t = 0;
        while t < n {
            let tok = batch.get(t);
            let first = visible_from(cfg, li, tok.pos);
            let segs = segments(first, tok.pos);
            let mut k = 1;
            while t + k < n && k < max_run {
                let next = batch.get(t + k);
                let joins = next.seq == tok.seq
                    && next.pos == tok.pos + k
                    && visible_from(cfg, li, next.pos) == first
                    && segments(first, next.pos) == segs;
                if !joins {
                    break;
                }
                k += 1;
            }
            runs.push((t, k));
            t += k;
        }
        let (q, caches, runs) = (&self.q[..n * q_dim], &*self.caches, &*self.runs);
        // Run r's heads that share kv head g, but for their queries.
        let heads_of = |g: usize, r: usize| {
            let (t0, k) = runs[r];
            let tok = batch.get(t0 + k - 1);
            let kv = caches[tok.seq].layer(li);
            Heads {
                cols: kv
                    .columns()
                    .expect("every cache of a state has the same type"),
                kv_head: g,
                hd,
                stride: kv.stride(),
                q: &[],
                first: visible_from(cfg, li, tok.pos),
                last: tok.pos,
                tokens: k,
                scale,
            }
        };
        // Unit (g, r, s) holds run r's k items for segment s; a (g, r)'s
        // segments follow each other.
        let mut units: Vec<(usize, usize, usize, &mut [f32])> =
            Vec::with_capacity(nkv * runs.len() * n_seg);
        let mut rest = &mut self.heads[..n * nkv * n_seg * item];
        for g in 0..nkv {
            for (r, &(_, k)) in runs.iter().enumerate() {
                for s in 0..n_seg {
                    let (unit, tail) = std::mem::take(&mut rest).split_at_mut(k * item);
                    units.push((g, r, s, unit));
                    rest = tail;
                }
            }
        }
        let attend = |_: usize, unit: &mut [(usize, usize, usize, &mut [f32])], _thread: usize| {
            let (g, r, s, ref mut buf) = unit[0];
            let (t0, k) = runs[r];
            let (qs, work) = buf.split_at_mut(k * qf);
            if s >= segments(
                visible_from(cfg, li, batch.get(t0).pos),
                batch.get(t0 + k - 1).pos,
            ) {
                return;
            }
            for (j, qj) in qs.chunks_exact_mut(qf).enumerate() {
                qj.copy_from_slice(&q[(t0 + j) * q_dim + g * qf..][..qf]);
            }
            Heads {
                q: qs,
                ..heads_of(g, r)
            }
            .segment(s, work);
        };
        let work: usize = batch.iter().map(|t| cfg.n_heads * (t.pos + 1)).sum();
        if pool.n_threads() > 1 && work >= PARALLEL_ATTENTION_FROM {
            pool.for_each_chunk_mut(&mut units, 1, attend);
        } else {
            for i in 0..units.len() {
                attend(i, &mut units[i..i + 1], 0);
            }
        }
        let (out, stats) = self.att_tmp.split_at_mut(MAX_HEADS.max(group) * hd);
        // Each (g, r)'s units: segment 0 and the n_seg − 1 after it.
        for at in (0..units.len()).step_by(n_seg) {
            let (g, r, _, ref buf) = units[at];
            let (t0, k) = runs[r];
            let heads = Heads {
                q: &buf[..k * qf],
                ..heads_of(g, r)
            };
            let works = units[at..at + n_seg].iter().map(|u| &u.3[k * qf..]);
            let (out, stats) = (&mut out[..k * qf], &mut stats[..2 * k * group]);
            heads.gather(works, out, stats);
            for (j, o) in out.chunks_exact(qf).enumerate() {
                self.att_out[(t0 + j) * q_dim + g * qf..][..qf].copy_from_slice(o);
            }
        }
    }

    /// A q8_0 cache, stored by rows: sequences are taken in groups whose
    /// K/V, widened to f32 ([`State::widen_group`]), fit the n_ctx rows of
    /// `kf`/`vf`, each group in one pass over the pool
    /// ([`State::attend_group`]), so several short sequences share one
    /// dispatch.
    fn attend_rows(&mut self, pool: &ThreadPool, li: usize, batch: &Batch<'_>) {
        let (n, hd, n_ctx) = (batch.n, self.cfg.head_dim, self.n_ctx);
        let mut next = 0;
        while next < self.caches.len() {
            let used;
            (next, used) = self.widen_group(pool, li, next);
            if used == 0 {
                break;
            }
            self.attend_group(pool, li, batch);
        }
        let stride = head_stride(self.cfg, n_ctx);
        let heads = &self.heads[..n * self.cfg.n_heads * stride];
        for (i, buf) in heads.chunks_exact(stride).enumerate() {
            self.att_out[i * hd..(i + 1) * hd].copy_from_slice(&buf[n_ctx..n_ctx + hd]);
        }
    }

    /// Widen layer `li`'s keys and values of the call's sequences from
    /// `first` on into `kf`/`vf` while they fit (one block conversion each,
    /// split over the pool when long), marking where each starts in
    /// `seq_base`. Returns the next sequence and the rows used.
    fn widen_group(&mut self, pool: &ThreadPool, li: usize, first: usize) -> (usize, usize) {
        let kv_dim = self.cfg.kv_dim();
        self.seq_base.fill(usize::MAX);
        let (mut next, mut used) = (first, 0);
        while next < self.caches.len() {
            let last = self.seq_last[next];
            if last == usize::MAX {
                next += 1;
                continue;
            }
            let n_pos = last + 1;
            if used > 0 && used + n_pos > self.n_ctx {
                break;
            }
            self.seq_base[next] = used;
            let kv = self.caches[next].layer(li);
            let span = used * kv_dim..(used + n_pos) * kv_dim;
            let (kf, vf) = (&mut self.kf[span.clone()], &mut self.vf[span]);
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
        (next, used)
    }

    /// Per (token, query head) of the sequences widened into `kf`/`vf`:
    /// scores, softmax and the weighted sum of values, into `heads`.
    fn attend_group(&mut self, pool: &ThreadPool, li: usize, batch: &Batch<'_>) {
        let cfg = self.cfg;
        let (n, hd, q_dim, kv_dim, n_ctx) =
            (batch.n, cfg.head_dim, cfg.q_dim(), cfg.kv_dim(), self.n_ctx);
        let (group, scale) = (cfg.n_heads / cfg.n_kv_heads, self.scale());
        let stride = head_stride(cfg, n_ctx);
        let (q, kf, vf, base) = (&self.q[..n * q_dim], &*self.kf, &*self.vf, &*self.seq_base);
        // One (token, head) per chunk of `heads`: scores, then output.
        let head = |start: usize, buf: &mut [f32], _thread: usize| {
            let th = start / stride; // token · n_heads + head
            let (t, h) = (th / cfg.n_heads, th % cfg.n_heads);
            let tok = batch.get(t);
            let b = base[tok.seq];
            if b == usize::MAX {
                return; // not in this group
            }
            let (kf, vf) = (&kf[b * kv_dim..], &vf[b * kv_dim..]); // (used, kv_dim) each
            let kvh = h / group;
            let q_h = &q[t * q_dim + h * hd..][..hd]; // (head_dim,)
            let (scores, rest) = buf.split_at_mut(n_ctx);
            let out = &mut rest[..hd]; // (head_dim,)
            let first = visible_from(cfg, li, tok.pos);
            let att = &mut scores[first..=tok.pos]; // (pos + 1 - first,)
                                                    // Key/value row p of this kv head: kf[p·kv_dim + kvh·hd..][..hd].
            let (kf, vf) = (&kf[first * kv_dim..], &vf[first * kv_dim..]);
            ops::dot_rows(q_h, &kf[kvh * hd..], kv_dim, att);
            for a in att.iter_mut() {
                *a *= scale.scale;
            }
            if scale.softcap > 0.0 {
                vecops::softcap(att, scale.softcap);
            }
            ops::softmax(att);
            out.fill(0.0);
            ops::axpy_rows(out, att, &vf[kvh * hd..], kv_dim);
        };
        // Spread (token, head) pairs over the pool once there is enough
        // work; each is computed the same way either way.
        let work: usize = (batch.iter())
            .filter(|t| base[t.seq] != usize::MAX)
            .map(|t| cfg.n_heads * (t.pos + 1))
            .sum();
        let heads = &mut self.heads[..n * cfg.n_heads * stride];
        if pool.n_threads() > 1 && work >= PARALLEL_ATTENTION_FROM {
            pool.for_each_chunk_mut(heads, stride, head);
        } else {
            for (i, buf) in heads.chunks_exact_mut(stride).enumerate() {
                head(i * stride, buf, 0);
            }
        }
    }

    /// xb = rmsnorm(x); x += (act(xb·Wgateᵀ) ⊙ xb·Wupᵀ)·Wdownᵀ, or the
    /// same through each token's experts; Gemma norms the sum first.
    fn mlp(&mut self, pool: &ThreadPool, li: usize, n: usize) {
        let (cfg, l) = (self.cfg, &self.w.layers[li]);
        let dim = cfg.dim;
        let (x, xb) = (&mut self.x[..n * dim], &mut self.xb[..n * dim]);
        norm_rows(pool, xb, x, &l.ffn_norm, cfg.norm_eps);
        let proj = &mut self.proj[..n * dim];
        match &l.ffn {
            Ffn::Dense { gate, up, down } => {
                let ffn = cfg.ffn_dim;
                // gate and up (n, ffn_dim) each, from one quantized input.
                let (hb, hb2) = (&mut self.hb[..n * ffn], &mut self.hb2[..n * ffn]);
                let outs = &mut [&mut *hb, &mut *hb2];
                matmul_each(pool, &[gate, up], xb, outs, &mut self.scratch);
                gated(pool, cfg.variant.act, hb, hb2);
                matmul(pool, down, hb, proj, &mut self.scratch); // (n, dim)
            }
            Ffn::Experts {
                router,
                gate,
                up,
                down,
            } => {
                let moe = self
                    .moe
                    .as_mut()
                    .expect("a mixture's state has its buffers");
                let bufs = (&mut self.hb, &mut self.hb2, &mut self.scratch);
                moe.run(pool, cfg, (router, gate, up, down), xb, n, proj, bufs);
            }
        }
        if let Some(w) = &l.post_ffn_norm {
            for p in proj.chunks_exact_mut(dim) {
                ops::rmsnorm_inplace(p, w, cfg.norm_eps);
            }
        }
        ops::add_inplace(x, proj);
    }

    /// logits = rmsnorm(x) · Woutᵀ for the rows asked for, `(rows, vocab)`.
    fn head(&mut self, pool: &ThreadPool) {
        let (cfg, w) = (self.cfg, self.w);
        let (dim, rows) = (cfg.dim, &self.out.rows);
        let xb = &mut self.xb[..rows.len() * dim];
        for (o, &r) in xb.chunks_exact_mut(dim).zip(rows) {
            ops::rmsnorm(
                o,
                &self.x[r * dim..(r + 1) * dim],
                &w.output_norm,
                cfg.norm_eps,
            );
        }
        if self.out.embeddings {
            // Embeddings: the normed hidden states, no vocabulary matmul.
            let n = rows.len() * dim;
            self.out.embd[..n].copy_from_slice(xb);
            self.out.n_embd = n;
            return;
        }
        let n_logits = rows.len() * cfg.vocab_size;
        self.out.n_logits = n_logits;
        let logits = &mut self.out.logits[..n_logits];
        matmul(pool, &w.output, xb, logits, &mut self.scratch);
        if cfg.variant.final_softcap > 0.0 {
            vecops::softcap(logits, cfg.variant.final_softcap); // Gemma 2
        }
    }
}

impl Pass for State<'_> {
    fn forward(&mut self, pool: &ThreadPool, batch: Batch<'_>) -> &[f32] {
        let lim = self.out.limits(self.n_batch, self.caches.len(), self.n_ctx);
        check_batch(&lim, &batch, &mut self.out.rows);
        self.out.begin(batch.n);
        self.embed(&batch);
        self.positions(&batch);
        for li in 0..=self.out.last_layer() {
            self.qkv(pool, li, &batch);
            self.attend(pool, li, &batch);
            self.mlp(pool, li, batch.n);
        }
        if self.out.head() {
            self.head(pool);
        }
        self.out.logits()
    }

    fn outputs(&self) -> &Outputs {
        &self.out
    }

    fn outputs_mut(&mut self) -> &mut Outputs {
        &mut self.out
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn n_batch(&self) -> usize {
        self.n_batch
    }

    fn n_seq(&self) -> usize {
        self.caches.len()
    }

    fn kv_type(&self) -> KvType {
        self.caches[0].ty()
    }

    fn kv_bytes(&self) -> usize {
        self.caches.iter().map(KvCache::bytes).sum()
    }

    /// Every layer has keys.
    fn capture(&mut self, layers: &[usize]) -> Result<(), Error> {
        self.out.capture.set(layers)
    }

    fn copy_seq(&mut self, src: usize, dst: usize, positions: std::ops::Range<usize>) {
        if src != dst {
            let (from, to) = crate::pass::two_mut(&mut self.caches, src, dst);
            from.copy_positions(to, positions);
        }
    }
}

/// Rows from which [`norm_rows`] splits them over the pool (a prompt's
/// batch).
const PARALLEL_NORM_FROM: usize = 8;

/// `out = rmsnorm(x)` row by row, each row as [`ops::rmsnorm`] computes
/// it; the rows of a batch split over the pool (a serial step between
/// two matrix products kept the other thread waiting).
fn norm_rows(pool: &ThreadPool, out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let dim = w.len();
    let rows = |start: usize, out: &mut [f32], _thread: usize| {
        ops::rmsnorm_rows(out, &x[start..start + out.len()], w, eps);
    };
    let n = out.len() / dim;
    if pool.n_threads() > 1 && n >= PARALLEL_NORM_FROM {
        let per_chunk = n.div_ceil(2 * pool.n_threads()).next_multiple_of(4);
        pool.for_each_chunk_mut(out, per_chunk * dim, rows);
    } else {
        rows(0, out, 0);
    }
}

/// Elements of `gate = act(gate) ⊙ up` from which it is split over the
/// pool (a prompt's batch; one token's is too small to pay a dispatch).
const PARALLEL_GATED_FROM: usize = 16 << 10;

/// `gate = act(gate) ⊙ up`, SiLU through the vector kernels' polynomial
/// `exp` (libm's scalar `expf` was 8% of a prompt's time).
fn gated(pool: &ThreadPool, act: Activation, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gated: gate and up lengths differ");
    let f = |start: usize, g: &mut [f32], _thread: usize| {
        let u = &up[start..start + g.len()];
        match act {
            Activation::Silu => vecops::swiglu(g, u),
            Activation::GeluTanh => ops::geglu(g, u),
        }
    };
    if pool.n_threads() > 1 && gate.len() >= PARALLEL_GATED_FROM {
        let chunk = gate
            .len()
            .div_ceil(4 * pool.n_threads())
            .next_multiple_of(16);
        pool.for_each_chunk_mut(gate, chunk, f);
    } else {
        f(0, gate, 0);
    }
}

/// First position a token at `pos` sees in layer `li` (0 but in a
/// sliding-window layer).
fn visible_from(cfg: &ModelConfig, li: usize, pos: usize) -> usize {
    cfg.variant
        .swa
        .as_ref()
        .map_or(0, |w| w.first_visible(li, pos))
}

/// Rows of the windowed layers' cos/sin tables (none without a window).
fn swa_rows(cfg: &ModelConfig, n_batch: usize) -> usize {
    if cfg.variant.swa.is_some() {
        n_batch
    } else {
        0
    }
}

/// Width of the MLP's hidden buffers: the MLP's, or one expert's.
fn ffn_width(cfg: &ModelConfig) -> usize {
    cfg.variant.experts.map_or(cfg.ffn_dim, |e| e.ffn_dim)
}

/// The buffers of a mixture of experts: router outputs, each token's
/// choice, and one expert's batch gathered from the tokens that chose it.
struct MoeBuffers {
    router: Vec<f32>,        // (n_batch, n_expert) logits, then probabilities
    chosen: Vec<(u32, f32)>, // (n_batch, used) expert and weight, by expert
    rows: Vec<usize>,        // tokens routed to the current expert
    weights: Vec<f32>,       // their weights
    xe: Vec<f32>,            // (n_batch, dim) their inputs
    ye: Vec<f32>,            // (n_batch, dim) the expert's outputs
}

impl MoeBuffers {
    fn new(dim: usize, e: &crate::config::Experts, nb: usize) -> MoeBuffers {
        MoeBuffers {
            router: vec![0.0; nb * e.count],
            chosen: vec![(0, 0.0); nb * e.used],
            rows: Vec::with_capacity(nb),
            weights: Vec::with_capacity(nb),
            xe: vec![0.0; nb * dim],
            ye: vec![0.0; nb * dim],
        }
    }

    /// `proj` `(n, dim)` = Σ over each token's chosen experts of weight ·
    /// expert(xb). Routing as llama.cpp's `build_moe_ffn` with softmax
    /// gating and `norm_w`: softmax over all experts, the `used` largest
    /// (lower index first on ties), their weights divided by their sum.
    /// Each expert's matrices are read once for all the tokens that chose
    /// it, and only chosen experts are read at all. A token's sum runs over
    /// its experts in expert order, whatever else is in the batch.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn run(
        &mut self,
        pool: &ThreadPool,
        cfg: &ModelConfig,
        (router, gate, up, down): (&QMatrix<'_>, &[QMatrix<'_>], &[QMatrix<'_>], &[QMatrix<'_>]),
        xb: &[f32],
        n: usize,
        proj: &mut [f32],
        (hb, hb2, scratch): (&mut Vec<f32>, &mut Vec<f32>, &mut MatmulScratch),
    ) {
        let e = cfg.variant.experts.expect("called for a mixture");
        let (dim, eff) = (cfg.dim, e.ffn_dim);
        let probs = &mut self.router[..n * e.count];
        matmul(pool, router, xb, probs, scratch); // (n, n_expert)
        let chosen = &mut self.chosen[..n * e.used];
        for (p, c) in probs
            .chunks_exact_mut(e.count)
            .zip(chosen.chunks_exact_mut(e.used))
        {
            ops::softmax(p);
            choose_experts(p, c);
        }
        proj.fill(0.0);
        for ex in 0..e.count {
            self.rows.clear();
            self.weights.clear();
            for (t, c) in chosen.chunks_exact(e.used).enumerate() {
                if let Some(&(_, w)) = c.iter().find(|(i, _)| *i as usize == ex) {
                    self.rows.push(t);
                    self.weights.push(w);
                }
            }
            let m = self.rows.len();
            if m == 0 {
                continue;
            }
            let xe = &mut self.xe[..m * dim];
            for (dst, &t) in xe.chunks_exact_mut(dim).zip(&self.rows) {
                dst.copy_from_slice(&xb[t * dim..(t + 1) * dim]);
            }
            let (h, h2) = (&mut hb[..m * eff], &mut hb2[..m * eff]);
            let outs = &mut [&mut *h, &mut *h2];
            matmul_each(pool, &[&gate[ex], &up[ex]], xe, outs, scratch);
            gated(pool, cfg.variant.act, h, h2);
            let ye = &mut self.ye[..m * dim];
            matmul(pool, &down[ex], h, ye, scratch); // (m, dim)
            for ((y, &t), &w) in ye.chunks_exact(dim).zip(&self.rows).zip(&self.weights) {
                ops::axpy(&mut proj[t * dim..(t + 1) * dim], w, y);
            }
        }
    }
}

/// The `c.len()` most probable experts of `probs`, with weights
/// renormalized to sum to 1 (llama.cpp clamps the sum at f16's smallest
/// normal), stored in expert order.
fn choose_experts(probs: &[f32], c: &mut [(u32, f32)]) {
    for slot in c.iter_mut() {
        *slot = (u32::MAX, f32::NEG_INFINITY);
    }
    for (i, &p) in probs.iter().enumerate() {
        // Insert into the sorted top list (descending; earlier index wins ties).
        if let Some(at) = c.iter().position(|&(_, q)| p > q) {
            c[at..].rotate_right(1);
            c[at] = (i as u32, p);
        }
    }
    let sum: f32 = c.iter().map(|&(_, w)| w).sum::<f32>().max(6.103_515_6e-5);
    for slot in c.iter_mut() {
        slot.1 /= sum;
    }
    c.sort_unstable_by_key(|&(i, _)| i);
}

/// Floats of one layer's keys (or values) widened to f32, for a cache
/// stored by rows (q8_0); other caches are read in place.
fn widened_kv(cfg: &ModelConfig, o: &StateOptions) -> usize {
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

/// Floats of attention work area per token, for either cache layout: by
/// rows, per head, scores over the context and the head's output; by
/// columns, per kv head, a work area per segment of the context.
fn attention_floats(cfg: &ModelConfig, n_ctx: usize) -> usize {
    let rows = cfg.n_heads * head_stride(cfg, n_ctx);
    let stride = n_ctx.next_multiple_of(vecops::KEY_BLOCK);
    let group = cfg.n_heads / cfg.n_kv_heads;
    let columns = cfg.n_kv_heads
        * stride.div_ceil(SEGMENT)
        * (group * cfg.head_dim + work_floats(group, cfg.head_dim, stride));
    rows.max(columns)
}

/// Floats of one run's gathered attention: outputs and statistics of up
/// to [`MAX_HEADS`] heads (or one token's group, if larger).
fn gathered_floats(cfg: &ModelConfig) -> usize {
    let group = cfg.n_heads / cfg.n_kv_heads.max(1);
    MAX_HEADS.max(group) * (cfg.head_dim + 2)
}

/// What a [`State`] made with `o` will hold (an unusable cache type counts
/// as f16 here; making the state reports it).
pub(crate) fn memory(cfg: &ModelConfig, weights_bytes: u64, o: &StateOptions) -> MemoryEstimate {
    let (n_ctx, nb) = (o.n_ctx, o.n_batch.max(1));
    let kv = |ty| KvCache::bytes_for(ty, cfg.n_layers, n_ctx, cfg.n_kv_heads, cfg.head_dim);
    let kv_cache = kv(o.kv_type).or_else(|| kv(KvType::F16)).unwrap_or(0) * o.n_seq.max(1) as u64;
    let per_token = 4 * cfg.dim
        + 2 * cfg.q_dim()
        + 2 * cfg.kv_dim()
        + 2 * ffn_width(cfg)
        + attention_floats(cfg, n_ctx)
        + cfg.rope.n_rot
        + if cfg.variant.swa.is_some() {
            cfg.rope.n_rot
        } else {
            0
        }
        + cfg
            .variant
            .experts
            .map_or(0, |e| e.count + 2 * cfg.dim + 2 * e.used);
    // Plus, for a q8_0 cache, one layer's K and V widened to f32.
    let floats = nb * per_token
        + o.logit_rows() * cfg.vocab_size
        + 2 * widened_kv(cfg, o)
        + gathered_floats(cfg);
    // Plus the quantized activations (at most ~1.1 bytes per input
    // float, rows rounded up to cache lines) and the transposed output.
    let widest = cfg.dim.max(cfg.ffn_dim).max(cfg.q_dim());
    let scratch = floats as u64 * 4
        + nb as u64 * (2 * widest as u64 + 64)
        + 4 * (nb * cfg.vocab_size.max(widest)) as u64;
    MemoryEstimate {
        weights: weights_bytes,
        kv_cache,
        scratch,
    }
}
