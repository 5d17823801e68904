//! Training, checkpoints and export end to end on a small slice of the
//! corpus and a small network: the loss falls, a run resumed from a
//! checkpoint equals an uninterrupted one bit for bit, and the exported
//! GGUF holds exactly the numbers the trainer computed with — and the
//! runtime reading it agrees with the trainer's forward pass.

use std::path::{Path, PathBuf};
use train::data::{self, DataConfig};
use train::export::{self, MatrixType};
use train::net::{self, config::parse_pattern, Acts, Layout, NetConfig, WeightFormat};
use train::trainer::{self, TrainConfig};
use train::{bpe, checkpoint, pack, paths};

/// data → bpe (vocab 300) → pack on the first ~60 KB of the corpus.
fn pipeline(dir: &Path) {
    let text = std::fs::read_to_string(testkit::workspace_root().join("data/tinyshakespeare.txt"))
        .unwrap();
    let cut = text[60_000..].find("\n\n").unwrap() + 60_000;
    std::fs::create_dir_all(dir).unwrap();
    let corpus = dir.join("small.txt");
    std::fs::write(&corpus, &text[..cut + 1]).unwrap();
    let config = DataConfig {
        corpus: vec![corpus],
        eval_passages: 20,
        ..DataConfig::default()
    };
    data::run(&config, dir, false).unwrap();
    bpe::run(300, dir, false).unwrap();
    pack::run(dir, false).unwrap();
}

fn small_net() -> NetConfig {
    NetConfig {
        vocab: 300,
        d: 32,
        ffn: 64,
        pattern: parse_pattern("CAC").unwrap(),
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 8,
        context: 64,
        conv_kernel: 4,
        softcap: 30.0,
        eps: 1e-6,
        rope_base: 10000.0,
        weights: WeightFormat::Int8,
        token_code_bits: 0,
        token_code_seed: 0,
    }
}

fn small_train() -> TrainConfig {
    TrainConfig {
        steps: 40,
        batch: 4,
        seq_len: 64,
        lr: 1e-2,
        warmup: 5,
        qat_fraction: 0.25,
        eval_every: 10,
        eval_windows: 8,
        checkpoint_every: 10,
        threads: 2,
        ..TrainConfig::default()
    }
}

fn copy_inputs(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn trains_resumes_exports_and_the_runtime_agrees() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    pipeline(&base);
    let (net, tc) = (small_net(), small_train());

    // One uninterrupted run.
    let a: PathBuf = tmp.path().join("a");
    copy_inputs(&base, &a);
    let ra = trainer::run(&net, &tc, &a, false, false).unwrap();
    assert_eq!(ra.steps_run, 40);
    let log = std::fs::read_to_string(a.join(paths::TRAIN_LOG)).unwrap();
    let vals: Vec<f64> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["val_loss"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(vals.len(), 4);
    let uniform = (net.vocab as f64).ln();
    assert!(
        vals[3] < uniform - 1.0,
        "validation loss {vals:?} vs uniform {uniform}"
    );
    assert!(vals[3] < vals[0], "{vals:?}");

    // The same run in two pieces.
    let b = tmp.path().join("b");
    copy_inputs(&base, &b);
    let first = TrainConfig {
        stop_after: Some(25),
        ..tc.clone()
    };
    assert_eq!(
        trainer::run(&net, &first, &b, false, false)
            .unwrap()
            .steps_run,
        25
    );
    let rb = trainer::run(&net, &tc, &b, false, false).unwrap();
    assert_eq!((rb.resumed_from, rb.steps_run), (25, 15));
    let (ca, cb) = (
        checkpoint::load(&a.join(paths::CHECKPOINT)).unwrap(),
        checkpoint::load(&b.join(paths::CHECKPOINT)).unwrap(),
    );
    assert_eq!(ca.step, 40);
    assert!(ca
        .params
        .iter()
        .zip(&cb.params)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    assert!(ca
        .v
        .iter()
        .zip(&cb.v)
        .all(|(x, y)| x.to_bits() == y.to_bits()));

    // Other settings with an existing checkpoint: refused, file kept.
    let other = TrainConfig {
        lr: 5e-3,
        ..tc.clone()
    };
    let e = trainer::run(&net, &other, &b, false, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--fresh"), "{e}");
    assert_eq!(
        checkpoint::load(&b.join(paths::CHECKPOINT)).unwrap().step,
        40
    );

    // Export: int8 holds exactly the fake-quantized numbers; f32 the raw ones.
    let l = Layout::new(&net);
    let mut fq = vec![0.0; l.len];
    net::fake_quantize(&net, &l, &ca.params, &mut fq);
    let int8 = a.join("model.gguf");
    let r = export::run(&a, Some(&int8), MatrixType::Int8, "test").unwrap();
    assert_eq!(r.step, 40);
    let (net2, p8) = export::read_gguf(&int8).unwrap();
    assert_eq!(net2, net);
    assert!(p8.iter().zip(&fq).all(|(x, y)| x.to_bits() == y.to_bits()));
    let f32_path = a.join("model-f32.gguf");
    export::run(&a, Some(&f32_path), MatrixType::F32, "test").unwrap();
    let (_, p32) = export::read_gguf(&f32_path).unwrap();
    assert_eq!(p32, ca.params);

    // The runtime reads the int8 file and agrees with the trainer.
    let (worst, argmax_equal) = runtime_vs_trainer(&a, &int8, &net, &p8);
    // Only the runtime's int8 activations (and summation order) differ.
    assert!(
        worst < 0.03,
        "worst logit difference {worst} of the row's range"
    );
    assert!(
        argmax_equal >= 60,
        "argmax equal at {argmax_equal}/64 positions"
    );

    // A damaged checkpoint is refused with its name.
    let ck = a.join(paths::CHECKPOINT);
    let bytes = std::fs::read(&ck).unwrap();
    std::fs::write(&ck, &bytes[..bytes.len() - 7]).unwrap();
    let e = export::run(&a, None, MatrixType::Int8, "x")
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("checkpoint.bin") && e.contains("truncated"),
        "{e}"
    );
}

/// Logits of the runtime reading `path` and of the trainer's forward pass
/// on `params` (inputs quantized as the runtime does when `quantized`),
/// over the first 64 validation tokens: the worst difference as a share of
/// a row's range, and at how many positions the argmax agrees.
fn runtime_vs_trainer(dir: &Path, path: &Path, net: &NetConfig, params: &[f32]) -> (f32, usize) {
    let l = Layout::new(net);
    let file = gguf::GgufFile::open(path).unwrap();
    let cfg = model::ModelConfig::from_gguf(file.metadata()).unwrap();
    let model = model::Model::from_gguf(&file, &cfg).unwrap();
    let opts = model::StateOptions {
        all_logits: true,
        n_batch: 64,
        ..model::StateOptions::new(64)
    };
    let mut st = model.new_state(&opts).unwrap();
    let val = trainer::read_tokens(dir, paths::VAL_BIN, net.vocab).unwrap();
    let window = &val[..64];
    let ids: Vec<u32> = window.iter().map(|&t| t as u32).collect();
    let pool = kernels::pool::ThreadPool::new(2);
    let rt = st.forward_seq(&pool, &ids, 0, model::Logits::All).to_vec();
    let mut acts = Acts::new(net, 64);
    acts.quantize_inputs = true;
    acts.input_pairs = true;
    net::forward(net, &l, params, window, &mut acts);
    let reference = &acts.logits[..64 * net.vocab];
    let (mut worst, mut argmax_equal) = (0f32, 0);
    for (a, b) in rt
        .chunks_exact(net.vocab)
        .zip(reference.chunks_exact(net.vocab))
    {
        let range =
            b.iter().cloned().fold(f32::MIN, f32::max) - b.iter().cloned().fold(f32::MAX, f32::min);
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs() / range);
        }
        let am = |r: &[f32]| {
            r.iter()
                .enumerate()
                .fold(0, |m, (i, &v)| if v > r[m] { i } else { m })
        };
        argmax_equal += usize::from(am(a) == am(b));
    }
    (worst, argmax_equal)
}

