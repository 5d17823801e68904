//! Tiny random `cachefit` models (docs/CACHEFIT-FORMAT.md) written to GGUF,
//! with F32 or int8 (+ per-row scale) matrices and a byte-level GPT-2
//! tokenizer, so the runtime and the CLI can be tested without a trained
//! model.

use gguf::{Builder, GgmlType, Metadata, TensorSpec, Value, ValueType};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;

/// The shape of a tiny model.
#[derive(Clone, Debug)]
pub struct Spec {
    pub pattern: String,
    pub vocab: usize,
    pub dim: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub conv_kernel: usize,
    pub context: usize,
    pub softcap: f32,
    pub eps: f32,
    pub rope_base: f32,
}

impl Spec {
    /// The shipped model's shape (d 144, CCACCA, 8 heads sharing one KV
    /// head of 18, f 396, K 4, cap 30) with a byte-level vocabulary.
    pub fn reference_shape() -> Spec {
        Spec {
            pattern: "CCACCA".into(),
            vocab: BYTE_VOCAB,
            dim: 144,
            ffn: 396,
            n_heads: 8,
            n_kv_heads: 1,
            head_dim: 18,
            conv_kernel: 4,
            context: 1024,
            softcap: 30.0,
            eps: 1e-6,
            rope_base: 10000.0,
        }
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// Tokens of the byte-level tokenizer: the 256 bytes and `<|endoftext|>`.
pub const BYTE_VOCAB: usize = 257;

/// How matrices are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    F32,
    /// `NAME.weight` I8 plus `NAME.scale` F32, as the exporter writes them.
    I8,
}

/// One tensor before writing: GGUF dims and values.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub dims: Vec<u64>,
    pub data: Vec<f32>,
    /// A matrix (stored per [`Storage`]); otherwise always F32.
    pub matrix: bool,
}

/// A random model: every tensor's values by base name (`blk.0.conv_gate`,
/// `blk.0.attn_norm.weight`, ...).
#[derive(Clone, Debug)]
pub struct TinyCachefit {
    pub spec: Spec,
    pub tensors: BTreeMap<String, Tensor>,
}

impl TinyCachefit {
    /// Random weights of roughly the trained model's scales (norm weights
    /// near 1, matrices ~1/√fan-in), reproducible from `seed`.
    pub fn random(spec: Spec, seed: u64) -> TinyCachefit {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let mut t = BTreeMap::new();
        let s = &spec;
        let mut add =
            |name: String, rows: usize, cols: usize, matrix: bool, scale: f32, offset: f32| {
                let data = (0..rows * cols)
                    .map(|_| offset + r.gen_range(-scale..scale))
                    .collect();
                let dims = if rows == 1 {
                    vec![cols as u64]
                } else {
                    vec![cols as u64, rows as u64]
                };
                t.insert(name, Tensor { dims, data, matrix });
            };
        let fan = |n: usize| 1.7 / (n as f32).sqrt();
        add("token_embd".into(), s.vocab, s.dim, true, 1.0, 0.0);
        add("output_norm.weight".into(), 1, s.dim, false, 0.2, 1.0);
        for (i, c) in s.pattern.chars().enumerate() {
            let n = |x: &str| format!("blk.{i}.{x}");
            add(n("attn_norm.weight"), 1, s.dim, false, 0.2, 1.0);
            match c {
                'C' => {
                    add(n("conv_gate"), s.dim, s.dim, true, fan(s.dim), 0.0);
                    // (dim, K): rows of K taps; stored as ne [K, dim].
                    add(n("conv_taps.weight"), s.dim, s.conv_kernel, false, 0.6, 0.0);
                    add(n("conv_out"), s.dim, s.dim, true, fan(s.dim), 0.0);
                }
                _ => {
                    add(
                        n("attn_qkv"),
                        s.q_dim() + 2 * s.kv_dim(),
                        s.dim,
                        true,
                        3.0 * fan(s.dim),
                        0.0,
                    );
                    add(
                        n("attn_output"),
                        s.dim,
                        s.q_dim(),
                        true,
                        fan(s.q_dim()),
                        0.0,
                    );
                }
            }
            add(n("ffn_norm.weight"), 1, s.dim, false, 0.2, 1.0);
            add(n("ffn_gate"), s.ffn, s.dim, true, fan(s.dim), 0.0);
            add(n("ffn_up"), s.ffn, s.dim, true, fan(s.dim), 0.0);
            add(n("ffn_down"), s.dim, s.ffn, true, fan(s.ffn), 0.0);
        }
        TinyCachefit { spec, tensors: t }
    }

    /// Values of tensor `name` (base name for matrices).
    pub fn get(&self, name: &str) -> &[f32] {
        &self.tensors[name].data
    }

    /// The same model with every matrix replaced by what its I8 storage
    /// holds (`scale · q`): the weights the runtime computes with when
    /// reading the [`Storage::I8`] file.
    pub fn dequantized(&self) -> TinyCachefit {
        let mut m = self.clone();
        for t in m.tensors.values_mut().filter(|t| t.matrix) {
            let cols = t.dims[0] as usize;
            let (q, s) = quantize_rows(&t.data, cols);
            for (row, (qr, &sr)) in t
                .data
                .chunks_exact_mut(cols)
                .zip(q.chunks_exact(cols).zip(&s))
            {
                for (v, &qv) in row.iter_mut().zip(qr) {
                    *v = sr * qv as f32;
                }
            }
        }
        m
    }

