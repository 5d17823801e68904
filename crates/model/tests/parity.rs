//! Logits parity with llama.cpp on the fixtures in `tests/fixtures/`
//! (`llamacpp-*.json`, produced by `scripts/llamacpp/`): 64 tokens per
//! prompt, llama.cpp's top 20 logits at each position and its 32-token
//! greedy continuation.
//!
//! Two kinds of check. On the Q4_1 weights dequantized to F32 neither side
//! quantizes activations, so only summation order differs: the issue's
//! bounds hold with room to spare (measured: top-10 logits within 0.002% of
//! the range, greedy-32 identical for 10/10 prompts). On the quantized files
//! both sides round activations to Q8 before each matmul, and one rounding
//! that flips early moves late logits by up to ~1 (llama.cpp's own one-batch
//! and one-token logits differ that much), so the worst case and greedy
//! agreement there are bounded by the reference's noise (measured, f32
//! cache: Q4_1 argmax 640/640, top-10 diff mean 0.47%, p99 2.0%, worst 3.2%
//! of the range, greedy-32 identical 3/10; Q8_0 637/640, 0.39%, 1.5%, 2.2%,
//! 4/10; every greedy parting at a llama.cpp top-2 gap below 0.3).

use gguf::GgufFile;
use kernels::pool::ThreadPool;
use model::{KvType, Logits, Model, ModelConfig, StateOptions};
use serde_json::Value;
use std::path::PathBuf;

/// llama.cpp top-2 gap below which either argmax is accepted.
const NEAR_TIE: f32 = 0.25;

