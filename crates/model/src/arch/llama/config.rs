//! The llama family's hyper-parameters from GGUF metadata (`{arch}.*`
//! keys, as llama.cpp's `load_hparams` and each model's
//! `load_arch_hparams` read them). The members differ in flags and in the
//! [`Variant`]: qwen2's q/k/v biases, qwen3's q/k norms, NeoX RoPE for all
//! but llama; Gemma's GeGLU, post-norms, embedding scale, sliding window
//! and soft caps; experts (Mixtral, qwen3moe); RoPE scaling (linear, YaRN,
//! Llama 3 and Phi-3 frequency factors).

use crate::config::{Activation, Arch, Experts, ModelConfig, SlidingWindow, Variant};
use crate::Error;
use gguf::Metadata;
use kernels::ops::{RopeLayout, RopeParams, Yarn};

/// Read a llama-family config (keys `{arch}.*`); `vocab_size` falls back to the length of
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
    if !matches!(scaling, "none" | "linear" | "yarn" | "longrope") {
        return Err(Error::BadValue {
            key: scaling_key,
            problem: format!("`{scaling}` is not supported (supported: none, linear, yarn, longrope; Llama 3 frequency factors come from `rope_freqs.weight`)"),
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
    // llama.cpp's `llama_model_rope_type`: NORM for llama, NEOX for the
    // others here.
    let layout = match arch {
        Arch::Llama => RopeLayout::Normal,
        _ => RopeLayout::NeoX,
    };
    let mut rope = RopeParams::new(n_rot, freq_base, freq_scale, layout);
    let orig_ctx = match md.opt(
        &key("rope.scaling.original_context_length"),
        Metadata::get_u64,
    )? {
        Some(0) | None => context_length,
        Some(v) => v as usize,
    };
    // The magnitude ggml's rope gets (llama.cpp's `llama_context`:
    // `yarn_attn_factor`, times `rope.scaling.attn_factor`).
    let attn_factor = md
        .opt(&key("rope.scaling.attn_factor"), Metadata::get_f32)?
        .unwrap_or(1.0);
    rope.mscale = attn_factor;
    if scaling == "yarn" && freq_scale != 1.0 {
        let f = 1.0 / freq_scale;
        let get_mscale = |m: f32| {
            if f <= 1.0 {
                1.0
            } else {
                0.1 * m * f.ln() + 1.0
            }
        };
        let log_mul = md
            .opt(&key("rope.scaling.yarn_log_multiplier"), Metadata::get_f32)?
            .unwrap_or(0.0);
        let base = if log_mul != 0.0 {
            get_mscale(1.0) / get_mscale(log_mul)
        } else {
            get_mscale(1.0)
        };
        // The rope multiplies by (1 + 0.1 ln f) again; llama.cpp divides
        // it out here first.
        rope.mscale = base * (1.0 / (1.0 + 0.1 * f.ln())) * attn_factor;
        rope.yarn = Some(Yarn {
            n_ctx_orig: orig_ctx,
            ext_factor: 1.0,
            beta_fast: md
                .opt(&key("rope.scaling.yarn_beta_fast"), Metadata::get_f32)?
                .unwrap_or(32.0),
            beta_slow: md
                .opt(&key("rope.scaling.yarn_beta_slow"), Metadata::get_f32)?
                .unwrap_or(1.0),
        });
    }
    let mut variant = Variant::plain(head_dim);
    // Phi-3 files carry long/short factors without saying `longrope`.
    if scaling == "longrope" || arch == Arch::Phi3 {
        variant.long_rope_above = Some(orig_ctx);
    }
    let gemma = matches!(arch, Arch::Gemma2 | Arch::Gemma3);
    if gemma {
        variant.act = Activation::GeluTanh;
        variant.embed_scale = (dim as f32).sqrt();
        variant.post_norms = true;
        // gemma_pytorch's query_pre_attn_scalar: the 27B models scale by
        // the width per head, the others by the head size (llama.cpp's
        // `load_arch_hparams` goes by the layer count).
        let big =
            (arch == Arch::Gemma2 && n_layers == 46) || (arch == Arch::Gemma3 && n_layers == 62);
        variant.attn_scale = if big {
            1.0 / ((dim / n_heads) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        let f32_or = |k: &str, d: f32| -> Result<f32, Error> {
            let v = md.opt(&key(k), Metadata::get_f32)?.unwrap_or(d);
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::BadValue {
                    key: key(k),
                    problem: format!("{v} must be a finite number ≥ 0"),
                });
            }
            Ok(v)
        };
        if arch == Arch::Gemma2 {
            variant.attn_softcap = f32_or("attn_logit_softcapping", 50.0)?;
            variant.final_softcap = f32_or("final_logit_softcapping", 30.0)?;
        } else {
            variant.final_softcap = f32_or("final_logit_softcapping", 0.0)?;
        }
        variant.swa = sliding_window(md, arch, n_layers, &rope)?;
    }
    if let Some(n) = md.opt(&key("expert_count"), Metadata::get_u64)? {
        variant.experts = experts(md, arch, n as usize, ffn_dim)?;
    } else if arch == Arch::Qwen3Moe {
        return Err(Error::BadValue {
            key: key("expert_count"),
            problem: "missing: a qwen3moe model needs its expert count".into(),
        });
    }
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
        rope,
        qkv_bias: arch == Arch::Qwen2,
        qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3),
        variant,
        cachefit: None,
    })
}

