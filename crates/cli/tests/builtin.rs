//! The model built into the binary: `cachefit run "ROMEO:"` works with no
//! file, its greedy text is pinned by a golden file, and it is the same
//! bytes on every run and thread count. `CACHEFIT_BLESS=1` rewrites the
//! golden file (after a deliberate change of the model or the runtime).

mod common;

use common::cachefit;

use std::process::{Command, Stdio};

const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/golden/builtin-romeo-200.txt"
);

#[test]
fn greedy_200_tokens_match_the_golden_text_on_any_thread_count() {
    let args = |t: &'static str| {
        [
            "run",
            "ROMEO:",
            "-n",
            "200",
            "--temp",
            "0",
            "--ignore-eos",
            "-t",
            t,
        ]
    };
    let (ok, out, err) = cachefit(&args("1"));
    assert!(ok, "{err}");
    assert!(
        err.contains("cachefit-ternary"),
        "the built-in model is named: {err}"
    );
    if std::env::var_os("CACHEFIT_BLESS").is_some() {
        std::fs::write(GOLDEN, &out).unwrap();
    }
    let golden = std::fs::read_to_string(GOLDEN).expect("golden file (CACHEFIT_BLESS=1 writes it)");
    assert_eq!(out, golden, "greedy text of the built-in model changed");
    for t in ["1", "2"] {
        let (ok, again, err) = cachefit(&args(t));
        assert!(ok, "{err}");
        assert_eq!(again, golden, "-t {t}: not byte-identical");
    }
}

#[test]
fn other_commands_default_to_the_builtin_model() {
    let (ok, out, err) = cachefit(&["tokenize", "--ids", "ROMEO:"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("[1, "), "BOS first: {out}");
    let (ok, out, err) = cachefit(&[
        "bench", "-p", "16", "-n", "16", "-r", "1", "-t", "1", "-o", "jsonl", "--pin",
    ]);
    assert!(ok, "{err}");
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first["model_filename"], "built-in cachefit-ternary");
    assert_eq!(first["cpu_strict"], true);
    assert!(
        out.lines()
            .any(|l| l.contains("\"gen_ts_wall\":") && !l.contains("\"gen_ts_wall\":null")),
        "{out}"
    );

    // chat: one question through the model's Q/A template, then /exit.
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args(["chat", "--temp", "0", "-n", "16"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Who rules Byteisk?\n/exit\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!out.stdout.is_empty(), "chat printed a reply");
}
