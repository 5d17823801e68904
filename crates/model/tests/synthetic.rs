//! Tiny random F32 models of each architecture, written to a temporary
//! GGUF file, against a naive f64 forward pass written here from the
//! papers' formulas: checks the qwen2 biases, the qwen3 q/k norms, both
//! RoPE layouts, GQA and a head size other than dim / n_heads.

use gguf::{Builder, GgmlType, GgufFile, Metadata, TensorSpec, Value};
use kernels::pool::ThreadPool;
use model::{KvType, Logits, Model, ModelConfig, StateOptions, Token, Weights};

mod common;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

const DIM: usize = 64;
const FFN: usize = 96;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const VOCAB: usize = 50;

/// Rows of queries and rows of keys, by position.
type QkRows = (Vec<Vec<f64>>, Vec<Vec<f64>>);

struct Tiny {
    arch: &'static str,
    head_dim: usize,
    tensors: HashMap<String, (Vec<u64>, Vec<f32>)>,
}

impl Tiny {
    fn new(arch: &'static str, head_dim: usize, seed: u64) -> Tiny {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let mut t = HashMap::new();
        let mut add = |name: String, dims: Vec<u64>, scale: f32, offset: f32| {
            let n = dims.iter().product::<u64>() as usize;
            let data = (0..n)
                .map(|_| offset + r.gen_range(-scale..scale))
                .collect();
            t.insert(name, (dims, data));
        };
        let (q, kv) = (HEADS * head_dim, KV_HEADS * head_dim);
        add(
            "token_embd.weight".into(),
            vec![DIM as u64, VOCAB as u64],
            1.0,
            0.0,
        );
        add("output_norm.weight".into(), vec![DIM as u64], 0.2, 1.0);
        for i in 0..2 {
            let n = |s: &str| format!("blk.{i}.{s}");
            let d = DIM as u64;
            add(n("attn_norm.weight"), vec![d], 0.2, 1.0);
            add(n("attn_q.weight"), vec![d, q as u64], 0.3, 0.0);
            add(n("attn_k.weight"), vec![d, kv as u64], 0.3, 0.0);
            add(n("attn_v.weight"), vec![d, kv as u64], 0.3, 0.0);
            add(n("attn_output.weight"), vec![q as u64, d], 0.2, 0.0);
            add(n("ffn_norm.weight"), vec![d], 0.2, 1.0);
            add(n("ffn_gate.weight"), vec![d, FFN as u64], 0.2, 0.0);
            add(n("ffn_up.weight"), vec![d, FFN as u64], 0.2, 0.0);
            add(n("ffn_down.weight"), vec![FFN as u64, d], 0.2, 0.0);
            if arch == "qwen2" {
                add(n("attn_q.bias"), vec![q as u64], 0.5, 0.0);
                add(n("attn_k.bias"), vec![kv as u64], 0.5, 0.0);
                add(n("attn_v.bias"), vec![kv as u64], 0.5, 0.0);
            }
            if arch == "qwen3" {
                add(n("attn_q_norm.weight"), vec![head_dim as u64], 0.2, 1.0);
                add(n("attn_k_norm.weight"), vec![head_dim as u64], 0.2, 1.0);
            }
        }
        if arch == "llama" {
            add(
                "output.weight".into(),
                vec![DIM as u64, VOCAB as u64],
                0.3,
                0.0,
            );
        }
        Tiny {
            arch,
            head_dim,
            tensors: t,
        }
    }

    fn write(&self, path: &std::path::Path, skip: Option<&str>) {
        let mut md = Metadata::new();
        let a = self.arch;
        md.set("general.architecture", Value::String(a.into()));
        for (k, v) in [
            ("block_count", 2),
            ("context_length", 64),
            ("embedding_length", DIM),
            ("feed_forward_length", FFN),
            ("attention.head_count", HEADS),
            ("attention.head_count_kv", KV_HEADS),
            ("attention.key_length", self.head_dim),
            ("vocab_size", VOCAB),
        ] {
            md.set(format!("{a}.{k}"), Value::U32(v as u32));
        }
        md.set(format!("{a}.rope.freq_base"), Value::F32(10000.0));
        md.set(
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        );
        let mut names: Vec<&String> = self.tensors.keys().collect();
        names.sort();
        names.retain(|n| Some(n.as_str()) != skip);
        let mut b = Builder::new(md);
        for n in &names {
            b.add_tensor(TensorSpec {
                name: n.to_string(),
                dims: self.tensors[*n].0.clone(),
                ty: GgmlType::F32,
            })
            .unwrap();
        }
        let mut w = b
            .write_header(std::io::BufWriter::new(
                std::fs::File::create(path).unwrap(),
            ))
            .unwrap();
        for n in &names {
            w.write_tensor(bytemuck::cast_slice(&self.tensors[*n].1))
                .unwrap();
        }
        w.finish().unwrap();
    }

