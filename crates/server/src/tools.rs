//! Tool calling on `/v1/chat/completions`, as OpenAI's API shapes it:
//! the request's `tools`, `tool_choice` and `parallel_tool_calls`, the
//! tool fields of messages (`tool_calls`, `tool_call_id`, `name`), and the
//! answer's `message.tool_calls` / streamed `delta.tool_calls`.
//!
//! The model sees the tools through its own chat template, or the Hermes
//! way when the template renders none, and its calls are read back by the
//! chat crate's parser ([`chat::tool_calls`]), which `run` and `chat`
//! share. This module is only the HTTP shapes around them.
//!
//! `tool_choice`:
//! - `"auto"` (the default with tools): the tools are shown; the reply is
//!   parsed for calls.
//! - `"none"`: the tools are not shown (llama.cpp's server and vLLM show
//!   them and leave the reply unparsed; a small model shown tools tends to
//!   call one anyway, which would then come back as text), and the reply
//!   is plain content.
//! - `"required"` and `{"type": "function", "function": {"name": ...}}`:
//!   the reply is constrained ([`call_grammar`], a Lark grammar with each
//!   tool's parameters as a JSON schema, compiled by llguidance in the
//!   engine) to one or more calls (one with `parallel_tool_calls: false`)
//!   in the template's syntax, so it always parses. Objects in those
//!   schemas that do not say otherwise take no extra keys (as llama.cpp's
//!   schema converter reads them).
//!
//! `parallel_tool_calls: false` keeps the first call of an `auto` reply.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use chat::tool_calls::{self, ParsedCall, Piece, ToolCallParser, ToolFormat};
use chat::{ChatTemplate, Message, ToolCall};
use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// Most tools one request may declare (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;

/// What the request lets the model do with its tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    /// This function, always.
    Function(String),
}

/// A request's tools, as given and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    /// The `tools` entries as the client sent them (what the template
    /// shows the model).
    pub tools: Vec<Value>,
    /// Each tool's name, in order.
    pub names: Vec<String>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true).
    pub parallel: bool,
}

impl ToolRequest {
    /// `tools`, `tool_choice` and `parallel_tool_calls` of a chat request;
    /// None when it has no tools (`tool_choice` "none" or "auto" alone
    /// mean nothing then).
    pub fn from_json(obj: &Map<String, Value>) -> Result<Option<ToolRequest>, ApiError> {
        let parallel = match obj.get("parallel_tool_calls") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(wrong_type("parallel_tool_calls", "a boolean", other)),
        };
        let tools = match obj.get("tools") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) if items.is_empty() => {
                return Err(ApiError::param(
                    "tools",
                    "`tools` must hold at least one tool (leave it out for none)",
                ))
            }
            Some(Value::Array(items)) if items.len() > MAX_TOOLS => {
                return Err(ApiError::param(
                    "tools",
                    format!(
                        "At most {MAX_TOOLS} tools are supported, not {}",
                        items.len()
                    ),
                ))
            }
            Some(Value::Array(items)) => items.clone(),
            Some(other) => return Err(wrong_type("tools", "an array", other)),
        };
        let mut names: Vec<String> = Vec::with_capacity(tools.len());
        for (i, tool) in tools.iter().enumerate() {
            let name = tool_name(i, tool)?;
            if names.contains(&name) {
                return Err(ApiError::param(
                    &format!("tools[{i}].function.name"),
                    format!("Tool names must be unique; `{name}` is given twice"),
                ));
            }
            names.push(name);
        }
        let choice = match obj.get("tool_choice") {
            None | Some(Value::Null) if tools.is_empty() => ToolChoice::None,
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::param(
                        "tool_choice",
                        format!(
                            "Invalid value for `tool_choice`: `{other}`; supported: none, auto, required, or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                        ),
                    ))
                }
            },
            Some(Value::Object(o)) => {
                let kind = o.get("type").and_then(Value::as_str);
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str);
                match (kind, name) {
                    (Some("function"), Some(name)) => ToolChoice::Function(name.to_string()),
                    (Some("function"), None) => {
                        return Err(ApiError::param(
                            "tool_choice.function.name",
                            "Missing required parameter: `tool_choice.function.name`",
                        ))
                    }
                    _ => {
                        return Err(ApiError::param(
                            "tool_choice.type",
                            "`tool_choice.type` must be `function`",
                        ))
                    }
                }
            }
            Some(other) => {
                return Err(wrong_type(
                    "tool_choice",
                    "a string or an object naming a function",
                    other,
                ))
            }
        };
        match &choice {
            ToolChoice::Required | ToolChoice::Function(_) if tools.is_empty() => {
                return Err(ApiError::param(
                    "tool_choice",
                    "`tool_choice` may ask for a call only when `tools` are given",
                ))
            }
            ToolChoice::Function(name) if !names.contains(name) => {
                return Err(ApiError::param(
                    "tool_choice",
                    format!(
                        "`tool_choice` names `{name}`, which is not among the tools ({})",
                        names.join(", ")
                    ),
                ))
            }
            _ => {}
        }
        if tools.is_empty() {
            return Ok(None);
        }
        Ok(Some(ToolRequest {
            tools,
            names,
            choice,
            parallel,
        }))
    }

    /// The tools the model is shown (none for `tool_choice` "none").
    pub fn shown(&self) -> &[Value] {
        match self.choice {
            ToolChoice::None => &[],
            _ => &self.tools,
        }
    }

    /// How to read the reply, given the template's syntax: None when it
    /// is not read for calls (`tool_choice` "none").
    pub fn reader(&self, format: ToolFormat) -> Option<ToolReader> {
        (self.choice != ToolChoice::None).then(|| ToolReader {
            format,
            names: self.names.clone(),
            parallel: self.parallel,
        })
    }

    /// The `parameters` schema of tool `name` (an object with no
    /// properties when it declares none), closed ([`closed`]).
    fn parameters(&self, name: &str) -> Value {
        let i = self.names.iter().position(|n| n == name);
        let mut schema = i
            .and_then(|i| self.tools[i]["function"].get("parameters").cloned())
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        closed(&mut schema);
        schema
    }
}

