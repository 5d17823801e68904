//! The `cachefit` runtime on tiny random models written to GGUF (F32 and
//! int8 + scale), against a plain f64 forward pass written here straight
//! from docs/CACHEFIT-FORMAT.md and recomputed from scratch for every
//! sequence; plus the properties the server and the CLI rely on: batch
//! and token-by-token give the same bits, so do sequences mixed in one
//! batch, thread counts, and continuing after a truncation.

use gguf::{GgmlType, GgufFile, Value};
use kernels::pool::ThreadPool;
use model::{
    Arch, KvType, Logits, MemoryEstimate, Model, ModelConfig, StateOptions, Token, Weights,
};
use std::collections::BTreeMap;
use testkit::cachefit::{Spec, Storage, TinyCachefit, BYTE_VOCAB};

mod common;

/// Small, but with grouped heads (4 query heads on 2 KV heads), a head
/// size that is not a power of two and every block kind twice.
fn small() -> Spec {
    Spec {
        pattern: "CACCA".into(),
        vocab: BYTE_VOCAB,
        dim: 48,
        ffn: 80,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 6,
        conv_kernel: 3,
        context: 64,
        softcap: 15.0,
        eps: 1e-6,
        rope_base: 10000.0,
    }
}

// --- the reference -----------------------------------------------------------

fn rmsnorm(x: &[f64], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, &w)| v * r * w as f64).collect()
}

/// `W x` for a `(rows, cols)` row-major matrix.
fn mv(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(&a, b)| a as f64 * b).sum())
        .collect()
}

/// One int8 rounding: `s = max|x|/127`, `s·round(x/s)` (halves away
/// from zero).
fn round_int8(x: &[f64]) -> Vec<f64> {
    let s = x.iter().fold(0.0f64, |m, v| m.max(v.abs())) / 127.0;
    if s == 0.0 {
        return vec![0.0; x.len()];
    }
    x.iter()
        .map(|v| (v / s).round().clamp(-127.0, 127.0) * s)
        .collect()
}

/// `x` as the runtime feeds it to an int8 matrix: rounded to int8, plus
/// what that leaves over rounded to int8 again (`Activation`).
fn int8_activation(x: &[f64]) -> Vec<f64> {
    let hi = round_int8(x);
    let rest: Vec<f64> = x.iter().zip(&hi).map(|(a, b)| a - b).collect();
    hi.iter()
        .zip(round_int8(&rest))
        .map(|(a, b)| a + b)
        .collect()
}

fn silu(z: f64) -> f64 {
    z / (1.0 + (-z).exp())
}

/// Logits after every token of `tokens` (positions 0..), `(n, vocab)`.
fn reference(m: &TinyCachefit, tokens: &[u32]) -> Vec<Vec<f64>> {
    reference_with(m, tokens, false)
}

/// [`reference`], with every matrix input rounded like the int8 runtime's
/// activations when `int8` is set.
fn reference_with(m: &TinyCachefit, tokens: &[u32], int8: bool) -> Vec<Vec<f64>> {
    reference_qk(m, tokens, int8).0
}

/// Rows of queries and rows of keys, by position.
type QkRows = (Vec<Vec<f64>>, Vec<Vec<f64>>);

