//! The `cachefit` forward pass. The model is small: its matrices stay in
//! L2, so a plain loop over the tokens (a few per weight read) keeps every
//! token's arithmetic identical whatever the batch, sequence mix or thread
//! count. The steps of [`Lane::run`]:
//!
//! ```text
//! x = E[token]                                            (dim,)          embed
//! for each block:
//!     h = rmsnorm(x) · attn_norm                          (dim,)
//!     C: hist[seq][pos] = h                                               conv
//!        g = Wgate·h                                      (dim,)
//!        c[j] = Σ_k taps[k][j] · hist[seq][pos-K+1+k][j]  zeros before 0
//!        x += Wout·(silu(g) ⊙ c)
//!     A: q | k | v = Wqkv·h                               (nh·hd | nkv·hd | nkv·hd)  qkv
//!        (captured blocks keep q and k here, before RoPE)
//!        rope(q, k); cache[seq][pos] = k, v
//!        per query head: softmax(q·Kᵀ/√hd over 0..=pos)·V (kv head = head / group)  attend
//!        x += Wo·heads
//!     h = rmsnorm(x) · ffn_norm                                           mlp
//!     x += Wdown·(silu(Wgate·h) ⊙ Wup·h)
//! logits = cap·tanh(E·(rmsnorm(x) · output_norm) / cap)   rows asked for  head
//! ```
//!
//! Int8 matrices read the activation quantized once per vector, as a
//! pair of int8 vectors ([`Activations`], up to [`TOKENS_PER_PASS`] tokens
//! against each weight read). Exp, SiLU, tanh and attention use
//! [`kernels::vecops`].
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
//!
//! Per-sequence state, sized by `n_ctx`: the attention blocks' keys and
//! values in a [`KvCache`] (f16 or f32, laid out as the llama family's),
//! and each convolution block's normed input `h` of **every** position
//! (f32, `(position, dim)`). Keeping all positions, not a rolling window
//! of K−1, makes the conv state behave exactly like the KV cache: a batch
//! may start at any position `p` whose predecessors were computed
//! (continuing, or after the server truncated a slot to a common prefix),
//! and a batch at position 0 needs no reset.

use super::weights::{Activations, Block, Input, Matrix, Mixer, Weights, TOKENS_PER_PASS};
use crate::attention::{self, Heads, Scale};
use crate::batch::{check_batch, Batch, StateOptions, Token};
use crate::capture::Capture;
use crate::config::{BlockKind, ModelConfig};
use crate::kv_cache::{KvCache, KvType};
use crate::memory::MemoryEstimate;
use crate::pass::{Outputs, Pass};
use crate::token_codes;
use crate::Error;
use kernels::matmul::MatmulScratch;
use kernels::ops;
use kernels::pool::ThreadPool;
use kernels::vecops;

/// The caches of one sequence.
struct Sequence {
    /// `(conv blocks, n_ctx, dim)`: each conv block's normed input by
    /// position.
    conv: Vec<f32>,
    /// The attention blocks' keys (after RoPE) and values.
    kv: KvCache,
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
    scores: Vec<f32>, // attention's work area (attention::work_floats)
    xq: Activations,
    scratch: MatmulScratch,
    /// A one-thread pool (no workers: runs inline) for the float matrices.
    serial: ThreadPool,
    toks: Vec<usize>,   // the call's tokens this lane runs, ascending
    tokens: Vec<Token>, // those tokens, sequences counted from the lane's first
    logits: Vec<f32>,   // (its logit rows, vocab)
    out: Vec<usize>,    // for each of its logit rows: the row of the call's output
    capture: Capture,   // its tokens' captured rows, in `toks` order
    codes: Vec<f32>,    // (n_batch, code bits) ±1 token codes, if the model has them
}

/// Two lanes: at most two groups of sequences run at once.
const LANES: usize = 2;

