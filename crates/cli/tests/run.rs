//! `cachefit run` through the real binary.

mod common;

use common::cachefit;

fn model() -> Option<String> {
    testkit::model(testkit::SMOLLM2_Q4_1).map(|p| p.to_str().unwrap().to_string())
}

#[test]
fn greedy_continuation_streams_and_reports_timings() {
    let Some(m) = model() else { return };
    let p = "The capital of France is";
    let (ok, out, err) = cachefit(&[
        "run", "--temp", "0", "-m", &m, "-p", p, "-n", "8", "-t", "2",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("Paris"), "{out:?}");
    assert!(
        err.contains("prompt eval time") && err.contains("tokens per second"),
        "{err}"
    );
    assert!(err.contains("2 threads"), "{err}");

    // Without -t: the physical cores available, with the reason logged.
    let (ok, _, err) = cachefit(&["run", "--temp", "0", "-m", &m, "-p", p, "-n", "1"]);
    assert!(ok, "{err}");
    assert!(err.contains("physical core"), "{err}");

    // Same tokens on one thread, and with the file read into memory.
    let (ok, out1, err) = cachefit(&[
        "run",
        "--temp",
        "0",
        "-m",
        &m,
        "-p",
        p,
        "-n",
        "8",
        "-t",
        "1",
        "--no-mmap",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, out1);
}

#[test]
fn threads_batch_reads_the_prompt_on_its_own_pool() {
    let Some(m) = model() else { return };
    // A prompt of several tokens, so it goes through the batch pool.
    let p = "The capital of France is";
    let run = |args: &[&str]| {
        let mut all = vec!["run", "--temp", "0", "-m", &m, "-p", p, "-n", "8", "--json"];
        all.extend_from_slice(args);
        let (ok, out, err) = cachefit(&all);
        assert!(ok, "{args:?}: {err}");
        (
            serde_json::from_str::<serde_json::Value>(&out).unwrap(),
            err,
        )
    };
    let (plain, err) = run(&["-t", "1"]);
    assert_eq!(plain["threads_batch"], 1, "{plain}");
    assert!(!err.contains("for prompts"), "{err}");
    // llama.cpp's spelling and ours; the kernels give the same bits on
    // any thread count, so the same tokens.
    for tb in [["-tb", "2"], ["--threads-batch", "2"]] {
        let (v, err) = run(&["-t", "1", tb[0], tb[1]]);
        assert!(
            err.contains("1 thread (set with -t), 2 for prompts"),
            "{err}"
        );
        assert_eq!(
            (v["threads"].clone(), v["threads_batch"].clone()),
            (1.into(), 2.into())
        );
        assert_eq!(v["text"], plain["text"]);
    }
    let (v, err) = run(&["-t", "2", "-tb=1"]);
    assert!(
        err.contains("2 threads (set with -t), 1 for prompts"),
        "{err}"
    );
    assert_eq!(v["text"], plain["text"]);
    // -ub caps the tokens per pass below -b: the prompt goes through in
    // passes of 2, to the same tokens.
    let (v, err) = run(&["-t", "1", "-b", "64", "-ub", "2"]);
    assert!(err.contains("batch 2,"), "{err}");
    assert_eq!(v["text"], plain["text"]);
}

#[test]
fn cpu_mask_and_range_choose_the_cpus_and_the_default_threads() {
    let Some(m) = model() else { return };
    let first = machine::allowed_cpus()[0];
    let masks = [
        vec!["-C".to_string(), format!("0x{:x}", 1u128 << first.min(127))],
        vec!["--cpu-range".to_string(), first.to_string()],
    ];
    for mask in &masks {
        if first >= 127 {
            break; // the hex mask above cannot name it
        }
        let mut args = vec![
            "run", "--temp", "0", "-m", &m, "-p", "Hi", "-n", "2", "--json",
        ];
        args.extend(mask.iter().map(String::as_str));
        let (ok, out, err) = cachefit(&args);
        assert!(ok, "{mask:?}: {err}");
        // One CPU allowed, so one thread by default, and the log says why.
        assert!(
            err.contains(&format!(
                "1 thread (1 physical core available (affinity {first}"
            )),
            "{err}"
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["threads"], 1, "{v}");
    }
}

#[test]
fn json_and_prompt_file() {
    let Some(m) = model() else { return };
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("prompt.txt");
    std::fs::write(&f, "The capital of France is").unwrap();
    let (ok, out, err) = cachefit(&[
        "run",
        "--temp",
        "0",
        "-m",
        &m,
        "-f",
        f.to_str().unwrap(),
        "-n",
        "6",
        "--json",
        "-c",
        "128",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["text"].as_str().unwrap().contains("Paris"), "{v}");
    assert_eq!(v["prompt_tokens"], 5);
    assert_eq!(v["generated_tokens"], 6);
    assert_eq!(v["stop"], "length");
    assert_eq!(v["n_ctx"], 128);
    assert!(v["gen_tok_s"].as_f64().unwrap() > 0.0);

    // Sampling with a seed is reproducible.
    let args = [
        "run",
        "-m",
        &m,
        "-p",
        "Once upon a time",
        "-n",
        "12",
        "--temp",
        "0.8",
        "--seed",
        "42",
        "--json",
    ];
    let (ok, a, err) = cachefit(&args);
    assert!(ok, "{err}");
    let (_, b, _) = cachefit(&args);
    let text = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap()["text"].clone();
    assert_eq!(text(&a), text(&b));
}

#[test]
fn stops_at_end_of_generation_unless_ignored() {
    let Some(m) = model() else { return };
    // A chat turn ends with <|im_end|>.
    let p = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n";
    let (ok, out, err) = cachefit(&[
        "run", "--temp", "0", "-m", &m, "-p", p, "-n", "200", "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stop"], "eog", "{v}");
    assert!(v["generated_tokens"].as_u64().unwrap() < 200);
    let (ok, out, err) = cachefit(&[
        "run",
        "-m",
        &m,
        "-p",
        p,
        "-n",
        "40",
        "--json",
        "--ignore-eos",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["stop"].as_str(), v["generated_tokens"].as_u64()),
        (Some("length"), Some(40))
    );
}

#[test]
fn stop_strings_penalties_and_cache_types() {
    let Some(m) = model() else { return };
    let p = "The capital of France is";
    let json = |args: &[&str]| -> serde_json::Value {
        let mut a = vec!["run", "--temp", "0", "-m", &m, "-p", p, "--json"];
        a.extend_from_slice(args);
        let (ok, out, err) = cachefit(&a);
        assert!(ok, "{args:?}: {err}");
        serde_json::from_str(&out).unwrap()
    };
    let base = json(&["-n", "24"]);
    let text = base["text"].as_str().unwrap().to_string();
    assert!(text.starts_with(" Paris."), "{text:?}");

    // --stop cuts the output before the stop string and says so.
    let v = json(&["-n", "24", "--stop", "."]);
    assert_eq!(
        (
            v["text"].as_str(),
            v["stop"].as_str(),
            v["stop_string"].as_str()
        ),
        (Some(" Paris"), Some("stop"), Some("."))
    );
    // A stop string that never occurs changes nothing.
    let v = json(&["-n", "24", "--stop", "zzzz-never"]);
    assert_eq!(v["text"], base["text"]);

    // A strong repeat penalty changes a greedy continuation that repeats.
    let v = json(&["-n", "24", "--repeat-penalty", "3.0"]);
    assert_ne!(v["text"], base["text"], "repeat penalty had no effect");
    let v = json(&[
        "-n",
        "24",
        "--presence-penalty",
        "5",
        "--frequency-penalty",
        "2",
    ]);
    assert_ne!(
        v["text"], base["text"],
        "presence/frequency penalties had no effect"
    );

    // Prompt batch sizes give the same greedy text (bit-identical logits),
    // and the q8_0 and f32 caches still answer Paris.
    for b in ["1", "3", "512"] {
        assert_eq!(json(&["-n", "24", "-b", b])["text"], base["text"], "-b {b}");
    }
    for ct in ["q8_0", "f32"] {
        let v = json(&["-n", "4", "--cache-type", ct]);
        assert!(
            v["text"].as_str().unwrap().starts_with(" Paris"),
            "{ct}: {v}"
        );
    }
}

#[test]
fn clear_errors() {
    let Some(m) = model() else { return };
    let fails = |args: &[&str], want: &str| {
        let (ok, out, err) = cachefit(args);
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(err.contains(want), "{args:?}: {err}");
    };
    fails(&["run", "-m", &m, "-p", ""], "prompt is empty");
    fails(
        &["run", "-m", &m, "-p", "x", "-c", "100000"],
        "larger than the model's context length 8192",
    );
    let long = "word ".repeat(100);
    fails(&["run", "-m", &m, "-p", &long, "-c", "16"], "context of 16");
    fails(&["run", "-m", &m], "no prompt: give one");
    let far = format!("0x1{}", "0".repeat(300)); // CPU 1200
                                                 // One bad flag value after a good prompt.
    for (flag, value, want) in [
        ("--cache-type", "q4_0", "unknown cache type"),
        ("-b", "0", "-b must be at least 1"),
        ("-ub", "0", "-ub must be at least 1"),
        ("-t", "0", "-t must be at least 1"),
        ("-tb", "0", "--threads-batch must be at least 1"),
        ("-C", "0x0", "-C 0x0 selects no CPU"),
        ("-C", "0xq", "not a hexadecimal CPU mask"),
        ("--cpu-range", "3-1", "not a CPU list"),
        (
            "-C",
            &far,
            "selects CPU 1200, which this process may not use",
        ),
    ] {
        fails(&["run", "-m", &m, "-p", "x", flag, value], want);
    }
    fails(&["run", "-m", &m, "-p", "x", "--temp", "-1"], "--temp");
    fails(&["run", "-m", &m, "-p", "x", "--top-p", "1.5"], "--top-p");
    fails(
        &["run", "-m", &m, "-p", "x", "--repeat-penalty", "0"],
        "--repeat-penalty",
    );
    fails(
        &["run", "-m", "/nonexistent.gguf", "-p", "x"],
        "/nonexistent.gguf",
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, b"ok \xff\xfe").unwrap();
    fails(
        &["run", "-m", &m, "-f", bad.to_str().unwrap()],
        "not valid UTF-8",
    );

    // -n 0: nothing generated, says so, succeeds.
    let (ok, out, err) = cachefit(&["run", "--temp", "0", "-m", &m, "-p", "Hi", "-n", "0"]);
    assert!(ok, "{err}");
    assert!(
        out.is_empty() && err.contains("nothing to generate"),
        "{out} {err}"
    );
}

#[test]
fn model_without_tokenizer_or_unknown_arch() {
    let Some(m) = model() else { return };
    // The model's metadata without tokenizer keys / with another arch.
    let src = gguf::GgufFile::open(&m).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, edit, want) in [
        ("notok.gguf", "tokenizer", "no usable tokenizer"),
        (
            "arch.gguf",
            "arch",
            "not supported (supported: llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, cachefit)",
        ),
    ] {
        let mut md = src.metadata().clone();
        if edit == "tokenizer" {
            let keys: Vec<String> = md
                .entries()
                .iter()
                .map(|(k, _)| k.clone())
                .filter(|k| k.starts_with("tokenizer."))
                .collect();
            for k in keys {
                md.remove(&k);
            }
        } else {
            md.set("general.architecture", gguf::Value::String("mamba".into()));
        }
        let out = dir.path().join(name);
        write_with_metadata(md, &out);
        let (ok, _, err) = cachefit(&[
            "run",
            "--temp",
            "0",
            "-m",
            out.to_str().unwrap(),
            "-p",
            "Hi",
            "-n",
            "1",
        ]);
        assert!(!ok);
        assert!(err.contains(want), "{name}: {err}");
    }
}

/// A file with `md` and no tensors: both checks fail before any tensor is
/// read.
fn write_with_metadata(md: gguf::Metadata, out: &std::path::Path) {
    let f = std::fs::File::create(out).unwrap();
    gguf::Builder::new(md)
        .write_header(f)
        .unwrap()
        .finish()
        .unwrap();
}