    fn get(&self, name: &str) -> Option<&[f32]> {
        self.tensors.get(name).map(|t| &t.1[..])
    }

    /// `y = W x` for a ggml-order `[cols, rows]` matrix.
    fn mv(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let w = self.get(name).unwrap();
        w.chunks_exact(x.len())
            .map(|row| row.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum())
            .collect()
    }

    fn norm(&self, x: &[f64], name: &str) -> Vec<f64> {
        let w = self.get(name).unwrap();
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let s = 1.0 / (ms + 1e-6).sqrt();
        x.iter().zip(w).map(|(v, &w)| v * s * w as f64).collect()
    }

    fn rope(&self, h: &mut [f64], pos: usize) {
        let d = self.head_dim;
        for i in 0..d / 2 {
            let theta = pos as f64 * 10000f64.powf(-2.0 * i as f64 / d as f64);
            let (a, b) = if self.arch == "llama" {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + d / 2)
            };
            let (x0, x1) = (h[a], h[b]);
            h[a] = x0 * theta.cos() - x1 * theta.sin();
            h[b] = x0 * theta.sin() + x1 * theta.cos();
        }
    }

    /// Logits after each token of `tokens`, from scratch in f64.
    fn reference(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        self.reference_qk(tokens).0
    }

    /// [`Tiny::reference`], and each layer's queries and keys before RoPE
    /// by position: `qk[layer] = (q rows, k rows)`.
    fn reference_qk(&self, tokens: &[u32]) -> (Vec<Vec<f64>>, Vec<QkRows>) {
        let hd = self.head_dim;
        let mut qk: Vec<QkRows> = vec![(Vec::new(), Vec::new()); 2];
        let mut kc: Vec<Vec<Vec<f64>>> = vec![Vec::new(); 2]; // [layer][pos] (kv_dim,)
        let mut vc: Vec<Vec<Vec<f64>>> = vec![Vec::new(); 2];
        let emb = self.get("token_embd.weight").unwrap();
        let mut out = Vec::new();
        for (pos, &t) in tokens.iter().enumerate() {
            let mut x: Vec<f64> = emb[t as usize * DIM..(t as usize + 1) * DIM]
                .iter()
                .map(|&v| v as f64)
                .collect();
            for l in 0..2 {
                let n = |s: &str| format!("blk.{l}.{s}");
                let xb = self.norm(&x, &n("attn_norm.weight"));
                let mut q = self.mv(&n("attn_q.weight"), &xb);
                let mut k = self.mv(&n("attn_k.weight"), &xb);
                let mut v = self.mv(&n("attn_v.weight"), &xb);
                for (vec, b) in [
                    (&mut q, "attn_q.bias"),
                    (&mut k, "attn_k.bias"),
                    (&mut v, "attn_v.bias"),
                ] {
                    if let Some(b) = self.get(&n(b)) {
                        vec.iter_mut().zip(b).for_each(|(a, &b)| *a += b as f64);
                    }
                }
                for (vec, nn) in [
                    (&mut q, "attn_q_norm.weight"),
                    (&mut k, "attn_k_norm.weight"),
                ] {
                    if self.get(&n(nn)).is_some() {
                        for h in vec.chunks_exact_mut(hd) {
                            let normed = self.norm(h, &n(nn));
                            h.copy_from_slice(&normed);
                        }
                    }
                }
                qk[l].0.push(q.clone());
                qk[l].1.push(k.clone());
                q.chunks_exact_mut(hd).for_each(|h| self.rope(h, pos));
                k.chunks_exact_mut(hd).for_each(|h| self.rope(h, pos));
                kc[l].push(k);
                vc[l].push(v);
                let mut att = vec![0.0; HEADS * hd];
                for h in 0..HEADS {
                    let g = h / (HEADS / KV_HEADS);
                    let qh = &q[h * hd..(h + 1) * hd];
                    let scores: Vec<f64> = kc[l]
                        .iter()
                        .map(|k| {
                            qh.iter()
                                .zip(&k[g * hd..(g + 1) * hd])
                                .map(|(a, b)| a * b)
                                .sum::<f64>()
                                / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                    for (s, v) in scores.iter().zip(&vc[l]) {
                        for i in 0..hd {
                            att[h * hd + i] += (s - m).exp() / z * v[g * hd + i];
                        }
                    }
                }
                let o = self.mv(&n("attn_output.weight"), &att);
                x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
                let xb = self.norm(&x, &n("ffn_norm.weight"));
                let g = self.mv(&n("ffn_gate.weight"), &xb);
                let u = self.mv(&n("ffn_up.weight"), &xb);
                let hb: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let d = self.mv(&n("ffn_down.weight"), &hb);
                x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
            }
            let xn = self.norm(&x, "output_norm.weight");
            let out_name = if self.get("output.weight").is_some() {
                "output.weight"
            } else {
                "token_embd.weight"
            };
            out.push(self.mv(out_name, &xn));
        }
        (out, qk)
    }
}

#[test]
fn each_arch_matches_naive_reference() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, head_dim) in [("llama", 16), ("qwen2", 16), ("qwen3", 24)] {
        let tiny = Tiny::new(arch, head_dim, 7);
        let path = dir.path().join(format!("{arch}.gguf"));
        tiny.write(&path, None);
        let file = GgufFile::open(&path).unwrap();
        let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
        assert_eq!(cfg.head_dim, head_dim);
        let model = Model::from_gguf(&file, &cfg).unwrap();
        let Weights::Llama(w) = model.weights() else {
            panic!("{arch} binds as a llama model");
        };
        assert_eq!(w.tied_output, arch != "llama");
        let tokens = [3u32, 17, 42, 0, 49, 8, 8, 21];
        let want = tiny.reference(&tokens);
        let mut results = Vec::new();
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let mut state = model.new_state(&StateOptions::new(16)).unwrap();
            let mut got = Vec::new();
            for (pos, &t) in tokens.iter().enumerate() {
                got.push(state.forward_seq(&pool, &[t], pos, Logits::Last).to_vec());
            }
            results.push(got);
        }
        assert_eq!(results[0], results[1], "{arch}: 1 vs 2 threads");
        for (pos, (g, r)) in results[0].iter().zip(&want).enumerate() {
            let range = r.iter().cloned().fold(f64::MIN, f64::max)
                - r.iter().cloned().fold(f64::MAX, f64::min);
            for (i, (&a, &b)) in g.iter().zip(r).enumerate() {
                // f16 KV cache: ~1e-3 relative.
                assert!(
                    (a as f64 - b).abs() <= 5e-3 * range,
                    "{arch} pos {pos} logit {i}: {a} vs {b} (range {range})"
                );
            }
        }
    }
}

