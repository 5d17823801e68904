//! `cachefit bench` through the real binary: every output format parses
//! and carries llama-bench's field names, `-pg`, `-d` and `--evict` do what
//! they say, bad flags fail with a message and exit 1. A tiny synthetic
//! model keeps most tests fast; the real SmolLM2 runs once.

use gguf::{Builder, GgmlType, Metadata, TensorSpec, Value};
use serde_json::Value as Json;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

/// One benchmark at a time: they share two cores with each other and
/// everything else, and each probes memory bandwidth.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn cachefit(args: &[&str]) -> (i32, String, String) {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args(args)
        .output()
        .expect("run cachefit");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn bench_ok(args: &[&str]) -> String {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    let (code, out, err) = cachefit(&all);
    assert_eq!(code, 0, "cachefit {all:?}\nstderr:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    out
}

fn bench_json(args: &[&str]) -> Vec<Json> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = bench_ok(&all);
    let v: Json = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v.as_array().expect("a JSON array").clone()
}

const DIM: u64 = 64;
const FFN: u64 = 96;
const HEADS: u64 = 4;
const KV_HEADS: u64 = 2;
const HEAD_DIM: u64 = 16;
const VOCAB: u64 = 50;

/// A two-layer llama with small random F32 weights and no tokenizer
/// (bench needs none).
fn write_tiny_model(path: &Path) {
    let mut md = Metadata::new();
    md.set("general.architecture", Value::String("llama".into()));
    for (k, v) in [
        ("block_count", 2),
        ("context_length", 256),
        ("embedding_length", DIM),
        ("feed_forward_length", FFN),
        ("attention.head_count", HEADS),
        ("attention.head_count_kv", KV_HEADS),
        ("vocab_size", VOCAB),
    ] {
        md.set(format!("llama.{k}"), Value::U32(v as u32));
    }
    md.set("llama.rope.freq_base", Value::F32(10000.0));
    md.set("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-6));
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut tensors: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![DIM, VOCAB]),
        ("output_norm.weight".into(), vec![DIM]),
        ("output.weight".into(), vec![DIM, VOCAB]),
    ];
    for i in 0..2 {
        for (name, dims) in [
            ("attn_norm.weight", vec![DIM]),
            ("attn_q.weight", vec![DIM, q]),
            ("attn_k.weight", vec![DIM, kv]),
            ("attn_v.weight", vec![DIM, kv]),
            ("attn_output.weight", vec![q, DIM]),
            ("ffn_norm.weight", vec![DIM]),
            ("ffn_gate.weight", vec![DIM, FFN]),
            ("ffn_up.weight", vec![DIM, FFN]),
            ("ffn_down.weight", vec![FFN, DIM]),
        ] {
            tensors.push((format!("blk.{i}.{name}"), dims));
        }
    }
    let mut b = Builder::new(md);
    for (name, dims) in &tensors {
        b.add_tensor(TensorSpec {
            name: name.clone(),
            dims: dims.clone(),
            ty: GgmlType::F32,
        })
        .unwrap();
    }
    let mut w = b
        .write_header(std::io::BufWriter::new(
            std::fs::File::create(path).unwrap(),
        ))
        .unwrap();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    for (name, dims) in &tensors {
        let n: u64 = dims.iter().product();
        let norm = name.contains("norm");
        let bytes: Vec<u8> = (0..n)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let r = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5; // [-0.5, 0.5)
                let v = if norm { 1.0 + 0.2 * r } else { 0.4 * r };
                v.to_le_bytes()
            })
            .collect();
        w.write_tensor(&bytes).unwrap();
    }
    w.finish().unwrap();
}

fn tiny() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path);
    let p = path.to_str().unwrap().to_string();
    (dir, p)
}

/// The llama-bench fields every JSON record carries.
const LLAMA_BENCH_FIELDS: [&str; 20] = [
    "build_commit",
    "cpu_info",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_batch",
    "n_threads",
    "type_k",
    "type_v",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
    "samples_ns",
    "samples_ts",
];

const OUR_FIELDS: [&str; 10] = [
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "bytes_per_token",
    "eff_bandwidth_gbps",
    "mem_level",
    "level_bandwidth_gbps",
    "bandwidth_pct",
    "test",
];

/// The commit a binary built from this checkout reports: git's short
/// HEAD, or "unknown" outside a git checkout.
fn head_commit() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    Command::new("git")
        .args(["rev-parse", "--short=7", "HEAD"])
        .current_dir(&root)
        .output()
        .ok()
        .filter(|o| o.status.success() && root.join(".git").exists())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}

