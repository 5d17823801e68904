//! A model split into several files (llama.cpp's gguf-split layout) runs
//! from its first file exactly as the single file does.

mod common;

use common::cachefit;
use std::path::PathBuf;

/// SmolLM2 and its 3 shards (at most 91 of its 272 tensors each, as
/// `llama-gguf-split --split --split-max-tensors 91` writes them).
fn split_smollm2() -> Option<(tempfile::TempDir, String, Vec<PathBuf>)> {
    let m = testkit::model(testkit::SMOLLM2_Q4_1)?;
    let dir = tempfile::tempdir().unwrap();
    let file = gguf::GgufFile::open(&m).unwrap();
    let shards = gguf::split::write_split(&file, &dir.path().join("smollm2"), 91).unwrap();
    assert_eq!(shards.len(), 3);
    Some((dir, m.to_str().unwrap().to_string(), shards))
}

#[test]
fn split_model_generates_what_the_single_file_does() {
    let Some((_dir, m, shards)) = split_smollm2() else {
        return;
    };
    let first = shards[0].to_str().unwrap();
    let p = "The capital of France is";
    let run = |model: &str, extra: &[&str]| {
        let mut args = vec![
            "run", "--temp", "0", "-m", model, "-p", p, "-n", "8", "-t", "2",
        ];
        args.extend_from_slice(extra);
        let (ok, out, err) = cachefit(&args);
        assert!(ok, "{model} {extra:?}: {err}");
        out
    };
    let want = run(&m, &[]);
    assert!(want.contains("Paris"), "{want:?}");
    assert_eq!(run(first, &[]), want);
    assert_eq!(run(first, &["--no-mmap"]), want);

    // Any shard but the first is refused, naming the first.
    let (ok, _, err) = cachefit(&["run", "-m", shards[1].to_str().unwrap(), "-p", p]);
    assert!(!ok);
    assert!(err.contains("file 2 of 3") && err.contains(first), "{err}");
    // A missing shard is named.
    std::fs::remove_file(&shards[2]).unwrap();
    let (ok, _, err) = cachefit(&["run", "-m", first, "-p", p]);
    assert!(!ok);
    assert!(
        err.contains("smollm2-00003-of-00003.gguf") && err.contains("is missing"),
        "{err}"
    );
}

#[test]
fn inspect_says_the_model_is_split() {
    let Some((_dir, _, shards)) = split_smollm2() else {
        return;
    };
    let first = shards[0].to_str().unwrap();
    let (ok, out, err) = cachefit(&["inspect", first]);
    assert!(ok, "{err}");
    assert!(out.contains("split into 3 files:"), "{out}");
    for s in &shards {
        assert!(out.contains(s.to_str().unwrap()), "{out}");
    }
    assert!(out.contains("134515008 parameters"), "{out}");

    let (ok, out, err) = cachefit(&["inspect", first, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tensors"].as_array().unwrap().len(), 272);
    assert_eq!(v["n_elements"], 134515008u64);
    let files = v["shards"].as_array().unwrap();
    let counts: Vec<_> = files
        .iter()
        .map(|s| s["tensors"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [91, 91, 90]);
    let bytes: u64 = shards
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(v["file_bytes"], bytes);
    let last = v["tensors"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["shard"], 3);
}

#[test]
fn quantize_reads_a_split_model_into_one_file() {
    let Some((dir, m, shards)) = split_smollm2() else {
        return;
    };
    let out = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    for (input, output) in [
        (m.as_str(), out("a.gguf")),
        (shards[0].to_str().unwrap(), out("b.gguf")),
    ] {
        let (ok, _, err) = cachefit(&["quantize", input, &output, "q8_0", "--allow-requantize"]);
        assert!(ok, "{input}: {err}");
    }
    // The same file, without split keys.
    let (a, b) = (
        std::fs::read(out("a.gguf")).unwrap(),
        std::fs::read(out("b.gguf")).unwrap(),
    );
    assert!(a == b, "quantizing the split model wrote another file");
    let f = gguf::GgufFile::open(out("b.gguf")).unwrap();
    assert!(!f.is_split() && f.metadata().get(gguf::split::SPLIT_COUNT).is_none());
}
