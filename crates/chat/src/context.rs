//! The variables a template sees, as transformers' `apply_chat_template`
//! passes them: `messages` (a list of `{role, content}` dicts), `tools` and
//! `documents` (None unless given), `add_generation_prompt`, the
//! tokenizer's special tokens (`bos_token`, `eos_token`; left undefined when
//! the tokenizer has none, so `bos_token is defined` answers as in Python),
//! then any extra keyword arguments, which may override the tokens.

use minijinja::value::Value;

use crate::error::Error;
use crate::message::Message;

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
    Value::from_pairs([
        ("role", message.role.as_str()),
        ("content", message.content.as_str()),
    ])
}

/// JSON as Python's `json.loads` gives it: null → None, objects → dicts.
fn json_value(value: &serde_json::Value) -> Value {
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