/// Gemma's sliding window: `attention.sliding_window` positions on every
/// layer but each `pattern`-th (Gemma 2: every other, Gemma 3: five of six;
/// `attention.sliding_window_pattern` overrides), with RoPE base
/// `rope.freq_base_swa` (Gemma 3 default 10,000; Gemma 2 the global base).
fn sliding_window(
    md: &Metadata,
    arch: Arch,
    n_layers: usize,
    rope: &RopeParams,
) -> Result<Option<SlidingWindow>, Error> {
    let key = |k: &str| format!("{}.{k}", arch.name());
    let (default_window, default_pattern) = match arch {
        Arch::Gemma2 => (Some(4096), 2),
        _ => (None, 6),
    };
    let window = match md.opt(&key("attention.sliding_window"), Metadata::get_u64)? {
        Some(w) => Some(w as usize),
        None => default_window,
    };
    let Some(window) = window.filter(|&w| w > 0) else {
        return Ok(None);
    };
    let pattern_key = key("attention.sliding_window_pattern");
    let layers = match md.get(&pattern_key) {
        Some(gguf::Value::Array(..)) => {
            let (_, items) = md.get_array(&pattern_key)?;
            let flags: Vec<bool> = items
                .iter()
                .map(|v| match v {
                    gguf::Value::Bool(b) => Some(*b),
                    _ => None,
                })
                .collect::<Option<_>>()
                .ok_or_else(|| Error::BadValue {
                    key: pattern_key.clone(),
                    problem: "an array pattern must hold booleans".into(),
                })?;
            if flags.len() != n_layers {
                return Err(Error::BadValue {
                    key: pattern_key,
                    problem: format!("{} entries for {n_layers} layers", flags.len()),
                });
            }
            flags
        }
        _ => {
            let n = md
                .opt(&pattern_key, Metadata::get_u64)?
                .unwrap_or(default_pattern) as usize;
            // llama.cpp's `set_swa_pattern`: 0 means every layer.
            (0..n_layers).map(|l| n == 0 || l % n < n - 1).collect()
        }
    };
    let base_default = match arch {
        Arch::Gemma3 => 10000.0,
        _ => rope.freq_base,
    };
    let base = md
        .opt(&key("rope.freq_base_swa"), Metadata::get_f32)?
        .unwrap_or(base_default);
    if !(base.is_finite() && base > 0.0) {
        return Err(Error::BadValue {
            key: key("rope.freq_base_swa"),
            problem: format!("{base} must be a positive finite number"),
        });
    }
    // Gemma 3's windowed layers keep an unscaled RoPE (llama.cpp:
    // `rope_freq_scale_train_swa` = 1); Gemma 2's use the global one.
    let scale = if arch == Arch::Gemma3 {
        1.0
    } else {
        rope.freq_scale
    };
    Ok(Some(SlidingWindow {
        window,
        layers,
        rope: RopeParams::new(rope.n_rot, base, scale, rope.layout),
    }))
}

