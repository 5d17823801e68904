//! `cachefit inspect` through the real binary.

mod common;

use common::cachefit;

use std::process::Command;

#[test]
fn inspect_real_model_table_and_json() {
    let Some(model) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let m = model.to_str().unwrap();
    let (ok, out, err) = cachefit(&["inspect", m]);
    assert!(ok, "{err}");
    assert!(out.contains("GGUF v3"), "{out}");
    assert!(out.contains("llama.block_count") && out.contains("30"));
    assert!(out.contains("blk.0.ffn_down.weight") && out.contains("Q4_1"));
    assert!(out.contains("totals by type:"));
    assert!(
        out.contains("134515008 parameters"),
        "{}",
        out.lines().last().unwrap()
    );

    for extra in [&[][..], &["--no-mmap"][..]] {
        let mut args = vec!["inspect", m, "--json"];
        args.extend_from_slice(extra);
        let (ok, out, err) = cachefit(&args);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["version"], 3);
        assert_eq!(v["tensors"].as_array().unwrap().len(), 272);
        assert_eq!(v["n_elements"], 134515008u64);
        let by_type = v["totals_by_type"].as_array().unwrap();
        let q41 = by_type.iter().find(|t| t["type"] == "Q4_1").unwrap();
        assert_eq!(q41["tensors"], 210);
        let bpw = v["bits_per_weight"].as_f64().unwrap();
        assert!((5.0..6.0).contains(&bpw), "{bpw}");
    }
}

#[test]
fn mlock_succeeds_or_says_why() {
    let Some(model) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let m = model.to_str().unwrap();
    let (ok, _, err) = cachefit(&["inspect", m, "--mlock"]);
    if !ok {
        assert!(
            err.contains("mlock") && err.contains("refused by the OS"),
            "{err}"
        );
    }
    // Make the OS refuse: a 64 KiB locked-memory limit, and (when running as
    // root) no CAP_IPC_LOCK to bypass it. Needs util-linux's setpriv.
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("setpriv not found: not forcing an mlock refusal");
        return;
    }
    let script = format!(
        "ulimit -l 64 && exec setpriv --bounding-set -ipc_lock --inh-caps -ipc_lock {} inspect --mlock {m}",
        env!("CARGO_BIN_EXE_cachefit")
    );
    let out = Command::new("sh").arg("-c").arg(script).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("mlock of 98362432 bytes refused by the OS"),
        "{err}"
    );
    assert!(err.contains("ulimit -l"), "{err}");
}

#[test]
fn bad_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (ok, _, err) = cachefit(&["inspect", d]);
    assert!(!ok && err.contains("is a directory"), "{err}");

    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let (ok, _, err) = cachefit(&["inspect", empty.to_str().unwrap()]);
    assert!(
        !ok && err.contains("empty.gguf") && err.contains("empty"),
        "{err}"
    );

    let text = dir.path().join("notes.txt");
    std::fs::write(&text, b"just some text").unwrap();
    let (ok, _, err) = cachefit(&["inspect", text.to_str().unwrap()]);
    assert!(!ok && err.contains("not a GGUF file"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let missing = dir.path().join("missing.gguf");
    let (ok, _, err) = cachefit(&["inspect", missing.to_str().unwrap()]);
    assert!(!ok && err.contains("missing.gguf"), "{err}");
}

#[test]
fn truncated_real_model_is_a_clear_error() {
    let Some(model) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let bytes = std::fs::read(&model).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for cut in [10usize, 1000, 1_000_000, bytes.len() - 1000] {
        let p = dir.path().join(format!("cut{cut}.gguf"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let (ok, _, err) = cachefit(&["inspect", p.to_str().unwrap()]);
        assert!(!ok, "cut {cut} accepted");
        assert!(
            err.contains("truncated") || err.contains("past the end"),
            "cut {cut}: {err}"
        );
    }
}
