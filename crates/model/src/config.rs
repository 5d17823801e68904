//! Hyper-parameters: what a file's metadata says about the network. Each
//! architecture reads its own keys (`arch/*/config.rs`);
//! [`ModelConfig::from_gguf`] picks the reader by `general.architecture`.

use crate::Error;
use kernels::ops::RopeParams;

/// The architectures, by their `general.architecture` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, Mistral, Mixtral (experts), SmolLM2, TinyLlama.
    Llama,
    Qwen2,
    Qwen3,
    /// Qwen3 with a mixture of experts.
    Qwen3Moe,
    Gemma2,
    Gemma3,
    Phi3,
    /// The cache-fit models of issue 5 (docs/CACHEFIT-FORMAT.md).
    Cachefit,
}

/// The names [`ModelConfig::from_gguf`] accepts.
pub const SUPPORTED_ARCHS: [&str; Arch::ALL.len()] = {
    let mut names = [""; Arch::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = Arch::ALL[i].name();
        i += 1;
    }
    names
};

impl Arch {
    pub const ALL: [Arch; 8] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::Phi3,
        Arch::Cachefit,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
            Arch::Cachefit => "cachefit",
        }
    }

    /// The architecture named `name` in a file's metadata.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    /// Blocks (a `cachefit` model's convolution and attention blocks alike).
    pub n_layers: usize,
    /// Residual stream width (`embedding_length`).
    pub dim: usize,
    /// MLP hidden width (`feed_forward_length`).
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Size of one query/key/value head (`attention.key_length`, default
    /// `dim / n_heads`).
    pub head_dim: usize,
    pub vocab_size: usize,
    /// Context the model was trained for.
    pub context_length: usize,
    pub norm_eps: f32,
    pub rope: RopeParams,
    /// q/k/v projections have biases (qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE (qwen3, gemma3).
    pub qk_norm: bool,
    /// What sets the other members of the llama family apart (Gemma's
    /// norms and window, experts, Phi-3's RoPE factors); plain for llama.
    pub variant: Variant,
    /// Blocks, convolution and soft cap of a `cachefit` model (`None` for
    /// the llama family).
    pub cachefit: Option<CachefitConfig>,
}

impl ModelConfig {
    /// Refuse values that would make every forward pass NaN or divide by
    /// zero (issue 19: a hostile file's `rms_epsilon` of NaN, 0 or -1, a
    /// RoPE base of 0, a RoPE dimension of 0), naming the key. Every
    /// architecture's config goes through it ([`ModelConfig::from_gguf`]).
    pub(crate) fn checked_numbers(self, arch_name: &str) -> Result<ModelConfig, Error> {
        let bad = |k: &str, problem: String| Error::BadValue {
            key: format!("{arch_name}.{k}"),
            problem,
        };
        let eps = self.norm_eps;
        if !(eps.is_finite() && eps > 0.0) {
            return Err(bad(
                "attention.layer_norm_rms_epsilon",
                format!("{eps} must be a positive finite number (usually 1e-5 or 1e-6)"),
            ));
        }
        let base = self.rope.freq_base;
        if !(base.is_finite() && base > 0.0) {
            return Err(bad(
                "rope.freq_base",
                format!("{base} must be a positive finite number (usually 10000 or more)"),
            ));
        }
        let scale = self.rope.freq_scale;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(bad(
                "rope.scaling.factor",
                format!("{} must be a positive finite number", 1.0 / scale),
            ));
        }
        if self.rope.n_rot == 0 {
            return Err(bad(
                "rope.dimension_count",
                "0: RoPE must rotate at least one pair of dimensions".to_string(),
            ));
        }
        Ok(self)
    }

    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// The llama family's departures from Llama, each off in
/// [`Variant::plain`].
#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    /// The MLP gate's activation.
    pub act: Activation,
    /// Multiplies the token embeddings (Gemma: √dim).
    pub embed_scale: f32,
    /// RMSNorm of the attention and MLP outputs before each residual add
    /// (`post_attention_norm`, `post_ffw_norm`: Gemma 2 and 3).
    pub post_norms: bool,
    /// Multiplies q·k (1/√head_dim unless the architecture says otherwise).
    pub attn_scale: f32,
    /// `cap · tanh(s / cap)` of the attention scores, 0 for none (Gemma 2).
    pub attn_softcap: f32,
    /// The same for the logits (Gemma 2).
    pub final_softcap: f32,
    /// Sliding-window attention on some layers.
    pub swa: Option<SlidingWindow>,
    /// Mixture of experts in place of every layer's MLP.
    pub experts: Option<Experts>,
    /// Phi-3 LongRoPE: contexts longer than this use
    /// `rope_factors_long.weight`, others `rope_factors_short.weight`.
    pub long_rope_above: Option<usize>,
}