/// Bounds on |ours − llama.cpp| / (max − min of our logits over the whole
/// vocabulary), over llama.cpp's top 10 at each position, and on the greedy
/// continuations.
struct Bounds {
    mean: f64,
    p99: f32,
    worst: f32,
    /// Greedy may part from llama.cpp only where its top-2 gap is below this.
    greedy_tie: f64,
    /// ... and must be identical for at least this fraction of prompts.
    greedy_identical: f64,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// Compares one fixture with our forward pass using a `kv` cache.
fn check(fixture: &str, model_name: &str, kv: KvType, bounds: Bounds) {
    let fx = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(fixture);
    let Ok(text) = std::fs::read_to_string(&fx) else {
        panic!("missing fixture {}", fx.display());
    };
    let fx: Value = serde_json::from_str(&text).unwrap();
    let path = match model_name {
        Q8_0_NAME => make_q8_0(fx["model_sha256"].as_str().unwrap()),
        F32_NAME => make_dequant_f32(),
        GEMMA3_F32_NAME => make_gemma3_f32(),
        // The tiny random models are committed next to their fixtures.
        _ if model_name.starts_with("arch/") => Some(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(model_name),
        ),
        _ => testkit::model(model_name),
    };
    let Some(path) = path else { return };
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    let model = Model::from_gguf(&file, &cfg).unwrap();
    let pool = ThreadPool::new(2);
    let vocab = cfg.vocab_size;
    let (mut positions, mut agree, mut worst, mut worst_abs) = (0usize, 0usize, 0f32, 0f32);
    let mut rels: Vec<f32> = Vec::new();
    let mut greedy_identical = 0;
    let prompts = fx["prompts"].as_array().unwrap();
    let tiny = model_name.starts_with("arch/");
    assert!(
        prompts.len() >= if tiny { 3 } else { 8 },
        "the issue asks for at least 8 prompts (3 for a tiny random model)"
    );
    // The context llama.cpp ran with: Phi-3 picks its RoPE factors by it.
    let n_ctx = fx["settings"]["n_ctx"].as_u64().map(|n| n as usize);
    let tokenizer = tokenize::Vocab::from_gguf(file.metadata()).unwrap();
    for p in prompts {
        let toks = ids(&p["tokens"]);
        let n_prompt = p["n_prompt"].as_u64().unwrap() as usize;
        // Our tokenizer splits the prompt as llama.cpp's did (the tiny
        // models' prompts are token ids).
        if let Some(text) = p["text"].as_str() {
            let special = p["parse_special"].as_bool().unwrap();
            assert_eq!(
                tokenizer.encode(text, true, special),
                toks[..n_prompt],
                "tokens of {text:?}"
            );
        }
        let top20 = p["top20"].as_array().unwrap();
        // All 64 positions as one batch, as llama.cpp made them.
        let mut state = model
            .new_state(&StateOptions {
                n_batch: toks.len(),
                kv_type: kv,
                all_logits: true,
                ..StateOptions::new(n_ctx.unwrap_or(toks.len()))
            })
            .unwrap();
        let all = state.forward_seq(&pool, &toks, 0, Logits::All);
        for (pos, logits) in all.chunks_exact(vocab).enumerate() {
            let refs: Vec<(usize, f32)> = top20[pos]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e[0].as_u64().unwrap() as usize,
                        e[1].as_f64().unwrap() as f32,
                    )
                })
                .collect();
            let max = logits.iter().copied().fold(f32::MIN, f32::max);
            let min = logits.iter().copied().fold(f32::MAX, f32::min);
            let range = max - min;
            let ours = kernels::ops::argmax(logits).unwrap();
            positions += 1;
            // Near-ties (llama.cpp's top two within NEAR_TIE) may flip
            // either way with noise of that size: they count as agreeing.
            if ours == refs[0].0 || refs[0].1 - refs[1].1 < NEAR_TIE {
                agree += 1;
            }
            for &(id, l) in &refs[..10] {
                let rel = (logits[id] - l).abs() / range;
                worst = worst.max(rel);
                worst_abs = worst_abs.max((logits[id] - l).abs());
                rels.push(rel);
                assert!(
                    rel <= bounds.worst,
                    "{kv}: {fixture} {:?} pos {pos} token {id}: ours {} vs llama.cpp {l} (range {range})",
                    p.get("text").unwrap_or(&p["prompt_ids"]),
                    logits[id]
                );
            }
        }

        // Greedy continuation of 32 tokens: the prompt as a batch, then one
        // token at a time (as llama.cpp made it).
        let want = ids(&p["greedy32"]);
        let gaps: Vec<f64> = p["greedy_top2_gap"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_f64().unwrap())
            .collect();
        let mut state = model
            .new_state(&StateOptions {
                n_batch: n_prompt,
                kv_type: kv,
                ..StateOptions::new(n_ctx.unwrap_or(n_prompt + want.len()))
            })
            .unwrap();
        let logits = state.forward_seq(&pool, &toks[..n_prompt], 0, Logits::Last);
        let mut next = kernels::ops::argmax(logits).unwrap() as u32;
        let mut got = Vec::new();
        for i in 0..want.len() {
            got.push(next);
            next =
                kernels::ops::argmax(state.forward_seq(&pool, &[next], n_prompt + i, Logits::Last))
                    .unwrap() as u32;
        }
        match got.iter().zip(&want).position(|(a, b)| a != b) {
            None => greedy_identical += 1,
            Some(i) => {
                eprintln!(
                    "{kv}: {fixture} {:?}: greedy parts from llama.cpp at token {i} (llama.cpp's top-2 gap there {})",
                    p.get("text").unwrap_or(&p["prompt_ids"]), gaps[i]
                );
                assert!(
                    gaps[i] < bounds.greedy_tie,
                    "{kv}: {fixture} {:?}: greedy token {i} is {} where llama.cpp has {}, and that was no near-tie (gap {})",
                    p.get("text").unwrap_or(&p["prompt_ids"]),
                    got[i],
                    want[i],
                    gaps[i]
                );
            }
        }
    }
    let rate = agree as f64 / positions as f64;
    let mean = rels.iter().map(|&r| r as f64).sum::<f64>() / rels.len() as f64;
    rels.sort_by(f32::total_cmp);
    let p99 = rels[rels.len() * 99 / 100];
    eprintln!(
        "{fixture} ({kv} cache): argmax agreement {agree}/{positions}, top-10 logit diff of range: mean {:.3}% p99 {:.3}% worst {:.3}% (largest |diff| {worst_abs:.4}); greedy-32 identical {greedy_identical}/{}",
        mean * 100.0,
        p99 * 100.0,
        worst * 100.0,
        prompts.len()
    );
    assert!(rate >= 0.99, "argmax agreement {rate}");
    assert!(mean <= bounds.mean, "mean top-10 diff {mean}");
    assert!(p99 <= bounds.p99, "p99 top-10 diff {p99}");
    assert!(
        greedy_identical as f64 >= bounds.greedy_identical * prompts.len() as f64,
        "greedy-32 identical for {greedy_identical} of {} prompts",
        prompts.len()
    );
}

