//! Speculative decoding by prompt lookup (`--lookup`) and with a draft
//! model (`-md`) through `run`, `chat` and `serve`: the same text as
//! without it, greedy and sampled, on every architecture we load (the
//! built-in model, the tiny fixtures of each llama-family variant, and the
//! real models when they are fetched), with guesses accepted where the
//! output copies the prompt or the draft agrees.

mod common;
#[path = "server_support/mod.rs"]
mod server_support;

use common::cachefit;
use serde_json::Value;
use server_support::Server;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A prompt whose continuation repeats it: lookup's guesses come true.
const REPEATING: &str = "one two three four five six seven eight nine ten\n\
one two three four five six seven eight nine ten\n\
one two three four five six seven eight nine ten\n\
one two three four";

/// `run --json` on `model` (None: the built-in one) with `extra` flags.
fn run_json(model: Option<&str>, prompt: &str, extra: &[&str]) -> Value {
    let mut args = vec!["run", "-t", "1", "-c", "256", "--json", "-p", prompt];
    if let Some(m) = model {
        args.extend(["-m", m]);
    }
    args.extend(extra);
    let (ok, out, err) = cachefit(&args);
    assert!(ok, "cachefit {args:?} failed: {err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Every model this machine has: the built-in one, the committed tiny
/// fixtures of each architecture, and the fetched real models.
fn models() -> Vec<Option<String>> {
    let mut all = vec![None];
    let arch = testkit::workspace_root().join("crates/model/tests/fixtures/arch");
    let mut tiny: Vec<_> = std::fs::read_dir(&arch)
        .expect("the architecture fixtures")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    tiny.sort();
    assert!(tiny.len() >= 8, "{tiny:?}");
    all.extend(
        tiny.into_iter()
            .map(|p| Some(p.to_str().unwrap().to_string())),
    );
    for name in [
        testkit::SMOLLM2_Q4_1,
        testkit::GEMMA3_270M,
        testkit::QWEN25_CODER_05B,
    ] {
        if let Some(p) = testkit::model(name) {
            all.push(Some(p.to_str().unwrap().to_string()));
        }
    }
    all
}

#[test]
fn run_gives_the_same_text_with_and_without_lookup_on_every_model() {
    for m in models() {
        let shown = m.as_deref().unwrap_or("built-in");
        for sampling in [
            &["--temp", "0"][..],
            &[
                "--temp", "1.0", "--top-k", "0", "--top-p", "1", "--min-p", "0", "-s", "7",
            ][..],
        ] {
            let mut base = vec!["-n", "40", "--ignore-eos"];
            base.extend(sampling);
            let plain = run_json(m.as_deref(), REPEATING, &base);
            let mut with = base.clone();
            with.extend(["--lookup", "--draft-max", "6"]);
            let spec = run_json(m.as_deref(), REPEATING, &with);
            assert_eq!(spec["text"], plain["text"], "{shown} {sampling:?}");
            assert_eq!(
                spec["generated_tokens"], plain["generated_tokens"],
                "{shown}"
            );
            assert_eq!(plain["speculation"], Value::Null);
            let s = &spec["speculation"];
            let (drafted, accepted) = (
                s["drafted"].as_u64().unwrap(),
                s["accepted"].as_u64().unwrap(),
            );
            assert!(accepted <= drafted, "{shown}: {s}");
            // Real models continue the count greedily: most guesses hold.
            let greedy = sampling[1] == "0";
            if m.as_deref().is_some_and(|p| !p.contains("fixtures")) && greedy {
                assert!(accepted >= 10, "{shown}: {s}");
            }
        }
    }
}

#[test]
fn bad_draft_settings_are_refused() {
    for (flags, want) in [
        (&["--lookup", "--draft-max", "0"][..], "draft"),
        (
            &["--lookup", "--draft-max", "2", "--draft-min", "3"][..],
            "draft",
        ),
    ] {
        let mut args = vec!["run", "-p", "x", "-n", "2"];
        args.extend(flags);
        let (ok, _, err) = cachefit(&args);
        assert!(!ok, "{args:?}");
        assert!(err.contains(want) && !err.contains("panicked"), "{err}");
    }
}

#[test]
fn chat_gives_the_same_replies_with_lookup() {
    let Some(m) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let m = m.to_str().unwrap();
    let reply = |extra: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cachefit"))
            .args([
                "chat", "-m", m, "-t", "1", "-c", "512", "--temp", "0", "-n", "40",
            ])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        writeln!(
            stdin,
            "Repeat exactly: the quick brown fox jumps over the lazy dog."
        )
        .unwrap();
        writeln!(stdin, "Again, twice.").unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let plain = reply(&[]);
    assert!(plain.contains("fox"), "{plain}");
    assert_eq!(reply(&["--lookup"]), plain);
}

#[test]
fn serve_gives_the_same_completions_with_lookup() {
    let body = format!(
        r#"{{"prompt": {}, "max_tokens": 40, "temperature": 0, "ignore_eos": true}}"#,
        serde_json::to_string(REPEATING).unwrap()
    );
    let complete = |extra: &[&str]| {
        let server = Server::start_builtin(extra);
        let r = server.post("/v1/completions", &[], &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let text = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
        server.signal("-TERM");
        let (status, _) = server.wait(Duration::from_secs(30));
        assert!(status.success());
        text
    };
    let plain = complete(&[]);
    assert_eq!(complete(&["--lookup", "--parallel", "2"]), plain);
}

/// Every model file here (the built-in model has no file to name with -md).
fn model_files() -> Vec<String> {
    models().into_iter().flatten().collect()
}

#[test]
fn run_gives_the_same_text_with_a_draft_model_on_every_model() {
    for m in model_files() {
        for sampling in [
            &["--temp", "0"][..],
            &[
                "--temp", "1.0", "--top-k", "0", "--top-p", "1", "--min-p", "0", "-s", "7",
            ][..],
        ] {
            let mut base = vec!["-n", "40", "--ignore-eos"];
            base.extend(sampling);
            let prompt = "Once upon a time";
            let plain = run_json(Some(&m), prompt, &base);
            // The model drafting for itself: every greedy guess is right,
            // so a mistake in the bookkeeping (positions, caches, rows)
            // shows as different text, not as a lower acceptance.
            let mut with = base.clone();
            with.extend(["-md", &m, "--draft-max", "5", "--draft-p-min", "0"]);
            let spec = run_json(Some(&m), prompt, &with);
            assert_eq!(spec["text"], plain["text"], "{m} {sampling:?}");
            assert_eq!(spec["generated_tokens"], plain["generated_tokens"], "{m}");
            let s = &spec["speculation"];
            let (drafted, accepted) = (
                s["drafted"].as_u64().unwrap(),
                s["accepted"].as_u64().unwrap(),
            );
            assert!(accepted <= drafted, "{m}: {s}");
            assert!(s["draft_model_passes"].as_u64().unwrap() > 0, "{m}: {s}");
            if sampling[1] == "0" {
                // Greedy: only the last draft may run past the budget.
                assert!(accepted + 5 >= drafted && accepted >= 30, "{m}: {s}");
            }
            // With lookup too: lookup first, the draft model where it has
            // nothing; still the same text.
            with.push("--lookup");
            let both = run_json(Some(&m), prompt, &with);
            assert_eq!(
                both["text"], plain["text"],
                "{m} {sampling:?} with --lookup"
            );
        }
    }
}

/// A smaller quantization of the same model as the draft: the real use.
#[test]
fn a_smaller_quantization_drafts_for_the_model() {
    let Some(small) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let small = small.to_str().unwrap();
    // SmolLM2 Q4_1 requantized to Q8_0 is the target, Q4_1 the draft.
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("smollm2-q8_0.gguf");
    let big = big.to_str().unwrap();
    let (ok, _, err) = cachefit(&["quantize", "--allow-requantize", small, big, "Q8_0"]);
    assert!(ok, "{err}");
    let base = ["--temp", "0", "-n", "48", "--ignore-eos"];
    let prompt = "The capital of France is";
    let plain = run_json(Some(big), prompt, &base);
    let mut with = base.to_vec();
    with.extend(["-md", small]);
    let spec = run_json(Some(big), prompt, &with);
    assert_eq!(spec["text"], plain["text"]);
    let s = &spec["speculation"];
    let (drafted, accepted) = (
        s["drafted"].as_u64().unwrap(),
        s["accepted"].as_u64().unwrap(),
    );
    assert!(accepted * 10 >= drafted * 7, "{s}");
}

#[test]
fn a_draft_model_must_share_the_vocabulary() {
    let arch = testkit::workspace_root().join("crates/model/tests/fixtures/arch");
    let fixture = arch.join("phi3.gguf");
    let fixture = fixture.to_str().unwrap();
    // The built-in model's vocabulary is not the fixture's.
    let (ok, _, err) = cachefit(&["run", "-p", "x", "-n", "2", "-md", fixture]);
    assert!(!ok);
    assert!(
        err.contains("-md") && err.contains("vocabulary") && !err.contains("panicked"),
        "{err}"
    );
    let (ok, _, err) = cachefit(&[
        "run",
        "-p",
        "x",
        "-n",
        "2",
        "-md",
        "/nonexistent/draft.gguf",
    ]);
    assert!(!ok);
    assert!(
        err.contains("-md") && err.contains("draft.gguf") && !err.contains("panicked"),
        "{err}"
    );
    for p in ["1.5", "-0.1", "nan"] {
        let p = format!("--draft-p-min={p}");
        let (ok, _, err) = cachefit(&[
            "run", "-p", "x", "-n", "2", "-m", fixture, "-md", fixture, &p,
        ]);
        assert!(!ok, "{p}");
        assert!(
            err.contains("--draft-p-min: the least draft probability") && !err.contains("panicked"),
            "{err}"
        );
    }
}

#[test]
fn chat_and_serve_give_the_same_text_with_a_draft_model() {
    let arch = testkit::workspace_root().join("crates/model/tests/fixtures/arch");
    let m = arch.join("gemma3.gguf");
    let m = m.to_str().unwrap();
    let reply = |extra: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cachefit"))
            .args([
                "chat", "-m", m, "-t", "1", "-c", "256", "--temp", "0", "-n", "24",
            ])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "Hello there").unwrap();
        writeln!(stdin, "And again").unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let plain = reply(&[]);
    assert!(!plain.trim().is_empty());
    assert_eq!(reply(&["-md", m, "--draft-p-min", "0"]), plain);

    let body = r#"{"prompt": "Hello", "max_tokens": 24, "temperature": 0, "ignore_eos": true}"#;
    let complete = |extra: &[&str]| {
        let mut args = vec!["-c", "256"];
        args.extend(extra);
        let server = Server::start(m, &args);
        let r = server.post("/v1/completions", &[], body);
        assert_eq!(r.status, 200, "{}", r.body);
        let text = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
        server.signal("-TERM");
        let (status, _) = server.wait(Duration::from_secs(30));
        assert!(status.success());
        text
    };
    let plain = complete(&[]);
    assert_eq!(
        complete(&["-md", m, "--draft-p-min", "0", "--parallel", "2"]),
        plain
    );
}