impl Variant {
    /// Llama's: SiLU, no scaling, no caps, full attention, one MLP.
    pub fn plain(head_dim: usize) -> Variant {
        Variant {
            act: Activation::Silu,
            embed_scale: 1.0,
            post_norms: false,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            attn_softcap: 0.0,
            final_softcap: 0.0,
            swa: None,
            experts: None,
            long_rope_above: None,
        }
    }
}

/// The gate activation of a gated MLP: `act(x·Wgateᵀ) ⊙ x·Wupᵀ`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU.
    Silu,
    /// GeGLU with GELU's tanh approximation (Gemma).
    GeluTanh,
}

/// Layers that attend only to the last `window` positions: a token at `p`
/// sees keys at `p - window + 1 ..= p` (llama.cpp's standard window: a key
/// at `k` is masked when `p - k >= window`).
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    /// `(n_layers,)`: which layers use the window.
    pub layers: Vec<bool>,
    /// RoPE of the windowed layers (Gemma 3 gives them their own base).
    pub rope: RopeParams,
}

impl SlidingWindow {
    /// First position a token at `pos` attends to in layer `layer`.
    pub fn first_visible(&self, layer: usize, pos: usize) -> usize {
        if self.layers[layer] {
            (pos + 1).saturating_sub(self.window)
        } else {
            0
        }
    }
}

/// A mixture of experts: a router picks `used` of `count` gated MLPs per
/// token (softmax over all, top `used`, weights renormalized to sum 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    pub count: usize,
    pub used: usize,
    /// Hidden width of one expert.
    pub ffn_dim: usize,
}

/// One block of a `cachefit` model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    /// Gated short causal convolution (`C`).
    Conv,
    /// Attention (`A`).
    Attn,
}

/// What the `cachefit` architecture adds to [`ModelConfig`] (its keys are
/// read in `arch/cachefit/config.rs`).
#[derive(Clone, Debug, PartialEq)]
pub struct CachefitConfig {
    /// The blocks in order (`block_pattern`).
    pub blocks: Vec<BlockKind>,
    /// Taps of each convolution, `K` (`conv.kernel_length`).
    pub conv_kernel: usize,
    /// Logit soft cap, 0 for none (`final_logit_softcapping`).
    pub softcap: f32,
    /// Fixed token codes instead of an embedding table
    /// (`token_codes.bits`, `token_codes.seed`).
    pub token_codes: Option<TokenCodes>,
}

/// The input side of a model with fixed token codes
/// ([`crate::token_codes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenCodes {
    pub bits: usize,
    pub seed: u64,
}

impl CachefitConfig {
    /// The pattern as stored, e.g. `CCACCA`.
    pub fn pattern(&self) -> String {
        self.blocks
            .iter()
            .map(|b| match b {
                BlockKind::Conv => 'C',
                BlockKind::Attn => 'A',
            })
            .collect()
    }

    pub fn n_conv(&self) -> usize {
        self.blocks
            .iter()
            .filter(|&&b| b == BlockKind::Conv)
            .count()
    }

    pub fn n_attn(&self) -> usize {
        self.blocks
            .iter()
            .filter(|&&b| b == BlockKind::Attn)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::{Metadata, Value};

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

    /// Issue 19: NaN, zero or negative norm epsilon, RoPE base or scale,
    /// and a zero RoPE dimension are refused at load, naming the key.
    #[test]
    fn numbers_that_break_the_forward_pass_are_refused() {
        let cases: &[(&str, Value, &str)] = &[
            (
                "llama.attention.layer_norm_rms_epsilon",
                Value::F32(f32::NAN),
                "layer_norm_rms_epsilon",
            ),
            (
                "llama.attention.layer_norm_rms_epsilon",
                Value::F32(0.0),
                "layer_norm_rms_epsilon",
            ),
            (
                "llama.attention.layer_norm_rms_epsilon",
                Value::F32(-1e-5),
                "layer_norm_rms_epsilon",
            ),
            (
                "llama.attention.layer_norm_rms_epsilon",
                Value::F32(f32::INFINITY),
                "layer_norm_rms_epsilon",
            ),
            ("llama.rope.freq_base", Value::F32(0.0), "rope.freq_base"),
            (
                "llama.rope.freq_base",
                Value::F32(-10000.0),
                "rope.freq_base",
            ),
            (
                "llama.rope.freq_base",
                Value::F32(f32::NAN),
                "rope.freq_base",
            ),
            (
                "llama.rope.scaling.factor",
                Value::F32(-2.0),
                "rope.scaling.factor",
            ),
            (
                "llama.rope.scaling.factor",
                Value::F32(f32::NAN),
                "rope.scaling.factor",
            ),
            (
                "llama.rope.dimension_count",
                Value::U32(0),
                "rope.dimension_count",
            ),
        ];
        for (key, value, named) in cases {
            let mut m = smollm_like();
            m.set(*key, value.clone());
            let e = ModelConfig::from_gguf(&m).unwrap_err().to_string();
            assert!(e.contains(named), "{key} = {value:?}: {e}");
        }
        assert!(ModelConfig::from_gguf(&smollm_like()).is_ok());
    }
}
