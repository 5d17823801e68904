//! The llama family's tensors bound in place ([`crate::binder`]): every
//! shape is checked here, so the pass can index without surprises. Fused
//! tensors (Phi-3's `attn_qkv` and gate-and-up `ffn_up`) are bound as row
//! ranges of one tensor, and experts as the matrices of a 3-D tensor, all
//! without copying.

use crate::binder::Binder;
use crate::config::{Arch, ModelConfig};
use crate::Error;
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
    pub q_norm: Option<Cow<'a, [f32]>>, // (head_dim,) qwen3, gemma3
    pub k_norm: Option<Cow<'a, [f32]>>, // (head_dim,)
    pub wo: QMatrix<'a>,                // (dim, q_dim)
    /// Gemma: RMSNorm weight of the attention output.
    pub post_attn_norm: Option<Cow<'a, [f32]>>, // (dim,)
    pub ffn_norm: Cow<'a, [f32]>,       // (dim,)
    pub ffn: Ffn<'a>,
    /// Gemma: RMSNorm weight of the MLP output.
    pub post_ffn_norm: Option<Cow<'a, [f32]>>, // (dim,)
}

/// A layer's MLP: one, or a router and its experts.
pub enum Ffn<'a> {
    Dense {
        gate: QMatrix<'a>, // (ffn_dim, dim)
        up: QMatrix<'a>,   // (ffn_dim, dim)
        down: QMatrix<'a>, // (dim, ffn_dim)
    },
    Experts {
        router: QMatrix<'a>, // (n_expert, dim)
        /// One per expert, `(expert_ffn, dim)`, `(expert_ffn, dim)`,
        /// `(dim, expert_ffn)`.
        gate: Vec<QMatrix<'a>>,
        up: Vec<QMatrix<'a>>,
        down: Vec<QMatrix<'a>>,
    },
}

impl<'a> Ffn<'a> {
    /// Every matrix, for sizing scratch and counting bytes.
    pub fn matrices(&self) -> Vec<&QMatrix<'a>> {
        match self {
            Ffn::Dense { gate, up, down } => vec![gate, up, down],
            Ffn::Experts {
                router,
                gate,
                up,
                down,
            } => std::iter::once(router)
                .chain(gate)
                .chain(up)
                .chain(down)
                .collect(),
        }
    }

    /// Bytes a token reads: every matrix of a dense MLP; the router and
    /// `used` experts' matrices of a mixture.
    fn bytes_per_token(&self, used: usize) -> usize {
        match self {
            Ffn::Dense { gate, up, down } => {
                gate.data().len() + up.data().len() + down.data().len()
            }
            Ffn::Experts {
                router,
                gate,
                up,
                down,
            } => {
                let one = gate[0].data().len() + up[0].data().len() + down[0].data().len();
                router.data().len() + used * one
            }
        }
    }
}

/// LongRoPE frequency factors for contexts above and up to the original
/// one, `(n_rot/2,)` each.
pub struct LongShort<'a> {
    pub long: Cow<'a, [f32]>,
    pub short: Cow<'a, [f32]>,
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
    /// Phi-3 LongRoPE factors ([`crate::Variant::long_rope_above`] picks
    /// one set per state).
    pub rope_long_short: Option<LongShort<'a>>,
    /// Experts a token uses (0 without experts).
    experts_used: usize,
}