/// [`reference_with`], and each attention block's queries and keys before
/// RoPE by position, by block index.
fn reference_qk(
    m: &TinyCachefit,
    tokens: &[u32],
    int8: bool,
) -> (Vec<Vec<f64>>, BTreeMap<usize, QkRows>) {
    let mut qk: BTreeMap<usize, QkRows> = BTreeMap::new();
    let mv = |w: &[f32], x: &[f64]| {
        if int8 {
            mv(w, &int8_activation(x))
        } else {
            mv(w, x)
        }
    };
    let s = &m.spec;
    let (d, hd, k) = (s.dim, s.head_dim, s.conv_kernel);
    let emb = m.get("token_embd");
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            emb[t as usize * d..(t as usize + 1) * d]
                .iter()
                .map(|&v| v as f64)
                .collect()
        })
        .collect();
    let n = tokens.len();
    for (i, kind) in s.pattern.chars().enumerate() {
        let w = |x: &str| m.get(&format!("blk.{i}.{x}"));
        let hs: Vec<Vec<f64>> = xs
            .iter()
            .map(|x| rmsnorm(x, w("attn_norm.weight"), s.eps))
            .collect();
        for t in 0..n {
            let mixed = if kind == 'C' {
                let g = mv(w("conv_gate"), &hs[t]);
                let taps = w("conv_taps.weight"); // (d, K)
                let c: Vec<f64> = (0..d)
                    .map(|j| {
                        (0..k)
                            .map(|kk| {
                                let p = t as i64 - (k as i64 - 1) + kk as i64;
                                if p < 0 {
                                    0.0
                                } else {
                                    taps[j * k + kk] as f64 * hs[p as usize][j]
                                }
                            })
                            .sum()
                    })
                    .collect();
                let u: Vec<f64> = g.iter().zip(&c).map(|(&g, &c)| silu(g) * c).collect();
                mv(w("conv_out"), &u)
            } else {
                let qkv_w = w("attn_qkv");
                let rope = |v: &mut [f64], pos: usize| {
                    for h in v.chunks_exact_mut(hd) {
                        for ii in 0..hd / 2 {
                            let theta = pos as f64
                                * (s.rope_base as f64).powf(-2.0 * ii as f64 / hd as f64);
                            let (a, b) = (h[ii], h[ii + hd / 2]);
                            h[ii] = a * theta.cos() - b * theta.sin();
                            h[ii + hd / 2] = a * theta.sin() + b * theta.cos();
                        }
                    }
                };
                let (qd, kvd) = (s.q_dim(), s.kv_dim());
                let mut ks = Vec::new();
                let mut vs = Vec::new();
                for (p, hp) in hs.iter().enumerate().take(t + 1) {
                    let r = mv(qkv_w, hp);
                    let mut kp = r[qd..qd + kvd].to_vec();
                    rope(&mut kp, p);
                    ks.push(kp);
                    vs.push(r[qd + kvd..].to_vec());
                }
                let mut q = mv(qkv_w, &hs[t])[..qd].to_vec();
                let rows = qk.entry(i).or_default();
                rows.0.push(q.clone());
                rows.1.push(mv(qkv_w, &hs[t])[qd..qd + kvd].to_vec());
                rope(&mut q, t);
                let group = s.n_heads / s.n_kv_heads;
                let mut out = vec![0.0; qd];
                for h in 0..s.n_heads {
                    let kvh = h / group;
                    let qh = &q[h * hd..(h + 1) * hd];
                    let sc: Vec<f64> = (0..=t)
                        .map(|p| {
                            qh.iter()
                                .zip(&ks[p][kvh * hd..(kvh + 1) * hd])
                                .map(|(a, b)| a * b)
                                .sum::<f64>()
                                / (hd as f64).sqrt()
                        })
                        .collect();
                    let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|v| (v - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for ii in 0..hd {
                        out[h * hd + ii] =
                            (0..=t).map(|p| e[p] * vs[p][kvh * hd + ii]).sum::<f64>() / z;
                    }
                }
                mv(w("attn_output"), &out)
            };
            // The block's input for later tokens is `hs`, computed before
            // any residual update, so updating x[t] here is safe.
            for (x, m) in xs[t].iter_mut().zip(mixed) {
                *x += m;
            }
        }
        for x in xs.iter_mut() {
            let h = rmsnorm(x, w("ffn_norm.weight"), s.eps);
            let g = mv(w("ffn_gate"), &h);
            let u = mv(w("ffn_up"), &h);
            let a: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
            for (x, y) in x.iter_mut().zip(mv(w("ffn_down"), &a)) {
                *x += y;
            }
        }
    }
    let logits = xs
        .iter()
        .map(|x| {
            let h = rmsnorm(x, m.get("output_norm.weight"), s.eps);
            mv(emb, &h)
                .into_iter()
                .map(|l| {
                    let cap = s.softcap as f64;
                    if cap > 0.0 {
                        cap * (l / cap).tanh()
                    } else {
                        l
                    }
                })
                .collect()
        })
        .collect();
    (logits, qk)
}

// --- helpers -------------------------------------------------------------------

