//! The network's hyper-parameters and where each parameter tensor lives in
//! one flat `f32` vector (one vector makes AdamW, gradient clipping,
//! checkpoints and gradient checks loops over a slice).

use crate::{Error, Result};
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    /// Gated causal depthwise convolution.
    Conv,
    /// Attention with few KV heads.
    Attn,
}

/// How the block matrices are stored (and fake-quantized in QAT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// Int8 rows with one f32 scale per row.
    Int8,
    /// Ternary (BitNet b1.58 style): `w ≈ s·t`, `t ∈ {−1, 0, +1}`, `s` the
    /// mean |w| of each run of `block` weights along a row (rounded to f16,
    /// as GGUF TQ2_0 stores it), or of the whole row when `block` is 0.
    /// Inputs of these matrices are int8 per 256 (Q8_K), as the runtime
    /// computes them.
    Ternary { block: usize },
}

impl WeightFormat {
    pub fn name(&self) -> String {
        match self {
            WeightFormat::Int8 => "int8".into(),
            WeightFormat::Ternary { block: 0 } => "ternary-row".into(),
            WeightFormat::Ternary { block } => format!("ternary-{block}"),
        }
    }

    pub fn parse(s: &str) -> Result<WeightFormat> {
        match s {
            "int8" | "i8" => Ok(WeightFormat::Int8),
            "ternary" | "ternary-256" => Ok(WeightFormat::Ternary { block: 256 }),
            "ternary-row" => Ok(WeightFormat::Ternary { block: 0 }),
            other => Err(Error::Config(format!(
                "weights {other:?}: expected int8, ternary (scale per 256) or ternary-row"
            ))),
        }
    }

    pub fn is_ternary(&self) -> bool {
        matches!(self, WeightFormat::Ternary { .. })
    }
}

/// Inputs of ternary matrices are quantized in blocks of this many values
/// (GGUF TQ2_0 rows are whole blocks of 256, so are the input widths).
pub const TERNARY_BLOCK: usize = 256;

#[derive(Clone, Debug, PartialEq)]
pub struct NetConfig {
    pub vocab: usize,
    pub d: usize,
    pub ffn: usize,
    pub pattern: Vec<BlockKind>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub context: usize,
    pub conv_kernel: usize,
    /// Logit soft cap; 0 = none.
    pub softcap: f32,
    pub eps: f32,
    pub rope_base: f32,
    /// Storage of the block matrices.
    pub weights: WeightFormat,
    /// Fixed token codes of this many bits (a multiple of 64) instead of a
    /// learned embedding table: the input is a learned projection
    /// (`token_proj`, d × bits) of the token's ±1 code, and the output head
    /// (`output`, vocab × d) is its own matrix. 0 = a learned table, tied
    /// to the output head.
    pub token_code_bits: usize,
    /// Seed of the token codes (`model::token_codes`).
    pub token_code_seed: u64,
}

impl Default for NetConfig {
    /// The shipped model's shape (the public reference design's).
    fn default() -> NetConfig {
        NetConfig {
            vocab: 4096,
            d: 144,
            ffn: 396,
            pattern: parse_pattern("CCACCA").expect("static pattern"),
            n_heads: 8,
            n_kv_heads: 1,
            head_dim: 18,
            context: 1024,
            conv_kernel: 4,
            softcap: 30.0,
            eps: 1e-6,
            rope_base: 10000.0,
            weights: WeightFormat::Int8,
            token_code_bits: 0,
            token_code_seed: 0,
        }
    }
}

pub fn parse_pattern(s: &str) -> Result<Vec<BlockKind>> {
    if s.is_empty() {
        return Err(Error::Config("block pattern is empty".into()));
    }
    s.chars()
        .map(|c| match c.to_ascii_uppercase() {
            'C' => Ok(BlockKind::Conv),
            'A' => Ok(BlockKind::Attn),
            other => Err(Error::Config(format!(
                "block pattern {s:?}: {other:?} is neither C (conv) nor A (attention)"
            ))),
        })
        .collect()
}

