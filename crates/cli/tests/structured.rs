//! Structured output the same through `run`, `chat` and `serve` (issue
//! 21): one greedy JSON-schema output through `run -j`, a piped `chat -j`
//! turn, `/v1/completions` with llama-server's `json_schema` and
//! `/v1/chat/completions` with `response_format`; and a GBNF grammar
//! through `run --grammar-file` and the `grammar` field. On SmolLM2 and on
//! the built-in model (another tokenizer).

mod server_support;

use server_support::Server;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use chat::{ChatTemplate, Message};
use serde_json::{json, Value};

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
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_suffix('\n').unwrap_or(&text).to_string()
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
            "sunny": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["old", "new", "big"]}, "maxItems": 2}
        },
        "required": ["city", "population", "sunny"],
        "additionalProperties": false
    })
}

fn check(text: &str, what: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}: {text:?}"));
    let o = v.as_object().unwrap_or_else(|| panic!("{what}: {text}"));
    assert!(
        o["city"].as_str().is_some_and(|c| c.chars().count() <= 20),
        "{what}: {text}"
    );
    let p = o["population"].as_f64().unwrap();
    assert!(
        p.fract() == 0.0 && (0.0..=1e8).contains(&p),
        "{what}: {text}"
    );
    assert!(o["sunny"].is_boolean(), "{what}: {text}");
    assert!(o
        .keys()
        .all(|k| ["city", "population", "sunny", "tags"].contains(&k.as_str())));
}

fn same_output_everywhere(model: Option<PathBuf>) {
    let path = model
        .clone()
        .unwrap_or_else(|| testkit::workspace_root().join("models/cachefit-ternary.gguf"));
    let file = gguf::GgufFile::open(&path).unwrap();
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).unwrap();
    let text = |id: Option<u32>| id.and_then(|i| vocab.token_text(i));
    let template =
        ChatTemplate::from_gguf(file.metadata(), text(vocab.bos()), text(vocab.eos())).unwrap();
    let message = "Describe a city as JSON.";
    let rendered = template.render(&[Message::user(message)], true).unwrap();
    let mut flags: Vec<String> = match &model {
        Some(p) => vec!["-m".into(), p.to_str().unwrap().into()],
        None => vec![],
    };
    // The built-in model's tokens are short and it likes indenting.
    flags.extend(["-n", "400", "-c", "512", "-t", "1"].map(String::from));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let schema_text = schema().to_string();
    let srv_args = ["--parallel", "2", "-c", "512"];
    let server = match &model {
        Some(p) => Server::start(p.to_str().unwrap(), &srv_args),
        None => Server::start_builtin(&srv_args),
    };
    let what = path.display().to_string();

    let run = cli(
        &[
            &["run"],
            &flags[..],
            &["--temp", "0", "-j", &schema_text, "-p", &rendered],
        ]
        .concat(),
        None,
    );
    check(&run, &format!("{what}: run"));
    let chat = cli(
        &[&["chat"], &flags[..], &["--temp", "0", "-j", &schema_text]].concat(),
        Some(&format!("{message}\n")),
    );
    assert_eq!(chat, run, "{what}: chat vs run");
    let r = server.post(
        "/v1/completions",
        &[],
        &json!({"prompt": rendered, "temperature": 0, "max_tokens": 400, "json_schema": schema()})
            .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = r.json();
    assert_eq!(
        r["choices"][0]["text"],
        json!(run),
        "{what}: /v1/completions vs run"
    );
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let r = server.post(
        "/v1/chat/completions",
        &[],
        &json!({"messages": [{"role": "user", "content": message}], "temperature": 0,
                "max_tokens": 400,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "city", "strict": true, "schema": schema()}}})
        .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = r.json();
    assert_eq!(
        r["choices"][0]["message"]["content"],
        json!(run),
        "{what}: /v1/chat/completions vs run"
    );
    assert_eq!(r["choices"][0]["finish_reason"], "stop");

    // A GBNF grammar, sampled: the same seed gives the same text.
    let dir = tempfile::tempdir().unwrap();
    let gbnf = dir.path().join("list.gbnf");
    std::fs::write(
        &gbnf,
        "root ::= item (\", \" item){2}\nitem ::= [a-z]{1,8}\n",
    )
    .unwrap();
    let sampled = ["--temp", "0.8", "-s", "5"];
    let run = cli(
        &[
            &["run"],
            &flags[..],
            &sampled[..],
            &[
                "--grammar-file",
                gbnf.to_str().unwrap(),
                "-p",
                "Three words:",
            ],
        ]
        .concat(),
        None,
    );
    let items: Vec<&str> = run.split(", ").collect();
    assert_eq!(items.len(), 3, "{what}: {run:?}");
    assert!(
        items
            .iter()
            .all(|w| (1..=8).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_lowercase())),
        "{what}: {run:?}"
    );
    let r = server.post(
        "/v1/completions",
        &[],
        &json!({"prompt": "Three words:", "temperature": 0.8, "seed": 5, "max_tokens": 400,
                "grammar": std::fs::read_to_string(&gbnf).unwrap()})
        .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["choices"][0]["text"],
        json!(run),
        "{what}: grammar"
    );
}

#[test]
fn smollm2_same_structured_output_through_run_chat_and_serve() {
    let Some(m) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    same_output_everywhere(Some(m));
}

#[test]
fn builtin_model_same_structured_output_through_run_chat_and_serve() {
    same_output_everywhere(None);
}

#[test]
fn bad_schemas_and_grammars_are_errors_naming_the_flag() {
    let fails = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cachefit"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = fails(&["run", "-n", "4", "-j", "{\"type\": 5", "x"]);
    assert!(
        e.contains("--json-schema") && e.contains("not valid JSON"),
        "{e}"
    );
    let e = fails(&["run", "-n", "4", "-j", "{\"type\": \"strin\"}", "x"]);
    assert!(
        e.contains("--json-schema") && e.contains("invalid JSON schema"),
        "{e}"
    );
    let e = fails(&["run", "-n", "4", "--grammar", "root ::= nothing", "x"]);
    assert!(
        e.contains("--grammar") && e.contains("\"nothing\" is used but never defined"),
        "{e}"
    );
    let e = fails(&[
        "run",
        "-n",
        "4",
        "--grammar",
        "root ::= \"a\"",
        "-j",
        "{}",
        "x",
    ]);
    assert!(e.contains("cannot be used with"), "{e}");
}