/// The bounds, on the clean reference: the Q4_1 weights dequantized
/// to F32, so neither side quantizes activations and only summation order
/// differs; f32 KV cache as in the reference.
const STRICT: Bounds = Bounds {
    mean: 0.001,
    p99: 0.02,
    worst: 0.02,
    greedy_tie: 0.1,
    greedy_identical: 7.0 / 8.0,
};

/// Files whose matmuls quantize activations to Q8 (as ggml does): one
/// flipped rounding early on moves later logits by up to ~1 (llama.cpp's own
/// one-batch vs one-token logits differ by up to 1.5 on these prompts, see
/// the fixtures' README), so the worst case and greedy agreement are bounded
/// by the reference's noise, not by our error.
const QUANTIZED: Bounds = Bounds {
    mean: 0.01,
    p99: 0.02,
    worst: 0.05,
    greedy_tie: 0.5,
    // Measured: 3/10 (Q4_1), 4/10 (Q8_0); every parting at a gap < 0.3.
    greedy_identical: 0.2,
};

#[test]
fn smollm2_dequant_f32_matches_llama_cpp() {
    check(
        "llamacpp-smollm2-q4_1-dequant-f32.json",
        F32_NAME,
        KvType::F32,
        STRICT,
    );
}

#[test]
fn smollm2_q4_1_matches_llama_cpp() {
    check(
        "llamacpp-smollm2-q4_1.json",
        testkit::SMOLLM2_Q4_1,
        KvType::F32,
        QUANTIZED,
    );
}

/// Our default f16 cache adds the rounding of K and V.
#[test]
fn smollm2_q4_1_f16_cache_close_to_llama_cpp() {
    check(
        "llamacpp-smollm2-q4_1.json",
        testkit::SMOLLM2_Q4_1,
        KvType::F16,
        QUANTIZED,
    );
}

/// The Q8_0 cache rounds K and V to 8 bits.
#[test]
fn smollm2_q4_1_q8_0_cache_close_to_llama_cpp() {
    check(
        "llamacpp-smollm2-q4_1.json",
        testkit::SMOLLM2_Q4_1,
        KvType::Q8_0,
        Bounds {
            mean: 0.015,
            p99: 0.03,
            worst: 0.1,
            ..QUANTIZED
        },
    );
}

#[test]
fn smollm2_q8_0_matches_llama_cpp() {
    check(
        "llamacpp-smollm2-q8_0.json",
        Q8_0_NAME,
        KvType::F32,
        QUANTIZED,
    );
}

