//! Issue 21's tool calls over plain HTTP on a model whose template renders
//! no tools (SmolLM2's): the tools go in the Hermes way, `tool_choice`
//! "required" and a named function always come back as parsable calls,
//! whole and streamed, and tool turns render. The real tool-calling model
//! (Qwen2.5-Coder) is tested with the openai client in
//! tests/openai/test_tools.py.

#[path = "server_support/mod.rs"]
mod server_support;

use serde_json::{json, Value};
use server_support::Server;

fn model() -> Option<String> {
    Some(
        testkit::model(testkit::SMOLLM2_Q4_1)?
            .to_string_lossy()
            .into_owned(),
    )
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
    ])
}

fn body(extra: Value) -> String {
    let mut b = json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools(),
        "temperature": 0,
        "max_tokens": 60,
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b.to_string()
}

#[test]
fn required_and_named_calls_always_parse_on_a_template_without_tools() {
    let Some(m) = model() else { return };
    let server = Server::start(&m, &["-c", "1024"]);
    for (choice, names) in [
        (json!("required"), vec!["get_weather", "get_time"]),
        (
            json!({"type": "function", "function": {"name": "get_time"}}),
            vec!["get_time"],
        ),
    ] {
        let r = server.post(
            "/v1/chat/completions",
            &[],
            &body(json!({"tool_choice": choice, "parallel_tool_calls": false})),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        // One call: the grammar is complete after it, and the job ends.
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{v}");
        assert!(c["message"]["content"].is_null(), "{v}");
        for call in calls {
            assert!(call["id"].as_str().unwrap().starts_with("call_"));
            assert_eq!(call["type"], "function");
            let name = call["function"]["name"].as_str().unwrap();
            assert!(names.contains(&name), "{v}");
            let args: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            match name {
                "get_weather" => assert!(args["city"].is_string(), "{args}"),
                _ => assert!(args["zone"] == "UTC" || args["zone"] == "CET", "{args}"),
            }
        }

        // Streamed: the same calls, as `delta.tool_calls` chunks.
        let r = server.post(
            "/v1/chat/completions",
            &[],
            &body(json!({"tool_choice": choice, "parallel_tool_calls": false, "stream": true})),
        );
        assert_eq!(r.status, 200);
        let mut streamed: Vec<(String, String)> = Vec::new();
        let mut finish = None;
        for line in r.body.lines() {
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(data).unwrap();
            let choice = &chunk["choices"][0];
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
            assert!(
                !choice["delta"]["content"]
                    .as_str()
                    .unwrap_or("")
                    .contains("<tool"),
                "{chunk}"
            );
            for t in choice["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let i = t["index"].as_u64().unwrap() as usize;
                if i == streamed.len() {
                    assert!(t["id"].as_str().unwrap().starts_with("call_"), "{t}");
                    streamed.push((
                        t["function"]["name"].as_str().unwrap().into(),
                        String::new(),
                    ));
                }
                streamed[i].1 += t["function"]["arguments"].as_str().unwrap_or("");
            }
        }
        assert_eq!(finish.as_deref(), Some("tool_calls"));
        let whole: Vec<(String, String)> = calls
            .iter()
            .map(|c| {
                (
                    c["function"]["name"].as_str().unwrap().into(),
                    c["function"]["arguments"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert_eq!(streamed, whole);
    }

    // With parallel calls allowed this small model goes on calling until
    // `max_tokens`: the whole calls are read, the one cut short is text.
    let r = server.post(
        "/v1/chat/completions",
        &[],
        &body(json!({"tool_choice": "required"})),
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    assert!(!v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap()
        .is_empty());

    // A whole loop's turns render (lowered to Hermes text) and the reply
    // is an answer; "none" reads no calls.
    let history = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, light rain"}
    ]);
    for choice in ["auto", "none"] {
        let r = server.post(
            "/v1/chat/completions",
            &[],
            &body(json!({"messages": history, "tool_choice": choice})),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
        assert!(["stop", "length", "tool_calls"].contains(&finish), "{v}");
        if choice == "none" {
            assert!(v["choices"][0]["message"]["tool_calls"].is_null(), "{v}");
        }
    }

    // Bad requests name the field.
    for (extra, param) in [
        (
            json!({"tools": [{"type": "function"}]}),
            "tools[0].function",
        ),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (
            json!({"tool_choice": "required", "response_format": {"type": "json_object"}}),
            "tool_choice",
        ),
    ] {
        let r = server.post("/v1/chat/completions", &[], &body(extra.clone()));
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        assert_eq!(r.error()["param"], param, "{extra}: {}", r.body);
    }
}
