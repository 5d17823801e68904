//! `cachefit tokenize` through the real binary. Expected ids are llama.cpp's
//! (`crates/tokenize/tests/fixtures/smollm2-special.out`, cases 11 and 47).

use std::process::Command;

fn tokenize(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .arg("tokenize")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn ids_match_llama_cpp() {
    let Some(model) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let m = model.to_str().unwrap();
    let (ok, out, err) = tokenize(&["-m", m, "--ids", "Hello world"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "[19556, 905]");
    let special = "<|im_start|><|im_start|>x<|im_end|>";
    let (ok, out, _) = tokenize(&["-m", m, "--ids", special]);
    assert!(ok);
    assert_eq!(out.trim(), "[1, 1, 104, 2]");
    // Without special-token parsing the markers are plain text.
    let (ok, out, _) = tokenize(&["-m", m, "--ids", "--no-parse-special", special]);
    assert!(ok);
    assert!(
        !out.contains("[1,") && out.matches(',').count() > 4,
        "{out}"
    );
    let (ok, out, err) = tokenize(&["-m", m, "Hello world"]);
    assert!(ok);
    assert!(
        out.contains("19556 -> 'Hello'") && out.contains("905 -> ' world'"),
        "{out}"
    );
    assert!(err.contains("2 tokens"), "{err}");
}

#[test]
fn file_without_tokenizer_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("no-vocab.gguf");
    let b = gguf::Builder::new(Default::default());
    let bytes = b.write_header(Vec::new()).unwrap().finish().unwrap();
    std::fs::write(&p, bytes).unwrap();
    let (ok, _, err) = tokenize(&["-m", p.to_str().unwrap(), "hi"]);
    assert!(!ok);
    assert!(
        err.contains("cannot load the tokenizer") && err.contains("tokenizer.ggml"),
        "{err}"
    );
}