/// Activations, per-sequence caches and scratch of a `cachefit` model, for
/// the weights they were made for.
pub struct State<'m> {
    cfg: &'m ModelConfig,
    w: &'m Weights<'m>,
    n_ctx: usize,
    n_batch: usize,
    kv_type: KvType,
    cos: Vec<f32>, // (n_ctx, head_dim/2) RoPE table
    sin: Vec<f32>, // (n_ctx, head_dim/2)
    lanes: Vec<Lane>,
    seq_tokens: Vec<usize>, // (n_seq,) tokens of each sequence in a call
    seqs: Vec<Sequence>,
    out: Outputs,
}

/// What every lane of a call reads.
struct Shared<'a> {
    cfg: &'a ModelConfig,
    w: &'a Weights<'a>,
    cos: &'a [f32],
    sin: &'a [f32],
    n_ctx: usize,
    /// The call's tokens whose logits are asked for.
    rows: &'a [usize],
    batch: Batch<'a>,
    /// The last block to run, and whether the output head follows it.
    last: usize,
    head: bool,
}

impl<'m> State<'m> {
    pub(crate) fn new(
        cfg: &'m ModelConfig,
        w: &'m Weights<'m>,
        o: &StateOptions,
    ) -> Result<State<'m>, Error> {
        let (n_ctx, nb, hd) = (o.n_ctx, o.n_batch.max(1), cfg.head_dim);
        if o.kv_type == KvType::Q8_0 {
            return Err(Error::BadValue {
                key: "cache type".into(),
                problem: format!(
                    "q8_0 is not supported by the cachefit architecture (its heads of {hd} \
                     values are stored per position, not in 32-value blocks); use f16 or f32"
                ),
            });
        }
        let (n_conv, n_attn) = w.n_blocks();
        let seq = || -> Result<Sequence, Error> {
            Ok(Sequence {
                conv: vec![0.0; n_conv * n_ctx * cfg.dim],
                kv: KvCache::new(o.kv_type, n_attn, n_ctx, cfg.n_kv_heads, hd)?,
            })
        };
        let seqs = (0..o.n_seq.max(1))
            .map(|_| seq())
            .collect::<Result<_, _>>()?;
        let half = hd / 2;
        let (mut cos, mut sin) = (vec![0.0; n_ctx * half], vec![0.0; n_ctx * half]);
        if half > 0 {
            let rows = cos.chunks_exact_mut(half).zip(sin.chunks_exact_mut(half));
            for (p, (c, s)) in rows.enumerate() {
                ops::rope_freqs(&cfg.rope, p, None, c, s);
            }
        }
        let lanes = (0..LANES).map(|_| Lane::new(cfg, w, o)).collect();
        Ok(State {
            cfg,
            w,
            n_ctx,
            n_batch: nb,
            kv_type: o.kv_type,
            cos,
            sin,
            lanes,
            seq_tokens: vec![0; o.n_seq.max(1)],
            seqs,
            out: Outputs::new(cfg, o),
        })
    }

    /// Sequence `seq`'s cache of the attention blocks' keys (after RoPE)
    /// and values; layer `i` is the `i`-th attention block.
    pub fn cache(&self, seq: usize) -> &KvCache {
        &self.seqs[seq].kv
    }

    /// Where to split the sequences so both groups get about half the
    /// tokens, when there are two threads and two sequences to split.
    fn split(&mut self, pool: &ThreadPool, batch: &Batch<'_>) -> Option<usize> {
        self.seq_tokens.fill(0);
        for t in batch.iter() {
            self.seq_tokens[t.seq] += 1;
        }
        let active = self.seq_tokens.iter().filter(|&&c| c > 0).count();
        (pool.n_threads() >= 2 && active >= 2).then(|| {
            let (n, counts) = (batch.n, &self.seq_tokens);
            let (mut before, mut mid) = (0, 0);
            // The first index past half the tokens, leaving tokens after it.
            while mid < counts.len() && (before == 0 || before + counts[mid] <= n / 2) {
                before += counts[mid];
                mid += 1;
            }
            mid
        })
    }
}

