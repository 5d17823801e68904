//! `cachefit run` on a tiny random `cachefit`-architecture model (int8 and
//! F32 matrices, byte-level tokenizer), through the real binary.

mod common;

use common::cachefit;

use serde_json::Value;
use std::path::Path;
use testkit::cachefit::{Spec, Storage, TinyCachefit, BYTE_VOCAB};

fn tiny(dir: &Path, storage: Storage) -> String {
    let spec = Spec {
        vocab: BYTE_VOCAB,
        ..Spec::reference_shape()
    };
    let path = dir.join(format!("tiny-{storage:?}.gguf"));
    TinyCachefit::random(spec, 5).write(&path, storage);
    path.to_str().unwrap().to_string()
}

fn run_json(m: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "run", "-m", m, "-p", "Hello", "-n", "8", "--temp", "0", "--json",
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = cachefit(&args);
    assert!(ok, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn run_greedy_on_a_tiny_cachefit_model() {
    let dir = tempfile::tempdir().unwrap();
    for storage in [Storage::I8, Storage::F32] {
        let m = tiny(dir.path(), storage);
        let (ok, _, err) = cachefit(&["run", "-m", &m, "-p", "Hello", "-n", "8", "--temp", "0"]);
        assert!(ok, "{err}");
        assert!(err.contains("(cachefit, 6 layers)"), "{err}");
        assert!(err.contains("tokens per second"), "{err}");

        let one = run_json(&m, &["-t", "1"]);
        assert_eq!(one["prompt_tokens"], 5, "{one}"); // one token per byte
        assert_eq!(one["generated_tokens"], 8, "{one}");
        assert_eq!(one["stop"], "length", "{one}");
        // Greedy output does not depend on the thread count.
        let two = run_json(&m, &["-t", "2"]);
        assert_eq!(one["text"], two["text"], "{storage:?}");
    }

    // The int8 cache layout is refused with a clear message.
    let m = tiny(dir.path(), Storage::I8);
    let (ok, _, err) = cachefit(&[
        "run",
        "-m",
        &m,
        "-p",
        "Hi",
        "-n",
        "2",
        "--cache-type",
        "q8_0",
    ]);
    assert!(!ok);
    assert!(err.contains("q8_0") && err.contains("cachefit"), "{err}");
}
