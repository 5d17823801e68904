//! The model's tensors bound in place: matrices are [`QMatrix`] views of the
//! file's bytes (no copy), norm weights and biases `f32` slices (borrowed
//! when stored as F32, dequantized once otherwise). Every shape is checked
//! here, so the forward pass can index without surprises.
//!
//! [`Weights`] is one enum over the architectures' own weight structs: the
//! llama family ([`LlamaWeights`]) and `cachefit`
//! ([`crate::cachefit::CachefitWeights`]). Callers hold a `Weights` and pass
//! it to the forward functions, which dispatch on it.

use crate::cachefit::CachefitWeights;
use crate::config::{Arch, ModelConfig};
use crate::Error;
use gguf::{GgmlType, GgufFile};
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

/// The weights of any supported architecture.
pub enum Weights<'a> {
    /// llama, qwen2, qwen3.
    Llama(LlamaWeights<'a>),
    Cachefit(CachefitWeights<'a>),
}

impl<'a> Weights<'a> {
    /// Bind the tensors `cfg.arch` needs, checking every shape.
    pub fn from_gguf(file: &'a GgufFile, cfg: &ModelConfig) -> Result<Weights<'a>, Error> {
        Ok(match cfg.arch {
            Arch::Cachefit => Weights::Cachefit(CachefitWeights::from_gguf(file, cfg)?),
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => {
                Weights::Llama(LlamaWeights::from_gguf(file, cfg)?)
            }
        })
    }

    /// Bytes of weight data the forward pass reads per token (every matrix
    /// once, the embedding row aside).
    pub fn bytes_per_token(&self) -> usize {
        match self {
            Weights::Llama(w) => w.bytes_per_token(),
            Weights::Cachefit(w) => w.bytes_per_token(),
        }
    }

    pub fn as_llama(&self) -> Option<&LlamaWeights<'a>> {
        match self {
            Weights::Llama(w) => Some(w),
            Weights::Cachefit(_) => None,
        }
    }

    pub fn as_cachefit(&self) -> Option<&CachefitWeights<'a>> {
        match self {
            Weights::Cachefit(w) => Some(w),
            Weights::Llama(_) => None,
        }
    }
}

/// The llama family's tensors.
pub struct LlamaWeights<'a> {
    pub token_embd: QMatrix<'a>, // (vocab, dim)
    pub layers: Vec<LayerWeights<'a>>,
    pub output_norm: Cow<'a, [f32]>, // (dim,)
    /// `output.weight`, or `token_embd.weight` when the file ties them.
    pub output: QMatrix<'a>, // (vocab, dim)
    pub tied_output: bool,
    /// Llama 3 RoPE frequency factors (`rope_freqs.weight`), `(n_rot/2,)`.
    pub rope_freqs: Option<Cow<'a, [f32]>>,
}

impl<'a> LlamaWeights<'a> {
    pub fn from_gguf(file: &'a GgufFile, cfg: &ModelConfig) -> Result<LlamaWeights<'a>, Error> {
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
        Ok(LlamaWeights {
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

/// Looks tensors up by name and checks them, with errors naming the tensor.
pub(crate) struct Binder<'a> {
    pub(crate) file: &'a GgufFile,
}

impl<'a> Binder<'a> {
    pub(crate) fn tensor(&self, name: &str) -> Result<(&'a gguf::TensorInfo, &'a [u8]), Error> {
        self.file.tensor(name).map_err(|_| Error::Tensor {
            name: name.to_string(),
            problem: "missing from the file".into(),
        })
    }

    /// A `rows × cols` matrix (ggml dims `[cols, rows]`).
    pub(crate) fn matrix(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<QMatrix<'a>, Error> {
        let (info, data) = self.tensor(name)?;
        let bad = |problem: String| Error::Tensor {
            name: name.to_string(),
            problem,
        };
        if info.dims != [cols as u64, rows as u64] {
            return Err(bad(format!(
                "shape {:?}, expected [{cols}, {rows}]",
                info.dims
            )));
        }
        QMatrix::new(info.ty, rows, cols, data).map_err(|e| bad(e.to_string()))
    }

    /// [`Binder::matrix`] in row tiles where they pay ([`Binder::tiled`]).
    pub(crate) fn weight(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<QMatrix<'a>, Error> {
        self.tiled(name, self.matrix(name, rows, cols)?)
    }

    /// `m` repacked into row tiles where they pay ([`kernels::quant::tiles`]),
    /// its rows as stored then released from memory (they come back from
    /// the file if read). Unchanged for types without tile kernels.
    pub(crate) fn tiled(&self, name: &str, m: QMatrix<'a>) -> Result<QMatrix<'a>, Error> {
        let Some(len) = m.tiles_bytes().filter(|_| kernels::quant::tiles::wanted()) else {
            return Ok(m);
        };
        let mut packed = Ok(());
        let tiles = self
            .file
            .keep_derived(len, |buf| packed = m.pack_tiles(buf))?;
        let bad = |e: kernels::matrix::MatrixError| Error::Tensor {
            name: name.to_string(),
            problem: e.to_string(),
        };
        packed.map_err(bad)?;
        let t = m.with_tiles(tiles).map_err(bad)?;
        self.file.release(m.data());
        Ok(t)
    }

    /// A vector of `len` elements as f32: borrowed if stored as F32.
    pub(crate) fn vector(&self, name: &str, len: usize) -> Result<Cow<'a, [f32]>, Error> {
        let (info, data) = self.tensor(name)?;
        let bad = |problem: String| Error::Tensor {
            name: name.to_string(),
            problem,
        };
        if info.n_elements() != len as u64 || info.dims.iter().skip(1).any(|&d| d != 1) {
            return Err(bad(format!("shape {:?}, expected [{len}]", info.dims)));
        }
        if info.ty == GgmlType::F32 {
            return bytemuck::try_cast_slice(data)
                .map(Cow::Borrowed)
                .map_err(|e| bad(format!("F32 data not castable: {e}")));
        }
        let tr = kernels::traits(info.ty)
            .filter(|_| len.is_multiple_of(info.ty.block_size()))
            .ok_or_else(|| bad(format!("type {} is not supported for a vector", info.ty)))?;
        let mut out = vec![0.0; len];
        (tr.to_float)(data, &mut out);
        Ok(Cow::Owned(out))
    }
}
