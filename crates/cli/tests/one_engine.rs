//! One engine behind `run`, `chat` and `serve` (issue #17): the same
//! greedy text for the same prompt and settings through `run`, one piped
//! `chat` turn, `/v1/completions` and `/v1/chat/completions` — plain, with
//! `--ignore-eos`, and with a stop string — on SmolLM2 and on the built-in
//! model.

mod server_support;

use server_support::Server;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use chat::{ChatTemplate, Message};
use serde_json::{json, Value};

/// One way of generating, as command-line flags and as request fields.
struct Variant {
    name: &'static str,
    ignore_eos: bool,
    stop: Vec<String>,
}

fn as_str(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The text a run/chat command printed (stdout, minus chat's newline).
fn cli(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

fn same_text_everywhere(model: Option<PathBuf>, message: &str, n: usize) {
    let path = model
        .clone()
        .unwrap_or_else(|| testkit::workspace_root().join("models/cachefit-ternary.gguf"));
    let file = gguf::GgufFile::open(&path).unwrap();
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).unwrap();
    let text = |id: Option<u32>| id.and_then(|i| vocab.token_text(i));
    let template =
        ChatTemplate::from_gguf(file.metadata(), text(vocab.bos()), text(vocab.eos())).unwrap();
    let rendered = template.render(&[Message::user(message)], true).unwrap();
    // What ends a chat turn besides the vocabulary's end tokens: `run` and
    // `/v1/completions` are told it as stop strings.
    let turn = engine::prompt::turn_end(&template, &vocab);
    assert!(turn.eog.is_empty(), "a template with its own end tokens");

    let m_args: Vec<String> = match &model {
        Some(p) => vec!["-m".into(), p.to_str().unwrap().into()],
        None => vec![],
    };
    let n_s = n.to_string();
    let common: Vec<&str> = ["--temp", "0", "-n", &n_s, "-c", "512", "-t", "1"].to_vec();

    let srv_args = ["--parallel", "2", "-c", "512"];
    let server = match &model {
        Some(p) => Server::start(p.to_str().unwrap(), &srv_args),
        None => Server::start_builtin(&srv_args),
    };

    // The plain greedy text picks the stop string of the third variant: a
    // piece from its middle, so the cut shows.
    let turn_stops: Vec<String> = turn
        .stop
        .iter()
        .flat_map(|s| ["--stop".to_string(), s.clone()])
        .collect();
    let base = cli(
        &[
            &["run"],
            &as_str(&m_args)[..],
            &common,
            &as_str(&turn_stops),
            &["-p", &rendered],
        ]
        .concat(),
        None,
    );
    let base = base.strip_suffix('\n').unwrap_or(&base).to_string();
    let mid: String = base
        .chars()
        .skip(base.chars().count() / 2)
        .take(3)
        .collect();
    assert!(
        !mid.trim().is_empty(),
        "a greedy text of some length: {base:?}"
    );
    let variants = [
        Variant {
            name: "plain",
            ignore_eos: false,
            stop: vec![],
        },
        Variant {
            name: "ignore-eos",
            ignore_eos: true,
            stop: vec![],
        },
        Variant {
            name: "stop string",
            ignore_eos: false,
            stop: vec![mid.clone()],
        },
    ];
    for v in &variants {
        let mut flags: Vec<String> = m_args.clone();
        flags.extend(common.iter().map(|s| s.to_string()));
        if v.ignore_eos {
            flags.push("--ignore-eos".into());
        }
        for s in &v.stop {
            flags.extend(["--stop".into(), s.clone()]);
        }
        let mut run_flags = flags.clone();
        run_flags.extend(turn_stops.iter().cloned());

        let run = cli(
            &[&["run"], &as_str(&run_flags)[..], &["-p", &rendered]].concat(),
            None,
        );
        let run = run.strip_suffix('\n').unwrap_or(&run).to_string();
        let chat = cli(
            &[&["chat"], &as_str(&flags)[..]].concat(),
            Some(&format!("{message}\n")),
        );
        let chat = chat.strip_suffix('\n').unwrap_or(&chat).to_string();

        let mut completion_stop: Vec<String> = v.stop.clone();
        completion_stop.extend(turn.stop.iter().cloned());
        let completions = server.post(
            "/v1/completions",
            &[],
            &json!({"prompt": rendered, "temperature": 0, "max_tokens": n,
                    "ignore_eos": v.ignore_eos, "stop": completion_stop})
            .to_string(),
        );
        assert_eq!(completions.status, 200, "{}", completions.body);
        let completions = completions.json()["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_string();
        let chat_completions = server.post(
            "/v1/chat/completions",
            &[],
            &json!({"messages": [{"role": "user", "content": message}], "temperature": 0,
                    "max_tokens": n, "ignore_eos": v.ignore_eos, "stop": v.stop})
            .to_string(),
        );
        assert_eq!(chat_completions.status, 200, "{}", chat_completions.body);
        let chat_completions: Value = chat_completions.json();
        let chat_completions = chat_completions["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();

        let what = format!("{} ({})", path.display(), v.name);
        assert!(!run.is_empty(), "{what}: no text");
        assert_eq!(chat, run, "{what}: chat vs run");
        assert_eq!(completions, run, "{what}: /v1/completions vs run");
        assert_eq!(chat_completions, run, "{what}: /v1/chat/completions vs run");
        if v.name == "stop string" {
            assert!(
                !run.contains(&mid) && base.starts_with(&run),
                "{what}: {run:?}"
            );
        }
        if v.name == "plain" {
            assert_eq!(run, base);
        }
    }
}

#[test]
fn smollm2_same_text_through_run_chat_and_serve() {
    let Some(m) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    same_text_everywhere(Some(m), "What is the capital of France?", 40);
}

#[test]
fn builtin_model_same_text_through_run_chat_and_serve() {
    same_text_everywhere(None, "Who is Romeo?", 60);
}
