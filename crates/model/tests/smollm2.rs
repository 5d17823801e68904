//! The forward pass on the real SmolLM2-135M-Instruct Q4_1.

use gguf::GgufFile;
use kernels::pool::ThreadPool;
use model::{KvType, Logits, Model, ModelConfig, StateOptions, Weights};

mod common;

/// Greedy continuation of `prompt`, `n` tokens, on `threads` threads.
fn greedy(file: &GgufFile, prompt: &str, n: usize, threads: usize) -> (Vec<u32>, String) {
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    let model = Model::from_gguf(file, &cfg).unwrap();
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).unwrap();
    let pool = ThreadPool::new(threads);
    let mut state = model.new_state(&StateOptions::new(64)).unwrap();
    let toks = vocab.encode(prompt, true, true);
    let mut logits = Vec::new();
    for (pos, &t) in toks.iter().enumerate() {
        logits = state.forward_seq(&pool, &[t], pos, Logits::Last).to_vec();
    }
    let mut out = Vec::new();
    for i in 0..n {
        let next = kernels::ops::argmax(&logits).unwrap() as u32;
        out.push(next);
        logits = (state.forward_seq(&pool, &[next], toks.len() + i, Logits::Last)).to_vec();
    }
    let text = vocab.decode(&out);
    (out, text)
}

#[test]
fn config_and_weights_bind() {
    let Some(path) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    assert_eq!((cfg.n_layers, cfg.dim, cfg.n_kv_heads), (30, 576, 3));
    assert_eq!(cfg.vocab_size, 49152);
    let model = Model::from_gguf(&file, &cfg).unwrap();
    let Weights::Llama(w) = model.weights() else {
        panic!("SmolLM2 binds as a llama model");
    };
    assert!(w.tied_output, "SmolLM2 ties output to token_embd");
    assert_eq!(w.layers.len(), 30);
    // Zero-copy: the matrices point into the file's mapping.
    let (_, bytes) = file.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(w.layers[0].wq.data().as_ptr(), bytes.as_ptr());
    // Repacked into row tiles exactly where the selected kernels want them
    // (AVX-512 here), the embedding rows left as stored.
    let tiled = kernels::quant::tiles::wanted();
    for l in &w.layers {
        for m in [&l.wq, &l.wk, &l.wv, &l.wo]
            .into_iter()
            .chain(l.ffn.matrices())
        {
            assert_eq!(m.tiles().is_some(), tiled, "{m:?}");
        }
    }
    assert_eq!(w.output.tiles().is_some(), tiled);
    assert!(w.token_embd.tiles().is_none());
}

#[test]
fn capital_of_france_is_paris_and_threads_agree() {
    let Some(path) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let (t1, text) = greedy(&file, "The capital of France is", 8, 1);
    assert!(text.contains("Paris"), "{text:?}");
    let (t2, _) = greedy(&file, "The capital of France is", 8, 2);
    assert_eq!(t1, t2, "1 vs 2 threads");
}

/// Past the position where attention is spread over the pool, logits are
/// still bit-identical across thread counts.
#[test]
fn long_context_logits_identical_across_threads() {
    let Some(path) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    let model = Model::from_gguf(&file, &cfg).unwrap();
    let tokens: Vec<u32> = (0..140u32).map(|i| 100 + (i * 37) % 5000).collect();
    let run = |threads: usize| {
        let pool = ThreadPool::new(threads);
        let mut state = model.new_state(&StateOptions::new(160)).unwrap();
        let mut out = Vec::new();
        for (pos, &t) in tokens.iter().enumerate() {
            let logits = state.forward_seq(&pool, &[t], pos, Logits::Last);
            if pos % 10 == 9 {
                out.push(logits.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            }
        }
        out
    };
    assert!(run(1) == run(3), "logits differ between 1 and 3 threads");
}

/// Captured keys are the cache's keys before RoPE; a state that stops
/// after layer 15 captures the same keys and queries as the full pass.
#[test]
fn captured_keys_are_the_cache_before_rope() {
    let Some(path) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    let model = Model::from_gguf(&file, &cfg).unwrap();
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).unwrap();
    let toks = vocab.encode(
        "The capital of France is Paris, and its river is",
        true,
        true,
    );
    let n = toks.len();
    let pool = ThreadPool::new(2);
    let opts = StateOptions {
        kv_type: KvType::F32,
        n_batch: n,
        ..StateOptions::new(64)
    };
    let layers = [0, 15, 29];
    let mut full = model.new_state(&opts).unwrap();
    full.capture(&layers).unwrap();
    assert_eq!(
        full.forward_seq(&pool, &toks, 0, Logits::Last).len(),
        cfg.vocab_size
    );
    for (i, &layer) in layers.iter().enumerate() {
        let k = full.captured_keys(i);
        assert_eq!(k.len(), n * cfg.kv_dim());
        assert_eq!(full.captured_queries(i).len(), n * cfg.q_dim());
        let cached = common::unroped_keys(&cfg, common::cache(&full, 0), layer, 0..n);
        let e = common::rel_err(k, &cached);
        assert!(e < 1e-6, "layer {layer}: keys vs the cache: {e}");
    }
    let mut early = model.new_state(&opts).unwrap();
    early.capture(&layers).unwrap();
    early.set_last_layer(Some(15)).unwrap();
    assert!(early.forward_seq(&pool, &toks, 0, Logits::Last).is_empty());
    for i in 0..2 {
        assert_eq!(
            common::bits(early.captured_keys(i)),
            common::bits(full.captured_keys(i))
        );
        let q = common::bits(early.captured_queries(i));
        assert_eq!(q, common::bits(full.captured_queries(i)));
    }
    assert!(early.captured_keys(2).is_empty());
}