impl Pass for State<'_> {
    fn forward(&mut self, pool: &ThreadPool, batch: Batch<'_>) -> &[f32] {
        let lim = self.out.limits(self.n_batch, self.seqs.len(), self.n_ctx);
        check_batch(&lim, &batch, &mut self.out.rows);
        self.out.begin(batch.n);
        let mid = self.split(pool, &batch);
        let ctx = Shared {
            cfg: self.cfg,
            w: self.w,
            cos: &self.cos,
            sin: &self.sin,
            n_ctx: self.n_ctx,
            rows: &self.out.rows,
            batch,
            last: self.out.last_layer(),
            head: self.out.head(),
        };
        match mid {
            None => {
                let lane = &mut self.lanes[0];
                lane.toks.clear();
                lane.toks.extend(0..batch.n);
                lane.run(&ctx, &mut self.seqs, 0);
            }
            Some(mid) => {
                for lane in &mut self.lanes {
                    lane.toks.clear();
                }
                for (i, t) in batch.iter().enumerate() {
                    self.lanes[usize::from(t.seq >= mid)].toks.push(i);
                }
                let (lo, hi) = self.seqs.split_at_mut(mid);
                let (l0, l1) = self.lanes.split_at_mut(1);
                let mut jobs = [(&mut l0[0], lo, 0), (&mut l1[0], hi, mid)];
                pool.for_each_chunk_mut(&mut jobs, 1, |_, job, _| {
                    let (lane, seqs, first) = &mut job[0];
                    lane.run(&ctx, seqs, *first);
                });
            }
        }
        // Each lane's logit rows and captured rows into the call's.
        let (v, out) = (self.cfg.vocab_size, &mut self.out);
        let head = out.head();
        if head {
            out.n_logits = out.rows.len() * v;
        }
        for lane in &mut self.lanes[..if mid.is_some() { LANES } else { 1 }] {
            // One lane ran every row, in order: hand its buffer over
            // instead of copying vocab floats a row (the lane's next call
            // overwrites what it gets back).
            if head && mid.is_none() && lane.logits.len() == out.logits.len() {
                std::mem::swap(&mut lane.logits, &mut out.logits);
            } else if head {
                for (k, &row) in lane.out.iter().enumerate() {
                    let dst = &mut out.logits[row * v..(row + 1) * v];
                    dst.copy_from_slice(&lane.logits[k * v..(k + 1) * v]);
                }
            }
            out.capture.scatter(&lane.capture, &lane.toks);
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
        self.seqs.len()
    }

    fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Keys and values, and the convolution blocks' inputs.
    fn kv_bytes(&self) -> usize {
        let seq = |s: &Sequence| 4 * s.conv.len() + s.kv.bytes();
        self.seqs.iter().map(seq).sum()
    }

    /// The attention blocks' keys and values, and the convolution blocks'
    /// inputs at those positions.
    fn copy_seq(&mut self, src: usize, dst: usize, positions: std::ops::Range<usize>) {
        if src == dst {
            return;
        }
        let (d, hist_len) = (self.cfg.dim, self.n_ctx * self.cfg.dim);
        let (from, to) = crate::pass::two_mut(&mut self.seqs, src, dst);
        from.kv.copy_positions(&mut to.kv, positions.clone());
        for (f, t) in from
            .conv
            .chunks_exact(hist_len)
            .zip(to.conv.chunks_exact_mut(hist_len))
        {
            let span = positions.start * d..positions.end * d;
            t[span.clone()].copy_from_slice(&f[span]);
        }
    }

    /// Layers are blocks; only attention blocks have keys and queries.
    fn capture(&mut self, layers: &[usize]) -> Result<(), Error> {
        for &l in layers {
            if let Some(Mixer::Conv { .. }) = self.w.blocks.get(l).map(|b| &b.mixer) {
                return Err(Error::Layer {
                    layer: l,
                    problem: "a convolution block: it has no keys or queries".into(),
                });
            }
        }
        self.out.capture.set(layers)?;
        for lane in &mut self.lanes {
            lane.capture.set(layers)?;
        }
        Ok(())
    }
}

