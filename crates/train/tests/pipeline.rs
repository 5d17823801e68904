//! The stages end to end, through the library: a small slice of the corpus
//! with a small vocabulary for speed, and one run of the real defaults
//! (whole corpus, 4096 tokens) for the tokenizer parity the runtime relies
//! on.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use train::data::{self, DataConfig};
use train::{bpe, pack, paths};

fn corpus_path() -> PathBuf {
    testkit::workspace_root().join("data/tinyshakespeare.txt")
}

/// The first ~100 KB of the corpus, cut at a paragraph, in `dir`.
fn small_corpus(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(corpus_path()).unwrap();
    let cut = text[100_000..].find("\n\n").unwrap() + 100_000;
    let path = dir.join("small.txt");
    std::fs::write(&path, &text[..cut + 1]).unwrap();
    path
}

fn small_config(corpus: PathBuf) -> DataConfig {
    DataConfig {
        corpus: vec![corpus],
        eval_passages: 60,
        ..DataConfig::default()
    }
}

/// Run all three stages into `out`.
fn run_all(config: &DataConfig, vocab_size: usize, out: &Path) -> pack::PackReport {
    data::run(config, out, false).unwrap();
    bpe::run(vocab_size, out, false).unwrap();
    pack::run(out, false).unwrap()
}

fn read_u16(path: &Path) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap();
    bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
        .collect()
}

#[test]
fn same_inputs_and_seed_give_identical_files() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(small_corpus(tmp.path()));
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    run_all(&config, 512, &a);
    run_all(&config, 512, &b);
    let mut names: Vec<String> = std::fs::read_dir(&a)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 12, "{names:?}"); // with val.small.bin
    for name in &names {
        let (x, y) = (
            std::fs::read(a.join(name)).unwrap(),
            std::fs::read(b.join(name)).unwrap(),
        );
        assert!(x == y, "{name} differs between two identical runs");
    }

    // A different seed changes the task passages, not the corpus split.
    let c = tmp.path().join("c");
    data::run(&DataConfig { seed: 2, ..config }, &c, false).unwrap();
    for (name, same) in [(paths::CORPUS_TRAIN, true), (paths::TASKS_TRAIN, false)] {
        let x = std::fs::read(a.join(name)).unwrap();
        let y = std::fs::read(c.join(name)).unwrap();
        assert_eq!(x == y, same, "{name}");
    }
}

#[test]
fn packed_tokens_decode_to_the_documents() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(small_corpus(tmp.path()));
    let out = tmp.path().join("out");
    let report = run_all(&config, 512, &out);
    let vocab = train::vocab::load_runtime(&out.join(paths::TOKENIZER_GGUF)).unwrap();
    assert_eq!(vocab.len(), 512);

    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join(paths::PACK_MANIFEST)).unwrap())
            .unwrap();
    assert_eq!(manifest["vocab_size"], 512);
    assert_eq!(manifest["dtype"], "u16le");

    let text = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    let expected = [
        (
            "train",
            train::documents::training(&text(paths::CORPUS_TRAIN), &text(paths::TASKS_TRAIN)),
        ),
        ("val", vec![text(paths::CORPUS_VAL)]),
        (
            "eval",
            train::documents::evaluation(&text(paths::TASKS_EVAL)),
        ),
    ];
    for ((name, docs), split) in expected.iter().zip(&report.splits) {
        assert_eq!(split.name, *name);
        let tokens = read_u16(&out.join(&split.file));
        assert_eq!(tokens.len(), split.tokens);
        assert_eq!(manifest["splits"][name]["tokens"], split.tokens);
        // BOS doc EOS, back to back.
        let mut found = Vec::new();
        let mut rest = &tokens[..];
        while !rest.is_empty() {
            assert_eq!(rest[0], 1, "{name}: document does not start with BOS");
            let end = rest.iter().position(|&t| t == 2).expect("EOS");
            let opts = tokenize::DecodeOptions {
                keep_spaces: true,
                ..Default::default()
            };
            found.push(String::from_utf8(vocab.decode_with(&rest[1..end], opts)).unwrap());
            rest = &rest[end + 1..];
        }
        assert_eq!(&found, docs, "{name}");
    }
    // The task passages really are in the training stream, spread out.
    let train_docs = &expected[0].1;
    assert!(train_docs.iter().any(|d| d.contains("\nQ: ")));
    assert!(train_docs[..train_docs.len() / 2]
        .iter()
        .any(|d| d.contains("\nA: ")));
}

