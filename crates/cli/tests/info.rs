//! `cachefit info` through the real binary.

mod common;

use common::cachefit;

use gguf::{Builder, GgmlType, Metadata, TensorSpec, Value};
use serde_json::Value as Json;
use std::path::Path;

fn info_json(args: &[&str]) -> Json {
    let mut all = vec!["info", "--quick", "--json"];
    all.extend_from_slice(args);
    let (ok, out, err) = cachefit(&all);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

const LEVELS: [&str; 4] = ["L1", "L2", "L3", "DRAM"];

/// A llama config with one 64 KiB tensor: small enough for any L2 or L3.
fn write_tiny_model(path: &Path) {
    let mut md = Metadata::new();
    md.set("general.architecture", Value::String("llama".into()));
    for (k, v) in [
        ("block_count", 2u32),
        ("context_length", 64),
        ("embedding_length", 64),
        ("feed_forward_length", 128),
        ("attention.head_count", 4),
        ("vocab_size", 256),
    ] {
        md.set(format!("llama.{k}"), Value::U32(v));
    }
    md.set("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-6));
    let mut b = Builder::new(md);
    b.add_tensor(TensorSpec {
        name: "token_embd.weight".into(),
        dims: vec![64, 256],
        ty: GgmlType::F32,
    })
    .unwrap();
    let mut w = b
        .write_header(std::fs::File::create(path).unwrap())
        .unwrap();
    w.write_tensor(&vec![0u8; 64 * 256 * 4]).unwrap();
    w.finish().unwrap();
}

#[test]
fn json_describes_the_machine_with_positive_bandwidths() {
    let v = info_json(&[]);
    assert!(v["kernels"]["selected"].is_string(), "{v}");
    assert!(v["features"].is_object(), "{v}");
    let cpus = &v["cpus"];
    let n_allowed = cpus["n_allowed"].as_u64().unwrap();
    let physical = cpus["physical_cores"].as_u64().unwrap();
    assert!(physical >= 1 && physical <= n_allowed, "{cpus}");
    assert!(cpus["allowed"].is_string(), "{cpus}");
    let threads = v["threads"].as_u64().unwrap();
    assert_eq!(v["default_threads"]["n"].as_u64(), Some(threads));
    assert!(v["default_threads"]["reason"]
        .as_str()
        .unwrap()
        .contains("physical core"));
    for c in v["caches"].as_array().unwrap() {
        assert!(c["bytes"].as_u64().unwrap() > 0, "{c}");
    }
    let bw = v["bandwidth"].as_array().unwrap();
    assert_eq!(bw.last().unwrap()["level"], "DRAM", "{v}");
    // One probe per known cache level, plus DRAM.
    assert_eq!(bw.len(), v["caches"].as_array().unwrap().len() + 1, "{v}");
    for b in bw {
        assert!(LEVELS.contains(&b["level"].as_str().unwrap()), "{b}");
        assert!(b["best_gbps"].as_f64().unwrap() > 0.0, "{b}");
        assert!(b["buffer_bytes"].as_u64().unwrap() > 0, "{b}");
        assert_eq!(b["threads"].as_u64(), Some(threads), "{b}");
    }
    // Without -m, the built-in model (since bcde633).
    assert_eq!(v["model"]["file"], "built-in cachefit-ternary", "{v}");
}

#[test]
fn text_and_thread_override() {
    let (ok, out, err) = cachefit(&["info", "--quick", "-t", "1"]);
    assert!(ok, "{err}");
    for want in [
        "cpu:",
        "features:",
        "kernels:",
        "cpus:",
        "threads:",
        "caches:",
        "DRAM",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    assert!(out.contains("read bandwidth with 1 thread,"), "{out}");
}

#[test]
fn real_model_weights_and_fit() {
    let Some(model) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let m = model.to_str().unwrap();
    let (ok, out, err) = cachefit(&["inspect", m, "--json"]);
    assert!(ok, "{err}");
    let tensor_bytes = serde_json::from_str::<Json>(&out).unwrap()["n_bytes"]
        .as_u64()
        .unwrap();

    let v = info_json(&["-m", m]);
    let model = &v["model"];
    assert_eq!(
        model["weights_bytes"].as_u64(),
        Some(tensor_bytes),
        "{model}"
    );
    // SmolLM2 has an 8192-token context; the default stops at 4096.
    assert_eq!(model["n_ctx"], 4096);
    let kv = model["kv_bytes"].as_u64().unwrap();
    let working_set = model["working_set_bytes"].as_u64().unwrap();
    assert!(kv > 0 && working_set > tensor_bytes + kv, "{model}");
    assert!(
        LEVELS.contains(&model["fits_level"].as_str().unwrap()),
        "{model}"
    );
    assert_eq!(model["bytes_per_token"].as_u64(), Some(tensor_bytes + kv));
    assert!(
        model["decode_ceiling_tok_s"].as_f64().unwrap() > 0.0,
        "{model}"
    );
    assert_eq!(model["recommended_threads"], v["threads"]);

    // The KV cache scales with -c.
    let v = info_json(&["-m", m, "-c", "256"]);
    assert_eq!(v["model"]["kv_bytes"].as_u64(), Some(kv / 16));
}

#[test]
fn a_tiny_model_fits_a_cache() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path);
    let v = info_json(&["-m", path.to_str().unwrap()]);
    let model = &v["model"];
    assert_eq!(model["weights_bytes"], 64 * 256 * 4);
    assert_eq!(model["n_ctx"], 64);
    let working_set = model["working_set_bytes"].as_u64().unwrap();
    let largest_cache = v["caches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["bytes"].as_u64())
        .max();
    match largest_cache {
        Some(c) if c >= working_set => {
            assert_ne!(model["fits_level"], "DRAM", "{v}");
            assert!(model["fits_level_bytes"].as_u64().unwrap() >= working_set);
        }
        _ => eprintln!("no cache holds {working_set} bytes here: fit not checked"),
    }
    // The ceiling is the fitting level's bandwidth over the bytes per token.
    let level = v["bandwidth"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["level"] == model["fits_level"])
        .unwrap();
    let want =
        level["best_gbps"].as_f64().unwrap() * 1e9 / model["bytes_per_token"].as_f64().unwrap();
    let got = model["decode_ceiling_tok_s"].as_f64().unwrap();
    assert!((got - want).abs() <= 1e-9 * want, "{got} vs {want}");

    // The short-context figure: the KV cache at 128 tokens instead of all
    // of them, so fewer bytes per token and a ceiling at least as high.
    let (n_ctx, kv) = (
        model["n_ctx"].as_u64().unwrap(),
        model["kv_bytes"].as_u64().unwrap(),
    );
    let short = model["short_context"].as_u64().unwrap();
    assert_eq!(short, n_ctx.min(128));
    let short_bytes = model["short_context_bytes_per_token"].as_u64().unwrap();
    assert_eq!(
        short_bytes,
        model["weights_bytes"].as_u64().unwrap() + kv * short / n_ctx
    );
    let level = v["bandwidth"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["level"] == model["short_context_level"])
        .unwrap();
    let want = level["best_gbps"].as_f64().unwrap() * 1e9 / short_bytes as f64;
    let got_short = model["decode_ceiling_short_tok_s"].as_f64().unwrap();
    assert!(
        (got_short - want).abs() <= 1e-9 * want,
        "{got_short} vs {want}"
    );
    assert!(short_bytes <= model["bytes_per_token"].as_u64().unwrap());
}

#[test]
fn model_errors_come_before_probing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let (ok, _, err) = cachefit(&["info", "-m", missing.to_str().unwrap()]);
    assert!(!ok && err.contains("missing.gguf"), "{err}");

    let tiny = dir.path().join("tiny.gguf");
    write_tiny_model(&tiny);
    let t = tiny.to_str().unwrap();
    let (ok, _, err) = cachefit(&["info", "-m", t, "-c", "0"]);
    assert!(!ok && err.contains("-c must be at least 1"), "{err}");
    let (ok, _, err) = cachefit(&["info", "-m", t, "-c", "65"]);
    assert!(!ok && err.contains("context length 64"), "{err}");
    let (ok, _, err) = cachefit(&["info", "-t", "0"]);
    assert!(!ok && err.contains("-t must be at least 1"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