impl Lane {
    fn new(cfg: &ModelConfig, w: &Weights<'_>, o: &StateOptions) -> Lane {
        let (d, nb, n_ctx) = (cfg.dim, o.n_batch.max(1), o.n_ctx);
        let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());
        let wide = d.max(cfg.ffn_dim);
        let code_bits = match &w.input {
            Input::Codes { codes, .. } => codes.bits,
            Input::Tied => 0,
        };
        let mut lane = Lane {
            x: vec![0.0; nb * d],
            h: vec![0.0; nb * d],
            g: vec![0.0; nb * wide],
            up: vec![0.0; nb * wide],
            qkv: vec![0.0; nb * (q_dim + 2 * kv_dim)],
            heads: vec![0.0; nb * q_dim],
            proj: vec![0.0; nb * d],
            scores: vec![
                0.0;
                attention::work_floats(
                    cfg.n_heads / cfg.n_kv_heads,
                    cfg.head_dim,
                    n_ctx.next_multiple_of(vecops::KEY_BLOCK),
                )
            ],
            xq: Activations::with_capacity(wide.max(q_dim).max(code_bits)),
            scratch: MatmulScratch::new(),
            serial: ThreadPool::new(1),
            toks: Vec::with_capacity(nb),
            tokens: Vec::with_capacity(nb),
            logits: vec![0.0; o.logit_rows() * cfg.vocab_size],
            out: Vec::with_capacity(o.logit_rows()),
            capture: Capture::new(cfg.n_layers, nb, q_dim, kv_dim),
            codes: vec![0.0; nb * code_bits],
        };
        // Size the float matrices' activation scratch now, so the first
        // call allocates nothing either.
        let mut float = |m: &Matrix<'_>| {
            if let Matrix::Float(q) = m {
                lane.scratch.reserve(q, 1);
            }
        };
        float(&w.head);
        if let Input::Codes { proj, codes } = &w.input {
            float(proj);
            debug_assert_eq!(lane.codes.len(), nb * codes.bits);
        }
        for b in &w.blocks {
            let (m0, m1) = match &b.mixer {
                Mixer::Conv { gate, out, .. } => (gate, out),
                Mixer::Attn { qkv, out } => (qkv, out),
            };
            for m in [m0, m1, &b.ffn_gate, &b.ffn_up, &b.ffn_down] {
                float(m);
            }
        }
        lane
    }

    /// The forward pass over the call's tokens `self.toks`, whose
    /// sequences are `seqs` (sequence `first + i` is `seqs[i]`).
    fn run(&mut self, ctx: &Shared<'_>, seqs: &mut [Sequence], first: usize) {
        self.tokens.clear();
        for &i in &self.toks {
            let t = ctx.batch.get(i);
            self.tokens.push(Token {
                seq: t.seq - first,
                ..t
            });
        }
        let (n, d, eps) = (self.toks.len(), ctx.cfg.dim, ctx.cfg.norm_eps);
        match &ctx.w.input {
            Input::Tied => {
                for (xt, t) in self.x[..n * d].chunks_exact_mut(d).zip(&self.tokens) {
                    ctx.w.head.row(t.id as usize, xt); // embed
                }
            }
            Input::Codes { proj, codes } => {
                // x = proj · code(token): ±1 codes quantize exactly.
                let bits = codes.bits;
                for (ct, t) in self.codes[..n * bits]
                    .chunks_exact_mut(bits)
                    .zip(&self.tokens)
                {
                    token_codes::code_signs(codes.seed, t.id, ct);
                }
                let (c, x) = (&self.codes[..n * bits], &mut self.x[..n * d]);
                project(&self.serial, proj, c, x, &mut self.xq, &mut self.scratch);
            }
        }
        let (mut ci, mut ai) = (0, 0); // index among conv / attention blocks
        for (b, block) in ctx.w.blocks.iter().enumerate().take(ctx.last + 1) {
            for (o, xt) in self.h[..n * d]
                .chunks_exact_mut(d)
                .zip(self.x.chunks_exact(d))
            {
                rmsnorm(o, xt, &block.attn_norm, eps);
            }
            match &block.mixer {
                Mixer::Conv { gate, taps, out } => {
                    self.conv(ctx, seqs, ci, [gate, out], taps);
                    ci += 1;
                }
                Mixer::Attn { qkv, out } => {
                    self.qkv(ctx, seqs, b, ai, qkv);
                    self.attend(ctx, seqs, ai, out);
                    ai += 1;
                }
            }
            ops::add_inplace(&mut self.x[..n * d], &self.proj[..n * d]);
            self.mlp(ctx.cfg, block);
        }
        if ctx.head {
            self.head(ctx);
        }
    }

    /// C (conv block `ci`): each token's `h` into its sequence's history;
    /// proj = Wout·(silu(Wgate·h) ⊙ causal convolution of the history).
    fn conv(
        &mut self,
        ctx: &Shared<'_>,
        seqs: &mut [Sequence],
        ci: usize,
        [gate, out]: [&Matrix<'_>; 2],
        taps: &[f32],
    ) {
        let (n, d, k_taps) = (self.tokens.len(), ctx.cfg.dim, ctx.w.conv_kernel);
        let hist_len = ctx.n_ctx * d;
        let h = &self.h[..n * d];
        // Every token's input first: a later token of the batch reads the
        // earlier ones'.
        for (ht, tok) in h.chunks_exact(d).zip(&self.tokens) {
            let hist = &mut seqs[tok.seq].conv[ci * hist_len..(ci + 1) * hist_len];
            hist[tok.pos * d..(tok.pos + 1) * d].copy_from_slice(ht);
        }
        let (g, c) = (&mut self.g[..n * d], &mut self.up[..n * d]);
        project(&self.serial, gate, h, g, &mut self.xq, &mut self.scratch); // (n, dim)
        for (ct, tok) in c.chunks_exact_mut(d).zip(&self.tokens) {
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
        let proj = &mut self.proj[..n * d];
        project(&self.serial, out, g, proj, &mut self.xq, &mut self.scratch); // (n, dim)
    }

    /// A (block `b`, attention block `ai`): q | k | v = Wqkv·h, captured
    /// before RoPE if asked; RoPE; k and v into each token's cache.
    fn qkv(&mut self, ctx: &Shared<'_>, seqs: &mut [Sequence], b: usize, ai: usize, qkv: &Matrix) {
        let cfg = ctx.cfg;
        let (n, d, hd, half) = (self.tokens.len(), cfg.dim, cfg.head_dim, cfg.head_dim / 2);
        let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());
        let buf = &mut self.qkv[..n * (q_dim + 2 * kv_dim)];
        project(
            &self.serial,
            qkv,
            &self.h[..n * d],
            buf,
            &mut self.xq,
            &mut self.scratch,
        );
        let slot = self.capture.slot(b);
        let rows = buf.chunks_exact_mut(q_dim + 2 * kv_dim);
        for (t, (row, tok)) in rows.zip(&self.tokens).enumerate() {
            let (qk, v) = row.split_at_mut(q_dim + kv_dim);
            if let Some(s) = slot {
                self.capture.store(s, t, &qk[..q_dim], &qk[q_dim..]);
            }
            let (c, sn) = (
                &ctx.cos[tok.pos * half..][..half],
                &ctx.sin[tok.pos * half..][..half],
            );
            for head in qk.chunks_exact_mut(hd) {
                ops::rope(head, c, sn, cfg.rope.layout);
            }
            seqs[tok.seq].kv.store(ai, tok.pos, &qk[q_dim..], v);
        }
    }

    /// Per token, query heads g·group.. attend over kv head g's positions
    /// 0..=pos of attention block `ai`; proj = Wo·heads.
    fn attend(&mut self, ctx: &Shared<'_>, seqs: &[Sequence], ai: usize, out: &Matrix) {
        let cfg = ctx.cfg;
        let (n, d, hd) = (self.tokens.len(), cfg.dim, cfg.head_dim);
        let (q_dim, qkv_dim) = (cfg.q_dim(), cfg.q_dim() + 2 * cfg.kv_dim());
        let group = cfg.n_heads / cfg.n_kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let heads = &mut self.heads[..n * q_dim];
        for (t, (o, tok)) in heads.chunks_exact_mut(q_dim).zip(&self.tokens).enumerate() {
            let q = &self.qkv[t * qkv_dim..][..q_dim];
            let kv = seqs[tok.seq].kv.layer(ai);
            let cols = kv
                .columns()
                .expect("a cachefit cache is f16 or f32, stored by columns");
            let groups = q
                .chunks_exact(group * hd)
                .zip(o.chunks_exact_mut(group * hd));
            for (g, (qg, og)) in groups.enumerate().take(cfg.n_kv_heads) {
                let heads = Heads {
                    cols,
                    kv_head: g,
                    hd,
                    stride: kv.stride(),
                    q: qg,
                    first: 0,
                    last: tok.pos,
                    tokens: 1,
                    scale: Scale {
                        scale,
                        softcap: 0.0,
                    },
                };
                heads.attend(&mut self.scores, og);
            }
        }
        let proj = &mut self.proj[..n * d];
        project(
            &self.serial,
            out,
            heads,
            proj,
            &mut self.xq,
            &mut self.scratch,
        ); // (n, dim)
    }

    /// h = rmsnorm(x) · ffn_norm; x += Wdown·(silu(Wgate·h) ⊙ Wup·h).
    fn mlp(&mut self, cfg: &ModelConfig, block: &Block<'_>) {
        let (n, d, ff) = (self.tokens.len(), cfg.dim, cfg.ffn_dim);
        let (x, h) = (&mut self.x[..n * d], &mut self.h[..n * d]);
        for (o, xt) in h.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
            rmsnorm(o, xt, &block.ffn_norm, cfg.norm_eps);
        }
        let (g, up) = (&mut self.g[..n * ff], &mut self.up[..n * ff]);
        let parts = h.chunks(TOKENS_PER_PASS * d);
        let outs = g
            .chunks_mut(TOKENS_PER_PASS * ff)
            .zip(up.chunks_mut(TOKENS_PER_PASS * ff));
        for (ht, (gt, ut)) in parts.zip(outs) {
            self.xq.quantize(ht, d); // once for gate and up
            block
                .ffn_gate
                .matvecs(&self.serial, ht, &mut self.xq, gt, &mut self.scratch);
            block
                .ffn_up
                .matvecs(&self.serial, ht, &mut self.xq, ut, &mut self.scratch);
        }
        for (gt, ut) in g.chunks_exact_mut(ff).zip(up.chunks_exact(ff)) {
            vecops::swiglu(gt, ut);
        }
        let proj = &mut self.proj[..n * d];
        project(
            &self.serial,
            &block.ffn_down,
            g,
            proj,
            &mut self.xq,
            &mut self.scratch,
        );
        ops::add_inplace(x, proj);
    }

    /// logits = softcap(H · rmsnorm(x)) (H the head), for the call's rows asked for that
    /// this lane ran, `(its rows, vocab)`.
    fn head(&mut self, ctx: &Shared<'_>) {
        let (d, v, w) = (ctx.cfg.dim, ctx.cfg.vocab_size, ctx.w);
        self.out.clear();
        for (row, &t) in ctx.rows.iter().enumerate() {
            let Ok(i) = self.toks.binary_search(&t) else {
                continue; // the other lane's
            };
            let k = self.out.len();
            let (hk, xi) = (&mut self.h[k * d..(k + 1) * d], &self.x[i * d..(i + 1) * d]);
            rmsnorm(hk, xi, &w.output_norm, ctx.cfg.norm_eps);
            self.out.push(row);
        }
        // The rows through the embedding (the largest matrix) several per
        // read of it, as every other matrix; each row's result is the same
        // bits as alone.
        let m = self.out.len();
        let (h, logits) = (&self.h[..m * d], &mut self.logits[..m * v]);
        project(
            &self.serial,
            &w.head,
            h,
            logits,
            &mut self.xq,
            &mut self.scratch,
        );
        if w.softcap > 0.0 {
            for lt in logits.chunks_exact_mut(v) {
                vecops::softcap(lt, w.softcap);
            }
        }
    }
}

