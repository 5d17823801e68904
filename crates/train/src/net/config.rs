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
        };
        c.validate()?;
        Ok(c)
    }
}

/// One parameter tensor: `rows × cols` at `offset` in the flat vector.
#[derive(Clone, Debug)]
pub struct ParamTensor {
    /// Its GGUF name without the `.weight` suffix (`blk.0.ffn_up`).
    pub name: String,
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    /// A matrix: int8 per-row in the export, fake-quantized in QAT,
    /// weight-decayed. Otherwise a norm or conv taps (kept f32).
    pub matrix: bool,
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
    pub embd: usize,
    pub output_norm: usize,
    pub blocks: Vec<BlockParams>,
}

impl Layout {
    pub fn new(c: &NetConfig) -> Layout {
        let mut tensors = Vec::new();
        let mut len = 0;
        let mut add = |name: String, rows: usize, cols: usize, matrix: bool| {
            tensors.push(ParamTensor {
                name,
                offset: len,
                rows,
                cols,
                matrix,
            });
            len += rows * cols;
            tensors.len() - 1
        };
        let embd = add("token_embd".into(), c.vocab, c.d, true);
        let mut blocks = Vec::new();
        for (i, &kind) in c.pattern.iter().enumerate() {
            let n = |s: &str| format!("blk.{i}.{s}");
            let attn_norm = add(n("attn_norm"), 1, c.d, false);
            let mix = match kind {
                BlockKind::Conv => [
                    add(n("conv_gate"), c.d, c.d, true),
                    add(n("conv_taps"), c.d, c.conv_kernel, false),
                    add(n("conv_out"), c.d, c.d, true),
                ],
                BlockKind::Attn => {
                    let qkv = add(n("attn_qkv"), c.qkv_dim(), c.d, true);
                    let out = add(n("attn_output"), c.d, c.q_dim(), true);
                    [qkv, out, usize::MAX]
                }
            };
            let ffn_norm = add(n("ffn_norm"), 1, c.d, false);
            let ffn_gate = add(n("ffn_gate"), c.ffn, c.d, true);
            let ffn_up = add(n("ffn_up"), c.ffn, c.d, true);
            let ffn_down = add(n("ffn_down"), c.d, c.ffn, true);
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
        let output_norm = add("output_norm".into(), 1, c.d, false);
        Layout {
            tensors,
            len,
            embd,
            output_norm,
            blocks,
        }
    }

    pub fn get<'p>(&self, params: &'p [f32], i: usize) -> &'p [f32] {
        &params[self.tensors[i].range()]
    }
}