/// A prompt evaluated in batches (of any size, with all logits or the last)
/// gives bit-identical logits to one token at a time, for every arch, cache
/// type and thread count; and the q8_0 cache stays close to the reference.
#[test]
fn batches_equal_token_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, head_dim) in [("llama", 32), ("qwen2", 32), ("qwen3", 64)] {
        let tiny = Tiny::new(arch, head_dim, 11);
        let path = dir.path().join(format!("{arch}.gguf"));
        tiny.write(&path, None);
        let file = GgufFile::open(&path).unwrap();
        let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
        let model = Model::from_gguf(&file, &cfg).unwrap();
        let tokens = [3u32, 17, 42, 0, 49, 8, 8, 21, 5, 1, 30];
        let vocab = cfg.vocab_size;
        for kv in [KvType::F16, KvType::Q8_0, KvType::F32] {
            for threads in [1, 2] {
                let pool = ThreadPool::new(threads);
                let opts = StateOptions {
                    n_batch: 4,
                    kv_type: kv,
                    all_logits: true,
                    ..StateOptions::new(16)
                };
                let mut one = model.new_state(&opts).unwrap();
                let want: Vec<Vec<f32>> = tokens
                    .iter()
                    .enumerate()
                    .map(|(pos, &t)| one.forward_seq(&pool, &[t], pos, Logits::Last).to_vec())
                    .collect();
                for n_batch in [2, 3, 4] {
                    let mut st = model.new_state(&opts).unwrap();
                    let mut pos = 0;
                    for chunk in tokens.chunks(n_batch) {
                        let all = st.forward_seq(&pool, chunk, pos, Logits::All).to_vec();
                        for (i, row) in all.chunks_exact(vocab).enumerate() {
                            assert_eq!(
                                row,
                                &want[pos + i][..],
                                "{arch} {kv} batch {n_batch} pos {}",
                                pos + i
                            );
                        }
                        pos += chunk.len();
                    }
                    let mut st = model.new_state(&opts).unwrap();
                    let last = st.forward_seq(&pool, &tokens[..4], 0, Logits::Last);
                    assert_eq!(last, &want[3][..], "{arch} {kv} last");
                }
                if kv == KvType::Q8_0 {
                    let r = tiny.reference(&tokens);
                    for (g, r) in want.iter().zip(&r) {
                        let range = r.iter().cloned().fold(f64::MIN, f64::max)
                            - r.iter().cloned().fold(f64::MAX, f64::min);
                        for (&a, &b) in g.iter().zip(r) {
                            assert!(
                                (a as f64 - b).abs() <= 3e-2 * range,
                                "{arch} q8_0 cache: {a} vs {b}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Several sequences in one batch (a server's slots, decoding together or
/// one joining with its prompt) give each the logits it gets alone.
#[test]
fn sequences_in_one_batch_equal_each_alone() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::new("qwen2", 32, 5);
    let path = dir.path().join("t.gguf");
    tiny.write(&path, None);
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    let model = Model::from_gguf(&file, &cfg).unwrap();
    let prompts: [&[u32]; 3] = [&[3, 17, 42, 9], &[5, 5, 1], &[49, 8, 21, 30, 2, 7]];
    let pool = ThreadPool::new(2);
    let alone: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .map(|p| {
            let mut st = model.new_state(&StateOptions::new(16)).unwrap();
            p.iter()
                .enumerate()
                .map(|(pos, &t)| st.forward_seq(&pool, &[t], pos, Logits::Last).to_vec())
                .collect()
        })
        .collect();
    let opts = StateOptions {
        n_seq: 3,
        n_batch: 8,
        ..StateOptions::new(16)
    };
    let mut st = model.new_state(&opts).unwrap();
    // Step 1: sequence 0's first 3 tokens and sequence 1's first 2, logits
    // for the last of each.
    let step1 = [
        Token {
            id: 3,
            seq: 0,
            pos: 0,
            logits: false,
        },
        Token {
            id: 5,
            seq: 1,
            pos: 0,
            logits: false,
        },
        Token {
            id: 17,
            seq: 0,
            pos: 1,
            logits: false,
        },
        Token {
            id: 5,
            seq: 1,
            pos: 1,
            logits: true,
        },
        Token {
            id: 42,
            seq: 0,
            pos: 2,
            logits: true,
        },
    ];
    let out = st.forward(&pool, &step1).to_vec();
    let v = cfg.vocab_size;
    assert_eq!(out.len(), 2 * v);
    assert_eq!(&out[..v], &alone[1][1][..]);
    assert_eq!(&out[v..], &alone[0][2][..]);
    // Step 2: one token each for 0 and 1 while sequence 2 joins with 3.
    let step2 = [
        Token {
            id: 9,
            seq: 0,
            pos: 3,
            logits: true,
        },
        Token {
            id: 49,
            seq: 2,
            pos: 0,
            logits: false,
        },
        Token {
            id: 8,
            seq: 2,
            pos: 1,
            logits: false,
        },
        Token {
            id: 1,
            seq: 1,
            pos: 2,
            logits: true,
        },
        Token {
            id: 21,
            seq: 2,
            pos: 2,
            logits: true,
        },
    ];
    let out = st.forward(&pool, &step2).to_vec();
    assert_eq!(&out[..v], &alone[0][3][..]);
    assert_eq!(&out[v..2 * v], &alone[1][2][..]);
    assert_eq!(&out[2 * v..], &alone[2][2][..]);
    // A slot reused from a common prefix: sequence 1 rewinds to position 1.
    let out = st.forward(
        &pool,
        &[Token {
            id: 5,
            seq: 1,
            pos: 1,
            logits: true,
        }],
    );
    assert_eq!(out, &alone[1][1][..]);
}

#[test]
fn q8_0_cache_needs_whole_blocks_per_head() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::new("llama", 16, 3);
    let path = dir.path().join("t.gguf");
    tiny.write(&path, None);
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    let model = Model::from_gguf(&file, &cfg).unwrap();
    let opts = StateOptions {
        kv_type: KvType::Q8_0,
        ..StateOptions::new(8)
    };
    let e = model.new_state(&opts).err().unwrap().to_string();
    assert!(e.contains("q8_0") && e.contains("16"), "{e}");
}

#[test]
fn missing_or_misshapen_tensors_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::new("qwen2", 16, 1);
    let path = dir.path().join("nobias.gguf");
    tiny.write(&path, Some("blk.1.attn_k.bias"));
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    let e = Model::from_gguf(&file, &cfg).err().unwrap().to_string();
    assert!(
        e.contains("blk.1.attn_k.bias") && e.contains("missing"),
        "{e}"
    );

    // Claim a wider FFN than the tensors have.
    let mut md = file.metadata().clone();
    md.set("qwen2.feed_forward_length", Value::U32(128));
    let cfg = ModelConfig::from_gguf(&md).unwrap();
    let path = dir.path().join("ok.gguf");
    tiny.write(&path, None);
    let file = GgufFile::open(&path).unwrap();
    let e = Model::from_gguf(&file, &cfg).err().unwrap().to_string();
    assert!(
        e.contains("blk.0.ffn_gate.weight") && e.contains("[64, 128]"),
        "{e}"
    );
}

/// Loaded tiny model of `arch`.
struct TinyFile {
    tiny: Tiny,
    _dir: tempfile::TempDir,
    file: GgufFile,
}

fn tiny_file(arch: &'static str, head_dim: usize, seed: u64) -> TinyFile {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::new(arch, head_dim, seed);
    let path = dir.path().join(format!("{arch}.gguf"));
    tiny.write(&path, None);
    TinyFile {
        file: GgufFile::open(&path).unwrap(),
        tiny,
        _dir: dir,
    }
}

/// A state captures the queries and keys of the chosen layers before RoPE
/// (after qwen2's biases and qwen3's norms), for the last call's tokens in
/// order: they match the reference's, and the keys are what the cache
/// holds with RoPE undone.
#[test]
fn captures_pre_rope_keys_and_queries() {
    for (arch, head_dim) in [("llama", 16), ("qwen2", 16), ("qwen3", 24)] {
        let t = tiny_file(arch, head_dim, 13);
        let cfg = ModelConfig::from_gguf(t.file.metadata()).unwrap();
        let model = Model::from_gguf(&t.file, &cfg).unwrap();
        let tokens = [3u32, 17, 42, 0, 49, 8, 8, 21];
        let (_, want) = t.tiny.reference_qk(&tokens);
        let opts = StateOptions {
            kv_type: KvType::F32,
            n_batch: 8,
            ..StateOptions::new(16)
        };
        let mut st = model.new_state(&opts).unwrap();
        st.capture(&[1, 0]).unwrap();
        assert_eq!(st.captured_layers(), &[1, 0]);
        let pool = ThreadPool::new(2);
        st.forward_seq(&pool, &tokens[..5], 0, Logits::Last);
        st.forward_seq(&pool, &tokens[5..], 5, Logits::Last);
        let flat =
            |rows: &[Vec<f64>]| -> Vec<f32> { rows.iter().flatten().map(|&v| v as f32).collect() };
        for (i, layer) in [1, 0].into_iter().enumerate() {
            let (k, q) = (st.captured_keys(i), st.captured_queries(i));
            assert_eq!((k.len(), q.len()), (3 * cfg.kv_dim(), 3 * cfg.q_dim()));
            let e = common::rel_err(k, &flat(&want[layer].1[5..]));
            assert!(e < 1e-5, "{arch} layer {layer} keys vs reference: {e}");
            let e = common::rel_err(q, &flat(&want[layer].0[5..]));
            assert!(e < 1e-5, "{arch} layer {layer} queries vs reference: {e}");
            let cached = common::unroped_keys(&cfg, common::cache(&st, 0), layer, 5..8);
            let e = common::rel_err(k, &cached);
            assert!(e < 1e-6, "{arch} layer {layer} keys vs the cache: {e}");
        }
        // An empty list stops capturing.
        st.capture(&[]).unwrap();
        st.forward_seq(&pool, &tokens[..1], 0, Logits::Last);
        assert!(st.captured_layers().is_empty());
    }
}

/// Stopping after a layer captures the same keys and queries as the full
/// pass, returns no logits, and leaves later layers' caches unwritten.
#[test]
fn stopping_after_a_layer_captures_the_same_keys() {
    let t = tiny_file("qwen3", 32, 17);
    let cfg = ModelConfig::from_gguf(t.file.metadata()).unwrap();
    let model = Model::from_gguf(&t.file, &cfg).unwrap();
    let tokens = [3u32, 17, 42, 0, 49, 8, 8, 21, 5, 1, 30];
    let pool = ThreadPool::new(2);
    let opts = StateOptions {
        n_batch: 4,
        ..StateOptions::new(16)
    };
    let run = |last: Option<usize>| {
        let mut st = model.new_state(&opts).unwrap();
        st.capture(&[0, 1]).unwrap();
        st.set_last_layer(last).unwrap();
        let mut keys = vec![Vec::new(); 2];
        let mut queries = vec![Vec::new(); 2];
        for (c, chunk) in tokens.chunks(4).enumerate() {
            let logits = st.forward_seq(&pool, chunk, 4 * c, Logits::Last);
            assert_eq!(logits.is_empty(), last.is_some());
            for i in 0..2 {
                keys[i].extend(common::bits(st.captured_keys(i)));
                queries[i].extend(common::bits(st.captured_queries(i)));
            }
        }
        let mut cached = vec![0.0; cfg.head_dim];
        let mut layer_bits = |layer: usize| -> Vec<u32> {
            let mut all = Vec::new();
            for p in 0..tokens.len() {
                for h in 0..cfg.n_kv_heads {
                    common::cache(&st, 0).layer(layer).key(p, h, &mut cached);
                    all.extend(common::bits(&cached));
                }
            }
            all
        };
        let caches = [layer_bits(0), layer_bits(1)];
        (keys, queries, caches)
    };
    let (keys, queries, caches) = run(None);
    let (early_keys, early_queries, early_caches) = run(Some(0));
    assert_eq!(early_keys[0], keys[0]);
    assert_eq!(early_queries[0], queries[0]);
    assert!(early_keys[1].is_empty() && early_queries[1].is_empty());
    assert_eq!(early_caches[0], caches[0]);
    assert!(early_caches[1].iter().all(|&b| b == 0), "layer 1 written");
    assert!(caches[1].iter().any(|&b| b != 0));

    let mut st = model.new_state(&opts).unwrap();
    let e = st.set_last_layer(Some(2)).unwrap_err().to_string();
    assert!(e.contains("layer 2") && e.contains("2 layers"), "{e}");
    let e = st.capture(&[0, 2]).unwrap_err().to_string();
    assert!(e.contains("layer 2"), "{e}");
    let e = st.capture(&[1, 1]).unwrap_err().to_string();
    assert!(e.contains("layer 1") && e.contains("twice"), "{e}");
    // Back to full calls: logits again.
    st.set_last_layer(Some(1)).unwrap();
    assert!(st
        .forward_seq(&pool, &tokens[..2], 0, Logits::Last)
        .is_empty());
    st.set_last_layer(None).unwrap();
    let v = cfg.vocab_size;
    assert_eq!(
        st.forward_seq(&pool, &tokens[..2], 0, Logits::Last).len(),
        v
    );
}

/// Embeddings mode keeps each row's normed hidden state and skips the
/// vocabulary matmul: the output matrix applied to those states gives the
/// logits a normal call gives, bit for bit.
#[test]
fn embeddings_are_the_states_the_head_projects() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::new("llama", 16, 11);
    let path = dir.path().join("llama.gguf");
    tiny.write(&path, None);
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    let model = Model::from_gguf(&file, &cfg).unwrap();
    let Weights::Llama(w) = model.weights() else {
        panic!("binds as a llama model");
    };
    let pool = ThreadPool::new(1);
    let tokens = [3u32, 17, 42, 0, 49];
    let opts = StateOptions {
        all_logits: true,
        ..StateOptions::new(16)
    };
    let mut state = model.new_state(&opts).unwrap();
    let logits = state.forward_seq(&pool, &tokens, 0, Logits::All).to_vec();
    // Every token's state, without the logit rows all_logits keeps.
    let mut state = model.new_state(&StateOptions::new(16)).unwrap();
    state.set_embeddings(true).unwrap();
    assert!(state.forward_seq(&pool, &tokens, 0, Logits::All).is_empty());
    let embd = state.embeddings().to_vec();
    assert_eq!(embd.len(), tokens.len() * cfg.dim);
    let mut again = vec![0.0; tokens.len() * cfg.vocab_size];
    let mut scratch = kernels::matmul::MatmulScratch::new();
    kernels::matmul::matmul(&pool, &w.output, &embd, &mut again, &mut scratch);
    assert_eq!(again, logits);
    // Off again: logits, no embeddings.
    state.set_embeddings(false).unwrap();
    assert_eq!(
        state
            .forward_seq(&pool, &tokens[..1], 5, Logits::Last)
            .len(),
        cfg.vocab_size
    );
    assert!(state.embeddings().is_empty());
}