/// A ternary network with fixed token codes: training from a seed gives a
/// byte-identical file twice; the file holds TQ2_0 block matrices whose
/// values are exactly the trainer's; the runtime agrees with the trainer.
#[test]
fn ternary_with_token_codes_trains_reproducibly_and_the_runtime_agrees() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    pipeline(&base);
    let net = NetConfig {
        d: 256,
        ffn: 256,
        n_heads: 4,
        head_dim: 64,
        weights: WeightFormat::Ternary { block: 256 },
        token_code_bits: 128,
        token_code_seed: 5,
        ..small_net()
    };
    let tc = TrainConfig {
        steps: 12,
        qat_fraction: 1.0,
        lr: 3e-3,
        eval_every: 6,
        ..small_train()
    };
    let mut files = Vec::new();
    for run in ["a", "b"] {
        let d = tmp.path().join(run);
        copy_inputs(&base, &d);
        trainer::run(&net, &tc, &d, false, false).unwrap();
        let path = d.join("model.gguf");
        export::run(&d, Some(&path), MatrixType::Int8, "test").unwrap();
        files.push((d, path));
    }
    let (da, pa) = &files[0];
    let bytes = std::fs::read(pa).unwrap();
    assert!(
        bytes == std::fs::read(&files[1].1).unwrap(),
        "two runs differ"
    );

    let file = gguf::GgufFile::open(pa).unwrap();
    let ty = |n: &str| file.tensor_info(n).unwrap().ty;
    assert_eq!(ty("blk.0.conv_gate.weight"), gguf::GgmlType::TQ2_0);
    assert_eq!(ty("blk.1.attn_qkv.weight"), gguf::GgmlType::TQ2_0);
    assert_eq!(ty("token_proj.weight"), gguf::GgmlType::I8);
    assert_eq!(ty("output.weight"), gguf::GgmlType::I8);
    assert!(file.tensor_info("token_embd.weight").is_none());

    let ck = checkpoint::load(&da.join(paths::CHECKPOINT)).unwrap();
    let l = Layout::new(&net);
    let mut fq = vec![0.0; l.len];
    net::fake_quantize(&net, &l, &ck.params, &mut fq);
    let (net2, read) = export::read_gguf(pa).unwrap();
    assert_eq!(
        (
            net2.token_code_bits,
            net2.token_code_seed,
            net2.weights.is_ternary()
        ),
        (128, 5, true)
    );
    for t in &l.tensors {
        let bad = t.range().find(|&i| read[i].to_bits() != fq[i].to_bits());
        assert!(
            bad.is_none(),
            "{}[{}]: {} vs {}",
            t.name,
            bad.unwrap() - t.offset,
            read[bad.unwrap()],
            fq[bad.unwrap()]
        );
    }

    let (worst, argmax_equal) = runtime_vs_trainer(da, pa, &net, &read);
    // Both quantize the same inputs the same way; the int8 head's pair
    // activations and the summation order are what differ.
    assert!(
        worst < 0.01,
        "worst logit difference {worst} of the row's range"
    );
    assert!(
        argmax_equal >= 62,
        "argmax equal at {argmax_equal}/64 positions"
    );
}
