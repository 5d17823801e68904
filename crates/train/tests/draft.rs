//! A draft model made by the pipeline on another model's vocabulary
//! (`bpe --from-model`, issue 23 §4): the import copies the tokenizer
//! exactly (same ids, text round trips), `pack` and `export` work with it,
//! the exported model carries the tokenizer so the engine's draft check
//! accepts it for the model it came from, and a pipeline model with its
//! own BPE is refused. Runs on the built-in model's vocabulary (in the
//! repository); the SmolLM2 import test skips without the fetched model.

use std::path::Path;
use train::data::{self, DataConfig};
use train::export::{self, MatrixType};
use train::net::{config::parse_pattern, NetConfig, WeightFormat};
use train::trainer::{self, TrainConfig};
use train::{bpe, import, pack, paths};

fn load_vocab(path: &Path) -> tokenize::Vocab {
    let file = gguf::GgufFile::open(path).unwrap();
    tokenize::Vocab::from_gguf(file.metadata()).unwrap()
}

fn read_u16(path: &Path) -> Vec<u16> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}

fn tokenizer_keys(path: &Path) -> Vec<(String, gguf::Value)> {
    let file = gguf::GgufFile::open(path).unwrap();
    file.metadata()
        .entries()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .cloned()
        .collect()
}

/// `data` on the first ~40 KB of tinyshakespeare, no task passages.
fn data_stage(dir: &Path) {
    let text = std::fs::read_to_string(testkit::workspace_root().join("data/tinyshakespeare.txt"))
        .unwrap();
    let cut = text[40_000..].find("\n\n").unwrap() + 40_000;
    std::fs::create_dir_all(dir).unwrap();
    let corpus = dir.join("small.txt");
    std::fs::write(&corpus, &text[..cut + 1]).unwrap();
    let config = DataConfig {
        corpus: vec![corpus],
        task_ratio: 0.0,
        eval_passages: 5,
        ..DataConfig::default()
    };
    data::run(&config, dir, false).unwrap();
}

/// A few steps of a tiny network with token codes, exported int8.
fn train_and_export(dir: &Path, vocab: usize) -> std::path::PathBuf {
    let net = NetConfig {
        vocab,
        d: 32,
        ffn: 64,
        pattern: parse_pattern("CA").unwrap(),
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 16,
        context: 64,
        conv_kernel: 4,
        softcap: 0.0,
        eps: 1e-6,
        rope_base: 10000.0,
        weights: WeightFormat::Int8,
        token_code_bits: 64,
        token_code_seed: 1,
    };
    let tc = TrainConfig {
        steps: 3,
        batch: 2,
        seq_len: 32,
        warmup: 1,
        eval_every: 3,
        eval_windows: 1,
        checkpoint_every: 3,
        threads: 1,
        ..TrainConfig::default()
    };
    trainer::run(&net, &tc, dir, true, false).unwrap();
    let out = dir.join("draft.gguf");
    export::run(dir, Some(&out), MatrixType::Int8, "draft").unwrap();
    out
}

