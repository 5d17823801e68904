//! Issue 21, part 3, over HTTP on SmolLM2: `logprobs` (chat and
//! completions, whole and streamed), `logit_bias`, `n` choices that read
//! the prompt once, and unknown fields answered with a 400 naming them.
//! (The values themselves are checked against a reference log-softmax in
//! crates/engine/tests/logprobs.rs.)

mod server_support;

use serde_json::{json, Value};
use server_support::Server;
use tokenize::Vocab;

fn model() -> Option<String> {
    testkit::model(testkit::SMOLLM2_Q4_1).map(|p| p.to_str().unwrap().to_string())
}

fn vocab(m: &str) -> Vocab {
    let file = gguf::GgufFile::open(m).unwrap();
    Vocab::from_gguf(file.metadata()).unwrap()
}

/// The JSON objects of an SSE body, `[DONE]` excluded (and required last).
fn events(body: &str) -> Vec<Value> {
    let data: Vec<&str> = body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn metric(server: &Server, name: &str) -> f64 {
    let r = server.request("GET", "/metrics", &[], b"");
    r.body
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
        .parse()
        .unwrap()
}

const QUESTION: &str =
    r#""messages": [{"role": "user", "content": "What is the capital of France?"}]"#;

#[test]
fn logprobs_whole_and_streamed() {
    let Some(m) = model() else { return };
    let server = Server::start(&m, &["--parallel", "2"]);

    // Chat: one entry per token, its text the content, the best first.
    let body = format!(
        r#"{{{QUESTION}, "max_tokens": 8, "temperature": 0, "logprobs": true, "top_logprobs": 3}}"#
    );
    let r = server.post("/v1/chat/completions", &[], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choice = &v["choices"][0];
    let content = choice["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let mut bytes = Vec::new();
    for e in &content {
        let b: Vec<u8> = serde_json::from_value(e["bytes"].clone()).unwrap();
        bytes.extend(&b);
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
        // Greedy: the token is the most likely one.
        assert_eq!(top[0]["token"], e["token"]);
        assert_eq!(top[0]["logprob"], e["logprob"]);
        assert!(lps[0] <= 0.0 && lps.iter().map(|l| l.exp()).sum::<f64>() <= 1.0 + 1e-6);
    }
    assert_eq!(
        String::from_utf8(bytes).unwrap(),
        choice["message"]["content"]
    );

    // Streamed: the same entries, each in the chunk of its text.
    let streamed = body.replace("\"logprobs\"", "\"stream\": true, \"logprobs\"");
    let r = server.post("/v1/chat/completions", &[], &streamed);
    assert_eq!(r.status, 200);
    let mut got = Vec::new();
    for c in events(&r.body) {
        let choice = &c["choices"][0];
        let entries = choice["logprobs"]["content"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let text: String = entries
            .iter()
            .map(|e| e["token"].as_str().unwrap())
            .collect();
        assert_eq!(
            text,
            choice["delta"]["content"].as_str().unwrap_or(""),
            "{c}"
        );
        got.extend(entries);
    }
    assert_eq!(got, content);

    // Not asked: null, as before.
    let r = server.post(
        "/v1/chat/completions",
        &[],
        &format!(r#"{{{QUESTION}, "max_tokens": 2, "temperature": 0}}"#),
    );
    assert!(r.json()["choices"][0]["logprobs"].is_null());

    // Completions: an integer, up to 5 alternatives, offsets in the text.
    let body = r#"{"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "logprobs": 2}"#;
    let r = server.post("/v1/completions", &[], body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let (text, l) = (
        v["choices"][0]["text"].as_str().unwrap(),
        &v["choices"][0]["logprobs"],
    );
    let tokens: Vec<String> = serde_json::from_value(l["tokens"].clone()).unwrap();
    assert_eq!(tokens.concat(), text);
    let offsets: Vec<usize> = serde_json::from_value(l["text_offset"].clone()).unwrap();
    let mut at = 0;
    for (t, &o) in tokens.iter().zip(&offsets) {
        assert_eq!(o, at);
        at += t.chars().count();
    }
    let top = l["top_logprobs"].as_array().unwrap();
    assert_eq!(top.len(), tokens.len());
    for (t, alts) in tokens.iter().zip(top) {
        assert_eq!(alts.as_object().unwrap().len(), 2);
        assert!(alts.get(t).is_some(), "greedy: {t:?} is among {alts}");
    }
    // `run --json --logprobs` reports the same numbers (one engine).
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args([
            "run",
            "-m",
            &m,
            "-p",
            "The capital of France is",
            "-n",
            "6",
            "--temp",
            "0",
        ])
        .args(["-t", "1", "-c", "256", "--json", "--logprobs", "2"])
        .output()
        .unwrap();
    let run: Value = serde_json::from_slice(&run.stdout).unwrap();
    let run_lp = run["logprobs"].as_array().unwrap();
    assert_eq!(run_lp.len(), tokens.len());
    for (i, e) in run_lp.iter().enumerate() {
        assert_eq!(e["token"], tokens[i].as_str());
        assert_eq!(e["logprob"], l["token_logprobs"][i]);
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
    }
    let streamed = body.replace("\"logprobs\"", "\"stream\": true, \"logprobs\"");
    let r = server.post("/v1/completions", &[], &streamed);
    let mut stream_tokens = Vec::new();
    let mut stream_offsets = Vec::new();
    for c in events(&r.body) {
        let l = &c["choices"][0]["logprobs"];
        if l.is_null() {
            continue;
        }
        stream_tokens.extend(serde_json::from_value::<Vec<String>>(l["tokens"].clone()).unwrap());
        stream_offsets
            .extend(serde_json::from_value::<Vec<usize>>(l["text_offset"].clone()).unwrap());
    }
    assert_eq!(stream_tokens, tokens);
    assert_eq!(stream_offsets, offsets);

    // Out of range: 400 naming the field.
    for (path, body, param) in [
        (
            "/v1/completions",
            r#"{"prompt": "x", "logprobs": 6}"#,
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            &format!(r#"{{{QUESTION}, "logprobs": true, "top_logprobs": 21}}"#),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            &format!(r#"{{{QUESTION}, "top_logprobs": 2}}"#),
            "top_logprobs",
        ),
    ] {
        let r = server.post(path, &[], body);
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.error()["param"], param);
    }
}

#[test]
fn logit_bias_forces_and_bans() {
    let Some(m) = model() else { return };
    let vocab = vocab(&m);
    let server = Server::start(&m, &[]);
    let ask = |extra: &str| {
        let r = server.post(
            "/v1/completions",
            &[],
            &format!(r#"{{"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0{extra}}}"#),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let greedy = ask("");
    assert!(greedy.starts_with(" Paris"), "{greedy}");
    // -100 bans the greedy token.
    let paris = vocab.encode(" Paris", false, false);
    assert_eq!(paris.len(), 1, "{paris:?}");
    let banned = ask(&format!(r#", "logit_bias": {{"{}": -100}}"#, paris[0]));
    assert!(!banned.starts_with(" Paris"), "{banned}");
    // +100 forces a token, every time (sampled too).
    let banana = vocab.encode(" banana", false, false);
    assert_eq!(banana.len(), 1, "{banana:?}");
    let forced = format!(r#", "logit_bias": {{"{}": 100}}"#, banana[0]);
    assert_eq!(ask(&forced), " banana".repeat(4));
    assert_eq!(
        ask(&format!(r#"{forced}, "temperature": 1.0, "seed": 3"#)),
        " banana".repeat(4)
    );
    // Wrong keys and values: 400 naming `logit_bias`.
    for bad in [
        r#", "logit_bias": {"Paris": 1}"#,
        r#", "logit_bias": {"5": 150}"#,
        r#", "logit_bias": {"999999": 1}"#,
        r#", "logit_bias": [1]"#,
    ] {
        let r = server.post(
            "/v1/completions",
            &[],
            &format!(r#"{{"prompt": "x"{bad}}}"#),
        );
        assert_eq!(r.status, 400, "{bad}");
        assert_eq!(r.error()["param"], "logit_bias", "{bad}");
    }
}

#[test]
fn three_choices_read_the_prompt_once() {
    let Some(m) = model() else { return };
    let server = Server::start(&m, &["--parallel", "3", "--max-queue", "4"]);
    let messages = r#""messages": [{"role": "user", "content": "Write a short poem about a lighthouse keeper."}]"#;
    let evaluated = metric(&server, "cachefit_prompt_tokens_evaluated_total");
    let body =
        format!(r#"{{{messages}, "max_tokens": 10, "temperature": 1.0, "seed": 9, "n": 3}}"#);
    let r = server.post("/v1/chat/completions", &[], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let prompt = v["usage"]["prompt_tokens"].as_f64().unwrap();
    // The prompt was evaluated once for the three choices (a fresh
    // server: nothing cached).
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        metric(&server, "cachefit_prompt_tokens_evaluated_total") - evaluated,
        prompt
    );
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let mut texts = Vec::new();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        texts.push(c["message"]["content"].as_str().unwrap().to_string());
    }
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "{texts:?}");
    let completion = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((3..=30).contains(&completion), "{completion}");
    assert_eq!(
        v["usage"]["total_tokens"].as_f64().unwrap(),
        prompt + completion as f64
    );

    // Choice i draws with seed + i: choice 1 of seed 9 is choice 0 of seed 10.
    let one = server.post(
        "/v1/chat/completions",
        &[],
        &format!(r#"{{{messages}, "max_tokens": 10, "temperature": 1.0, "seed": 10}}"#),
    );
    assert_eq!(
        one.json()["choices"][0]["message"]["content"],
        texts[1].as_str()
    );

    // Streamed with usage: every chunk names its choice; the texts are
    // the same; the usage chunk comes last with the prompt counted once.
    let streamed = body.replace(
        "\"n\": 3",
        r#""n": 3, "stream": true, "stream_options": {"include_usage": true}"#,
    );
    let r = server.post("/v1/chat/completions", &[], &streamed);
    assert_eq!(r.status, 200);
    let chunks = events(&r.body);
    let mut got = vec![String::new(); 3];
    let mut finished = [0; 3];
    for c in &chunks[..chunks.len() - 1] {
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        got[i].push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        finished[i] += choice["finish_reason"].is_string() as usize;
        assert!(c["usage"].is_null());
    }
    assert_eq!(got, texts);
    assert_eq!(finished, [1, 1, 1]);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["prompt_tokens"].as_f64().unwrap(), prompt);
    assert_eq!(
        last["usage"]["completion_tokens"].as_u64().unwrap(),
        completion
    );

    // More choices than slots queue (later ones copy the prompt); more
    // than the queue holds is a 400.
    let r = server.post(
        "/v1/completions",
        &[],
        r#"{"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0, "n": 4}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let texts: Vec<&str> = (0..4)
        .map(|i| v["choices"][i]["text"].as_str().unwrap())
        .collect();
    assert!(texts.iter().all(|t| *t == texts[0]), "greedy: {texts:?}");
    let r = server.post("/v1/completions", &[], r#"{"prompt": "x", "n": 5}"#);
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["param"], "n");
}

#[test]
fn unknown_fields_are_a_400_naming_them() {
    let Some(m) = model() else { return };
    let server = Server::start(&m, &[]);
    for (path, body, param) in [
        (
            "/v1/chat/completions",
            format!(r#"{{{QUESTION}, "best_of": 2}}"#),
            "best_of",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{{QUESTION}, "functions": []}}"#),
            "functions",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "top_logprobs": 1}"#.to_string(),
            "top_logprobs",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "typical_p": 0.5}"#.to_string(),
            "typical_p",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{{QUESTION}, "stream_options": {{"include_usage": true, "x": 1}}}}"#),
            "stream_options.x",
        ),
    ] {
        let r = server.post(path, &[], &body);
        assert_eq!(r.status, 400, "{body}");
        let e = r.error();
        assert_eq!(e["param"], param, "{e}");
        assert!(e["message"].as_str().unwrap().contains(param), "{e}");
    }
    // What OpenAI's clients commonly send is accepted.
    let r = server.post(
        "/v1/chat/completions",
        &[],
        &format!(
            r#"{{{QUESTION}, "model": "gpt-4o", "max_tokens": 2, "n": 1, "stream": false, "logprobs": false,
               "user": "someone", "metadata": {{"k": "v"}}, "store": false, "service_tier": "auto",
               "temperature": 0, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0,
               "logit_bias": {{}}, "stop": null, "seed": null, "max_completion_tokens": 2}}"#
        ),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}
