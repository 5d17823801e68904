//! The llama family's hyper-parameters from GGUF metadata (`{arch}.*`
//! keys, as llama.cpp's `llm_load_hparams` reads them). The variants differ
//! in flags: qwen2's q/k/v biases, qwen3's q/k norms, NeoX RoPE for both.

use crate::config::{Arch, ModelConfig};
use crate::Error;
use gguf::Metadata;
use kernels::ops::{RopeLayout, RopeParams};

/// Read a llama-family config (`arch` is llama, qwen2 or qwen3, whose
/// keys are `{arch}.*`); `vocab_size` falls back to the length of
/// `tokenizer.ggml.tokens` when `{arch}.vocab_size` is absent.
pub(crate) fn read(md: &Metadata, arch: Arch) -> Result<ModelConfig, Error> {
    let arch_name = arch.name();
    let key = |k: &str| format!("{arch_name}.{k}");
    let usize_key = |k: &str| -> Result<usize, Error> { Ok(md.get_u64(&key(k))? as usize) };
    let positive = |k: &str| -> Result<usize, Error> {
        let v = usize_key(k)?;
        if v == 0 {
            return Err(Error::BadValue {
                key: key(k),
                problem: "must be positive".into(),
            });
        }
        Ok(v)
    };
    let n_layers = positive("block_count")?;
    let dim = positive("embedding_length")?;
    let ffn_dim = positive("feed_forward_length")?;
    let n_heads = positive("attention.head_count")?;
    let n_kv_heads = match md.opt(&key("attention.head_count_kv"), Metadata::get_u64)? {
        Some(v) => v as usize,
        None => n_heads,
    };
    if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return Err(Error::BadValue {
            key: key("attention.head_count_kv"),
            problem: format!("{n_kv_heads} does not divide head_count {n_heads}"),
        });
    }
    let head_dim = match md.opt(&key("attention.key_length"), Metadata::get_u64)? {
        Some(v) => v as usize,
        None => {
            if !dim.is_multiple_of(n_heads) {
                return Err(Error::BadValue {
                    key: key("attention.head_count"),
                    problem: format!("{n_heads} heads do not divide embedding_length {dim}"),
                });
            }
            dim / n_heads
        }
    };
    if let Some(v) = md.opt(&key("attention.value_length"), Metadata::get_u64)? {
        if v as usize != head_dim {
            return Err(Error::BadValue {
                key: key("attention.value_length"),
                problem: format!("{v} differs from the key length {head_dim} (not supported)"),
            });
        }
    }
    let context_length = positive("context_length")?;
    let norm_eps = md.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
    let n_rot = match md.opt(&key("rope.dimension_count"), Metadata::get_u64)? {
        Some(v) => v as usize,
        None => head_dim,
    };
    if n_rot > head_dim || !n_rot.is_multiple_of(2) {
        return Err(Error::BadValue {
            key: key("rope.dimension_count"),
            problem: format!("{n_rot} must be even and at most the head size {head_dim}"),
        });
    }
    let freq_base = md
        .opt(&key("rope.freq_base"), Metadata::get_f32)?
        .unwrap_or(10000.0);
    let scaling_key = key("rope.scaling.type");
    let scaling = match md.get(&scaling_key) {
        None => "linear",
        Some(_) => md.get_str(&scaling_key)?,
    };
    if !matches!(scaling, "none" | "linear") {
        return Err(Error::BadValue {
            key: key("rope.scaling.type"),
            problem: format!("`{scaling}` is not supported (supported: none, linear; Llama 3 frequency factors come from `rope_freqs.weight`)"),
        });
    }
    let factor = match md.opt(&key("rope.scaling.factor"), Metadata::get_f32)? {
        Some(f) => Some(f),
        None => md.opt(&key("rope.scale_linear"), Metadata::get_f32)?,
    }
    .unwrap_or(0.0);
    let freq_scale = if factor == 0.0 || scaling == "none" {
        1.0
    } else {
        1.0 / factor
    };
    let vocab_size = match md.opt(&key("vocab_size"), Metadata::get_u64)? {
        Some(v) => v as usize,
        None => md.get_array("tokenizer.ggml.tokens")?.1.len(),
    };
    Ok(ModelConfig {
        arch,
        n_layers,
        dim,
        ffn_dim,
        n_heads,
        n_kv_heads,
        head_dim,
        vocab_size,
        context_length,
        norm_eps,
        rope: RopeParams {
            n_rot,
            freq_base,
            freq_scale,
            // llama.cpp's `llama_model_rope_type`: NORM for llama,
            // NEOX for the qwen family.
            layout: match arch {
                Arch::Llama => RopeLayout::Normal,
                _ => RopeLayout::NeoX,
            },
        },
        qkv_bias: arch == Arch::Qwen2,
        qk_norm: arch == Arch::Qwen3,
        cachefit: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::Value;

    fn smollm_like() -> Metadata {
        let mut m = Metadata::new();
        m.set("general.architecture", Value::String("llama".into()));
        for (k, v) in [
            ("block_count", 30),
            ("context_length", 8192),
            ("embedding_length", 576),
            ("feed_forward_length", 1536),
            ("attention.head_count", 9),
            ("attention.head_count_kv", 3),
            ("rope.dimension_count", 64),
            ("vocab_size", 49152),
        ] {
            m.set(format!("llama.{k}"), Value::U32(v));
        }
        m.set("llama.rope.freq_base", Value::F32(100000.0));
        m.set("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
        m
    }

    #[test]
    fn reads_llama() {
        let c = ModelConfig::from_gguf(&smollm_like()).unwrap();
        assert_eq!(c.arch, Arch::Llama);
        assert_eq!((c.n_layers, c.dim, c.ffn_dim), (30, 576, 1536));
        assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (9, 3, 64));
        assert_eq!((c.q_dim(), c.kv_dim(), c.vocab_size), (576, 192, 49152));
        assert_eq!(c.rope.layout, RopeLayout::Normal);
        assert_eq!((c.rope.freq_base, c.rope.freq_scale), (100000.0, 1.0));
        assert!(!c.qkv_bias && !c.qk_norm);
    }

    #[test]
    fn qwen_flags_and_rope_scaling() {
        let mut m = smollm_like();
        let entries: Vec<_> = m.entries().to_vec();
        let mut q = Metadata::new();
        for (k, v) in entries {
            q.set(k.replace("llama.", "qwen3."), v);
        }
        q.set("general.architecture", Value::String("qwen3".into()));
        q.set("qwen3.attention.key_length", Value::U32(128));
        let c = ModelConfig::from_gguf(&q).unwrap();
        assert_eq!((c.arch, c.head_dim, c.q_dim()), (Arch::Qwen3, 128, 1152));
        assert_eq!(c.rope.layout, RopeLayout::NeoX);
        assert!(c.qk_norm && !c.qkv_bias);
        q.set("general.architecture", Value::String("qwen2".into()));
        assert!(ModelConfig::from_gguf(&q).is_err()); // keys are qwen3.*

        m.set("llama.rope.scaling.type", Value::String("linear".into()));
        m.set("llama.rope.scaling.factor", Value::F32(4.0));
        assert_eq!(ModelConfig::from_gguf(&m).unwrap().rope.freq_scale, 0.25);
        m.set("llama.rope.scaling.type", Value::String("yarn".into()));
        let e = ModelConfig::from_gguf(&m).unwrap_err().to_string();
        assert!(
            e.contains("llama.rope.scaling.type") && e.contains("yarn"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_key_or_arch() {
        let mut m = smollm_like();
        m.set("general.architecture", Value::String("gpt2".into()));
        let e = ModelConfig::from_gguf(&m).unwrap_err().to_string();
        assert!(
            e.contains("gpt2") && e.contains("llama, qwen2, qwen3"),
            "{e}"
        );

        let mut m = smollm_like();
        m.remove("llama.embedding_length");
        let e = ModelConfig::from_gguf(&m).unwrap_err().to_string();
        assert!(e.contains("llama.embedding_length"), "{e}");

        let mut m = smollm_like();
        m.set("llama.attention.head_count_kv", Value::U32(4));
        let e = ModelConfig::from_gguf(&m).unwrap_err().to_string();
        assert!(e.contains("head_count_kv"), "{e}");

        let mut m = smollm_like();
        m.set("llama.block_count", Value::String("x".into()));
        let e = ModelConfig::from_gguf(&m).unwrap_err().to_string();
        assert!(e.contains("llama.block_count"), "{e}");

        let m = Metadata::new();
        let e = ModelConfig::from_gguf(&m).unwrap_err().to_string();
        assert!(e.contains("general.architecture"), "{e}");
    }
}
