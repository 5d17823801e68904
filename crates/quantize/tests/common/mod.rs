//! Synthetic llama-like GGUF files for the quantize tests.
#![allow(dead_code)]

use gguf::{Builder, GgmlType, Metadata, TensorSpec, Value};
use std::path::Path;

/// A model to write: metadata and tensors with their raw bytes.
pub struct Synth {
    pub meta: Metadata,
    pub tensors: Vec<(TensorSpec, Vec<u8>)>,
    /// Fill F32 tensors with zeros (plan tests only look at the header).
    pub zeros: bool,
}

/// Shape of a llama-like model.
#[derive(Clone, Copy)]
pub struct Shape {
    pub n_layer: usize,
    pub width: u64,
    pub ffn: u64,
    pub n_head: u32,
    pub n_head_kv: u32,
    /// No `output.weight`: the token embedding doubles as the output.
    pub tied: bool,
    pub vocab: u64,
    /// Zero data instead of random values (for plan-only tests).
    pub zeros: bool,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape {
            n_layer: 8,
            width: 256,
            ffn: 512,
            n_head: 4,
            n_head_kv: 2,
            tied: false,
            vocab: 64,
            zeros: true,
        }
    }
}

/// Deterministic roughly-normal values (sum of four uniforms), scale ~0.1.
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uni = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f32 / (1u64 << 53) as f32
    };
    (0..n)
        .map(|_| (uni() + uni() + uni() + uni() - 2.0) * 0.17)
        .collect()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Synth {
    pub fn new() -> Synth {
        let mut meta = Metadata::new();
        meta.set("general.architecture", Value::String("llama".into()));
        meta.set("general.name", Value::String("synthetic".into()));
        Synth {
            meta,
            tensors: Vec::new(),
            zeros: false,
        }
    }

    /// A llama-like model: embeddings, per-layer attention and FFN, norms,
    /// output (unless tied). All F32 with deterministic values.
    pub fn llama(shape: Shape) -> Synth {
        let mut s = Synth::new();
        s.zeros = shape.zeros;
        let kv = shape.width / shape.n_head as u64 * shape.n_head_kv as u64;
        s.meta
            .set("llama.block_count", Value::U32(shape.n_layer as u32));
        s.meta
            .set("llama.embedding_length", Value::U32(shape.width as u32));
        s.meta
            .set("llama.attention.head_count", Value::U32(shape.n_head));
        s.meta
            .set("llama.attention.head_count_kv", Value::U32(shape.n_head_kv));
        s.meta.set("general.file_type", Value::U32(0));
        let (w, f) = (shape.width, shape.ffn);
        s.f32("token_embd.weight", &[w, shape.vocab]);
        for i in 0..shape.n_layer {
            s.f32(&format!("blk.{i}.attn_norm.weight"), &[w]);
            s.f32(&format!("blk.{i}.attn_q.weight"), &[w, w]);
            s.f32(&format!("blk.{i}.attn_k.weight"), &[w, kv]);
            s.f32(&format!("blk.{i}.attn_v.weight"), &[w, kv]);
            s.f32(&format!("blk.{i}.attn_output.weight"), &[w, w]);
            s.f32(&format!("blk.{i}.ffn_norm.weight"), &[w]);
            s.f32(&format!("blk.{i}.ffn_gate.weight"), &[w, f]);
            s.f32(&format!("blk.{i}.ffn_up.weight"), &[w, f]);
            s.f32(&format!("blk.{i}.ffn_down.weight"), &[f, w]);
        }
        s.f32("output_norm.weight", &[w]);
        if !shape.tied {
            s.f32("output.weight", &[w, shape.vocab]);
        }
        s
    }

    /// Add an F32 tensor with deterministic values.
    pub fn f32(&mut self, name: &str, dims: &[u64]) -> &mut Synth {
        let n: u64 = dims.iter().product();
        let seed = self.tensors.len() as u64 + 1;
        let data = if self.zeros {
            vec![0u8; n as usize * 4]
        } else {
            f32_bytes(&values(seed, n as usize))
        };
        self.raw(name, dims, GgmlType::F32, data)
    }

    /// Add a tensor with the given bytes.
    pub fn raw(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Synth {
        let spec = TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
        };
        assert_eq!(spec.n_bytes(), Some(data.len() as u64), "{name}");
        self.tensors.push((spec, data));
        self
    }

    /// Bytes of the named tensor's data.
    pub fn data_mut(&mut self, name: &str) -> &mut Vec<u8> {
        &mut self
            .tensors
            .iter_mut()
            .find(|(s, _)| s.name == name)
            .expect("tensor exists")
            .1
    }

    pub fn write(&self, path: &Path) {
        let mut b = Builder::new(self.meta.clone());
        for (spec, _) in &self.tensors {
            b.add_tensor(spec.clone()).unwrap();
        }
        let f = std::fs::File::create(path).unwrap();
        let mut w = b.write_header(std::io::BufWriter::new(f)).unwrap();
        for (_, data) in &self.tensors {
            w.write_tensor(data).unwrap();
        }
        w.finish().unwrap();
    }

    /// Write into `dir` as `name` and open it.
    pub fn open_in(&self, dir: &Path, name: &str) -> gguf::GgufFile {
        let p = dir.join(name);
        self.write(&p);
        gguf::GgufFile::open(&p).unwrap()
    }
}

/// Names of entries in `dir`, sorted.
pub fn dir_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