impl<'a> Weights<'a> {
    pub(crate) fn from_binder(b: &Binder<'a>, cfg: &ModelConfig) -> Result<Weights<'a>, Error> {
        let file = b.file;
        let (dim, q, kv, ff, v) = (
            cfg.dim,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.ffn_dim,
            cfg.vocab_size,
        );
        let token_embd = b.embedding("token_embd.weight", v, dim)?;
        // Gemma always ties them (llama.cpp reads token_embd for both).
        let (output, tied_output) = match file.tensor_info("output.weight") {
            Some(_) if cfg.arch != Arch::Gemma2 => (b.weight("output.weight", v, dim)?, false),
            // The embedding lookups read token_embd's rows as stored.
            _ => (b.tiled("token_embd.weight", token_embd)?, true),
        };
        let gemma = matches!(cfg.arch, Arch::Gemma2 | Arch::Gemma3);
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
            let has = |s: &str| file.tensor_info(&n(s)).is_some();
            // q, k and v: three tensors, or one fused (llama.cpp's
            // `create_tensor_qkv` takes either, for every architecture).
            let (wq, wk, wv) = if has("attn_qkv.weight") {
                let name = n("attn_qkv.weight");
                let qkv = b.matrix(&name, q + 2 * kv, dim)?;
                (
                    b.tiled(&name, b.rows(&name, &qkv, 0, q)?)?,
                    b.tiled(&name, b.rows(&name, &qkv, q, kv)?)?,
                    b.tiled(&name, b.rows(&name, &qkv, q + kv, kv)?)?,
                )
            } else {
                (
                    b.weight(&n("attn_q.weight"), q, dim)?,
                    b.weight(&n("attn_k.weight"), kv, dim)?,
                    b.weight(&n("attn_v.weight"), kv, dim)?,
                )
            };
            let ffn = match &cfg.variant.experts {
                Some(e) => Ffn::Experts {
                    router: b.weight(&n("ffn_gate_inp.weight"), e.count, dim)?,
                    gate: b.experts(&n("ffn_gate_exps.weight"), e.count, e.ffn_dim, dim)?,
                    up: b.experts(&n("ffn_up_exps.weight"), e.count, e.ffn_dim, dim)?,
                    down: b.experts(&n("ffn_down_exps.weight"), e.count, dim, e.ffn_dim)?,
                },
                // Phi-3: gate rows then up rows in one `ffn_up`.
                None if !has("ffn_gate.weight") && cfg.arch == Arch::Phi3 => {
                    let name = n("ffn_up.weight");
                    let gate_up = b.matrix(&name, 2 * ff, dim)?;
                    Ffn::Dense {
                        gate: b.tiled(&name, b.rows(&name, &gate_up, 0, ff)?)?,
                        up: b.tiled(&name, b.rows(&name, &gate_up, ff, ff)?)?,
                        down: b.weight(&n("ffn_down.weight"), dim, ff)?,
                    }
                }
                None => Ffn::Dense {
                    gate: b.weight(&n("ffn_gate.weight"), ff, dim)?,
                    up: b.weight(&n("ffn_up.weight"), ff, dim)?,
                    down: b.weight(&n("ffn_down.weight"), dim, ff)?,
                },
            };
            layers.push(LayerWeights {
                attn_norm: b.vector(&n("attn_norm.weight"), dim)?,
                wq,
                wk,
                wv,
                bq: opt_vec(cfg.qkv_bias, "attn_q.bias", q)?,
                bk: opt_vec(cfg.qkv_bias, "attn_k.bias", kv)?,
                bv: opt_vec(cfg.qkv_bias, "attn_v.bias", kv)?,
                q_norm: opt_vec(cfg.qk_norm, "attn_q_norm.weight", cfg.head_dim)?,
                k_norm: opt_vec(cfg.qk_norm, "attn_k_norm.weight", cfg.head_dim)?,
                wo: b.weight(&n("attn_output.weight"), dim, q)?,
                post_attn_norm: opt_vec(gemma, "post_attention_norm.weight", dim)?,
                ffn_norm: b.vector(&n("ffn_norm.weight"), dim)?,
                ffn,
                post_ffn_norm: opt_vec(gemma, "post_ffw_norm.weight", dim)?,
            });
        }
        let half = cfg.rope.n_rot / 2;
        let rope_freqs = match file.tensor_info("rope_freqs.weight") {
            Some(_) => Some(b.vector("rope_freqs.weight", half)?),
            None => None,
        };
        let rope_long_short = match cfg.variant.long_rope_above {
            Some(_) if file.tensor_info("rope_factors_long.weight").is_some() => Some(LongShort {
                long: b.vector("rope_factors_long.weight", half)?,
                short: b.vector("rope_factors_short.weight", half)?,
            }),
            _ => None,
        };
        Ok(Weights {
            token_embd,
            layers,
            output_norm: b.vector("output_norm.weight", dim)?,
            output,
            tied_output,
            rope_freqs,
            rope_long_short,
            experts_used: cfg.variant.experts.map_or(0, |e| e.used),
        })
    }

    /// Bytes of weight data the forward pass reads per token (every matrix
    /// once, the embedding row aside; of a mixture, the router and the
    /// experts one token uses).
    pub fn bytes_per_token(&self) -> usize {
        let mut n = self.output.data().len();
        for l in &self.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo] {
                n += m.data().len();
            }
            n += l.ffn.bytes_per_token(self.experts_used);
        }
        n
    }
}