/// Gemma 3 270M Q4_K_M (gemma3: GeGLU, post-norms, q/k norms, a sliding
/// window of 512 on five layers of six, 262K vocabulary). Gemma's residual
/// stream is large (embeddings × √640, norms after each block), so one
/// flipped Q8 rounding moves late logits further than SmolLM2's: llama.cpp's
/// own one-batch and one-token logits differ by up to 2.5 here (1.3 over
/// the top 20). Bounded by that noise; the math itself is held to the
/// strict bounds on the F32 weights below.
#[test]
fn gemma3_270m_matches_llama_cpp() {
    check(
        "llamacpp-gemma3-270m-q4_k_m.json",
        testkit::GEMMA3_270M,
        KvType::F32,
        // Measured: argmax 636/640, top-10 diff mean 0.54%, p99 2.3%, worst
        // 6.0% of the range; greedy-32 identical 5/10, partings at llama.cpp
        // top-2 gaps up to 0.29 with attention's separate multiplies and
        // adds; with its fused multiply-adds argmax 635/640, mean 0.50%,
        // p99 2.3%, greedy-32 4/10, partings up to a gap of 0.63 (the same logits
        // within a few ulp move Q8 roundings of this large residual
        // stream: llama.cpp's own one-batch and one-token logits differ by
        // up to 2.5, above), so ties are counted up to 0.75 here.
        Bounds {
            p99: 0.03,
            worst: 0.08,
            greedy_tie: 0.75,
            ..QUANTIZED
        },
    );
}

/// Gemma 3 270M's weights dequantized to F32: the clean reference for the
/// gemma3 math (no activation quantization on either side).
#[test]
fn gemma3_270m_dequant_f32_matches_llama_cpp() {
    check(
        "llamacpp-gemma3-270m-dequant-f32.json",
        GEMMA3_F32_NAME,
        KvType::F32,
        STRICT,
    );
}

/// The tiny random-weight models of `fixtures/arch/` (made by
/// scripts/llamacpp/make-arch-fixtures.py, which says what each exercises):
/// every architecture and RoPE scaling without a downloadable model.
/// F32/F16 weights are held to the strict bounds, quantized ones to the
/// quantized bounds (both sides round activations to Q8), the ternary ones
/// to TERNARY.
fn tiny(name: &str, bounds: Bounds) {
    check(
        &format!("arch/{name}.json"),
        &format!("arch/{name}.gguf"),
        KvType::F32,
        bounds,
    );
}

#[test]
fn tiny_llama_rope_llama3_matches_llama_cpp() {
    tiny("llama-rope-llama3", QUANTIZED);
}

#[test]
fn tiny_llama_rope_yarn_matches_llama_cpp() {
    tiny("llama-rope-yarn", STRICT);
}

#[test]
fn tiny_llama_rope_linear_matches_llama_cpp() {
    tiny("llama-rope-linear-swa", STRICT);
}

#[test]
fn tiny_phi3_matches_llama_cpp() {
    tiny("phi3", QUANTIZED);
}

/// At a context of 256 (the original one) Phi-3 takes its short factors.
#[test]
fn tiny_phi3_short_factors_match_llama_cpp() {
    check(
        "arch/phi3-nctx256.json",
        "arch/phi3.gguf",
        KvType::F32,
        QUANTIZED,
    );
}

#[test]
fn tiny_qwen3moe_matches_llama_cpp() {
    tiny("qwen3moe", QUANTIZED);
}

#[test]
fn tiny_mixtral_matches_llama_cpp() {
    tiny("mixtral", QUANTIZED);
}

#[test]
fn tiny_gemma3_matches_llama_cpp() {
    tiny("gemma3", QUANTIZED);
}

#[test]
fn tiny_gemma2_matches_llama_cpp() {
    tiny("gemma2", QUANTIZED);
}

/// The ternary files (llama.cpp's TQ2_0/TQ1_0, issue 24): tighter than
/// QUANTIZED, because on these prompts llama.cpp's own one-batch and
/// one-token logits agree to 5e-6 (no flipped Q8_K rounding) and an
/// independent exact emulation of ggml (make-arch-fixtures.py's float64
/// numpy pass with Q8_K activations) lands at mean 0.09%, p99 0.6%, worst
/// 1.4% of the range: the bounds leave ~2× that. QUANTIZED would miss a
/// wrong block: a 10% error in one block's scale (one row of one matrix)
/// moves the mean to 0.23–0.25% and nothing else past QUANTIZED.
const TERNARY: Bounds = Bounds {
    mean: 0.002,
    p99: 0.01,
    worst: 0.03,
    greedy_tie: 0.5,
    greedy_identical: 2.0 / 3.0,
};

