//! Hyper-parameters: what a file's metadata says about the network. Each
//! architecture reads its own keys (`arch/*/config.rs`);
//! [`ModelConfig::from_gguf`] picks the reader by `general.architecture`.

use kernels::ops::RopeParams;

/// The architectures, by their `general.architecture` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
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
    pub const ALL: [Arch; 4] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Cachefit];

    pub const fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
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
    /// Per-head RMSNorm of q and k before RoPE (qwen3).
    pub qk_norm: bool,
    /// Blocks, convolution and soft cap of a `cachefit` model (`None` for
    /// the llama family).
    pub cachefit: Option<CachefitConfig>,
}

impl ModelConfig {
    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
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