pub fn pattern_string(p: &[BlockKind]) -> String {
    p.iter()
        .map(|k| match k {
            BlockKind::Conv => 'C',
            BlockKind::Attn => 'A',
        })
        .collect()
}

impl NetConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.vocab < 3 || self.vocab > 65536 {
            return bad(format!(
                "vocab {} must be 3..=65536 (ids are u16)",
                self.vocab
            ));
        }
        for (name, v) in [
            ("d", self.d),
            ("ffn", self.ffn),
            ("heads", self.n_heads),
            ("kv heads", self.n_kv_heads),
            ("head dim", self.head_dim),
            ("context", self.context),
            ("conv kernel", self.conv_kernel),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive"));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "{} heads are not a multiple of {} kv heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head dim {} must be even (RoPE pairs)",
                self.head_dim
            ));
        }
        if self.pattern.is_empty() {
            return bad("block pattern is empty".into());
        }
        if !self.token_code_bits.is_multiple_of(64) || self.token_code_bits > 4096 {
            return bad(format!(
                "token codes of {} bits: use a multiple of 64 up to 4096 (0 = an embedding table)",
                self.token_code_bits
            ));
        }
        if self.weights.is_ternary() {
            // Every ternary matrix's input width must be whole TQ2_0 blocks.
            for (name, v) in [
                ("d", self.d),
                ("ffn", self.ffn),
                ("heads × head dim", self.q_dim()),
            ] {
                if !v.is_multiple_of(TERNARY_BLOCK) {
                    return bad(format!(
                        "ternary weights need {name} ({v}) to be a multiple of {TERNARY_BLOCK} \
                         (TQ2_0 rows are whole blocks of {TERNARY_BLOCK})"
                    ));
                }
            }
            if let WeightFormat::Ternary { block } = self.weights {
                if block != 0 && (block > TERNARY_BLOCK || !TERNARY_BLOCK.is_multiple_of(block)) {
                    return bad(format!(
                        "ternary scale block {block} must divide {TERNARY_BLOCK} (0 = one per row)"
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn qkv_dim(&self) -> usize {
        (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
    }

    pub fn to_json(&self) -> Value {
        json!({
            "vocab": self.vocab, "d": self.d, "ffn": self.ffn,
            "pattern": pattern_string(&self.pattern),
            "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim, "context": self.context,
            "conv_kernel": self.conv_kernel, "softcap": self.softcap,
            "eps": self.eps, "rope_base": self.rope_base,
            "weights": self.weights.name(),
            "token_code_bits": self.token_code_bits,
            "token_code_seed": self.token_code_seed,
        })
    }

    pub fn from_json(v: &Value) -> Result<NetConfig> {
        let u = |k: &str| -> Result<usize> {
            v[k].as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| Error::Config(format!("config: {k} missing or not an integer")))
        };
        let f = |k: &str| -> Result<f32> {
            v[k].as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| Error::Config(format!("config: {k} missing or not a number")))
        };
        let pattern = v["pattern"]
            .as_str()
            .ok_or_else(|| Error::Config("config: pattern missing".into()))?;
        let c = NetConfig {
            vocab: u("vocab")?,
            d: u("d")?,
            ffn: u("ffn")?,
            pattern: parse_pattern(pattern)?,
            n_heads: u("n_heads")?,
            n_kv_heads: u("n_kv_heads")?,
            head_dim: u("head_dim")?,
            context: u("context")?,
            conv_kernel: u("conv_kernel")?,
            softcap: f("softcap")?,
            eps: f("eps")?,
            rope_base: f("rope_base")?,
            // Absent in checkpoints made before ternary weights and codes.
            weights: match v["weights"].as_str() {
                Some(w) => WeightFormat::parse(w)?,
                None => WeightFormat::Int8,
            },
            token_code_bits: v["token_code_bits"].as_u64().unwrap_or(0) as usize,
            token_code_seed: v["token_code_seed"].as_u64().unwrap_or(0),
        };
        c.validate()?;
        Ok(c)
    }
}

/// What a tensor is, for its storage.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A norm or conv taps: f32.
    Vector,
    /// A block's matrix: the network's weight format.
    Block,
    /// The embedding, token projection or output head: int8 always (the
    /// first and last layers are the ones low-bit training hurts most).
    Edge,
}

/// One parameter tensor: `rows × cols` at `offset` in the flat vector.
#[derive(Clone, Debug)]
pub struct ParamTensor {
    /// Its GGUF name without the `.weight` suffix (`blk.0.ffn_up`).
    pub name: String,
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    /// A matrix: quantized in the export, fake-quantized in QAT,
    /// weight-decayed. Otherwise a norm or conv taps (kept f32).
    pub matrix: bool,
    /// A block matrix stored ternary (else int8 when `matrix`).
    pub ternary: bool,
}

impl ParamTensor {
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// Indices into [`Layout::tensors`] for one block.
#[derive(Clone, Debug)]
pub struct BlockParams {
    pub kind: BlockKind,
    pub attn_norm: usize,
    /// Conv: gate, taps, out. Attention: qkv, output (third unused).
    pub mix: [usize; 3],
    pub ffn_norm: usize,
    pub ffn_gate: usize,
    pub ffn_up: usize,
    pub ffn_down: usize,
}

#[derive(Clone, Debug)]
pub struct Layout {
    pub tensors: Vec<ParamTensor>,
    pub len: usize,
    /// The input side: the embedding table `token_embd` (vocab × d, also
    /// the output head), or with token codes `token_proj` (d × bits).
    pub embd: usize,
    /// The output head: `embd` itself when tied, else `output` (vocab × d).
    pub head: usize,
    /// Bits of the token codes (0 = a table).
    pub code_bits: usize,
    pub output_norm: usize,
    pub blocks: Vec<BlockParams>,
}

impl Layout {
    pub fn new(c: &NetConfig) -> Layout {
        let mut tensors = Vec::new();
        let mut len = 0;
        let ternary = c.weights.is_ternary();
        let mut add = |name: String, rows: usize, cols: usize, kind: Kind| {
            tensors.push(ParamTensor {
                name,
                offset: len,
                rows,
                cols,
                matrix: kind != Kind::Vector,
                ternary: kind == Kind::Block && ternary,
            });
            len += rows * cols;
            tensors.len() - 1
        };
        use Kind::{Block as B, Edge as E, Vector as V};
        let embd = if c.token_code_bits > 0 {
            add("token_proj".into(), c.d, c.token_code_bits, E)
        } else {
            add("token_embd".into(), c.vocab, c.d, E)
        };
        let mut blocks = Vec::new();
        for (i, &kind) in c.pattern.iter().enumerate() {
            let n = |s: &str| format!("blk.{i}.{s}");
            let attn_norm = add(n("attn_norm"), 1, c.d, V);
            let mix = match kind {
                BlockKind::Conv => [
                    add(n("conv_gate"), c.d, c.d, B),
                    add(n("conv_taps"), c.d, c.conv_kernel, V),
                    add(n("conv_out"), c.d, c.d, B),
                ],
                BlockKind::Attn => {
                    let qkv = add(n("attn_qkv"), c.qkv_dim(), c.d, B);
                    let out = add(n("attn_output"), c.d, c.q_dim(), B);
                    [qkv, out, usize::MAX]
                }
            };
            let ffn_norm = add(n("ffn_norm"), 1, c.d, V);
            let ffn_gate = add(n("ffn_gate"), c.ffn, c.d, B);
            let ffn_up = add(n("ffn_up"), c.ffn, c.d, B);
            let ffn_down = add(n("ffn_down"), c.d, c.ffn, B);
            blocks.push(BlockParams {
                kind,
                attn_norm,
                mix,
                ffn_norm,
                ffn_gate,
                ffn_up,
                ffn_down,
            });
        }
        let output_norm = add("output_norm".into(), 1, c.d, V);
        let head = if c.token_code_bits > 0 {
            add("output".into(), c.vocab, c.d, E)
        } else {
            embd
        };
        Layout {
            tensors,
            len,
            embd,
            head,
            code_bits: c.token_code_bits,
            output_norm,
            blocks,
        }
    }

    pub fn get<'p>(&self, params: &'p [f32], i: usize) -> &'p [f32] {
        &params[self.tensors[i].range()]
    }
}
