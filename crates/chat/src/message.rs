//! One turn of a conversation, as the template sees it: a dict with `role`
//! and `content`, in that order (Python dicts keep insertion order, and a
//! template may iterate or `tojson` a message), then, only when the turn
//! has them, `tool_calls`, `tool_call_id` and `name`. Keys a turn lacks
//! are left out rather than set to None, as transformers passes the dicts
//! it is given: Llama 3's template asks `'tool_calls' in message`.

/// A conversation turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`, or whatever else the
    /// template knows.
    pub role: String,
    /// The text; `None` is Python's None (an assistant turn that only
    /// calls tools, sent with `"content": null`).
    pub content: Option<String>,
    /// The calls an assistant turn made (OpenAI's `tool_calls`).
    pub tool_calls: Vec<ToolCall>,
    /// Which call a `tool` turn answers.
    pub tool_call_id: Option<String>,
    /// The function a `tool` turn answers for (or a participant's name).
    pub name: Option<String>,
}

/// A function call of an assistant turn, as the template sees it:
/// `{"id": ..., "type": "function", "function": {"name": ..., "arguments": ...}}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: Option<String>,
    pub name: String,
    /// The arguments as templates expect them: a JSON object (transformers
    /// documents a dict; templates write it with `tojson`). OpenAI's
    /// clients send a JSON string: [`ToolCall::from_openai`] parses it.
    pub arguments: serde_json::Value,
}

impl ToolCall {
    /// A call as OpenAI's API carries it, `arguments` a JSON string: it
    /// reaches the template parsed, as vLLM and llama.cpp's server pass
    /// it (a template's `arguments | tojson` would otherwise write a
    /// quoted string). A string that is not JSON stays a string.
    pub fn from_openai(id: Option<String>, name: String, arguments: &str) -> ToolCall {
        let arguments = serde_json::from_str(arguments)
            .unwrap_or_else(|_| serde_json::Value::String(arguments.to_string()));
        ToolCall {
            id,
            name,
            arguments,
        }
    }
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }

    /// An assistant turn that calls tools, with no text (`content` None).
    pub fn tool_calls(calls: Vec<ToolCall>) -> Message {
        Message {
            content: None,
            tool_calls: calls,
            ..Message::new("assistant", "")
        }
    }

    /// A `tool` turn: the result of the call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            tool_call_id: Some(tool_call_id.into()),
            ..Message::new("tool", content)
        }
    }

    /// The text, `""` for None.
    pub fn text(&self) -> &str {
        self.content.as_deref().unwrap_or("")
    }
}