/// Objects in `schema` that list their `properties` and do not say
/// whether others may follow get `additionalProperties: false`, at every
/// level (as llama.cpp's schema converter and OpenAI's strict mode read
/// them): a small model left free to add keys adds them until
/// `max_tokens` runs out, and the call never closes.
fn closed(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            for (key, value) in map.iter_mut() {
                match key.as_str() {
                    // Maps of name → schema.
                    "properties" | "$defs" | "definitions" | "patternProperties" => {
                        if let Value::Object(m) = value {
                            m.values_mut().for_each(closed);
                        }
                    }
                    // A schema, or a list of them.
                    "items"
                    | "additionalProperties"
                    | "anyOf"
                    | "oneOf"
                    | "allOf"
                    | "not"
                    | "prefixItems"
                    | "if"
                    | "then"
                    | "else" => match value {
                        Value::Array(list) => list.iter_mut().for_each(closed),
                        v => closed(v),
                    },
                    _ => {}
                }
            }
        }
        Value::Array(list) => list.iter_mut().for_each(closed),
        _ => {}
    }
}

/// `tools[i]`: `{"type": "function", "function": {"name", "description"?,
/// "parameters"?, "strict"?}}`; its name.
fn tool_name(i: usize, tool: &Value) -> Result<String, ApiError> {
    let param = format!("tools[{i}]");
    let Value::Object(t) = tool else {
        return Err(wrong_type(&param, "an object", tool));
    };
    match t.get("type") {
        Some(Value::String(s)) if s == "function" => {}
        Some(Value::String(s)) => {
            return Err(ApiError::param(
                &format!("{param}.type"),
                format!("Tools of type `{s}` are not supported; only `function`"),
            ))
        }
        _ => {
            return Err(ApiError::param(
                &format!("{param}.type"),
                format!("`{param}.type` must be `function`"),
            ))
        }
    }
    let f_param = format!("{param}.function");
    let f = match t.get("function") {
        Some(Value::Object(f)) => f,
        None | Some(Value::Null) => {
            return Err(ApiError::param(
                &f_param,
                format!("Missing required parameter: `{f_param}`"),
            ))
        }
        Some(other) => return Err(wrong_type(&f_param, "an object", other)),
    };
    let name_param = format!("{f_param}.name");
    let name = match f.get("name") {
        Some(Value::String(n)) => n,
        None | Some(Value::Null) => {
            return Err(ApiError::param(
                &name_param,
                format!("Missing required parameter: `{name_param}`"),
            ))
        }
        Some(other) => return Err(wrong_type(&name_param, "a string", other)),
    };
    // OpenAI's rule; it also keeps names safe inside a grammar literal.
    let valid = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if !valid {
        return Err(ApiError::param(
            &name_param,
            format!("`{name_param}` must be 1 to 64 letters, digits, `_` or `-`, not `{name}`"),
        ));
    }
    if let Some(d) = f
        .get("description")
        .filter(|d| !d.is_null() && !d.is_string())
    {
        return Err(wrong_type(&format!("{f_param}.description"), "a string", d));
    }
    if let Some(p) = f
        .get("parameters")
        .filter(|p| !p.is_null() && !p.is_object())
    {
        return Err(wrong_type(
            &format!("{f_param}.parameters"),
            "an object (a JSON schema)",
            p,
        ));
    }
    if let Some(s) = f.get("strict").filter(|s| !s.is_null() && !s.is_boolean()) {
        return Err(wrong_type(&format!("{f_param}.strict"), "a boolean", s));
    }
    Ok(name.clone())
}