struct Loaded {
    _dir: tempfile::TempDir,
    file: GgufFile,
}

fn write(m: &TinyCachefit, storage: Storage) -> Loaded {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    m.write(&path, storage);
    Loaded {
        file: GgufFile::open(&path).unwrap(),
        _dir: dir,
    }
}

fn tokens(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 40_503) >> 7) % vocab as u32)
        .collect()
}

fn opts(n_ctx: usize, n_batch: usize, all: bool, n_seq: usize) -> StateOptions {
    StateOptions {
        n_ctx,
        n_batch,
        all_logits: all,
        n_seq,
        ..StateOptions::new(n_ctx)
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// All logits of `toks` from position 0 in one batch, `(n, vocab)`.
fn batched(model: &Model<'_>, pool: &ThreadPool, toks: &[u32], kv: KvType) -> Vec<f32> {
    let o = StateOptions {
        kv_type: kv,
        ..opts(64, toks.len(), true, 1)
    };
    let mut s = model.new_state(&o).unwrap();
    s.forward_seq(pool, toks, 0, Logits::All).to_vec()
}

fn max_err(got: &[f32], want: &[Vec<f64>]) -> (f64, f64) {
    let want: Vec<f64> = want.iter().flatten().copied().collect();
    assert_eq!(got.len(), want.len());
    let err = got
        .iter()
        .zip(&want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max);
    let lo = want.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = want.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (err, hi - lo)
}

// --- tests ---------------------------------------------------------------------

#[test]
fn config_reads_the_cachefit_keys() {
    let m = TinyCachefit::random(small(), 1);
    let l = write(&m, Storage::I8);
    let cfg = ModelConfig::from_gguf(l.file.metadata()).unwrap();
    assert_eq!(cfg.arch, Arch::Cachefit);
    assert_eq!((cfg.n_layers, cfg.dim, cfg.ffn_dim), (5, 48, 80));
    assert_eq!((cfg.n_heads, cfg.n_kv_heads, cfg.head_dim), (4, 2, 6));
    assert_eq!((cfg.vocab_size, cfg.context_length), (BYTE_VOCAB, 64));
    assert_eq!(cfg.rope.n_rot, 6);
    let cf = cfg.cachefit.as_ref().unwrap();
    assert_eq!(
        (cf.pattern().as_str(), cf.conv_kernel, cf.softcap),
        ("CACCA", 3, 15.0)
    );
    let model = Model::from_gguf(&l.file, &cfg).unwrap();
    assert!(matches!(model.weights(), Weights::Cachefit(_)));
    // Every matrix once plus the scales: the whole file but the norms and
    // taps (a little more where the AVX-512 kernel's packed copy pads rows
    // to blocks of 16 and columns to groups of 4).
    let norms_and_taps: u64 = l
        .file
        .tensors()
        .iter()
        .filter(|t| t.name.ends_with("norm.weight") || t.name.contains("conv_taps"))
        .map(|t| t.n_bytes)
        .sum();
    let all: u64 = l.file.tensors().iter().map(|t| t.n_bytes).sum();
    let read = model.bytes_per_token() as u64;
    let matrices = all - norms_and_taps;
    assert!(
        read >= matrices && read <= matrices * 11 / 10,
        "{read} vs {matrices}"
    );
}

#[test]
fn f32_file_matches_reference() {
    let m = TinyCachefit::random(small(), 2);
    let l = write(&m, Storage::F32);
    let cfg = ModelConfig::from_gguf(l.file.metadata()).unwrap();
    let model = Model::from_gguf(&l.file, &cfg).unwrap();
    let toks = tokens(20, 1, BYTE_VOCAB);
    let want = reference(&m, &toks);
    for kv in [KvType::F32, KvType::F16] {
        let got = batched(&model, &ThreadPool::new(1), &toks, kv);
        let (err, range) = max_err(&got, &want);
        // f32 arithmetic throughout (f16 keys and values add ~1e-3 relative).
        let tol = if kv == KvType::F32 { 2e-5 } else { 2e-3 };
        assert!(
            err <= tol * range,
            "{kv}: max error {err} over a range of {range}"
        );
    }
}

#[test]
fn i8_file_matches_reference_on_dequantized_weights() {
    let m = TinyCachefit::random(small(), 3);
    let l = write(&m, Storage::I8);
    let cfg = ModelConfig::from_gguf(l.file.metadata()).unwrap();
    let model = Model::from_gguf(&l.file, &cfg).unwrap();
    let toks = tokens(20, 2, BYTE_VOCAB);
    let got = batched(&model, &ThreadPool::new(1), &toks, KvType::F32);
    let dq = m.dequantized();
    // Against plain arithmetic on the stored weights: the two int8
    // roundings of every matrix input leave up to ~amax/64516 per element,
    // which 5 blocks of random, untrained weights amplify (measured
    // 7.6e-4 of the range).
    let (err, range) = max_err(&got, &reference(&dq, &toks));
    assert!(
        err <= 2e-3 * range,
        "max error {err} over a range of {range}"
    );
    // Closer once the reference rounds the activations the same way
    // (measured 1.3e-4): what is left is the second rounding of f32
    // against f64 inputs, whose steps are fine enough that ~1e-7 relative
    // differences move some across a half.
    let (err, range) = max_err(&got, &reference_with(&dq, &toks, true));
    assert!(
        err <= 4e-4 * range,
        "max error {err} over a range of {range}"
    );
}

#[test]
fn token_by_token_equals_batches_bit_for_bit() {
    for storage in [Storage::I8, Storage::F32] {
        let m = TinyCachefit::random(small(), 4);
        let l = write(&m, storage);
        let cfg = ModelConfig::from_gguf(l.file.metadata()).unwrap();
        let model = Model::from_gguf(&l.file, &cfg).unwrap();
        let pool = ThreadPool::new(1);
        let toks = tokens(23, 3, BYTE_VOCAB);
        let all = batched(&model, &pool, &toks, KvType::F16);
        let v = cfg.vocab_size;
        // One at a time.
        let mut s = model.new_state(&StateOptions::new(64)).unwrap();
        for (p, &t) in toks.iter().enumerate() {
            let got = s.forward_seq(&pool, &[t], p, Logits::Last);
            assert_eq!(
                bits(got),
                bits(&all[p * v..(p + 1) * v]),
                "{storage:?} pos {p}"
            );
        }
        // In uneven batches, last logits only.
        let mut s = model.new_state(&opts(64, 7, false, 1)).unwrap();
        let mut p = 0;
        for chunk in toks.chunks(7) {
            let got = s.forward_seq(&pool, chunk, p, Logits::Last);
            p += chunk.len();
            assert_eq!(
                bits(got),
                bits(&all[(p - 1) * v..p * v]),
                "{storage:?} batch to {p}"
            );
        }
    }
}

#[test]
fn sequences_in_one_batch_equal_each_alone() {
    let m = TinyCachefit::random(small(), 5);
    let l = write(&m, Storage::I8);
    let cfg = ModelConfig::from_gguf(l.file.metadata()).unwrap();
    let model = Model::from_gguf(&l.file, &cfg).unwrap();
    let pool = ThreadPool::new(1);
    let v = cfg.vocab_size;
    let a = tokens(12, 5, BYTE_VOCAB);
    let b = tokens(9, 6, BYTE_VOCAB);
    let alone: Vec<Vec<f32>> = [&a, &b]
        .iter()
        .map(|t| batched(&model, &pool, t, KvType::F16))
        .collect();
    // Sequence 1 gets 2 prompt tokens in the first batch, then both
    // decode one token per batch, interleaved (as server slots are). With
    // two or more threads the two sequences run on different threads.
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        let mut s = model.new_state(&opts(64, 16, false, 2)).unwrap();
        let mut batch: Vec<Token> = (0..5)
            .map(|p| Token {
                id: a[p],
                seq: 0,
                pos: p,
                logits: p == 4,
            })
            .collect();
        batch.extend((0..2).map(|p| Token {
            id: b[p],
            seq: 1,
            pos: p,
            logits: p == 1,
        }));
        let got = s.forward(&pool, &batch).to_vec();
        assert_eq!(bits(&got[..v]), bits(&alone[0][4 * v..5 * v]));
        assert_eq!(bits(&got[v..]), bits(&alone[1][v..2 * v]));
        for step in 0..7 {
            let (pa, pb) = (5 + step, 2 + step);
            let batch = [
                Token {
                    id: b[pb],
                    seq: 1,
                    pos: pb,
                    logits: true,
                },
                Token {
                    id: a[pa],
                    seq: 0,
                    pos: pa,
                    logits: true,
                },
            ];
            let got = s.forward(&pool, &batch).to_vec();
            assert_eq!(
                bits(&got[..v]),
                bits(&alone[1][pb * v..(pb + 1) * v]),
                "b at {pb}, {threads} threads"
            );
            assert_eq!(
                bits(&got[v..]),
                bits(&alone[0][pa * v..(pa + 1) * v]),
                "a at {pa}, {threads} threads"
            );
        }
    }
}

#[test]
fn thread_counts_give_identical_logits() {
    // The shipped shape with a vocabulary large enough that the output head
    // is split over the threads.
    let spec = Spec {
        vocab: 2048,
        ..Spec::reference_shape()
    };
    let m = TinyCachefit::random(spec, 6);
    for storage in [Storage::I8, Storage::F32] {
        let l = write(&m, storage);
        let cfg = ModelConfig::from_gguf(l.file.metadata()).unwrap();
        let model = Model::from_gguf(&l.file, &cfg).unwrap();
        let toks = tokens(9, 7, 2048);
        let runs: Vec<Vec<f32>> = (1..=3)
            .map(|t| {
                let pool = ThreadPool::new(t);
                let mut s = model.new_state(&StateOptions::new(32)).unwrap();
                let mut out = batched(&model, &pool, &toks[..6], KvType::F16);
                s.forward_seq(&pool, &toks[..6], 0, Logits::Last);
                for (p, &t) in toks.iter().enumerate().skip(6) {
                    out.extend_from_slice(s.forward_seq(&pool, &[t], p, Logits::Last));
                }
                out
            })
            .collect();
        assert_eq!(bits(&runs[0]), bits(&runs[1]), "{storage:?} 1 vs 2 threads");
        assert_eq!(bits(&runs[0]), bits(&runs[2]), "{storage:?} 1 vs 3 threads");
    }
}

#[test]
fn continuing_after_truncation_is_exact() {
    let m = TinyCachefit::random(small(), 8);
    let l = write(&m, Storage::I8);
    let cfg = ModelConfig::from_gguf(l.file.metadata()).unwrap();
    let model = Model::from_gguf(&l.file, &cfg).unwrap();
    let pool = ThreadPool::new(1);
    let prompt = tokens(10, 9, BYTE_VOCAB);
    let other = tokens(8, 10, BYTE_VOCAB);
    let more = tokens(6, 11, BYTE_VOCAB);
    let mut want_toks = prompt.clone();
    want_toks.extend(&more);
    let want = batched(&model, &pool, &want_toks, KvType::F16);
    let v = cfg.vocab_size;

    let mut s = model.new_state(&opts(64, 16, true, 1)).unwrap();
    s.forward_seq(&pool, &prompt, 0, Logits::Last);
    // A diverging continuation fills positions 10..18 (and conv inputs).
    s.forward_seq(&pool, &other, 10, Logits::Last);
    // Truncate to the common prefix of 7 and continue from there.
    let mut rest = prompt[7..].to_vec();
    rest.extend(&more);
    let got = s.forward_seq(&pool, &rest, 7, Logits::All);
    assert_eq!(bits(got), bits(&want[7 * v..]));

    // A new sequence from position 0 in a used state is a fresh start (the
    // convolution reads nothing before position 0).
    let fresh = tokens(5, 12, BYTE_VOCAB);
    let got = s.forward_seq(&pool, &fresh, 0, Logits::All).to_vec();
    assert_eq!(
        bits(&got),
        bits(&batched(&model, &pool, &fresh, KvType::F16))
    );
}

#[test]
fn cache_types_and_memory_estimate() {
    let m = TinyCachefit::random(small(), 9);
    let l = write(&m, Storage::I8);
    let cfg = ModelConfig::from_gguf(l.file.metadata()).unwrap();
    let model = Model::from_gguf(&l.file, &cfg).unwrap();
    for (kv, n_seq) in [(KvType::F16, 1), (KvType::F32, 3)] {
        let o = StateOptions {
            kv_type: kv,
            ..opts(40, 8, false, n_seq)
        };
        let s = model.new_state(&o).unwrap();
        assert_eq!(
            (s.n_ctx(), s.n_batch(), s.n_seq(), s.kv_type()),
            (40, 8, n_seq, kv)
        );
        let est = MemoryEstimate::for_state(&cfg, 0, &o);
        assert_eq!(est.kv_cache, s.kv_bytes() as u64, "{kv}");
        // 2 attention blocks' K and V (40 positions held as 48, whole
        // blocks of 16 keys), 3 conv blocks' inputs, per sequence.
        let elem = if kv == KvType::F32 { 4 } else { 2 };
        let per_seq = 2 * 2 * 12 * 48 * elem + 3 * 40 * 48 * 4;
        assert_eq!(s.kv_bytes(), per_seq * n_seq);
        assert!(est.scratch > 0);
    }
    let o = StateOptions {
        kv_type: KvType::Q8_0,
        ..opts(40, 8, false, 1)
    };
    let e = model.new_state(&o).err().unwrap().to_string();
    assert!(e.contains("q8_0") && e.contains("f16"), "{e}");
}

#[test]
#[should_panic(expected = "outside the context")]
fn positions_past_the_context_panic() {
    let m = TinyCachefit::random(small(), 10);
    let l = write(&m, Storage::I8);
    let cfg = ModelConfig::from_gguf(l.file.metadata()).unwrap();
    let model = Model::from_gguf(&l.file, &cfg).unwrap();
    let mut s = model.new_state(&StateOptions::new(8)).unwrap();
    s.forward_seq(&ThreadPool::new(1), &[1], 8, Logits::Last);
}

/// Bind a file edited by `edit` and return the error message.
fn load_error(
    storage: Storage,
    edit: impl FnOnce(&mut gguf::Metadata, &mut Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>),
) -> String {
    let m = TinyCachefit::random(small(), 11);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.gguf");
    m.write_with(&path, storage, edit);
    let file = GgufFile::open(&path).unwrap();
    let cfg = match ModelConfig::from_gguf(file.metadata()) {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    match Model::from_gguf(&file, &cfg) {
        Ok(_) => panic!("the file was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_files_get_clear_errors() {
    let e = load_error(Storage::I8, |_, t| {
        t.retain(|x| x.0 != "blk.3.ffn_up.weight")
    });
    assert!(
        e.contains("blk.3.ffn_up.weight") && e.contains("missing"),
        "{e}"
    );

    let e = load_error(Storage::I8, |_, t| {
        t.retain(|x| x.0 != "blk.0.ffn_gate.scale")
    });
    assert!(
        e.contains("blk.0.ffn_gate.scale") && e.contains("I8"),
        "{e}"
    );

    let e = load_error(Storage::F32, |_, t| {
        let x = t
            .iter_mut()
            .find(|x| x.0 == "blk.1.attn_qkv.weight")
            .unwrap();
        x.2 = vec![48, 23];
        x.3.truncate(48 * 23 * 4);
    });
    assert!(
        e.contains("blk.1.attn_qkv.weight") && e.contains("expected [48, 48]"),
        "{e}"
    );

    let e = load_error(Storage::I8, |_, t| {
        let x = t
            .iter_mut()
            .find(|x| x.0 == "blk.0.conv_taps.weight")
            .unwrap();
        x.2 = vec![48, 3];
    });
    assert!(
        e.contains("blk.0.conv_taps.weight") && e.contains("[3, 48]"),
        "{e}"
    );

    let e = load_error(Storage::I8, |_, t| {
        let x = t
            .iter_mut()
            .find(|x| x.0 == "blk.2.conv_out.weight")
            .unwrap();
        x.3[5] = 0x80; // -128
    });
    assert!(
        e.contains("blk.2.conv_out.weight") && e.contains("-128"),
        "{e}"
    );

    let e = load_error(Storage::I8, |md, _| {
        md.set("cachefit.block_pattern", Value::String("CAXCA".into()));
    });
    assert!(
        e.contains("cachefit.block_pattern") && e.contains("'X'"),
        "{e}"
    );

    let e = load_error(Storage::I8, |md, _| {
        md.set("cachefit.block_count", Value::U32(4));
    });
    assert!(
        e.contains("cachefit.block_count") && e.contains("5 blocks"),
        "{e}"
    );

    let e = load_error(Storage::I8, |md, _| {
        md.set("cachefit.attention.head_count_kv", Value::U32(3));
    });
    assert!(
        e.contains("head_count_kv") && e.contains("does not divide"),
        "{e}"
    );

    let e = load_error(Storage::I8, |md, _| {
        md.remove("cachefit.conv.kernel_length");
    });
    assert!(e.contains("cachefit.conv.kernel_length"), "{e}");

    let e = load_error(Storage::F32, |_, t| {
        t.push((
            "blk.0.ffn_up.scale".into(),
            GgmlType::F32,
            vec![80],
            vec![0; 320],
        ));
    });
    assert!(e.contains("blk.0.ffn_up.scale") && e.contains("F32"), "{e}");

    // Token codes: a width that is not whole 64-bit words, a missing seed,
    // and the tensors a file with codes needs.
    let e = load_error(Storage::I8, |md, _| {
        md.set("cachefit.token_codes.bits", Value::U32(100));
        md.set("cachefit.token_codes.seed", Value::U64(1));
    });
    assert!(
        e.contains("cachefit.token_codes.bits") && e.contains("multiple of 64"),
        "{e}"
    );
    let e = load_error(Storage::I8, |md, _| {
        md.set("cachefit.token_codes.bits", Value::U32(64));
    });
    assert!(e.contains("cachefit.token_codes.seed"), "{e}");
    let e = load_error(Storage::I8, |md, _| {
        md.set("cachefit.token_codes.bits", Value::U32(64));
        md.set("cachefit.token_codes.seed", Value::U64(1));
    });
    assert!(e.contains("output.weight") && e.contains("missing"), "{e}");
}

/// For `cachefit` the captured layers are attention blocks (here 1 and 4
/// of CACCA): their queries and keys before RoPE match the reference's,
/// the keys are what the cache holds with RoPE undone, and rows follow the
/// call's tokens when two sequences run on two threads (lanes). Stopping
/// after a block keeps the earlier blocks' captures and returns no logits.
#[test]
fn captures_attention_blocks_before_rope() {
    let m = TinyCachefit::random(small(), 12);
    let l = write(&m, Storage::F32);
    let cfg = ModelConfig::from_gguf(l.file.metadata()).unwrap();
    let model = Model::from_gguf(&l.file, &cfg).unwrap();
    let (a, b) = (tokens(10, 13, BYTE_VOCAB), tokens(7, 14, BYTE_VOCAB));
    let f32_cache = |n_seq| StateOptions {
        kv_type: KvType::F32,
        ..opts(64, 32, false, n_seq)
    };
    let pool = ThreadPool::new(2);
    let flat =
        |rows: &[Vec<f64>]| -> Vec<f32> { rows.iter().flatten().map(|&v| v as f32).collect() };

    let mut st = model.new_state(&f32_cache(1)).unwrap();
    let e = st.capture(&[1, 2]).unwrap_err().to_string();
    assert!(e.contains("layer 2") && e.contains("convolution"), "{e}");
    let e = st.capture(&[5]).unwrap_err().to_string();
    assert!(e.contains("layer 5") && e.contains("5 layers"), "{e}");
    // Each sequence alone: against the reference and the cache.
    let mut alone = Vec::new();
    for toks in [&a, &b] {
        let mut st = model.new_state(&f32_cache(1)).unwrap();
        st.capture(&[4, 1]).unwrap();
        st.forward_seq(&pool, toks, 0, Logits::Last);
        let (_, want) = reference_qk(&m, toks, false);
        let n = toks.len();
        for (i, (block, attn)) in [(4, 1), (1, 0)].into_iter().enumerate() {
            let (k, q) = (st.captured_keys(i), st.captured_queries(i));
            let e = common::rel_err(k, &flat(&want[&block].1));
            assert!(e < 2e-5, "block {block} keys vs reference: {e}");
            let e = common::rel_err(q, &flat(&want[&block].0));
            assert!(e < 2e-5, "block {block} queries vs reference: {e}");
            let cached = common::unroped_keys(&cfg, common::cache(&st, 0), attn, 0..n);
            let e = common::rel_err(k, &cached);
            assert!(e < 1e-6, "block {block} keys vs the cache: {e}");
        }
        alone.push([0, 1].map(|i| (bits(st.captured_keys(i)), bits(st.captured_queries(i)))));
    }
    // Both sequences in one call, interleaved, on two lanes.
    let mut st = model.new_state(&f32_cache(2)).unwrap();
    st.capture(&[4, 1]).unwrap();
    let mut batch = Vec::new();
    for p in 0..a.len() {
        batch.push(Token {
            id: a[p],
            seq: 0,
            pos: p,
            logits: p + 1 == a.len(),
        });
        if let Some(&id) = b.get(p) {
            batch.push(Token {
                id,
                seq: 1,
                pos: p,
                logits: p + 1 == b.len(),
            });
        }
    }
    st.forward(&pool, &batch);
    let (kv_dim, q_dim) = (cfg.kv_dim(), cfg.q_dim());
    for (i, block) in st.captured_layers().iter().enumerate() {
        let (k, q) = (st.captured_keys(i), st.captured_queries(i));
        assert_eq!(k.len(), batch.len() * kv_dim, "block {block}");
        let mut next = [0, 0]; // each sequence's next row alone
        for (r, t) in batch.iter().enumerate() {
            let (ka, qa) = &alone[t.seq][i];
            let j = next[t.seq];
            next[t.seq] += 1;
            assert_eq!(bits(&k[r * kv_dim..][..kv_dim]), ka[j * kv_dim..][..kv_dim]);
            assert_eq!(bits(&q[r * q_dim..][..q_dim]), qa[j * q_dim..][..q_dim]);
        }
    }
    // Stopping after block 2 (a convolution): block 1's captures as in the
    // full pass, none of block 4's, no logits.
    let mut st = model.new_state(&f32_cache(1)).unwrap();
    st.capture(&[4, 1]).unwrap();
    st.set_last_layer(Some(2)).unwrap();
    assert!(st.forward_seq(&pool, &a, 0, Logits::Last).is_empty());
    assert!(st.captured_keys(0).is_empty() && st.captured_queries(0).is_empty());
    assert_eq!(bits(st.captured_keys(1)), alone[0][1].0);
    assert_eq!(bits(st.captured_queries(1)), alone[0][1].1);
}

/// `State::copy_seq`: a sequence given another's prefix (over stale
/// positions of its own) continues with the same bits as the original.
#[test]
fn a_copied_sequence_continues_exactly() {
    let m = TinyCachefit::random(small(), 12);
    let l = write(&m, Storage::I8);
    let cfg = ModelConfig::from_gguf(l.file.metadata()).unwrap();
    let model = Model::from_gguf(&l.file, &cfg).unwrap();
    let pool = ThreadPool::new(1);
    let (prompt, stale, more) = (
        tokens(12, 3, BYTE_VOCAB),
        tokens(20, 5, BYTE_VOCAB),
        tokens(5, 4, BYTE_VOCAB),
    );
    let mut s = model.new_state(&opts(64, 32, false, 2)).unwrap();
    let run = |s: &mut model::State<'_>, seq: usize, ids: &[u32], pos0: usize| {
        let toks: Vec<Token> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| Token {
                id,
                seq,
                pos: pos0 + i,
                logits: i + 1 == ids.len(),
            })
            .collect();
        s.forward(&pool, &toks);
    };
    run(&mut s, 0, &prompt, 0);
    run(&mut s, 1, &stale, 0);
    s.copy_seq(0, 1, 0..prompt.len());
    for (i, &id) in more.iter().enumerate() {
        let pos = prompt.len() + i;
        let both: Vec<Token> = (0..2)
            .map(|seq| Token {
                id,
                seq,
                pos,
                logits: true,
            })
            .collect();
        let out = s.forward(&pool, &both);
        let v = cfg.vocab_size;
        assert_eq!(bits(&out[..v]), bits(&out[v..]), "token {i}");
    }
}
