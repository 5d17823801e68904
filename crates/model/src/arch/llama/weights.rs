//! The llama family's tensors bound in place ([`crate::binder`]): every
//! shape is checked here, so the pass can index without surprises.

use crate::binder::Binder;
use crate::config::ModelConfig;
use crate::Error;
use gguf::GgufFile;
use kernels::matrix::QMatrix;
use std::borrow::Cow;

pub struct LayerWeights<'a> {
    pub attn_norm: Cow<'a, [f32]>,      // (dim,)
    pub wq: QMatrix<'a>,                // (q_dim, dim)
    pub wk: QMatrix<'a>,                // (kv_dim, dim)
    pub wv: QMatrix<'a>,                // (kv_dim, dim)
    pub bq: Option<Cow<'a, [f32]>>,     // (q_dim,) qwen2
    pub bk: Option<Cow<'a, [f32]>>,     // (kv_dim,)
    pub bv: Option<Cow<'a, [f32]>>,     // (kv_dim,)
    pub q_norm: Option<Cow<'a, [f32]>>, // (head_dim,) qwen3
    pub k_norm: Option<Cow<'a, [f32]>>, // (head_dim,)
    pub wo: QMatrix<'a>,                // (dim, q_dim)
    pub ffn_norm: Cow<'a, [f32]>,       // (dim,)
    pub w_gate: QMatrix<'a>,            // (ffn_dim, dim)
    pub w_up: QMatrix<'a>,              // (ffn_dim, dim)
    pub w_down: QMatrix<'a>,            // (dim, ffn_dim)
}

/// The llama family's tensors.
pub struct Weights<'a> {
    pub token_embd: QMatrix<'a>, // (vocab, dim)
    pub layers: Vec<LayerWeights<'a>>,
    pub output_norm: Cow<'a, [f32]>, // (dim,)
    /// `output.weight`, or `token_embd.weight` when the file ties them.
    pub output: QMatrix<'a>, // (vocab, dim)
    pub tied_output: bool,
    /// Llama 3 RoPE frequency factors (`rope_freqs.weight`), `(n_rot/2,)`.
    pub rope_freqs: Option<Cow<'a, [f32]>>,
}

impl<'a> Weights<'a> {
    pub fn from_gguf(file: &'a GgufFile, cfg: &ModelConfig) -> Result<Weights<'a>, Error> {
        let b = Binder { file };
        let (dim, q, kv, ff, v) = (
            cfg.dim,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.ffn_dim,
            cfg.vocab_size,
        );
        let token_embd = b.matrix("token_embd.weight", v, dim)?;
        let (output, tied_output) = match file.tensor_info("output.weight") {
            Some(_) => (b.weight("output.weight", v, dim)?, false),
            // The embedding lookups read token_embd's rows as stored.
            None => (b.tiled("token_embd.weight", token_embd)?, true),
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let opt_vec = |on: bool, s: &str, len: usize| -> Result<_, Error> {
                if on {
                    b.vector(&n(s), len).map(Some)
                } else {
                    Ok(None)
                }
            };
            layers.push(LayerWeights {
                attn_norm: b.vector(&n("attn_norm.weight"), dim)?,
                wq: b.weight(&n("attn_q.weight"), q, dim)?,
                wk: b.weight(&n("attn_k.weight"), kv, dim)?,
                wv: b.weight(&n("attn_v.weight"), kv, dim)?,
                bq: opt_vec(cfg.qkv_bias, "attn_q.bias", q)?,
                bk: opt_vec(cfg.qkv_bias, "attn_k.bias", kv)?,
                bv: opt_vec(cfg.qkv_bias, "attn_v.bias", kv)?,
                q_norm: opt_vec(cfg.qk_norm, "attn_q_norm.weight", cfg.head_dim)?,
                k_norm: opt_vec(cfg.qk_norm, "attn_k_norm.weight", cfg.head_dim)?,
                wo: b.weight(&n("attn_output.weight"), dim, q)?,
                ffn_norm: b.vector(&n("ffn_norm.weight"), dim)?,
                w_gate: b.weight(&n("ffn_gate.weight"), ff, dim)?,
                w_up: b.weight(&n("ffn_up.weight"), ff, dim)?,
                w_down: b.weight(&n("ffn_down.weight"), dim, ff)?,
            });
        }
        let rope_freqs = match file.tensor_info("rope_freqs.weight") {
            Some(_) => Some(b.vector("rope_freqs.weight", cfg.rope.n_rot / 2)?),
            None => None,
        };
        Ok(Weights {
            token_embd,
            layers,
            output_norm: b.vector("output_norm.weight", dim)?,
            output,
            tied_output,
            rope_freqs,
        })
    }

    /// Bytes of weight data the forward pass reads per token (every matrix
    /// once, the embedding row aside).
    pub fn bytes_per_token(&self) -> usize {
        let mut n = self.output.data().len();
        for l in &self.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                n += m.data().len();
            }
        }
        n
    }
}