/// `out = x / sqrt(mean(x²) + eps) · weight`, as [`ops::rmsnorm`] but with
/// the f64 sum of squares over eight accumulators: `ops` adds 144 squares
/// in one dependent chain (~500 cycles, 13 times a token). An f64 sum of
/// f32 squares is exact here in any order unless the terms span more than
/// ~29 binary orders, and even then differs only in bits far below the f32
/// the mean is rounded to, so the outputs are `ops::rmsnorm`'s
/// (`rmsnorm_matches_ops_bit_for_bit`).
fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    assert!(
        out.len() == x.len() && weight.len() == x.len(),
        "rmsnorm: out {}, x {}, weight {} differ",
        out.len(),
        x.len(),
        weight.len()
    );
    if x.is_empty() {
        return;
    }
    let mut acc = [0.0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += (v * v) as f64;
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        *a += (v * v) as f64;
    }
    let sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
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

/// What a [`State`] made with `o` will hold: keys and values of the
/// attention blocks (f16 unless f32 is asked for), every position's input
/// of the convolution blocks (f32), per sequence; activations, RoPE table
/// and logits.
pub(crate) fn memory(cfg: &ModelConfig, weights_bytes: u64, o: &StateOptions) -> MemoryEstimate {
    let blocks = cfg.cachefit.as_ref().map_or(&[][..], |cf| &cf.blocks[..]);
    let n_attn = blocks.iter().filter(|&&b| b == BlockKind::Attn).count();
    let n_conv = blocks.len() - n_attn;
    let (n_ctx, nb) = (o.n_ctx as u64, o.n_batch.max(1) as u64);
    let kv_type = if o.kv_type == KvType::F32 {
        KvType::F32
    } else {
        KvType::F16
    };
    let kv = KvCache::bytes_for(kv_type, n_attn, o.n_ctx, cfg.n_kv_heads, cfg.head_dim);
    let per_seq = kv.unwrap_or(0) + n_conv as u64 * n_ctx * cfg.dim as u64 * 4;
    let kv_dim = cfg.kv_dim() as u64;
    let wide = cfg.dim.max(cfg.ffn_dim).max(cfg.q_dim()) as u64;
    let per_token =
        3 * cfg.dim as u64 + 2 * wide + (cfg.q_dim() as u64 + 2 * kv_dim) + cfg.q_dim() as u64;
    let floats = nb * per_token
        + n_ctx * (1 + 2 * kv_dim + cfg.head_dim as u64)
        + o.logit_rows() as u64 * cfg.vocab_size as u64;
    MemoryEstimate {
        weights: weights_bytes,
        kv_cache: per_seq * o.n_seq.max(1) as u64,
        scratch: floats * 4 + 3 * wide + 64 * 3 + 4 * wide,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_matches_ops_bit_for_bit() {
        // xorshift64: no dependency, reproducible.
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0 // in [-1, 1)
        };
        for round in 0..2000 {
            let n = 1 + round % 401;
            // Magnitudes over up to 2¹² (activations of a residual stream
            // with a few large channels).
            let spread = (round % 13) as i32;
            let x: Vec<f32> = (0..n)
                .map(|i| next() * 2f32.powi((i as i32 * 7) % (spread + 1)))
                .collect();
            let w: Vec<f32> = (0..n).map(|_| next() + 1.0).collect();
            let (mut want, mut got) = (vec![0.0; n], vec![f32::NAN; n]);
            ops::rmsnorm(&mut want, &x, &w, 1e-5);
            rmsnorm(&mut got, &x, &w, 1e-5);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "n={n} spread={spread}");
        }
    }
}