/// The tool fields of message `m` (`messages[i]`, already read into
/// `message`): an assistant's `tool_calls` (its content may then be null,
/// which the template sees as None), a tool result's `tool_call_id`
/// (required, as OpenAI requires it), and `name`.
pub fn message_fields(
    param: &str,
    m: &Map<String, Value>,
    message: &mut Message,
) -> Result<(), ApiError> {
    let role = message.role.as_str();
    match m.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) if role == "assistant" => {
            for (k, call) in calls.iter().enumerate() {
                message
                    .tool_calls
                    .push(message_call(&format!("{param}.tool_calls[{k}]"), call)?);
            }
            if !message.tool_calls.is_empty() && m.get("content").is_none_or(Value::is_null) {
                message.content = None;
            }
        }
        Some(Value::Array(_)) => {
            return Err(ApiError::param(
                &format!("{param}.tool_calls"),
                format!("Only `assistant` messages have `tool_calls`, not `{role}` ones"),
            ))
        }
        Some(other) => {
            return Err(wrong_type(
                &format!("{param}.tool_calls"),
                "an array",
                other,
            ))
        }
    }
    let id_param = format!("{param}.tool_call_id");
    match m.get("tool_call_id") {
        Some(Value::String(id)) => message.tool_call_id = Some(id.clone()),
        None | Some(Value::Null) if role == "tool" => {
            return Err(ApiError::param(
                &id_param,
                format!(
                    "Missing required parameter: `{id_param}` (a `tool` message answers a call)"
                ),
            ))
        }
        None | Some(Value::Null) => {}
        Some(other) => return Err(wrong_type(&id_param, "a string", other)),
    }
    match m.get("name") {
        Some(Value::String(name)) => message.name = Some(name.clone()),
        None | Some(Value::Null) => {}
        Some(other) => return Err(wrong_type(&format!("{param}.name"), "a string", other)),
    }
    Ok(())
}

/// One of an assistant message's `tool_calls`: `{"id", "type":
/// "function", "function": {"name", "arguments": a JSON string}}`.
fn message_call(param: &str, call: &Value) -> Result<ToolCall, ApiError> {
    let Value::Object(c) = call else {
        return Err(wrong_type(param, "an object", call));
    };
    if let Some(kind) = c.get("type").filter(|t| !t.is_null()) {
        if kind.as_str() != Some("function") {
            return Err(ApiError::param(
                &format!("{param}.type"),
                format!("`{param}.type` must be `function`"),
            ));
        }
    }
    let id = match c.get("id") {
        Some(Value::String(id)) => Some(id.clone()),
        None | Some(Value::Null) => None,
        Some(other) => return Err(wrong_type(&format!("{param}.id"), "a string", other)),
    };
    let f_param = format!("{param}.function");
    let Some(Value::Object(f)) = c.get("function") else {
        return Err(ApiError::param(
            &f_param,
            format!("`{f_param}` must be an object with `name` and `arguments`"),
        ));
    };
    let Some(Value::String(name)) = f.get("name") else {
        return Err(ApiError::param(
            &format!("{f_param}.name"),
            format!("`{f_param}.name` must be a string"),
        ));
    };
    let arguments = match f.get("arguments") {
        Some(Value::String(a)) => a.clone(),
        // Some clients send the object itself.
        Some(v @ Value::Object(_)) => v.to_string(),
        None | Some(Value::Null) => "{}".to_string(),
        Some(other) => {
            return Err(wrong_type(
                &format!("{f_param}.arguments"),
                "a string (JSON)",
                other,
            ))
        }
    };
    Ok(ToolCall::from_openai(id, name.clone(), &arguments))
}

