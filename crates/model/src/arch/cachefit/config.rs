//! The `cachefit.*` metadata keys (docs/CACHEFIT-FORMAT.md, "Metadata").

use crate::config::{Arch, BlockKind, CachefitConfig, ModelConfig, TokenCodes, Variant};
use crate::Error;
use gguf::Metadata;
use kernels::ops::{RopeLayout, RopeParams};

/// Read a `cachefit` model's config. The llama-style fields of
/// [`ModelConfig`] get their natural meaning (`n_layers` = blocks, RoPE
/// NeoX over the whole head); the rest is in [`ModelConfig::cachefit`].
pub(crate) fn read(md: &Metadata) -> Result<ModelConfig, Error> {
    let key = |k: &str| format!("cachefit.{k}");
    let bad = |k: &str, problem: String| Error::BadValue {
        key: key(k),
        problem,
    };
    let positive = |k: &str| -> Result<usize, Error> {
        match md.get_u64(&key(k))? as usize {
            0 => Err(bad(k, "must be positive".into())),
            v => Ok(v),
        }
    };

    let pattern = md.get_str(&key("block_pattern"))?;
    if pattern.is_empty() {
        return Err(bad("block_pattern", "is empty".into()));
    }
    let blocks = pattern
        .chars()
        .map(|c| match c {
            'C' | 'c' => Ok(BlockKind::Conv),
            'A' | 'a' => Ok(BlockKind::Attn),
            other => Err(bad(
                "block_pattern",
                format!("{pattern:?}: {other:?} is neither C (conv) nor A (attention)"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let n_layers = positive("block_count")?;
    if n_layers != blocks.len() {
        return Err(bad(
            "block_count",
            format!(
                "{n_layers} differs from the {} blocks of block_pattern {pattern:?}",
                blocks.len()
            ),
        ));
    }
    let dim = positive("embedding_length")?;
    let ffn_dim = positive("feed_forward_length")?;
    let n_heads = positive("attention.head_count")?;
    let n_kv_heads = positive("attention.head_count_kv")?;
    if !n_heads.is_multiple_of(n_kv_heads) {
        return Err(bad(
            "attention.head_count_kv",
            format!("{n_kv_heads} does not divide head_count {n_heads}"),
        ));
    }
    let head_dim = positive("attention.key_length")?;
    if !head_dim.is_multiple_of(2) {
        return Err(bad(
            "attention.key_length",
            format!("{head_dim} must be even (RoPE rotates pairs)"),
        ));
    }
    let context_length = positive("context_length")?;
    let norm_eps = md.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
    let freq_base = md
        .opt(&key("rope.freq_base"), Metadata::get_f32)?
        .unwrap_or(10000.0);
    let conv_kernel = positive("conv.kernel_length")?;
    let softcap = md
        .opt(&key("final_logit_softcapping"), Metadata::get_f32)?
        .unwrap_or(0.0);
    if !(softcap >= 0.0 && softcap.is_finite()) {
        return Err(bad(
            "final_logit_softcapping",
            format!("{softcap} must be finite and at least 0"),
        ));
    }
    let vocab_size = match md.opt(&key("vocab_size"), Metadata::get_u64)? {
        Some(v) => v as usize,
        None => md.get_array("tokenizer.ggml.tokens")?.1.len(),
    };
    let token_codes = match md.opt(&key("token_codes.bits"), Metadata::get_u64)? {
        None => None,
        Some(bits) => {
            let bits = bits as usize;
            if bits == 0 || !bits.is_multiple_of(64) || bits > 4096 {
                return Err(bad(
                    "token_codes.bits",
                    format!("{bits}: must be a positive multiple of 64 up to 4096"),
                ));
            }
            let seed = md.get_u64(&key("token_codes.seed"))?;
            Some(TokenCodes { bits, seed })
        }
    };
    Ok(ModelConfig {
        arch: Arch::Cachefit,
        n_layers,
        dim,
        ffn_dim,
        n_heads,
        n_kv_heads,
        head_dim,
        vocab_size,
        context_length,
        norm_eps,
        rope: RopeParams::new(head_dim, freq_base, 1.0, RopeLayout::NeoX),
        qkv_bias: false,
        qk_norm: false,
        variant: Variant::plain(head_dim),
        cachefit: Some(CachefitConfig {
            blocks,
            conv_kernel,
            softcap,
            token_codes,
        }),
    })
}
