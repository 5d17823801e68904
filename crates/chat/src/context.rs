//! The variables a template sees, as transformers' `apply_chat_template`
//! passes them: `messages` (a list of `{role, content}` dicts, with
//! `tool_calls`, `tool_call_id` and `name` where a turn has them), `tools` and
//! `documents` (None unless given), `add_generation_prompt`, the
//! tokenizer's special tokens (`bos_token`, `eos_token`; left undefined when
//! the tokenizer has none, so `bos_token is defined` answers as in Python),
//! then any extra keyword arguments, which may override the tokens.

use minijinja::value::Value;

use crate::error::Error;
use crate::message::{Message, ToolCall};

/// Extra variables callers may not override: the renderer sets them.
const RESERVED: [&str; 2] = ["messages", "add_generation_prompt"];

pub struct Context<'a> {
    pub messages: &'a [Message],
    pub add_generation_prompt: bool,
    pub bos_token: Option<&'a str>,
    pub eos_token: Option<&'a str>,
    pub extra: &'a serde_json::Map<String, serde_json::Value>,
}

impl Context<'_> {
    pub fn to_value(&self) -> Result<Value, Error> {
        let messages: Vec<Value> = self.messages.iter().map(message_value).collect();
        let mut vars: Vec<(&str, Value)> = vec![
            ("messages", Value::from(messages)),
            ("tools", Value::from(())),
            ("documents", Value::from(())),
            (
                "add_generation_prompt",
                Value::from(self.add_generation_prompt),
            ),
        ];
        if let Some(bos) = self.bos_token {
            vars.push(("bos_token", Value::from(bos)));
        }
        if let Some(eos) = self.eos_token {
            vars.push(("eos_token", Value::from(eos)));
        }
        for (name, value) in self.extra {
            if RESERVED.contains(&name.as_str()) {
                return Err(Error::ReservedVariable(name.clone()));
            }
            let value = json_value(value);
            match vars.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = value,
                None => vars.push((name, value)),
            }
        }
        Ok(Value::from_pairs(vars))
    }
}

fn message_value(message: &Message) -> Value {
    let mut pairs = vec![
        ("role", Value::from(message.role.as_str())),
        ("content", Value::from(message.content.as_deref())),
    ];
    if !message.tool_calls.is_empty() {
        let calls: Vec<Value> = message.tool_calls.iter().map(tool_call_value).collect();
        pairs.push(("tool_calls", Value::from(calls)));
    }
    if let Some(id) = &message.tool_call_id {
        pairs.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(name) = &message.name {
        pairs.push(("name", Value::from(name.as_str())));
    }
    Value::from_pairs(pairs)
}

/// `{"id": ..., "type": "function", "function": {"name": ..., "arguments": ...}}`,
/// the shape of OpenAI's calls (templates read `tool_call.function`).
fn tool_call_value(call: &ToolCall) -> Value {
    let function = Value::from_pairs([
        ("name", Value::from(call.name.as_str())),
        ("arguments", json_value(&call.arguments)),
    ]);
    let mut pairs = Vec::with_capacity(3);
    if let Some(id) = &call.id {
        pairs.push(("id", Value::from(id.as_str())));
    }
    pairs.push(("type", Value::from("function")));
    pairs.push(("function", function));
    Value::from_pairs(pairs)
}

/// JSON as Python's `json.loads` gives it: null → None, objects → dicts.
pub(crate) fn json_value(value: &serde_json::Value) -> Value {
    use serde_json::Value as Json;
    match value {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(json_value).collect::<Vec<_>>()),
        Json::Object(map) => {
            Value::from_pairs(map.iter().map(|(k, v)| (k.as_str(), json_value(v))))
        }
    }
}