/// A mixture of experts from `expert_count`, `expert_used_count` and
/// (qwen3moe) `expert_feed_forward_length`.
fn experts(
    md: &Metadata,
    arch: Arch,
    count: usize,
    ffn_dim: usize,
) -> Result<Option<Experts>, Error> {
    let key = |k: &str| format!("{}.{k}", arch.name());
    if count == 0 {
        if arch == Arch::Qwen3Moe {
            return Err(Error::BadValue {
                key: key("expert_count"),
                problem: "0: a qwen3moe model needs at least one expert".into(),
            });
        }
        return Ok(None);
    }
    let used = md.get_u64(&key("expert_used_count"))? as usize;
    if used == 0 || used > count {
        return Err(Error::BadValue {
            key: key("expert_used_count"),
            problem: format!("{used} must be between 1 and expert_count {count}"),
        });
    }
    let ffn = match md.opt(&key("expert_feed_forward_length"), Metadata::get_u64)? {
        Some(v) => v as usize,
        None => ffn_dim,
    };
    if ffn == 0 {
        return Err(Error::BadValue {
            key: key("expert_feed_forward_length"),
            problem: "must be positive".into(),
        });
    }
    Ok(Some(Experts {
        count,
        used,
        ffn_dim: ffn,
    }))
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
        m.set("llama.rope.scaling.type", Value::String("su".into()));
        let e = ModelConfig::from_gguf(&m).unwrap_err().to_string();
        assert!(
            e.contains("llama.rope.scaling.type") && e.contains("`su`") && e.contains("yarn"),
            "{e}"
        );
        // YaRN: factor 4 over an original 4096 positions, llama.cpp's
        // defaults for the rest; the magnitude nets to (1 + 0.1 ln 4) in
        // the rope, so the config's mscale is 1 (exactly, as in llama.cpp).
        m.set("llama.rope.scaling.type", Value::String("yarn".into()));
        m.set(
            "llama.rope.scaling.original_context_length",
            Value::U32(4096),
        );
        let c = ModelConfig::from_gguf(&m).unwrap();
        let y = c.rope.yarn.unwrap();
        assert_eq!(
            (y.n_ctx_orig, y.ext_factor, y.beta_fast, y.beta_slow),
            (4096, 1.0, 32.0, 1.0)
        );
        assert_eq!((c.rope.freq_scale, c.rope.mscale), (0.25, 1.0));
    }

    fn with(arch: &str, extra: &[(&str, Value)]) -> Metadata {
        let mut m = Metadata::new();
        for (k, v) in smollm_like().entries().to_vec() {
            m.set(k.replace("llama.", &format!("{arch}.")), v);
        }
        m.set("general.architecture", Value::String(arch.into()));
        for (k, v) in extra {
            m.set(format!("{arch}.{k}"), v.clone());
        }
        m
    }

    #[test]
    fn gemma_and_experts_read_their_keys() {
        let c = ModelConfig::from_gguf(&with(
            "gemma3",
            &[("attention.sliding_window", Value::U32(512))],
        ))
        .unwrap();
        let v = &c.variant;
        assert_eq!(v.act, Activation::GeluTanh);
        assert_eq!(v.embed_scale, 576f32.sqrt());
        assert!(v.post_norms && c.qk_norm && v.experts.is_none());
        let w = v.swa.as_ref().unwrap();
        // Five windowed layers of six; the windowed ones at base 10,000.
        assert_eq!(w.layers.iter().filter(|&&l| l).count(), 25);
        assert!(!w.layers[5] && w.layers[6] && !w.layers[29]);
        assert_eq!(
            (w.window, w.rope.freq_base, c.rope.freq_base),
            (512, 10000.0, 100000.0)
        );
        assert_eq!(w.first_visible(0, 600), 89);
        assert_eq!(w.first_visible(5, 600), 0);
        assert_eq!(w.first_visible(0, 100), 0);

        let c = ModelConfig::from_gguf(&with("gemma2", &[])).unwrap();
        assert_eq!(
            (c.variant.attn_softcap, c.variant.final_softcap),
            (50.0, 30.0)
        );
        assert_eq!(c.variant.swa.as_ref().unwrap().window, 4096);

        let moe = with(
            "qwen3moe",
            &[
                ("expert_count", Value::U32(8)),
                ("expert_used_count", Value::U32(2)),
                ("expert_feed_forward_length", Value::U32(64)),
            ],
        );
        let e = ModelConfig::from_gguf(&moe)
            .unwrap()
            .variant
            .experts
            .unwrap();
        assert_eq!((e.count, e.used, e.ffn_dim), (8, 2, 64));
        let mixtral = with(
            "llama",
            &[
                ("expert_count", Value::U32(4)),
                ("expert_used_count", Value::U32(2)),
            ],
        );
        let e = ModelConfig::from_gguf(&mixtral)
            .unwrap()
            .variant
            .experts
            .unwrap();
        assert_eq!((e.count, e.used, e.ffn_dim), (4, 2, 1536));
    }

    /// Issue 20: a hostile or half-supported file gets an error naming the
    /// key.
    #[test]
    fn half_supported_files_name_the_key() {
        let cases: Vec<(Metadata, &str)> = vec![
            (with("qwen3moe", &[]), "qwen3moe.expert_count"),
            (
                with("qwen3moe", &[("expert_count", Value::U32(0))]),
                "qwen3moe.expert_count",
            ),
            (
                with("qwen3moe", &[("expert_count", Value::U32(8))]),
                "qwen3moe.expert_used_count",
            ),
            (
                with(
                    "llama",
                    &[
                        ("expert_count", Value::U32(4)),
                        ("expert_used_count", Value::U32(5)),
                    ],
                ),
                "llama.expert_used_count",
            ),
            (
                with(
                    "qwen3moe",
                    &[
                        ("expert_count", Value::U32(4)),
                        ("expert_used_count", Value::U32(2)),
                        ("expert_feed_forward_length", Value::U32(0)),
                    ],
                ),
                "qwen3moe.expert_feed_forward_length",
            ),
            (
                with(
                    "llama",
                    &[("rope.scaling.type", Value::String("dynamic".into()))],
                ),
                "llama.rope.scaling.type",
            ),
            (
                with(
                    "gemma3",
                    &[
                        ("attention.sliding_window", Value::U32(512)),
                        (
                            "attention.sliding_window_pattern",
                            Value::Array(gguf::ValueType::Bool, vec![Value::Bool(true); 3]),
                        ),
                    ],
                ),
                "gemma3.attention.sliding_window_pattern",
            ),
            (
                with(
                    "gemma2",
                    &[("final_logit_softcapping", Value::F32(f32::NAN))],
                ),
                "gemma2.final_logit_softcapping",
            ),
            (
                with(
                    "gemma3",
                    &[
                        ("attention.sliding_window", Value::U32(512)),
                        ("rope.freq_base_swa", Value::F32(0.0)),
                    ],
                ),
                "gemma3.rope.freq_base_swa",
            ),
        ];
        for (md, key) in cases {
            let e = ModelConfig::from_gguf(&md).unwrap_err().to_string();
            assert!(e.contains(key), "want {key}: {e}");
        }
    }

    #[test]
    fn errors_name_the_key_or_arch() {
        let mut m = smollm_like();
        m.set("general.architecture", Value::String("gpt2".into()));
        let e = ModelConfig::from_gguf(&m).unwrap_err().to_string();
        assert!(
            e.contains("gpt2") && e.contains("llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3"),
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
