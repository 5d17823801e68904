//! Shared by the integration tests: loading vocabularies and reading test
//! vectors in llama.cpp's `.inp` / `.out` format.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use tokenize::{DecodeOptions, TokenizerModel, Vocab};

pub fn vocab_path(name: &str) -> PathBuf {
    testkit::workspace_root().join("testdata/vocab").join(name)
}

pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn metadata(path: &Path) -> gguf::Metadata {
    let file = gguf::GgufFile::open(path).unwrap_or_else(|e| panic!("{e}"));
    file.metadata().clone()
}

pub fn load(path: &Path) -> Vocab {
    Vocab::from_gguf(&metadata(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// SmolLM2-135M-Instruct's vocabulary, or `None` (after a note) when the
/// model has not been fetched.
pub fn smollm2() -> Option<Vocab> {
    testkit::model(testkit::SMOLLM2_Q4_1).map(|p| load(&p))
}

/// Inputs separated by exactly `\n__ggml_vocab_test__\n` (so an input may
/// itself start or end with newlines), as `test-tokenizer-0.cpp` splits them.
pub fn read_inputs(path: &Path) -> Vec<String> {
    let inp = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(SEP) {
            Some(i) => {
                inputs.push(rest[..i].to_string());
                rest = &rest[i + SEP.len()..];
            }
            None => {
                inputs.push(rest.to_string());
                rest = "";
            }
        }
    }
    inputs
}

/// One line of space-separated ids per input.
pub fn read_outputs(path: &Path) -> Vec<Vec<u32>> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect()
}

/// Encode every input (`add_special`, `parse_special` as given) and compare
/// with the expected ids; returns the number of cases or a report of the
/// failures.
pub fn compare(
    what: &str,
    vocab: &Vocab,
    inputs: &[String],
    expected: &[Vec<u32>],
    add_special: bool,
    parse_special: bool,
) -> Result<usize, String> {
    if inputs.len() != expected.len() {
        return Err(format!(
            "{what}: {} inputs but {} outputs",
            inputs.len(),
            expected.len()
        ));
    }
    let mut failures = Vec::new();
    for (input, want) in inputs.iter().zip(expected) {
        let got = vocab.encode(input, add_special, parse_special);
        if &got != want {
            let short: String = input.chars().take(200).collect();
            failures.push(format!(
                "{short:?}\n  expected {want:?}\n  got      {got:?}"
            ));
        }
    }
    if failures.is_empty() {
        eprintln!("{what}: {} of {} cases pass", inputs.len(), inputs.len());
        Ok(inputs.len())
    } else {
        Err(format!(
            "{what}: {} of {} cases fail:\n{}",
            failures.len(),
            inputs.len(),
            failures.join("\n")
        ))
    }
}

/// What a round trip through `vocab` gives back for text encoded without
/// special tokens. BPE: the pieces are exactly the input's bytes (the
/// optional space clean-up is what stops plain `decode` being exact).
/// SPM: encoding adds a leading space and `decode` removes one, so
/// `decode` itself is exact.
pub fn round_trip(vocab: &Vocab, text: &str) -> String {
    let ids = vocab.encode(text, false, false);
    match vocab.model() {
        TokenizerModel::Bpe => {
            let opts = DecodeOptions {
                keep_spaces: true,
                ..Default::default()
            };
            String::from_utf8(vocab.decode_with(&ids, opts))
                .expect("valid UTF-8 in, valid UTF-8 out")
        }
        TokenizerModel::Spm => vocab.decode(&ids),
    }
}

/// A vocab file against its `.inp` / `.out` (no BOS, special tokens as
/// text, as the C++ test runs), plus the round trip of every input.
pub fn check_vectors(path: &Path) -> Result<usize, String> {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let vocab = Vocab::from_gguf(&metadata(path)).map_err(|e| format!("{name}: {e}"))?;
    let inputs = read_inputs(&path.with_extension("gguf.inp"));
    let expected = read_outputs(&path.with_extension("gguf.out"));
    let n = compare(&name, &vocab, &inputs, &expected, false, false)?;
    for input in &inputs {
        let back = round_trip(&vocab, input);
        if &back != input {
            return Err(format!("{name}: {input:?} decodes to {back:?}"));
        }
    }
    Ok(n)
}