/// llama.cpp's ternary type TQ2_0 for every layer matrix of a llama-arch
/// file (token_embd Q4_K, output Q6_K as llama-quantize picks them); both
/// sides dot it against Q8_K activations. Measured: argmax 192/192, top-10
/// diff mean 0.051%, p99 0.51%, worst 0.92% of the range (0.21 in logits),
/// greedy-32 identical 3/3.
#[test]
fn tiny_llama_tq2_0_matches_llama_cpp() {
    tiny("llama-tq2_0", TERNARY);
}

/// TQ1_0 (five trits a byte in base 3), n_ff 512 so ffn_down rows span two
/// blocks. Measured: argmax 192/192, mean 0.013%, p99 0.38%, worst 0.88%
/// (0.20 in logits), greedy-32 identical 3/3.
#[test]
fn tiny_llama_tq1_0_matches_llama_cpp() {
    tiny("llama-tq1_0", TERNARY);
}

const Q8_0_NAME: &str = "SmolLM2-135M-Instruct.Q8_0.cachefit.gguf";

/// The Q8_0 file the fixture was made from: `cachefit quantize` of the
/// shipped Q4_1 model (deterministic), made here if missing and checked
/// against the SHA-256 the fixture recorded.
fn make_q8_0(want_sha256: &str) -> Option<PathBuf> {
    use sha2::{Digest, Sha256};
    let src = testkit::model(testkit::SMOLLM2_Q4_1)?;
    let out = testkit::models_dir().join(Q8_0_NAME);
    if !out.is_file() {
        let opts = quantize::QuantizeOptions {
            allow_requantize: true,
            pure: false,
            threads: 2,
            interrupt: None,
        };
        let target = "Q8_0".parse::<quantize::Target>().unwrap();
        quantize::quantize_file(&src, &out, target, &opts, &|_| {}).unwrap();
    }
    let got = format!("{:x}", Sha256::digest(std::fs::read(&out).unwrap()));
    assert_eq!(
        got,
        want_sha256,
        "{} is not the file the fixture was made from (quantizer output changed?)",
        out.display()
    );
    Some(out)
}

const F32_NAME: &str = "SmolLM2-135M-Instruct.Q4_1-dequant-F32.cachefit.gguf";

/// The shipped Q4_1 file with every tensor dequantized to F32 by
/// `cachefit quantize` (tensor data identical to llama-quantize's, which the
/// fixture was made from; our dequantizers are checked bit for bit against
/// ggml's in crates/kernels/tests/ggml_reference.rs).
fn make_dequant_f32() -> Option<PathBuf> {
    let src = testkit::model(testkit::SMOLLM2_Q4_1)?;
    let out = testkit::models_dir().join(F32_NAME);
    if !out.is_file() {
        let opts = quantize::QuantizeOptions {
            allow_requantize: true,
            pure: false,
            threads: 2,
            interrupt: None,
        };
        let target = "F32".parse::<quantize::Target>().unwrap();
        quantize::quantize_file(&src, &out, target, &opts, &|_| {}).unwrap();
    }
    Some(out)
}

const GEMMA3_F32_NAME: &str = "gemma-3-270m-Q4_K_M-dequant-F32.cachefit.gguf";

/// Gemma 3 270M Q4_K_M with every tensor dequantized to F32 (1 GB), as
/// [`make_dequant_f32`] for SmolLM2.
fn make_gemma3_f32() -> Option<PathBuf> {
    let src = testkit::model(testkit::GEMMA3_270M)?;
    let out = testkit::models_dir().join(GEMMA3_F32_NAME);
    if !out.is_file() {
        let opts = quantize::QuantizeOptions {
            allow_requantize: true,
            pure: false,
            threads: 2,
            interrupt: None,
        };
        let target = "F32".parse::<quantize::Target>().unwrap();
        quantize::quantize_file(&src, &out, target, &opts, &|_| {}).unwrap();
    }
    Some(out)
}
