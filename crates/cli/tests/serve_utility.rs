//! Issue 21's utility endpoints, shaped as llama-server shapes them
//! (`/tokenize`, `/detokenize`, `/props`), OpenAI's `/v1/models/{id}`, and
//! the one log line per request (`--log-format text|json`), on the
//! built-in model (no download).

#[path = "server_support/mod.rs"]
mod server_support;

use serde_json::Value;
use server_support::Server;
use std::time::{Duration, Instant};

/// The stderr lines that arrive within `wait`, until one contains `what`.
fn log_until(server: &Server, what: &str, wait: Duration) -> Vec<String> {
    let deadline = Instant::now() + wait;
    let mut lines = Vec::new();
    while Instant::now() < deadline {
        if let Ok(line) = server
            .stderr
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            let done = line.contains(what);
            lines.push(line);
            if done {
                return lines;
            }
        }
    }
    panic!("no log line with {what:?} in {lines:?}");
}

#[test]
fn tokenize_and_detokenize_round_trip() {
    let server = Server::start_builtin(&[]);
    let text = "ROMEO: But soft, what light";
    let r = server.post("/tokenize", &[], &format!(r#"{{"content": "{text}"}}"#));
    assert_eq!(r.status, 200, "{}", r.body);
    let tokens = r.json()["tokens"].as_array().unwrap().clone();
    assert!(
        tokens.len() > 3 && tokens.iter().all(Value::is_u64),
        "{tokens:?}"
    );

    // The same ids `cachefit tokenize --ids --no-special` prints.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args(["tokenize", "--ids", "--no-special", text])
        .output()
        .unwrap();
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli.as_array().unwrap(), &tokens);

    let r = server.post(
        "/detokenize",
        &[],
        &serde_json::json!({ "tokens": tokens }).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["content"], text);

    let r = server.post(
        "/tokenize",
        &[],
        &format!(r#"{{"content": "{text}", "with_pieces": true}}"#),
    );
    let pieces = r.json()["tokens"].as_array().unwrap().clone();
    let joined: String = pieces
        .iter()
        .map(|p| p["piece"].as_str().unwrap())
        .collect();
    assert_eq!(joined, text);
    assert_eq!(pieces[0]["id"], tokens[0]);

    // Bad requests name the field.
    for (path, body, param) in [
        ("/tokenize", r#"{}"#, "content"),
        ("/tokenize", r#"{"content": 3}"#, "content"),
        ("/tokenize", r#"{"content": "x", "bogus": 1}"#, "bogus"),
        (
            "/tokenize",
            r#"{"content": "x", "add_special": "yes"}"#,
            "add_special",
        ),
        ("/detokenize", r#"{"tokens": [1, -2]}"#, "tokens"),
        ("/detokenize", r#"{"tokens": [99999999]}"#, "tokens"),
        ("/detokenize", r#"{"tokens": "1 2"}"#, "tokens"),
    ] {
        let r = server.post(path, &[], body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        assert_eq!(r.error()["param"], param, "{path} {body}");
    }
}

#[test]
fn props_and_model_by_id() {
    let server = Server::start_builtin(&["--temp", "0.5"]);
    let r = server.request("GET", "/props", &[], b"");
    assert_eq!(r.status, 200, "{}", r.body);
    let p = r.json();
    assert_eq!(p["default_generation_settings"]["n_ctx"], 256);
    assert_eq!(
        p["default_generation_settings"]["params"]["temperature"],
        0.5
    );
    assert!(p["total_slots"].as_u64().unwrap() >= 1, "{p}");
    assert!(
        p["chat_template"].as_str().is_some_and(|t| !t.is_empty()),
        "{p}"
    );
    assert!(p["build_info"].as_str().unwrap().starts_with("cachefit "));

    let list = server.request("GET", "/v1/models", &[], b"").json();
    let id = list["data"][0]["id"].as_str().unwrap().to_string();
    let r = server.request("GET", &format!("/v1/models/{id}"), &[], b"");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), list["data"][0]);
    let r = server.request("GET", "/v1/models/no-such-model", &[], b"");
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.error()["code"], "model_not_found");
}

#[test]
fn one_log_line_per_request() {
    let server = Server::start_builtin(&[]);
    let r = server.post(
        "/v1/completions",
        &[],
        r#"{"prompt": "ROMEO:", "max_tokens": 5, "temperature": 0, "ignore_eos": true}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let usage = r.json()["usage"].clone();
    let lines = log_until(&server, "POST /v1/completions", Duration::from_secs(10));
    let line = lines.last().unwrap();
    let want = format!(
        "POST /v1/completions 200 in={} out=5 ",
        usage["prompt_tokens"]
    );
    assert!(line.contains(&want), "{line:?} lacks {want:?}");
    assert!(line.ends_with('s'), "{line:?}");

    // A streamed request is logged once its stream has ended.
    let r = server.post(
        "/v1/chat/completions",
        &[],
        r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, "ignore_eos": true, "stream": true}"#,
    );
    assert_eq!(r.status, 200);
    let lines = log_until(
        &server,
        "POST /v1/chat/completions",
        Duration::from_secs(10),
    );
    assert!(lines.last().unwrap().contains(" 200 in="), "{lines:?}");
    assert!(lines.last().unwrap().contains(" out=4 "), "{lines:?}");

    // Errors too; /health is not logged.
    server.request("GET", "/health", &[], b"");
    let r = server.request("GET", "/nowhere", &[], b"");
    assert_eq!(r.status, 404);
    let lines = log_until(&server, "GET /nowhere 404", Duration::from_secs(10));
    assert!(lines.iter().all(|l| !l.contains("/health")), "{lines:?}");
}

#[test]
fn json_log_lines_for_machines() {
    let server = Server::start_builtin(&["--log-format", "json"]);
    let r = server.post("/tokenize", &[], r#"{"content": "ROMEO"}"#);
    assert_eq!(r.status, 200);
    let lines = log_until(&server, "/tokenize", Duration::from_secs(10));
    let v: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(v["method"], "POST");
    assert_eq!(v["path"], "/tokenize");
    assert_eq!(v["status"], 200);
    assert_eq!(v["prompt_tokens"], 0);
    assert!(v["seconds"].as_f64().unwrap() >= 0.0);

    let (ok, _, err) = server_support_bad_flag();
    assert!(!ok && err.contains("text, json or off"), "{err}");
}

/// `--log-format` is checked before anything loads.
fn server_support_bad_flag() -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args(["serve", "--log-format", "xml"])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn smollm2() -> Option<String> {
    testkit::model(testkit::SMOLLM2_Q4_1).map(|p| p.to_str().unwrap().to_string())
}

fn vector(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `/v1/embeddings` on SmolLM2: unit vectors of the model's width, one per
/// input, the same for a text and its token ids, deterministic, nearer for
/// related texts; base64 decodes to the same floats.
#[test]
fn embeddings_of_texts_and_token_ids() {
    let Some(m) = smollm2() else { return };
    let server = Server::start(&m, &[]);
    let texts = [
        "The cat sat on the mat.",
        "A cat was sitting on a mat.",
        "Quarterly revenue rose by four percent.",
    ];
    let body = serde_json::json!({ "input": texts, "model": "x" }).to_string();
    let r = server.post("/v1/embeddings", &[], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let j = r.json();
    assert_eq!(j["object"], "list");
    let data = j["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let vs: Vec<Vec<f64>> = data.iter().map(|d| vector(&d["embedding"])).collect();
    for (i, (d, v)) in data.iter().zip(&vs).enumerate() {
        assert_eq!(
            (d["object"].as_str(), d["index"].as_u64()),
            (Some("embedding"), Some(i as u64))
        );
        assert_eq!(v.len(), 576);
        assert!((cosine(v, v) - 1.0).abs() < 1e-5, "not unit length");
    }
    assert!(j["usage"]["prompt_tokens"].as_u64().unwrap() >= 15, "{j}");
    assert!(
        cosine(&vs[0], &vs[1]) > cosine(&vs[0], &vs[2]),
        "related texts should be nearer: {} vs {}",
        cosine(&vs[0], &vs[1]),
        cosine(&vs[0], &vs[2])
    );

    // The same text as token ids (what /tokenize gives, with the model's
    // specials): the same vector. And again: deterministic.
    let toks = server
        .post(
            "/tokenize",
            &[],
            &format!(r#"{{"content": "{}", "add_special": true}}"#, texts[0]),
        )
        .json()["tokens"]
        .clone();
    let r = server.post(
        "/v1/embeddings",
        &[],
        &serde_json::json!({ "input": toks }).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(vector(&r.json()["data"][0]["embedding"]), vs[0]);

    // base64: little-endian f32.
    let body = serde_json::json!({ "input": texts[0], "encoding_format": "base64" }).to_string();
    let b64 = server.post("/v1/embeddings", &[], &body).json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_string();
    let bytes = decode_base64(&b64);
    let floats: Vec<f64> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
        .collect();
    // JSON carries the f32 values' shortest decimal form: equal as f32.
    let as_f32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    assert_eq!(as_f32(&floats), as_f32(&vs[0]));

    for (body, param) in [
        (r#"{}"#, "input"),
        (r#"{"input": []}"#, "input"),
        (r#"{"input": [1, "a"]}"#, "input"),
        (
            r#"{"input": "x", "encoding_format": "hex"}"#,
            "encoding_format",
        ),
        (r#"{"input": "x", "dimensions": 8}"#, "dimensions"),
        (r#"{"input": "x", "pooling": "max"}"#, "pooling"),
        (r#"{"input": [99999999]}"#, "input"),
    ] {
        let r = server.post("/v1/embeddings", &[], body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.error()["param"], param, "{body}");
    }
}

/// The built-in model's head shares its token embedding: embeddings are
/// refused with a clear error, not made up.
#[test]
fn builtin_model_refuses_embeddings_clearly() {
    let server = Server::start_builtin(&[]);
    let r = server.post("/v1/embeddings", &[], r#"{"input": "ROMEO"}"#);
    assert_eq!(r.status, 400, "{}", r.body);
    let e = r.error();
    assert_eq!(e["code"], "not_supported");
    assert!(e["message"].as_str().unwrap().contains("cachefit"), "{e}");
}

fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let n = chunk
            .iter()
            .map(|&c| if c == b'=' { 0 } else { val(c) })
            .fold(0u32, |acc, v| acc << 6 | v);
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    out
}

/// `/slots`: one entry per slot; a slot that served a prompt keeps its
/// tokens cached and is idle afterwards.
#[test]
fn slots_say_what_each_slot_holds() {
    let server = Server::start_builtin(&["--parallel", "2"]);
    let slots = server.request("GET", "/slots", &[], b"").json();
    let slots = slots.as_array().unwrap();
    assert_eq!(slots.len(), 2, "{slots:?}");
    assert!(slots
        .iter()
        .all(|s| s["is_processing"] == false && s["n_ctx"] == 256));
    let r = server.post(
        "/v1/completions",
        &[],
        r#"{"prompt": "ROMEO:", "max_tokens": 3, "temperature": 0, "ignore_eos": true}"#,
    );
    assert_eq!(r.status, 200);
    let n_prompt = r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    // The reply can arrive before the engine publishes the step that ended
    // the job: wait (briefly) for the slots to say idle.
    let deadline = Instant::now() + Duration::from_secs(5);
    let slots = loop {
        let slots = server.request("GET", "/slots", &[], b"").json();
        let idle = slots
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["is_processing"] == false);
        if idle || Instant::now() > deadline {
            break slots;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let cached: Vec<u64> = slots
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["n_cached_tokens"].as_u64().unwrap())
        .collect();
    assert!(
        cached.iter().any(|&c| c >= n_prompt),
        "a slot keeps the prompt: {slots}"
    );
    assert!(slots
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["is_processing"] == false));
}
