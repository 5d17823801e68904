//! Gemma 3 270M (issue 20) through every tool a user reaches for: `run`,
//! `chat`, `serve` and `bench` (perplexity against llama.cpp is in
//! perplexity.rs, logits in the model crate's parity test). Greedy text is
//! checked against llama.cpp's greedy continuation from the model crate's
//! fixture, up to its first near-tie.

mod common;
#[path = "server_support/mod.rs"]
mod server_support;

use common::cachefit;
use serde_json::Value;
use server_support::Server;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

fn model() -> Option<String> {
    testkit::model(testkit::GEMMA3_270M).map(|p| p.to_str().unwrap().to_string())
}

/// llama.cpp's greedy continuation of "The capital of France is", as text,
/// up to (not including) its first step with a top-2 gap below 0.15 (where
/// either side may pick the other token).
fn llama_cpp_greedy_prefix(m: &str) -> String {
    let path = testkit::workspace_root()
        .join("crates/model/tests/fixtures/llamacpp-gemma3-270m-q4_k_m.json");
    let fx: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let p = &fx["prompts"][0];
    assert_eq!(p["text"], "The capital of France is");
    let gaps = p["greedy_top2_gap"].as_array().unwrap();
    let n = gaps
        .iter()
        .take_while(|g| g.as_f64().unwrap() >= 0.15)
        .count();
    assert!(n >= 3, "the fixture's first tokens are no near-ties");
    let ids: Vec<u32> = p["greedy32"].as_array().unwrap()[..n]
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let file = gguf::GgufFile::open(m).unwrap();
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).unwrap();
    vocab.decode(&ids)
}

#[test]
fn run_continues_as_llama_cpp_does() {
    let Some(m) = model() else { return };
    let want = llama_cpp_greedy_prefix(&m);
    let (ok, out, err) = cachefit(&[
        "run",
        "-m",
        &m,
        "-p",
        "The capital of France is",
        "-n",
        "12",
        "--temp",
        "0",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("gemma3, 18 layers"), "{err}");
    assert!(
        out.starts_with(&want),
        "{out:?} does not start with {want:?}"
    );
}

/// No template in the file: Gemma's turn format, and the reply ends at
/// `<end_of_turn>` (an end-of-generation token) or the limit.
#[test]
fn chat_uses_gemma_turns() {
    let Some(m) = model() else { return };
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args([
            "chat",
            "-m",
            &m,
            "-n",
            "16",
            "--temp",
            "0",
            "--verbose-prompt",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("using Gemma's turn format"), "{err}");
    assert!(
        err.contains(
            "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
        ),
        "{err}"
    );
    assert!(err.contains("cachefit: reply "), "{err}");
}

#[test]
fn serve_answers_chat_and_completions() {
    let Some(m) = model() else { return };
    let server = Server::start(&m, &["-c", "512"]);
    let r = server.post(
        "/v1/completions",
        &[],
        r#"{"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let text = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
    let want = llama_cpp_greedy_prefix(&m);
    assert!(text.starts_with(&want), "{text:?} vs {want:?}");
    let r = server.post(
        "/v1/chat/completions",
        &[],
        r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let j = r.json();
    assert!(j["usage"]["prompt_tokens"].as_u64().unwrap() >= 8, "{j}");
    server.signal("-TERM");
    let (status, _) = server.wait(Duration::from_secs(30));
    assert!(status.success());
}

#[test]
fn bench_names_the_quantization_mix() {
    let Some(m) = model() else { return };
    let (ok, out, err) = cachefit(&["bench", "-m", &m, "-p", "32", "-n", "4", "-r", "1"]);
    assert!(ok, "{err}");
    assert!(out.contains("gemma3 268M Q4_K - Medium"), "{out}");
    assert!(out.contains("pp32") && out.contains("tg4"), "{out}");
}
