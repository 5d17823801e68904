//! `cachefit perplexity` through the real binary.
//!
//! The full comparison with llama-perplexity (40 chunks of 512 on
//! tinyshakespeare, both SmolLM2 files) takes minutes, so it is `#[ignore]`d
//! here and run by `scripts/test.sh` on a release build:
//! `cargo test --release -p cachefit --test perplexity -- --ignored`.

mod common;

use common::cachefit;

use serde_json::Value;
use std::path::PathBuf;

fn shakespeare() -> PathBuf {
    testkit::workspace_root().join("data/tinyshakespeare.txt")
}

fn model() -> Option<String> {
    testkit::model(testkit::SMOLLM2_Q4_1).map(|p| p.to_str().unwrap().to_string())
}

fn ppl_json(args: &[&str]) -> Value {
    let mut a = vec!["perplexity", "--json"];
    a.extend_from_slice(args);
    let (ok, out, err) = cachefit(&a);
    assert!(ok, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn small_context_scores_second_halves_and_is_deterministic() {
    let Some(m) = model() else { return };
    let f = shakespeare();
    let f = f.to_str().unwrap();
    let v = ppl_json(&["-m", &m, "-f", f, "-c", "64", "--chunks", "3", "-b", "16"]);
    // 3 chunks × (64 − 32 − 1) scored tokens.
    assert_eq!(v["scored_tokens"], 3 * 31);
    assert_eq!(v["running_ppl"].as_array().unwrap().len(), 3);
    let ppl = v["ppl"].as_f64().unwrap();
    assert!(ppl > 5.0 && ppl < 500.0, "{v}");
    assert!(v["ppl_err"].as_f64().unwrap() > 0.0);
    let bpb = v["bits_per_byte"].as_f64().unwrap();
    assert!(bpb > 0.5 && bpb < 8.0, "{v}");
    // Batch size and thread count do not change the result.
    let w = ppl_json(&[
        "-m", &m, "-f", f, "-c", "64", "--chunks", "3", "-b", "64", "-t", "1",
    ]);
    assert_eq!(v["ppl"], w["ppl"]);

    // The text output ends with llama.cpp's summary line.
    let (ok, out, err) = cachefit(&["perplexity", "-m", &m, "-f", f, "-c", "64", "--chunks", "1"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("[1]") && out.contains("Final estimate: PPL = "),
        "{out}"
    );
}

#[test]
fn clear_errors() {
    let Some(m) = model() else { return };
    let fails = |args: &[&str], want: &str| {
        let mut a = vec!["perplexity"];
        a.extend_from_slice(args);
        let (ok, out, err) = cachefit(&a);
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(err.contains(want), "{args:?}: {err}");
    };
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "To be, or not to be.").unwrap();
    let short = short.to_str().unwrap();
    fails(&["-m", &m, "-f", short], "needs at least 1024 (2 × -c)");
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    fails(&["-m", &m, "-f", empty.to_str().unwrap()], "is empty");
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, b"ok \xff").unwrap();
    fails(&["-m", &m, "-f", bad.to_str().unwrap()], "not valid UTF-8");
    fails(&["-m", &m, "-f", "/nonexistent.txt"], "/nonexistent.txt");
    fails(
        &["-m", &m, "-f", short, "--chunks", "0"],
        "--chunks must be at least 1",
    );
    fails(&["-m", &m, "-f", short, "-c", "2"], "too small");
}

/// Within 0.5% of llama-perplexity (the bound) on both SmolLM2
/// files (40 chunks of 512) and on Gemma 3 270M (24 chunks: its 262,144-token
/// head makes each chunk dearer), with the reference values from
/// crates/model/tests/fixtures/llamacpp-perplexity*.json.
#[test]
#[ignore = "minutes; run on a release build by scripts/test.sh"]
fn matches_llama_perplexity() {
    let fixtures = [
        "llamacpp-perplexity.json",
        "llamacpp-perplexity-gemma3.json",
    ];
    let runs: Vec<Value> = fixtures
        .iter()
        .flat_map(|f| {
            let path = testkit::workspace_root()
                .join("crates/model/tests/fixtures")
                .join(f);
            let fx: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            fx["runs"].as_array().unwrap().clone()
        })
        .collect();
    for run in &runs {
        let name = run["model"].as_str().unwrap();
        let quant = run["quant"].as_str().unwrap();
        let path = match quant {
            "q4_1" => testkit::model(testkit::SMOLLM2_Q4_1),
            "q4_k_m" => testkit::model(testkit::GEMMA3_270M),
            "q8_0" => Some(testkit::models_dir().join(name)).filter(|p| p.is_file()),
            _ => continue, // the dequantized file: 540 MB, covered by the model crate's parity test
        };
        let Some(path) = path else {
            eprintln!("*** SKIPPING perplexity for {name}: not in the models folder ***");
            assert!(std::env::var("CACHEFIT_REQUIRE_MODELS").as_deref() != Ok("1"));
            continue;
        };
        // The chunk count the reference used (`--chunks N` in its command).
        let command = run["command"].as_str().unwrap();
        let chunks = command
            .split_whitespace()
            .skip_while(|w| *w != "--chunks")
            .nth(1)
            .unwrap();
        let f = shakespeare();
        let v = ppl_json(&[
            "-m",
            path.to_str().unwrap(),
            "-f",
            f.to_str().unwrap(),
            "-c",
            "512",
            "--chunks",
            chunks,
            "-b",
            "64",
        ]);
        let (ours, theirs) = (v["ppl"].as_f64().unwrap(), run["ppl"].as_f64().unwrap());
        let rel = (ours - theirs).abs() / theirs;
        eprintln!(
            "{name}: cachefit PPL {ours:.4} ± {:.5}, llama.cpp {theirs} ± {}, difference {:.3}%",
            v["ppl_err"].as_f64().unwrap(),
            run["ppl_pm"],
            rel * 100.0
        );
        assert!(rel <= 0.005, "{name}: {ours} vs llama.cpp {theirs}");
    }
}
