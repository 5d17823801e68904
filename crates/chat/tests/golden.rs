//! Every template × conversation in tests/fixtures/expected.json, rendered
//! here and by Python jinja2 the way transformers' apply_chat_template does
//! (scripts/chat-templates/render.py), must match byte for byte; where
//! jinja2 raised (`raise_exception`), we must fail with the same message.
//! Tool cases (Qwen2.5's and Llama 3.2's templates) pass `tools` and
//! tool turns (`tool_calls`, null content, `tool_call_id`, `name`).

use std::path::{Path, PathBuf};

use chat::{ChatTemplate, DateTime, Error, Message, ToolCall};
use serde_json::Value as Json;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn expected() -> Json {
    let path = fixtures().join("expected.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The pinned `strftime_now` time render.py used (ISO, no zone).
fn pinned_now(expected: &Json) -> DateTime {
    expected["now"].as_str().unwrap().parse().unwrap()
}

fn template(expected: &Json, name: &str) -> ChatTemplate {
    let spec = &expected["templates"][name];
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(spec["file"].as_str().unwrap());
    let source =
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    ChatTemplate::new(
        &source,
        spec["bos_token"].as_str(),
        spec["eos_token"].as_str(),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
    .with_now(pinned_now(expected))
}

fn conversation(expected: &Json, name: &str) -> Vec<Message> {
    expected["conversations"][name]
        .as_array()
        .unwrap()
        .iter()
        .map(message)
        .collect()
}

/// A message dict as render.py gives it: content a string or null, and
/// `tool_calls`, `tool_call_id`, `name` when present.
fn message(m: &Json) -> Message {
    let text = |key: &str| m.get(key).and_then(Json::as_str).map(str::to_string);
    let tool_calls = m
        .get("tool_calls")
        .and_then(Json::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| ToolCall {
                    id: c["id"].as_str().map(str::to_string),
                    name: c["function"]["name"].as_str().unwrap().to_string(),
                    arguments: c["function"]["arguments"].clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    Message {
        role: text("role").unwrap(),
        content: text("content"),
        tool_calls,
        tool_call_id: text("tool_call_id"),
        name: text("name"),
    }
}

#[test]
fn every_case_matches_python_jinja2() {
    let expected = expected();
    let cases = expected["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    let mut templates_seen = std::collections::BTreeSet::new();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        templates_seen.insert(name);
        let template = template(&expected, name);
        let conv = case["conversation"].as_str().unwrap();
        let messages = conversation(&expected, conv);
        let add_generation_prompt = case["add_generation_prompt"].as_bool().unwrap();
        let extra = match case["extra"].as_str() {
            Some(extra) => expected["extras"][extra].as_object().unwrap().clone(),
            None => serde_json::Map::new(),
        };
        let got = template.render_with(&messages, add_generation_prompt, &extra);
        let label = format!(
            "{name} × {conv} (add_generation_prompt={add_generation_prompt}, extra={})",
            case["extra"]
        );
        match (&got, case.get("output"), case.get("error")) {
            (Ok(got), Some(want), _) if want.as_str() == Some(got.as_str()) => {}
            (Err(Error::Raised { message }), _, Some(want)) if want.as_str() == Some(message) => {}
            _ => failures.push(format!(
                "{label}\n  want: {:?}\n  got:  {got:?}",
                case.get("output").or(case.get("error"))
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from jinja2:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // The shared templates, SmolLM2's own, our fallback and shim fixtures.
    for name in [
        "smollm2",
        "smollm3",
        "qwen2.5",
        "gemma-2",
        "llama-3.2",
        "phi-3.5",
        "chatml-fallback",
    ] {
        assert!(templates_seen.contains(name), "no cases for {name}");
    }
    // The templates we ship that render tools have tool round trips.
    for name in ["qwen2.5", "llama-3.2"] {
        assert!(
            cases.iter().any(|c| c["template"] == name
                && c["conversation"] == "tool_round_trip"
                && c.get("output").is_some()),
            "no tool round trip for {name}"
        );
    }
}

/// The fixture copies of the shared templates are the shared ones.
#[test]
fn fixture_templates_match_shared_testdata() {
    let shared = testkit::workspace_root().join("../shared/testdata/templates");
    let Ok(entries) = std::fs::read_dir(&shared) else {
        eprintln!("skipping: {} not found", shared.display());
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        let ours = fixtures().join("templates").join(name);
        assert_eq!(
            std::fs::read(&ours).unwrap_or_default(),
            std::fs::read(&path).unwrap(),
            "{} differs from {}",
            ours.display(),
            path.display()
        );
    }
}