    /// The metadata the file gets.
    pub fn metadata(&self) -> Metadata {
        let s = &self.spec;
        let mut md = Metadata::new();
        md.set("general.architecture", Value::String("cachefit".into()));
        md.set("general.name", Value::String("tiny cachefit".into()));
        md.set("cachefit.block_pattern", Value::String(s.pattern.clone()));
        for (k, v) in [
            ("block_count", s.pattern.len()),
            ("context_length", s.context),
            ("embedding_length", s.dim),
            ("feed_forward_length", s.ffn),
            ("attention.head_count", s.n_heads),
            ("attention.head_count_kv", s.n_kv_heads),
            ("attention.key_length", s.head_dim),
            ("conv.kernel_length", s.conv_kernel),
            ("vocab_size", s.vocab),
        ] {
            md.set(format!("cachefit.{k}"), Value::U32(v as u32));
        }
        md.set(
            "cachefit.attention.layer_norm_rms_epsilon",
            Value::F32(s.eps),
        );
        md.set("cachefit.rope.freq_base", Value::F32(s.rope_base));
        md.set("cachefit.final_logit_softcapping", Value::F32(s.softcap));
        byte_level_tokenizer(&mut md, s.vocab);
        md
    }

    /// Write the model to `path` with matrices in `storage`.
    pub fn write(&self, path: &Path, storage: Storage) {
        self.write_with(path, storage, |_, _| {})
    }

    /// [`TinyCachefit::write`], letting `edit` change the metadata and the
    /// list of tensors (name, type, dims, bytes) first: how tests make bad
    /// files.
    pub fn write_with(
        &self,
        path: &Path,
        storage: Storage,
        edit: impl FnOnce(&mut Metadata, &mut Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>),
    ) {
        let mut md = self.metadata();
        let mut out = Vec::new();
        for (name, t) in &self.tensors {
            if !t.matrix {
                out.push((
                    name.clone(),
                    GgmlType::F32,
                    t.dims.clone(),
                    f32_bytes(&t.data),
                ));
                continue;
            }
            let w = format!("{name}.weight");
            match storage {
                Storage::F32 => out.push((w, GgmlType::F32, t.dims.clone(), f32_bytes(&t.data))),
                Storage::I8 => {
                    let (q, s) = quantize_rows(&t.data, t.dims[0] as usize);
                    out.push((
                        w,
                        GgmlType::I8,
                        t.dims.clone(),
                        bytemuck::cast_slice(&q).to_vec(),
                    ));
                    out.push((
                        format!("{name}.scale"),
                        GgmlType::F32,
                        vec![t.dims[1]],
                        f32_bytes(&s),
                    ));
                }
            }
        }
        edit(&mut md, &mut out);
        let mut b = Builder::new(md);
        for (name, ty, dims, _) in &out {
            b.add_tensor(TensorSpec {
                name: name.clone(),
                dims: dims.clone(),
                ty: *ty,
            })
            .expect("a valid tensor spec");
        }
        let file = std::fs::File::create(path).expect("create the model file");
        let mut w = b
            .write_header(std::io::BufWriter::new(file))
            .expect("write the header");
        for (_, _, _, bytes) in &out {
            w.write_tensor(bytes).expect("write a tensor");
        }
        w.finish().expect("finish the file");
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// The exporter's quantization: per row `scale = max|w| / 127`, `q =
/// round(w / scale)` (halves away from zero); an all-zero row has scale 0.
pub fn quantize_rows(w: &[f32], cols: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(w.len());
    let mut scales = Vec::new();
    for row in w.chunks_exact(cols) {
        let amax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let s = amax / 127.0;
        scales.push(s);
        for &v in row {
            q.push(if s == 0.0 {
                0
            } else {
                (v / s).round().clamp(-127.0, 127.0) as i8
            });
        }
    }
    (q, scales)
}

/// GPT-2's byte-to-character map (`bytes_to_unicode`).
pub fn byte_char(b: u8) -> char {
    let keeps = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if keeps(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !keeps(x)).count() as u32;
    char::from_u32(256 + n).expect("a valid code point")
}

/// A byte-level BPE tokenizer without merges: one token per byte, then
/// `<|endoftext|>` (id 256, the end-of-sequence token), then unused
/// padding tokens up to `vocab`.
pub fn byte_level_tokenizer(md: &mut Metadata, vocab: usize) {
    assert!(
        vocab >= BYTE_VOCAB,
        "the byte-level tokenizer needs {BYTE_VOCAB} tokens"
    );
    let mut tokens: Vec<Value> = (0..=255u8)
        .map(|b| Value::String(byte_char(b).to_string()))
        .collect();
    let mut types: Vec<Value> = vec![Value::I32(1); 256];
    tokens.push(Value::String("<|endoftext|>".into()));
    types.push(Value::I32(3));
    for i in BYTE_VOCAB..vocab {
        tokens.push(Value::String(format!("<|unused_{i}|>")));
        types.push(Value::I32(5));
    }
    md.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    md.set("tokenizer.ggml.pre", Value::String("gpt-2".into()));
    md.set(
        "tokenizer.ggml.tokens",
        Value::Array(ValueType::String, tokens),
    );
    md.set(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::I32, types),
    );
    md.set(
        "tokenizer.ggml.merges",
        Value::Array(ValueType::String, Vec::new()),
    );
    md.set("tokenizer.ggml.eos_token_id", Value::U32(256));
    md.set("tokenizer.ggml.bos_token_id", Value::U32(256));
}
