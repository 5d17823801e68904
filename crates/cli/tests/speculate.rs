//! Speculative decoding by prompt lookup (`--lookup`) through `run`,
//! `chat` and `serve`: the same text as without it, greedy and sampled,
//! on every architecture we load (the built-in model, the tiny fixtures of
//! each llama-family variant, and the real models when they are fetched),
//! with guesses accepted where the output copies the prompt.

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