#[test]
fn a_draft_on_an_imported_vocabulary_is_accepted_and_a_foreign_one_refused() {
    let root = testkit::workspace_root();
    let target = root.join("models/cachefit-shakespeare.gguf");
    let other = root.join("models/cachefit-ternary.gguf");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("draft");
    data_stage(&dir);

    let r = import::run(&target, &dir).unwrap();
    let target_vocab = load_vocab(&target);
    assert_eq!(r.vocab_size, target_vocab.len());
    assert!(
        r.checked_tokens > 1000,
        "held-out text checked: {}",
        r.checked_tokens
    );
    // The vocab-only file holds the model's tokenizer keys, all of them,
    // and no tensors.
    let tok_path = dir.join(paths::TOKENIZER_GGUF);
    assert_eq!(tokenizer_keys(&tok_path), tokenizer_keys(&target));
    assert_eq!(gguf::GgufFile::open(&tok_path).unwrap().tensors().len(), 0);
    // Same ids as the model's own tokenizer, and the text back.
    let imported = load_vocab(&tok_path);
    let text = std::fs::read_to_string(dir.join(paths::CORPUS_VAL)).unwrap();
    let ids = imported.encode(&text, false, false);
    assert_eq!(ids, target_vocab.encode(&text, false, false));
    let opts = tokenize::DecodeOptions {
        keep_spaces: true,
        ..Default::default()
    };
    assert_eq!(imported.decode_with(&ids, opts), text.as_bytes());

    // pack wraps documents in the tokenizer's own BOS/EOS.
    pack::run(&dir, false).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(paths::PACK_MANIFEST)).unwrap())
            .unwrap();
    assert_eq!(manifest["vocab_size"], target_vocab.len());
    assert_eq!(manifest["bos_id"], target_vocab.bos().unwrap());
    assert_eq!(manifest["eos_id"], target_vocab.eos().unwrap());

    // Distilled generations: the training part repeated after the corpus,
    // every 10th held out and first in val.bin.
    let corpus_train = read_u16(&dir.join(paths::TRAIN_BIN));
    let corpus_val = read_u16(&dir.join(paths::VAL_BIN));
    let jsonl = dir.join("distilled.jsonl");
    let lines: String = (0..10)
        .map(|i| {
            format!(
                "{{\"prompt\": \"First Citizen:\", \"ids\": [{}, 40], \"stop\": \"eog\"}}\n",
                300 + i
            )
        })
        .collect();
    std::fs::write(&jsonl, lines).unwrap();
    let options = pack::PackOptions {
        distilled: Some(jsonl),
        distilled_repeat: 3,
    };
    let report = pack::run_with(&dir, &options, false).unwrap();
    let d = train::distill::load(&dir.join("distilled.jsonl"), &target_vocab).unwrap();
    assert_eq!((d.train.len(), d.val.len()), (9, 1));
    let train_bin = read_u16(&dir.join(paths::TRAIN_BIN));
    assert_eq!(
        train_bin,
        [corpus_train, d.train.concat().repeat(3)].concat()
    );
    let val_bin = read_u16(&dir.join(paths::VAL_BIN));
    assert_eq!(val_bin, [d.val.concat(), corpus_val].concat());
    assert_eq!(read_u16(&dir.join("val.distilled.bin")), d.val.concat());
    assert_eq!(report.sources[0].name, "val.distilled");
    assert_eq!(report.splits[0].documents, 1 + 27);

    // The exported draft carries the model's tokenizer, chat template
    // included, and the engine's draft check accepts it.
    let draft = train_and_export(&dir, target_vocab.len());
    assert_eq!(tokenizer_keys(&draft), tokenizer_keys(&target));
    let draft_vocab = load_vocab(&draft);
    engine::draft::check_vocab(&target_vocab, &draft_vocab).unwrap();
    // The runtime binds it (token codes, int8 head over the whole vocabulary).
    let file = gguf::GgufFile::open(&draft).unwrap();
    let cfg = model::ModelConfig::from_gguf(file.metadata()).unwrap();
    assert_eq!(cfg.vocab_size, target_vocab.len());
    model::Model::from_gguf(&file, &cfg).unwrap();
    // A model with another vocabulary is refused, naming the difference.
    let e = engine::draft::check_vocab(&load_vocab(&other), &draft_vocab).unwrap_err();
    assert!(
        e.contains("token") && e.contains("a draft model needs the same vocabulary"),
        "{e}"
    );

    // Training a BPE in the same folder replaces the import: export now
    // writes that vocabulary, and the draft made with it is refused.
    bpe::run(300, &dir, false).unwrap();
    assert!(import::imported_tokenizer(&dir).unwrap().is_none());
    pack::run(&dir, false).unwrap();
    let foreign = train_and_export(&dir, 300);
    let e = engine::draft::check_vocab(&target_vocab, &load_vocab(&foreign)).unwrap_err();
    assert!(
        e.contains("the draft model has 300 tokens and the model 4096"),
        "{e}"
    );
}

#[test]
fn a_model_without_a_tokenizer_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bare.gguf");
    let mut md = gguf::Metadata::new();
    md.set("general.architecture", gguf::Value::String("llama".into()));
    let mut bytes = Vec::new();
    gguf::Builder::new(md)
        .write_header(&mut bytes)
        .unwrap()
        .finish()
        .unwrap();
    std::fs::write(&path, bytes).unwrap();
    let e = import::run(&path, &tmp.path().join("out"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bare.gguf") && e.contains("has no tokenizer"),
        "{e}"
    );
    let missing = import::run(&tmp.path().join("nope.gguf"), &tmp.path().join("out"))
        .unwrap_err()
        .to_string();
    assert!(missing.contains("nope.gguf"), "{missing}");
}

/// SmolLM2's tokenizer (49,152 tokens, control tokens for its chat
/// format): imported, it tokenizes as the model does, and distilled
/// generations become the ids SmolLM2 read and wrote.
#[test]
fn imports_smollm2s_tokenizer() {
    let Some(smollm) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("draft");
    let r = import::run(&smollm, &dir).unwrap();
    assert_eq!((r.vocab_size, r.bos, r.eos), (49152, Some(1), Some(2)));
    assert!(r.has_chat_template);
    let ours = load_vocab(&dir.join(paths::TOKENIZER_GGUF));
    let theirs = load_vocab(&smollm);
    let text =
        "<|im_start|>user\nSummarise: It was the best of times, 1859. ünïcödé 🙂<|im_end|>\n";
    assert_eq!(
        ours.encode(text, true, true),
        theirs.encode(text, true, true)
    );
    assert_eq!(ours.encode(text, true, true)[0], 1);
    engine::draft::check_vocab(&theirs, &ours).unwrap();

    let jsonl = dir.join("d.jsonl");
    let line = serde_json::json!({"prompt": text, "ids": [504, 3437], "stop": "eog"});
    std::fs::write(&jsonl, format!("{line}\n")).unwrap();
    let d = train::distill::load(&jsonl, &ours).unwrap();
    let want: Vec<u16> = theirs
        .encode(text, true, true)
        .iter()
        .map(|&t| t as u16)
        .chain([504, 3437, 2])
        .collect();
    assert_eq!(d.train, [want]);
}