fn check_record(r: &Json, reps: usize) {
    for f in LLAMA_BENCH_FIELDS.iter().chain(&OUR_FIELDS) {
        assert!(r.get(f).is_some(), "missing {f} in {r}");
    }
    assert_eq!(r["samples_ns"].as_array().unwrap().len(), reps, "{r}");
    assert_eq!(r["samples_ts"].as_array().unwrap().len(), reps, "{r}");
    let avg = r["avg_ts"].as_f64().unwrap();
    assert!(avg.is_finite() && avg > 0.0, "{r}");
    assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0, "{r}");
    assert!(r["avg_ns"].as_u64().unwrap() > 0, "{r}");
    assert!(r["level_bandwidth_gbps"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["bandwidth_pct"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["bytes_per_token"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["build_commit"], head_commit().as_str(), "{r}");
    let (p, n) = (
        r["n_prompt"].as_u64().unwrap(),
        r["n_gen"].as_u64().unwrap(),
    );
    // Time to first token only when there is a prompt, time per output
    // token only when there is generation.
    assert_eq!(r["ttft_ms_p50"].is_number(), p > 0, "{r}");
    assert_eq!(r["tpot_ms_p99"].is_number(), n > 0, "{r}");
    if n > 0 {
        assert!(
            r["tpot_ms_p99"].as_f64() >= r["tpot_ms_p50"].as_f64(),
            "{r}"
        );
    }
}

#[test]
fn json_has_llama_bench_fields_and_ours() {
    let (_dir, m) = tiny();
    let recs = bench_json(&["-m", &m, "-p", "16", "-n", "8", "-r", "2", "-t", "1,2"]);
    let tests: Vec<(u64, u64, u64)> = recs
        .iter()
        .map(|r| {
            check_record(r, 2);
            (
                r["n_threads"].as_u64().unwrap(),
                r["n_prompt"].as_u64().unwrap(),
                r["n_gen"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(tests, [(1, 16, 0), (1, 0, 8), (2, 16, 0), (2, 0, 8)]);
    let r = &recs[0];
    assert_eq!(r["model_filename"], m.as_str());
    let ty = r["model_type"].as_str().unwrap();
    assert!(ty.starts_with("llama ") && ty.ends_with("K F32"), "{ty}");
    assert_eq!(r["type_k"], "f16");
    assert_eq!(r["test"], "pp16");
    assert!(r.get("evict_ratio").is_none());
}

#[test]
fn pg_and_depth_as_one_figure() {
    let (_dir, m) = tiny();
    let out = bench_ok(&[
        "-m", &m, "-p", "0", "-n", "0", "-pg", "8,4", "-d", "4", "-r", "2", "-t", "1", "-o",
        "jsonl",
    ]);
    let recs: Vec<Json> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(recs.len(), 1, "{out}");
    let r = &recs[0];
    check_record(r, 2);
    assert_eq!(
        (
            r["n_prompt"].as_u64(),
            r["n_gen"].as_u64(),
            r["n_depth"].as_u64()
        ),
        (Some(8), Some(4), Some(4))
    );
    assert_eq!(r["test"], "pp8+tg4 @ d4");
    // t/s counts prompt and generated tokens, as llama-bench does.
    let ns = r["samples_ns"][0].as_f64().unwrap();
    let ts = r["samples_ts"][0].as_f64().unwrap();
    assert!((ts - 12.0 * 1e9 / ns).abs() < 1e-6 * ts, "{r}");
}

/// Split a CSV line whose values are all quoted (llama-bench style).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

#[test]
fn csv_and_markdown() {
    let (_dir, m) = tiny();
    let out = bench_ok(&[
        "-m", &m, "-p", "8", "-n", "4", "-r", "2", "-t", "1", "-o", "csv",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    let header: Vec<&str> = lines[0].split(',').collect();
    for f in LLAMA_BENCH_FIELDS.iter().chain(&OUR_FIELDS) {
        // llama-bench's CSV leaves the sample arrays out; so do we.
        if !f.starts_with("samples_") {
            assert!(header.contains(f), "{f} not in {header:?}");
        }
    }
    for row in &lines[1..] {
        let values = csv_fields(row);
        assert_eq!(values.len(), header.len(), "{row}");
        let at = |f: &str| &values[header.iter().position(|h| *h == f).unwrap()];
        assert!(at("avg_ts").parse::<f64>().unwrap() > 0.0);
        assert_eq!(at("model_filename"), &m);
    }

    let out = bench_ok(&["-m", &m, "-p", "8", "-n", "4", "-r", "2", "-t", "1"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("| model"), "{out}");
    for col in ["size", "params", "backend", "threads", "test", "t/s"] {
        assert!(
            lines[0].contains(&format!(" {col} ")),
            "{col}: {}",
            lines[0]
        );
    }
    assert!(
        lines[2].contains(" pp8 ") && lines[2].contains(" CPU "),
        "{out}"
    );
    assert!(
        lines[3].contains(" tg4 ") && lines[3].contains(" ± "),
        "{out}"
    );
    assert!(out.contains("\nbuild: "), "{out}");
}

#[test]
fn no_probe_measures_no_bandwidth() {
    let (_dir, m) = tiny();
    let mut all = vec![
        "bench", "-m", &m, "-p", "8", "-n", "0", "-r", "1", "-t", "1",
    ];
    let (code, out, err) = cachefit(&all);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("read bandwidth ("), "{err}");
    assert!(out.contains("level read bandwidth (best pass): "), "{out}");
    all.push("--no-probe");
    let (code, out, err) = cachefit(&all);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("read bandwidth ("), "{err}");
    assert!(
        out.contains("level read bandwidth: not measured (--no-probe)"),
        "{out}"
    );
    let mut all = all.clone();
    all.extend(["-o", "json"]);
    let (_, out, _) = cachefit(&all);
    let v: Json = serde_json::from_str(&out).unwrap();
    // Not measured: null, not a made-up zero (and no percentage of it).
    assert!(v[0]["level_bandwidth_gbps"].is_null(), "{out}");
    assert!(v[0]["bandwidth_pct"].is_null(), "{out}");
    let mut md = all[..all.len() - 2].to_vec();
    md.extend(["-o", "md"]);
    let (_, out, _) = cachefit(&md);
    let row = out.lines().find(|l| l.contains("pp8")).expect("a pp8 row");
    assert!(!row.contains('%'), "{row}");
}

#[test]
fn evict_reports_clean_evicted_and_ratio() {
    let (_dir, m) = tiny();
    let recs = bench_json(&[
        "-m", &m, "-p", "0", "-n", "8", "-r", "2", "-t", "1", "--evict", "read",
    ]);
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    check_record(r, 2);
    assert_eq!(r["evict_mode"], "read");
    assert!(r["evict_bytes"].as_u64().unwrap() > 0, "{r}");
    let (clean, evicted, ratio) = (
        r["clean_ts"].as_f64().unwrap(),
        r["evicted_ts"].as_f64().unwrap(),
        r["evict_ratio"].as_f64().unwrap(),
    );
    assert_eq!(clean, r["avg_ts"].as_f64().unwrap());
    assert!(evicted > 0.0 && ratio > 0.0, "{r}");
    assert!((ratio - evicted / clean).abs() < 1e-9, "{r}");
    assert!(r["evict_passes"].as_u64().unwrap() >= 1, "{r}");

    let out = bench_ok(&[
        "-m", &m, "-p", "0", "-n", "4", "-r", "2", "-t", "1", "--evict", "write",
    ]);
    assert!(
        out.lines().next().unwrap().contains("evicted/clean"),
        "{out}"
    );
    assert!(out.contains("evict: write sweep"), "{out}");
}

#[test]
fn bad_flags_fail_with_a_message() {
    let (_dir, m) = tiny();
    let cases: [(&[&str], &str); 9] = [
        (&["-m", &m, "-t", "1,,2"], "empty item"),
        (&["-m", &m, "-p", "x"], "`x` is not a whole number"),
        (&["-m", &m, "-r", "0"], "-r must be at least 1"),
        (&["-m", &m, "-t", "0"], "must be at least 1"),
        (&["-m", &m, "-pg", "5"], "two numbers"),
        (&["-m", &m, "-p", "0", "-n", "0"], "nothing to benchmark"),
        (
            &["-m", &m, "-p", "300", "-n", "0"],
            "more than the model's 256",
        ),
        (&["-m", "/no/such/model.gguf"], "not found"),
        // No -m: the built-in model, with its own limits.
        (&["-p", "2000", "-n", "0"], "more than the model's 1024"),
    ];
    for (args, want) in cases {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        let (code, _, err) = cachefit(&all);
        assert_eq!(code, 1, "{all:?}: {err}");
        assert!(err.contains(want), "{all:?}: want {want:?} in {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn real_model_small_sizes() {
    let Some(path) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let m = path.to_str().unwrap();
    let recs = bench_json(&["-m", m, "-p", "16", "-n", "8", "-r", "2", "-t", "1"]);
    assert_eq!(recs.len(), 2);
    for r in &recs {
        check_record(r, 2);
        assert!(r["model_type"].as_str().unwrap().contains("Q4_1"), "{r}");
        assert_eq!(r["model_n_params"].as_u64(), Some(134_515_008));
    }
    // About 92 MiB of weights per token: a decode reads them all.
    let bpt = recs[1]["bytes_per_token"].as_u64().unwrap();
    assert!(bpt > 80 << 20 && bpt < 100 << 20, "{bpt}");
}