#[test]
fn no_held_out_name_appears_in_the_training_stream() {
    // The real corpus: names must also avoid every word of it.
    let set = data::build(
        &DataConfig {
            corpus: vec![corpus_path()],
            ..DataConfig::default()
        },
        false,
    )
    .unwrap();
    let template = train::tasks::template_words();
    let words = |text: &str| -> HashSet<String> { train::names::words(text).collect() };
    let training = words(&(set.corpus_train.clone() + &set.tasks_train_text()));
    let eval_names: HashSet<String> = words(&set.tasks_eval_text())
        .into_iter()
        .filter(|w| !template.contains(w))
        .collect();
    assert!(eval_names.len() > 1000, "{}", eval_names.len());
    for name in &eval_names {
        // Creature names also appear as plurals.
        let stem = name.strip_suffix('s').unwrap_or(name);
        assert!(
            !training.contains(name.as_str()) && !training.contains(stem),
            "held-out name {name:?} appears in the training stream"
        );
    }
    // And the mix is what was asked for.
    let ratio = set.tasks_train_text().len() as f64 / set.corpus_train.len() as f64;
    assert!((0.099..0.102).contains(&ratio), "{ratio}");
}

/// The real defaults: the whole corpus, vocabulary 4096. Our runtime
/// tokenizer, loaded from a GGUF holding only the vocabulary metadata,
/// must give the same ids as `tokenizers` on the whole validation split,
/// and decode back to the text.
#[test]
fn default_vocabulary_matches_tokenizers_on_the_whole_validation_split() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path();
    let config = DataConfig {
        corpus: vec![corpus_path()],
        ..DataConfig::default()
    };
    data::run(&config, out, false).unwrap();
    let report = bpe::run(bpe::DEFAULT_VOCAB, out, false).unwrap();
    assert_eq!(report.vocab_size, 4096);
    assert_eq!(report.merges, 4096 - 3 - 256);

    // Independently of `bpe::run`'s own check: a GGUF written from the
    // metadata alone, and `tokenizers` loading the saved JSON.
    let json = std::fs::read_to_string(out.join(paths::TOKENIZER_JSON)).unwrap();
    let vocab = train::Vocabulary::from_tokenizer_json(&json).unwrap();
    let mut md = gguf::Metadata::new();
    for (k, v) in train::vocab_metadata(&vocab) {
        md.set(k, v);
    }
    let gguf_path = out.join("vocab-only.gguf");
    let mut bytes = Vec::new();
    gguf::Builder::new(md)
        .write_header(&mut bytes)
        .unwrap()
        .finish()
        .unwrap();
    std::fs::write(&gguf_path, bytes).unwrap();
    let ours = train::vocab::load_runtime(&gguf_path).unwrap();
    assert!(ours.warnings().is_empty(), "{:?}", ours.warnings());
    assert_eq!(ours.pre_tokenizer(), Some(tokenize::PreTokenizer::Gpt2));
    let theirs = tokenizers::Tokenizer::from_file(out.join(paths::TOKENIZER_JSON)).unwrap();

    let val = std::fs::read_to_string(out.join(paths::CORPUS_VAL)).unwrap();
    assert!(val.len() > 100_000);
    let want = theirs
        .encode(val.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    let got = ours.encode(&val, false, false);
    assert_eq!(got.len(), want.len());
    assert!(got == want, "ids differ");
    let opts = tokenize::DecodeOptions {
        keep_spaces: true,
        ..Default::default()
    };
    assert_eq!(
        String::from_utf8(ours.decode_with(&got, opts)).unwrap(),
        val
    );
    assert_eq!(theirs.decode(&want, true).unwrap(), val);

    // With specials: both add BOS and nothing else.
    let with = theirs.encode("To be.", true).unwrap().get_ids().to_vec();
    assert_eq!(with, ours.encode("To be.", true, false));
    assert_eq!(with[0], 1);
}

/// Text the corpus does not have: other scripts, emoji, digits, runs of
/// spaces and newlines, contractions in both cases. The pre-tokenizers
/// (the `tokenizers` regex and our port of llama.cpp's) must cut it alike.
#[test]
fn tokenizers_agree_beyond_the_corpus() {
    let tricky = "Café naïve—déjà vu: 你好，世界! 🦙🦙 x²+y³ = 12345.678\n\
                  I'M here, we'll see; they'RE gone. 'tis o'er\n\n\n   \
                  tabs\there\t\t and  double  spaces   \n\u{a0}nbsp \u{2003}em\r\nend ";
    let docs: Vec<String> = (0..20).map(|i| format!("{tricky} {i}\n")).collect();
    let json = bpe::train(&docs, 400).unwrap();
    let vocab = train::Vocabulary::from_tokenizer_json(&json).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("v.gguf");
    vocab.write_gguf(&path).unwrap();
    let ours = train::vocab::load_runtime(&path).unwrap();
    let n = bpe::check_parity(
        &json,
        &ours,
        &[("tricky", tricky), ("unseen", "Zß∂ƒ 9 ½ ٣ Ⅻ")],
    )
    .unwrap();
    assert!(n > 20);
}