/// Whether a conversation has tool turns (which a template without tools
/// needs lowered even when the request shows none).
pub fn has_tool_turns(messages: &[Message]) -> bool {
    messages
        .iter()
        .any(|m| m.role == "tool" || !m.tool_calls.is_empty())
}

/// The conversation and template variables to render for a request with
/// `tools` (None: no tools), and how to read the reply.
pub fn prompt(
    template: &ChatTemplate,
    messages: Vec<Message>,
    tools: Option<&ToolRequest>,
) -> (Vec<Message>, Map<String, Value>, Option<ToolReader>) {
    let shown = tools.map_or(&[][..], ToolRequest::shown);
    if shown.is_empty() && !has_tool_turns(&messages) {
        return (messages, Map::new(), None);
    }
    let p = tool_calls::prepare(template, &messages, shown);
    let reader = tools.and_then(|t| t.reader(p.format));
    (p.messages, p.extra, reader)
}

/// How to read a reply for calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolReader {
    pub format: ToolFormat,
    pub names: Vec<String>,
    /// `parallel_tool_calls`: false keeps the first call only.
    pub parallel: bool,
}

impl ToolReader {
    /// A streaming reader for one choice.
    pub fn stream(&self) -> ToolStream {
        ToolStream {
            parser: ToolCallParser::new(self.format, self.names.clone()),
            parallel: self.parallel,
            calls: 0,
        }
    }
}

/// The Lark grammar (llguidance's dialect) for `tool_choice` "required" or
/// a named function: one call in the template's syntax (or one or more,
/// newline-separated, with `parallel_tool_calls`), each call's arguments
/// valid against its tool's `parameters`. None for "auto" and "none".
pub fn call_grammar(tools: &ToolRequest, format: ToolFormat) -> Option<String> {
    let names: Vec<&String> = match &tools.choice {
        ToolChoice::Required => tools.names.iter().collect(),
        ToolChoice::Function(name) => vec![name],
        ToolChoice::None | ToolChoice::Auto => return None,
    };
    let arguments_key = match format {
        ToolFormat::Hermes => "arguments",
        ToolFormat::Llama3 => "parameters",
    };
    // One %json rule per tool, so each call's arguments follow its own
    // tool's schema.
    let mut rules = String::new();
    let mut alternatives = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"const": name},
                arguments_key: tools.parameters(name),
            },
            "required": ["name", arguments_key],
            "additionalProperties": false,
            "x-guidance": {"whitespace_pattern": r"(?: |\n{1,2}[ \t]{0,20})"},
        });
        rules.push_str(&format!("call_{i}: %json {schema}\n"));
        alternatives.push(format!("call_{i}"));
    }
    let call = match format {
        ToolFormat::Hermes => r#""<tool_call>\n" call "\n</tool_call>""#,
        ToolFormat::Llama3 => "call",
    };
    let separator = match format {
        ToolFormat::Hermes => r#""\n""#,
        ToolFormat::Llama3 => r#""; ""#,
    };
    let start = if tools.parallel {
        format!("start: one ({separator} one)*\n")
    } else {
        "start: one\n".to_string()
    };
    Some(format!(
        "%llguidance {{}}\n{start}one: {call}\ncall: {}\n{rules}",
        alternatives.join(" | ")
    ))
}

/// A call id: `call_` and 24 letters and digits, as OpenAI's look.
pub fn call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let state = RandomState::new();
    let mut id = String::from("call_");
    for part in 0..2u64 {
        let mut h = state.build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u64(part);
        let mut x = h.finish();
        for _ in 0..12 {
            id.push(ALPHABET[(x % ALPHABET.len() as u64) as usize] as char);
            x /= ALPHABET.len() as u64;
        }
    }
    id
}

/// A call as the answer lists it.
fn call_value(call: &ParsedCall, id: &str) -> Value {
    json!({
        "id": id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

/// Read the calls out of every choice of a whole chat answer: each
/// choice's `message.content` becomes the text outside its calls (null
/// when there is none), `message.tool_calls` lists the calls, and
/// `finish_reason` is `tool_calls`. Choices without calls are unchanged.
pub fn read_response(body: &mut Value, reader: &ToolReader) {
    let Some(choices) = body.get_mut("choices").and_then(Value::as_array_mut) else {
        return;
    };
    for choice in choices {
        let text = choice["message"]["content"].as_str().unwrap_or("");
        let mut parsed = tool_calls::parse(reader.format, &reader.names, text);
        if parsed.calls.is_empty() {
            continue;
        }
        if !reader.parallel {
            parsed.calls.truncate(1);
        }
        let calls: Vec<Value> = parsed
            .calls
            .iter()
            .map(|c| call_value(c, &call_id()))
            .collect();
        let message = &mut choice["message"];
        message["content"] = parsed.content.map_or(Value::Null, Value::String);
        message["tool_calls"] = Value::Array(calls);
        choice["finish_reason"] = json!("tool_calls");
    }
}

/// What a streamed choice says next.
#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    Content(String),
    /// A whole call: its first chunk (index, id, type, name) and its
    /// arguments are two `delta.tool_calls` chunks ([`call_deltas`]).
    Call {
        index: usize,
        call: ParsedCall,
    },
}

/// One streamed choice's reader: text in, content and calls out.
#[derive(Debug)]
pub struct ToolStream {
    parser: ToolCallParser,
    parallel: bool,
    calls: usize,
}

impl ToolStream {
    /// More of the reply.
    pub fn text(&mut self, text: &str) -> Vec<Delta> {
        let pieces = self.parser.push(text);
        self.deltas(pieces)
    }

    /// The end of the reply: what was held back.
    pub fn finish(&mut self) -> Vec<Delta> {
        let pieces = self.parser.finish();
        self.deltas(pieces)
    }

    /// Whether the reply called a tool (its `finish_reason` is then
    /// `tool_calls`).
    pub fn called(&self) -> bool {
        self.calls > 0
    }

    fn deltas(&mut self, pieces: Vec<Piece>) -> Vec<Delta> {
        let mut out = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match piece {
                Piece::Content(t) => out.push(Delta::Content(t)),
                Piece::Call(call) => {
                    if !self.parallel && self.calls > 0 {
                        continue;
                    }
                    out.push(Delta::Call {
                        index: self.calls,
                        call,
                    });
                    self.calls += 1;
                }
            }
        }
        out
    }
}

/// The `delta.tool_calls` of a streamed call as OpenAI sends them: first
/// the index, id, type and name with empty arguments, then the arguments.
pub fn call_deltas(index: usize, call: &ParsedCall) -> [Value; 2] {
    [
        json!([{
            "index": index,
            "id": call_id(),
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]),
        json!([{"index": index, "function": {"arguments": call.arguments}}]),
    ]
}

fn wrong_type(param: &str, want: &str, got: &Value) -> ApiError {
    let got = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    ApiError::param(param, format!("`{param}` must be {want}, not {got}")).with_code("invalid_type")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }})
    }

    fn time() -> Value {
        json!({"type": "function", "function": {"name": "get_time"}})
    }

    fn request(extra: Value) -> Result<Option<ToolRequest>, ApiError> {
        let mut o = obj(json!({"tools": [weather(), time()]}));
        o.extend(obj(extra));
        ToolRequest::from_json(&o)
    }

    #[test]
    fn tool_choices() {
        let r = request(json!({})).unwrap().unwrap();
        assert_eq!(r.choice, ToolChoice::Auto);
        assert_eq!(r.names, ["get_weather", "get_time"]);
        assert!(r.parallel);
        assert_eq!(r.shown().len(), 2);
        let r = request(json!({"tool_choice": "none"})).unwrap().unwrap();
        assert_eq!(r.choice, ToolChoice::None);
        assert!(r.shown().is_empty());
        assert!(r.reader(ToolFormat::Hermes).is_none());
        let r = request(json!({"tool_choice": "required", "parallel_tool_calls": false}))
            .unwrap()
            .unwrap();
        assert_eq!(r.choice, ToolChoice::Required);
        assert!(!r.parallel);
        let r =
            request(json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}))
                .unwrap()
                .unwrap();
        assert_eq!(r.choice, ToolChoice::Function("get_time".into()));
        // No tools: nothing, whatever "none"/"auto" say.
        for choice in [json!(null), json!("none"), json!("auto")] {
            assert_eq!(
                ToolRequest::from_json(&obj(json!({"tool_choice": choice}))),
                Ok(None)
            );
        }
    }

    #[test]
    fn invalid_tools_name_the_field() {
        let cases = [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": []}), "tools"),
            (json!({"tools": [5]}), "tools[0]"),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
            (
                json!({"tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"description": "x"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "has space"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
                "tools[0].function.parameters",
            ),
            (json!({"tools": [time(), time()]}), "tools[1].function.name"),
            (
                json!({"tools": [time()], "tool_choice": "always"}),
                "tool_choice",
            ),
            (json!({"tools": [time()], "tool_choice": 1}), "tool_choice"),
            (
                json!({"tools": [time()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
            ),
            (
                json!({"tools": [time()], "tool_choice": {"type": "function"}}),
                "tool_choice.function.name",
            ),
            (
                json!({"tools": [time()], "tool_choice": {"type": "code"}}),
                "tool_choice.type",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [time()], "parallel_tool_calls": "no"}),
                "parallel_tool_calls",
            ),
        ];
        for (body, param) in cases {
            let e = ToolRequest::from_json(&obj(body.clone())).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    fn message(m: Value) -> Result<Message, ApiError> {
        let m = obj(m);
        let mut message = Message::new(
            m["role"].as_str().unwrap(),
            m.get("content").and_then(Value::as_str).unwrap_or(""),
        );
        message_fields("messages[1]", &m, &mut message)?;
        Ok(message)
    }

    #[test]
    fn tool_turns_of_messages() {
        let m = message(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
        ]}))
        .unwrap();
        assert_eq!(m.content, None);
        assert_eq!(
            m.tool_calls,
            vec![ToolCall {
                id: Some("call_1".into()),
                name: "get_weather".into(),
                arguments: json!({"city": "Paris"}),
            }]
        );
        let m = message(json!({"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"}))
            .unwrap();
        assert_eq!(m.tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(m.name.as_deref(), Some("get_weather"));
        assert_eq!(m.content.as_deref(), Some("18 C"));
        // Text with calls stays text.
        let m = message(
            json!({"role": "assistant", "content": "Let me see.", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
            ]}),
        )
        .unwrap();
        assert_eq!(m.content.as_deref(), Some("Let me see."));
        for (m, param) in [
            (
                json!({"role": "tool", "content": "x"}),
                "messages[1].tool_call_id",
            ),
            (
                json!({"role": "tool", "tool_call_id": 5, "content": "x"}),
                "messages[1].tool_call_id",
            ),
            (
                json!({"role": "user", "content": "x", "tool_calls": []}),
                "messages[1].tool_calls",
            ),
            (
                json!({"role": "assistant", "tool_calls": {}}),
                "messages[1].tool_calls",
            ),
            (
                json!({"role": "assistant", "tool_calls": [5]}),
                "messages[1].tool_calls[0]",
            ),
            (
                json!({"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}),
                "messages[1].tool_calls[0].function.name",
            ),
            (
                json!({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 5}}]}),
                "messages[1].tool_calls[0].function.arguments",
            ),
            (
                json!({"role": "assistant", "tool_calls": [{"type": "x", "function": {"name": "f"}}]}),
                "messages[1].tool_calls[0].type",
            ),
            (
                json!({"role": "user", "content": "x", "name": 1}),
                "messages[1].name",
            ),
        ] {
            let e = message(m.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{m}: {}", e.message);
        }
    }

    /// Through the chat request parser: tools and tool turns together.
    #[test]
    fn a_chat_request_with_tools_and_tool_turns() {
        let body = json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}
            ],
            "tools": [weather(), time()],
            "tool_choice": "auto",
            "parallel_tool_calls": true,
        });
        let defaults = engine::GenParams::new(engine::SamplerConfig::default());
        let r = crate::api::ChatRequest::from_json(&obj(body), &defaults).unwrap();
        let t = r.tools.unwrap();
        assert_eq!((t.choice, t.parallel), (ToolChoice::Auto, true));
        assert_eq!(r.messages[1].content, None);
        assert_eq!(
            r.messages[1].tool_calls[0].arguments,
            json!({"city": "Paris"})
        );
        assert_eq!(r.messages[2], Message::tool("call_1", "18 C"));
        assert!(has_tool_turns(&r.messages));
    }

    fn reader(parallel: bool) -> ToolReader {
        ToolReader {
            format: ToolFormat::Hermes,
            names: vec!["get_weather".into(), "get_time".into()],
            parallel,
        }
    }

    #[test]
    fn whole_answers_list_their_calls() {
        let text = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let body = json!({"choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"},
            {"index": 1, "message": {"role": "assistant", "content": "No call."}, "finish_reason": "stop"},
        ]});
        let mut b = body.clone();
        read_response(&mut b, &reader(true));
        let c = &b["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert_eq!(c["message"]["content"], "Checking.");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        assert_ne!(calls[0]["id"], calls[1]["id"]);
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert_eq!(b["choices"][1], body["choices"][1]);
        // parallel_tool_calls false: the first call only.
        let mut b = body.clone();
        read_response(&mut b, &reader(false));
        assert_eq!(
            b["choices"][0]["message"]["tool_calls"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        // Only calls: content null.
        let mut b = json!({"choices": [{"message": {"content": "{\"name\": \"get_time\", \"arguments\": {}}"}}]});
        read_response(&mut b, &reader(true));
        assert!(b["choices"][0]["message"]["content"].is_null());
        assert_eq!(
            b["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
    }

    #[test]
    fn streams_give_content_then_calls() {
        let mut s = reader(true).stream();
        let mut deltas = Vec::new();
        for piece in [
            "Check",
            "ing.\n<tool",
            "_call>\n{\"name\": \"get_time\", ",
            "\"arguments\": {}}\n</tool_call>",
        ] {
            deltas.extend(s.text(piece));
        }
        deltas.extend(s.finish());
        assert_eq!(
            deltas,
            vec![
                Delta::Content("Check".into()),
                Delta::Content("ing.".into()),
                Delta::Call {
                    index: 0,
                    call: ParsedCall {
                        name: "get_time".into(),
                        arguments: "{}".into()
                    }
                }
            ]
        );
        assert!(s.called());
        let [first, rest] = call_deltas(
            0,
            &ParsedCall {
                name: "get_time".into(),
                arguments: "{}".into(),
            },
        );
        assert_eq!(first[0]["function"]["arguments"], "");
        assert_eq!(first[0]["type"], "function");
        assert!(first[0]["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(
            rest[0],
            json!({"index": 0, "function": {"arguments": "{}"}})
        );
    }

    #[test]
    fn call_ids_differ() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| call_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids
            .iter()
            .all(|id| id.len() == 29 && id.starts_with("call_")));
    }

    #[test]
    fn grammars_for_required_and_named_calls() {
        let r = request(json!({"tool_choice": "required"}))
            .unwrap()
            .unwrap();
        let g = call_grammar(&r, ToolFormat::Hermes).unwrap();
        assert!(g.contains("call: call_0 | call_1"), "{g}");
        assert!(
            g.contains(r#""<tool_call>\n" call "\n</tool_call>""#),
            "{g}"
        );
        assert!(g.contains(r#"start: one ("\n" one)*"#), "{g}");
        assert!(g.contains(r#""const":"get_weather""#), "{g}");
        let r = request(json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}, "parallel_tool_calls": false}))
            .unwrap()
            .unwrap();
        let g = call_grammar(&r, ToolFormat::Llama3).unwrap();
        assert!(
            g.contains("start: one\n") && g.contains("call: call_0\n"),
            "{g}"
        );
        assert!(
            g.contains(
                r#""parameters":{"type":"object","properties":{},"additionalProperties":false}"#
            ),
            "{g}"
        );
        assert!(call_grammar(&request(json!({})).unwrap().unwrap(), ToolFormat::Hermes).is_none());
    }

    #[test]
    fn schemas_are_closed_where_they_do_not_say() {
        let mut s = json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string"}}},
            "c": {"type": "array", "items": {"type": "object", "properties": {}}},
            "d": {"type": "object", "properties": {}, "additionalProperties": true},
            "e": {"anyOf": [{"type": "object", "properties": {"x": {}}}, {"type": "null"}]},
        }});
        closed(&mut s);
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["a"]["additionalProperties"], false);
        assert_eq!(s["properties"]["c"]["items"]["additionalProperties"], false);
        assert_eq!(s["properties"]["d"]["additionalProperties"], true);
        assert_eq!(
            s["properties"]["e"]["anyOf"][0]["additionalProperties"],
            false
        );
        assert!(s["properties"]["e"]["anyOf"][1]
            .get("additionalProperties")
            .is_none());
    }

    /// The grammars compile with llguidance, and random walks through them
    /// (every byte a token, random choices) always give replies the parser
    /// reads as calls of the allowed tools with valid arguments.
    #[test]
    fn grammar_outputs_always_parse_as_calls() {
        use engine::{ConstraintSpec, GrammarCompiler};
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"<tool_call>".to_vec());
        let eos = words.len() as u32;
        words.push(b"\xff<|im_end|>".to_vec());
        let compiler = GrammarCompiler::from_token_bytes(words.clone(), eos).unwrap();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for (extra, format, allowed) in [
            (
                json!({"tool_choice": "required"}),
                ToolFormat::Hermes,
                vec!["get_weather", "get_time"],
            ),
            (
                json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false}),
                ToolFormat::Hermes,
                vec!["get_weather"],
            ),
            (
                json!({"tool_choice": "required"}),
                ToolFormat::Llama3,
                vec!["get_weather", "get_time"],
            ),
        ] {
            let r = request(extra).unwrap().unwrap();
            let lark = call_grammar(&r, format).unwrap();
            let grammar = compiler
                .compile(&ConstraintSpec::Lark(lark.clone()))
                .unwrap_or_else(|e| panic!("{e}\n{lark}"));
            let reader = r.reader(format).unwrap();
            let mut complete = 0;
            for walk in 0..20 {
                let mut c = grammar.start();
                let mut out = Vec::new();
                let mut ended = false;
                for _ in 0..400 {
                    if c.is_complete() {
                        ended = true;
                        break;
                    }
                    let allowed: Vec<u32> = (0..words.len() as u32)
                        .filter(|&t| t != eos && c.allows(t).unwrap())
                        .collect();
                    if c.is_accepting() && (allowed.is_empty() || next() % 3 == 0) {
                        ended = true;
                        break;
                    }
                    // Prefer closing brackets and quotes so walks end.
                    let closing: Vec<u32> = allowed
                        .iter()
                        .copied()
                        .filter(|&t| matches!(t as u8, b'}' | b'"' | b'<' | b'\n') && t < 256)
                        .collect();
                    let pool = if !closing.is_empty() && next() % 2 == 0 {
                        &closing
                    } else {
                        &allowed
                    };
                    let t = pool[(next() % pool.len() as u64) as usize];
                    out.extend_from_slice(&words[t as usize]);
                    c.commit(t).unwrap();
                }
                if !ended {
                    continue;
                }
                complete += 1;
                let text = String::from_utf8_lossy(&out).into_owned();
                let parsed = tool_calls::parse(reader.format, &reader.names, &text);
                assert!(!parsed.calls.is_empty(), "walk {walk}: {text:?}");
                assert_eq!(parsed.content, None, "walk {walk}: {text:?}");
                if !r.parallel {
                    assert_eq!(parsed.calls.len(), 1);
                }
                for call in parsed.calls {
                    assert!(allowed.contains(&call.name.as_str()), "{text:?}");
                    let args: Value = serde_json::from_str(&call.arguments).unwrap();
                    if call.name == "get_weather" {
                        assert!(args["city"].is_string(), "{text:?}");
                    }
                }
            }
            assert!(complete >= 10, "{complete} of 20 walks ended");
        }
    }
}
