//! OpenAI request parsing and response shapes for `/v1/chat/completions`
//! and `/v1/completions`.
//!
//! Requests are read from a `serde_json::Value` field by field, so a wrong
//! type or value names the field (`param`) in the 400 answered. A field
//! not in [`COMMON_FIELDS`] or the endpoint's list ([`CHAT_FIELDS`],
//! [`COMPLETION_FIELDS`]) is a 400 naming it: nothing a client asks for is
//! silently ignored (docs/API.md says what each field does).
//!
//! Sampling defaults are llama.cpp's server's (temperature 0.8, top-k 40,
//! top-p 0.95, min-p 0.05), not OpenAI's; `top_k`, `min_p` and
//! `repeat_penalty` are accepted as llama.cpp's extensions.

use chat::Message;
use engine::{Finish, FinishReason, GenParams, SamplerConfig};
use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// Most stop strings a request may give.
pub const MAX_STOP: usize = 16;

/// Which endpoint: the shapes of their responses differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// Fields both endpoints know. Each is implemented, or harmless to accept
/// and documented as accepted-and-ignored in docs/API.md (`metadata`,
/// `service_tier`, `prediction`, `cache_prompt`: none changes the output).
/// A new field goes here (or in its endpoint's list) with its parser.
pub const COMMON_FIELDS: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "user",
    "metadata",
    "store",
    "service_tier",
    // llama.cpp server's extensions.
    "top_k",
    "min_p",
    "repeat_penalty",
    "ignore_eos",
    "cache_prompt",
    // Structured output.
    "response_format",
    "grammar",
    "json_schema",
    // Ours: a long memory by name.
    "memory",
];

/// Fields only `/v1/chat/completions` knows.
pub const CHAT_FIELDS: &[&str] = &[
    "messages",
    "top_logprobs",
    "prediction",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];

/// Fields only `/v1/completions` knows.
pub const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "suffix"];

/// Keys of `stream_options` (`include_obfuscation` pads chunks against
/// length side channels on OpenAI's side; accepted and ignored).
pub const STREAM_OPTIONS_FIELDS: &[&str] = &["include_usage", "include_obfuscation"];

/// Most choices one request may ask for (`n`); the server also keeps `n`
/// within its slots.
pub const MAX_N: u64 = 64;

/// Most `logprobs` alternatives of `/v1/completions` (OpenAI's limit; chat's
/// `top_logprobs` goes to [`engine::params::MAX_TOP_LOGPROBS`]).
pub const MAX_COMPLETION_LOGPROBS: u64 = 5;

/// 400 for the first field of `obj` that `kind` does not know, naming it
/// (OpenAI's message for an unknown argument).
pub fn check_fields(obj: &Map<String, Value>, kind: Kind) -> Result<(), ApiError> {
    let own = match kind {
        Kind::Chat => CHAT_FIELDS,
        Kind::Completion => COMPLETION_FIELDS,
    };
    match obj
        .keys()
        .find(|k| !COMMON_FIELDS.contains(&k.as_str()) && !own.contains(&k.as_str()))
    {
        Some(k) => Err(
            ApiError::param(k, format!("Unrecognized request argument supplied: {k}"))
                .with_code("unknown_parameter"),
        ),
        None => Ok(()),
    }
}

/// What both endpoints take besides the prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub stream: bool,
    /// Choices to generate for the one prompt (`n`, at least 1).
    pub n: usize,
    pub include_usage: bool,
    /// How to generate: the server's defaults (its command line) with what
    /// the request sets. `max_tokens` is `max_completion_tokens`, else
    /// `max_tokens`; `usize::MAX` runs until the context is full.
    pub params: GenParams,
}

/// A completions prompt: text, or token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub options: Options,
    /// `tools`, `tool_choice`, `parallel_tool_calls` ([`crate::tools`]).
    pub tools: Option<crate::tools::ToolRequest>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    pub options: Options,
}

/// The body as a JSON object, or a 400 saying why not.
pub fn parse_body(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("The body is not valid JSON: {e}")))?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(ApiError::invalid(format!(
            "The body must be a JSON object, not {}",
            type_name(&other)
        ))),
    }
}

impl ChatRequest {
    pub fn from_json(
        obj: &Map<String, Value>,
        defaults: &GenParams,
    ) -> Result<ChatRequest, ApiError> {
        check_fields(obj, Kind::Chat)?;
        let messages = match obj.get("messages") {
            Some(Value::Array(items)) if !items.is_empty() => items
                .iter()
                .enumerate()
                .map(|(i, m)| message(i, m))
                .collect::<Result<Vec<_>, _>>()?,
            Some(Value::Array(_)) => {
                return Err(ApiError::param("messages", "`messages` must not be empty"))
            }
            None | Some(Value::Null) => {
                return Err(ApiError::param(
                    "messages",
                    "Missing required parameter: `messages`",
                ))
            }
            Some(other) => return Err(wrong_type("messages", "an array", other)),
        };
        Ok(ChatRequest {
            messages,
            options: Options::from_json(obj, defaults, Kind::Chat)?,
            tools: crate::tools::ToolRequest::from_json(obj)?,
        })
    }
}

impl CompletionRequest {
    pub fn from_json(
        obj: &Map<String, Value>,
        defaults: &GenParams,
    ) -> Result<CompletionRequest, ApiError> {
        check_fields(obj, Kind::Completion)?;
        let one_prompt = || ApiError::param("prompt", "Only one prompt per request is supported");
        let prompt = match obj.get("prompt") {
            Some(Value::String(s)) => Prompt::Text(s.clone()),
            Some(Value::Array(items)) if items.is_empty() => {
                return Err(ApiError::param("prompt", "`prompt` must not be empty"))
            }
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
                if items.len() > 1 {
                    return Err(one_prompt());
                }
                Prompt::Text(items[0].as_str().unwrap_or_default().to_string())
            }
            Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
                Prompt::Tokens(token_ids(items)?)
            }
            Some(Value::Array(items)) if items.iter().all(Value::is_array) => {
                if items.len() > 1 {
                    return Err(one_prompt());
                }
                let inner = items[0].as_array().expect("checked");
                if inner.is_empty() {
                    return Err(ApiError::param("prompt", "`prompt` must not be empty"));
                }
                Prompt::Tokens(token_ids(inner)?)
            }
            None | Some(Value::Null) => {
                return Err(ApiError::param(
                    "prompt",
                    "Missing required parameter: `prompt`",
                ))
            }
            Some(other) => {
                return Err(wrong_type(
                    "prompt",
                    "a string, an array of one string, or an array of token ids",
                    other,
                ))
            }
        };
        if obj.get("echo").and_then(Value::as_bool) == Some(true) {
            return Err(ApiError::param("echo", "`echo` is not supported"));
        }
        if let Some(suffix) = obj.get("suffix").filter(|v| !v.is_null()) {
            if suffix.as_str() != Some("") {
                return Err(ApiError::param("suffix", "`suffix` is not supported"));
            }
        }
        Ok(CompletionRequest {
            prompt,
            options: Options::from_json(obj, defaults, Kind::Completion)?,
        })
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| {
                    ApiError::param("prompt", format!("Token id {v} is not a valid token id"))
                })
        })
        .collect()
}

/// The roles OpenAI's API takes; anything else is a 400, as there (a
/// template given a role it does not know may render it as anything).
pub const ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// One chat message: `role` and `content` (a string, null, or an array of
/// `{"type": "text", "text": ...}` parts).
fn message(i: usize, m: &Value) -> Result<Message, ApiError> {
    let param = format!("messages[{i}]");
    let Value::Object(m) = m else {
        return Err(wrong_type(&param, "an object", m));
    };
    let role = match m.get("role") {
        Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.clone(),
        Some(Value::String(r)) if !r.is_empty() => {
            return Err(ApiError::param(
                &format!("{param}.role"),
                format!(
                    "Invalid value for `{param}.role`: `{r}`; supported: {}",
                    ROLES.join(", ")
                ),
            ))
        }
        Some(other) if !other.is_null() => {
            return Err(wrong_type(&format!("{param}.role"), "a string", other))
        }
        _ => {
            return Err(ApiError::param(
                &format!("{param}.role"),
                format!("Missing required parameter: `{param}.role`"),
            ))
        }
    };
    let content_param = format!("{param}.content");
    let content = match m.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (k, part) in parts.iter().enumerate() {
                let p = format!("{content_param}[{k}]");
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some("text"), _) => {
                        return Err(ApiError::param(
                            &format!("{p}.text"),
                            format!("`{p}.text` must be a string"),
                        ))
                    }
                    (Some(other), _) => {
                        return Err(ApiError::param(
                            &p,
                            format!(
                                "Content parts of type `{other}` are not supported; only `text`"
                            ),
                        ))
                    }
                    (None, _) => {
                        return Err(ApiError::param(
                            &p,
                            format!("`{p}` must be an object with a `type`"),
                        ))
                    }
                }
            }
            text
        }
        Some(other) => {
            return Err(wrong_type(
                &content_param,
                "a string or an array of content parts",
                other,
            ))
        }
    };
    let mut message = Message::new(role, content);
    crate::tools::message_fields(&param, m, &mut message)?;
    Ok(message)
}

impl Options {
    /// The request's settings over `defaults`. Sampling values go through
    /// the engine's one check ([`engine::validate`]), as the command
    /// line's do. `kind` says how `logprobs` reads (chat: a boolean with
    /// `top_logprobs`; completions: how many alternatives).
    pub fn from_json(
        obj: &Map<String, Value>,
        defaults: &GenParams,
        kind: Kind,
    ) -> Result<Options, ApiError> {
        let f = Fields(obj);
        let n = f.int("n", 1, MAX_N)?.map_or(1, |n| n as usize);
        let logprobs = logprobs(&f, kind)?;
        let logit_bias = logit_bias(obj)?;
        if f.bool("store")? == Some(true) {
            return Err(ApiError::param(
                "store",
                "This server stores no completions: `store` must be false or absent",
            ));
        }
        let stream = f.bool("stream")?.unwrap_or(false);
        let include_usage = match obj.get("stream_options") {
            None | Some(Value::Null) => false,
            Some(Value::Object(o)) => {
                if let Some(k) = o
                    .keys()
                    .find(|k| !STREAM_OPTIONS_FIELDS.contains(&k.as_str()))
                {
                    let param = format!("stream_options.{k}");
                    return Err(ApiError::param(
                        &param,
                        format!("Unrecognized request argument supplied: {param}"),
                    )
                    .with_code("unknown_parameter"));
                }
                Fields(o)
                    .bool("include_usage")
                    .map_err(|e| e.with_param("stream_options.include_usage"))?
                    .unwrap_or(false)
            }
            Some(other) => return Err(wrong_type("stream_options", "an object", other)),
        };
        let max_tokens = match f.int("max_completion_tokens", 1, u64::MAX)? {
            Some(n) => Some(n),
            None => f.int("max_tokens", 1, u64::MAX)?,
        }
        .map_or(defaults.max_tokens, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        });
        let seed = match obj.get("seed") {
            None | Some(Value::Null) => defaults.sampling.seed,
            // The sampler's seed is 32 bits: take the low ones.
            Some(v) => match (v.as_i64(), v.as_u64()) {
                (Some(s), _) => Some(s as u32),
                (None, Some(s)) => Some(s as u32),
                _ => return Err(wrong_type("seed", "an integer", v)),
            },
        };
        let stop = match obj.get("stop") {
            None | Some(Value::Null) => defaults.stop.clone(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => {
                if items.len() > MAX_STOP {
                    return Err(ApiError::param(
                        "stop",
                        format!("At most {MAX_STOP} stop strings are supported"),
                    ));
                }
                items
                    .iter()
                    .map(|s| match s {
                        Value::String(s) => Ok(s.clone()),
                        other => Err(wrong_type("stop", "a string or an array of strings", other)),
                    })
                    .collect::<Result<_, _>>()?
            }
            Some(other) => {
                return Err(wrong_type("stop", "a string or an array of strings", other))
            }
        };
        let d = &defaults.sampling;
        let sampling = SamplerConfig {
            temp: f.num("temperature")?.unwrap_or(d.temp),
            top_p: f.num("top_p")?.unwrap_or(d.top_p),
            min_p: f.num("min_p")?.unwrap_or(d.min_p),
            top_k: f
                .int("top_k", 0, u32::MAX as u64)?
                .map_or(d.top_k, |k| k as usize),
            frequency_penalty: f.num("frequency_penalty")?.unwrap_or(d.frequency_penalty),
            presence_penalty: f.num("presence_penalty")?.unwrap_or(d.presence_penalty),
            repeat_penalty: f.num("repeat_penalty")?.unwrap_or(d.repeat_penalty),
            seed,
            ..d.clone()
        };
        engine::validate(&sampling).map_err(|e| {
            let name = e.param.field();
            ApiError::param(name, e.describe(&format!("`{name}`")))
        })?;
        Ok(Options {
            stream,
            n,
            include_usage,
            params: GenParams {
                max_tokens,
                sampling,
                stop,
                ignore_eos: f.bool("ignore_eos")?.unwrap_or(defaults.ignore_eos),
                logprobs,
                logit_bias,
                // Anything else as the server's defaults say.
                ..defaults.clone()
            },
        })
    }
}

/// `logprobs` (and chat's `top_logprobs`): how many alternatives each
/// generated token lists, or `None` for no log-probabilities.
fn logprobs(f: &Fields, kind: Kind) -> Result<Option<usize>, ApiError> {
    match kind {
        Kind::Chat => {
            let on = f.bool("logprobs")?.unwrap_or(false);
            let top = f.int("top_logprobs", 0, engine::params::MAX_TOP_LOGPROBS as u64)?;
            match (on, top) {
                (false, Some(_)) => Err(ApiError::param(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs` set to true",
                )),
                (false, None) => Ok(None),
                (true, top) => Ok(Some(top.unwrap_or(0) as usize)),
            }
        }
        Kind::Completion => Ok(f
            .int("logprobs", 0, MAX_COMPLETION_LOGPROBS)?
            .map(|n| n as usize)),
    }
}

/// `logit_bias`: an object from token ids (as strings, OpenAI's form) to
/// biases in [-100, 100]. Whether an id is in the vocabulary is checked
/// with the model ([`check_logit_bias`]).
fn logit_bias(obj: &Map<String, Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let map = match obj.get("logit_bias") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(wrong_type(
                "logit_bias",
                "an object from token ids to biases",
                other,
            ))
        }
    };
    let max = engine::params::MAX_LOGIT_BIAS;
    map.iter()
        .map(|(k, v)| {
            let id = k.parse::<u32>().map_err(|_| {
                ApiError::param(
                    "logit_bias",
                    format!("`logit_bias` keys are token ids (e.g. \"50256\"), not {k:?}"),
                )
            })?;
            let bias = v
                .as_f64()
                .filter(|b| (-(max as f64)..=max as f64).contains(b))
                .ok_or_else(|| {
                    ApiError::param(
                        "logit_bias",
                        format!(
                            "`logit_bias` values are numbers from -{max} to {max}; token {k} has {v}"
                        ),
                    )
                })?;
            Ok((id, bias as f32))
        })
        .collect()
}

/// 400 when a `logit_bias` token is outside the model's vocabulary.
pub fn check_logit_bias(params: &GenParams, n_vocab: usize) -> Result<(), ApiError> {
    match params
        .logit_bias
        .iter()
        .find(|(t, _)| *t as usize >= n_vocab)
    {
        Some((t, _)) => Err(ApiError::param(
            "logit_bias",
            format!("`logit_bias` names token {t}, outside the model's vocabulary of {n_vocab}"),
        )),
        None => Ok(()),
    }
}

/// The memory a request names: its `memory` field (our extension), else
/// OpenAI's `user` field. A name is a file name's stem: 1 to 128 letters,
/// digits, `_`, `-` or `.`, starting with a letter or digit, so it can
/// never leave the memory folder.
pub fn memory_name(obj: &Map<String, Value>) -> Result<Option<(&'static str, String)>, ApiError> {
    let (field, v) = match (obj.get("memory"), obj.get("user")) {
        (Some(v), _) if !v.is_null() => ("memory", v),
        (_, Some(v)) if !v.is_null() => ("user", v),
        _ => return Ok(None),
    };
    let Value::String(name) = v else {
        return Err(wrong_type(field, "a string", v));
    };
    let ok = (1..=128).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !ok {
        return Err(ApiError::param(
            field,
            format!(
                "`{field}` names a memory: 1 to 128 letters, digits, `_`, `-` or `.`, starting with a letter or digit"
            ),
        ));
    }
    Ok(Some((field, name.clone())))
}

/// Typed, range-checked reads of optional fields; null counts as absent.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// A number; its range is [`engine::validate`]'s to check.
    fn num(&self, name: &str) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let x = v.as_f64().ok_or_else(|| wrong_type(name, "a number", v))? as f32;
        Ok(Some(x))
    }

    fn int(&self, name: &str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let out_of_range = || {
            ApiError::param(
                name,
                if hi == u64::MAX {
                    format!("`{name}` must be at least {lo}, not {v}")
                } else {
                    format!("`{name}` must be between {lo} and {hi}, not {v}")
                },
            )
        };
        match (v.as_u64(), v.as_i64()) {
            (Some(n), _) if (lo..=hi).contains(&n) => Ok(Some(n)),
            (Some(_), _) | (None, Some(_)) => Err(out_of_range()),
            _ => Err(wrong_type(name, "an integer", v)),
        }
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong_type(name, "a boolean", v)),
        }
    }
}

pub(crate) fn wrong_type(param: &str, want: &str, got: &Value) -> ApiError {
    ApiError::param(
        param,
        format!("`{param}` must be {want}, not {}", type_name(got)),
    )
    .with_code("invalid_type")
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Names a response: its id, creation time and model.
#[derive(Clone, Debug)]
pub struct Envelope {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Envelope {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// The whole answer of a non-streaming request.
    pub fn response(&self, text: &str, finish: &Finish) -> Value {
        let choice = match self.kind {
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish_reason(finish.reason),
            }),
            Kind::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish_reason(finish.reason),
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": fingerprint(),
            "choices": [choice],
            "usage": usage(finish),
        })
    }

    /// A streamed chunk: the first (role only, for chat), a text delta, or
    /// the last (`finish_reason` set, no text). With `include_usage` every
    /// chunk has `"usage": null`, as OpenAI sends them.
    pub fn chunk(
        &self,
        role: bool,
        text: Option<&str>,
        finish: Option<&str>,
        include_usage: bool,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                    delta.insert("content".into(), json!(""));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Kind::Completion => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish,
            }),
        };
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": fingerprint(),
            "choices": [choice],
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// The extra last chunk of `stream_options.include_usage`: no choices.
    pub fn usage_chunk(&self, finish: &Finish) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": fingerprint(),
            "choices": [],
            "usage": usage(finish),
        })
    }
}

/// OpenAI's `finish_reason`: `stop` for an end-of-generation token, a
/// stop string or a complete structured output, `length` for
/// `max_tokens` or a full context.
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::EndOfGeneration
        | FinishReason::StopString
        | FinishReason::Cancelled
        | FinishReason::GrammarComplete => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
    }
}

fn fingerprint() -> String {
    format!("cachefit-{}", env!("CARGO_PKG_VERSION"))
}

pub fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn obj(text: &str) -> Map<String, Value> {
        parse_body(text.as_bytes()).unwrap()
    }

    fn defaults() -> GenParams {
        GenParams::new(SamplerConfig::default())
    }

    fn chat_err(text: &str) -> ApiError {
        ChatRequest::from_json(&obj(text), &defaults()).unwrap_err()
    }

    #[test]
    fn parses_a_full_chat_request() {
        let r = ChatRequest::from_json(&obj(r#"{
            "model": "x", "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": null}
            ],
            "max_completion_tokens": 7, "max_tokens": 3, "temperature": 0, "top_p": 0.5,
            "seed": 42, "stop": ["\n", "END"], "frequency_penalty": 0.5, "presence_penalty": -1,
            "stream": true, "stream_options": {"include_usage": true}, "n": 1, "user": "ignored",
            "ignore_eos": true
        }"#), &defaults())
        .unwrap();
        assert_eq!(
            r.messages,
            vec![
                Message::system("Be brief."),
                Message::user("Hi there"),
                Message::assistant("")
            ]
        );
        let o = r.options;
        assert!(o.stream && o.include_usage);
        let p = o.params;
        assert_eq!(p.max_tokens, 7);
        assert_eq!(p.sampling.temp, 0.0);
        assert_eq!(p.sampling.top_p, 0.5);
        assert_eq!(p.sampling.seed, Some(42));
        assert_eq!(p.sampling.frequency_penalty, 0.5);
        assert_eq!(p.sampling.presence_penalty, -1.0);
        assert_eq!(p.stop, vec!["\n", "END"]);
        assert!(p.ignore_eos);
    }

    #[test]
    fn defaults_are_the_server_s() {
        let body = obj(r#"{"messages": [{"role": "user", "content": "x"}]}"#);
        let o = ChatRequest::from_json(&body, &defaults()).unwrap().options;
        assert!(!o.stream && !o.include_usage);
        assert_eq!(o.params, defaults());
        // The command line's settings are the defaults requests start from.
        let server = GenParams {
            max_tokens: 9,
            stop: vec!["END".into()],
            ignore_eos: true,
            ..GenParams::new(SamplerConfig {
                temp: 0.2,
                seed: Some(5),
                ..SamplerConfig::greedy()
            })
        };
        assert_eq!(
            ChatRequest::from_json(&body, &server)
                .unwrap()
                .options
                .params,
            server
        );
    }

    #[test]
    fn wrong_types_and_values_name_the_field() {
        let cases = [
            (r#"{"messages": "hi"}"#, "messages"),
            (r#"{"messages": []}"#, "messages"),
            (r#"{}"#, "messages"),
            (r#"{"messages": [{"content": "x"}]}"#, "messages[0].role"),
            (
                r#"{"messages": [{"role": "wizard", "content": "x"}]}"#,
                "messages[0].role",
            ),
            (
                r#"{"messages": [{"role": "user", "content": 5}]}"#,
                "messages[0].content",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
                "messages[0].content[0]",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#,
                "temperature",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "temperature": -1}"#,
                "temperature",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}"#,
                "max_tokens",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}"#,
                "max_tokens",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}"#,
                "max_tokens",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "stop": 5}"#,
                "stop",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "stop": ["a", 1]}"#,
                "stop",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}"#,
                "stream",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "seed": "s"}"#,
                "seed",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "n": 0}"#,
                "n",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}}"#,
                "stream_options.include_usage",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}"#,
                "top_p",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "repeat_penalty": 0}"#,
                "repeat_penalty",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "presence_penalty": "a lot"}"#,
                "presence_penalty",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "ignore_eos": 1}"#,
                "ignore_eos",
            ),
        ];
        for (body, param) in cases {
            let e = chat_err(body);
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    fn completion(text: &str) -> Result<CompletionRequest, ApiError> {
        CompletionRequest::from_json(&obj(text), &defaults())
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = chat_err(r#"{"messages": [{"role": "user", "content": "x"}], "best_of": 2}"#);
        assert_eq!(e.param.as_deref(), Some("best_of"));
        assert!(e.message.contains("best_of"), "{}", e.message);
        // Each endpoint's own fields are unknown to the other.
        let e = chat_err(r#"{"messages": [{"role": "user", "content": "x"}], "echo": false}"#);
        assert_eq!(e.param.as_deref(), Some("echo"));
        let e = completion(r#"{"prompt": "x", "top_logprobs": 2}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        let e = chat_err(
            r#"{"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true, "chunk_size": 3}}"#,
        );
        assert_eq!(e.param.as_deref(), Some("stream_options.chunk_size"));
        // Harmless ones are accepted; `store: true` asks for what we do not do.
        let ok = r#"{"messages": [{"role": "user", "content": "x"}], "user": "u", "metadata": {"a": "b"},
            "store": false, "service_tier": "auto", "cache_prompt": true, "n": 1, "logprobs": false,
            "stream_options": {"include_obfuscation": false}}"#;
        assert!(ChatRequest::from_json(&obj(ok), &defaults()).is_ok());
        let e = chat_err(r#"{"messages": [{"role": "user", "content": "x"}], "store": true}"#);
        assert_eq!(e.param.as_deref(), Some("store"));
        // Every listed field passes the check (its own parser judges its value).
        for kind in [Kind::Chat, Kind::Completion] {
            let own = if kind == Kind::Chat {
                CHAT_FIELDS
            } else {
                COMPLETION_FIELDS
            };
            let all: Map<String, Value> = COMMON_FIELDS
                .iter()
                .chain(own)
                .map(|k| (k.to_string(), Value::Null))
                .collect();
            assert_eq!(check_fields(&all, kind), Ok(()));
        }
    }

    #[test]
    fn logprobs_n_and_logit_bias() {
        let chat = |extra: &str| {
            ChatRequest::from_json(
                &obj(&format!(
                    r#"{{"messages": [{{"role": "user", "content": "x"}}]{extra}}}"#
                )),
                &defaults(),
            )
            .map(|r| r.options)
        };
        let o = chat(r#", "logprobs": true, "top_logprobs": 20, "n": 3, "logit_bias": {"5": -100, "7": 2.5}"#)
            .unwrap();
        assert_eq!(o.params.logprobs, Some(20));
        assert_eq!(o.n, 3);
        let mut bias = o.params.logit_bias.clone();
        bias.sort_by_key(|b| b.0);
        assert_eq!(bias, vec![(5, -100.0), (7, 2.5)]);
        assert_eq!(
            chat(r#", "logprobs": true"#).unwrap().params.logprobs,
            Some(0)
        );
        assert_eq!(chat("").unwrap().params.logprobs, None);
        assert_eq!(chat("").unwrap().n, 1);
        for (extra, param) in [
            (r#", "top_logprobs": 2"#, "top_logprobs"),
            (r#", "logprobs": true, "top_logprobs": 21"#, "top_logprobs"),
            (r#", "logprobs": 3"#, "logprobs"),
            (r#", "n": 65"#, "n"),
            (r#", "logit_bias": {"x": 1}"#, "logit_bias"),
            (r#", "logit_bias": {"3": 101}"#, "logit_bias"),
            (r#", "logit_bias": {"3": "a lot"}"#, "logit_bias"),
            (r#", "logit_bias": {"-3": 1}"#, "logit_bias"),
            (r#", "logit_bias": [[3, 1]]"#, "logit_bias"),
        ] {
            let e = chat(extra).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
        }
        // Completions: `logprobs` is how many alternatives, 0 to 5.
        let lp = |v: &str| {
            completion(&format!(r#"{{"prompt": "x", "logprobs": {v}}}"#))
                .map(|r| r.options.params.logprobs)
        };
        assert_eq!(lp("0"), Ok(Some(0)));
        assert_eq!(lp("5"), Ok(Some(5)));
        assert_eq!(lp("null"), Ok(None));
        for bad in ["6", "true", "-1"] {
            assert_eq!(
                lp(bad).unwrap_err().param.as_deref(),
                Some("logprobs"),
                "{bad}"
            );
        }
        // Token ids are checked against the model's vocabulary.
        let p = chat(r#", "logit_bias": {"49151": 1}"#).unwrap().params;
        assert!(check_logit_bias(&p, 49152).is_ok());
        assert_eq!(
            check_logit_bias(&p, 49151).unwrap_err().param.as_deref(),
            Some("logit_bias")
        );
    }

    #[test]
    fn bodies_that_are_not_objects() {
        assert_eq!(parse_body(b"{\"messages\": [").unwrap_err().status, 400);
        assert_eq!(parse_body(b"[1, 2]").unwrap_err().status, 400);
        assert_eq!(parse_body(b"\xff\xfe").unwrap_err().status, 400);
        assert_eq!(parse_body(b"").unwrap_err().status, 400);
    }

    #[test]
    fn completion_prompts() {
        let p = |s: &str| CompletionRequest::from_json(&obj(s), &defaults()).map(|r| r.prompt);
        assert_eq!(p(r#"{"prompt": "hi"}"#), Ok(Prompt::Text("hi".into())));
        assert_eq!(p(r#"{"prompt": ["hi"]}"#), Ok(Prompt::Text("hi".into())));
        assert_eq!(
            p(r#"{"prompt": [1, 2, 3]}"#),
            Ok(Prompt::Tokens(vec![1, 2, 3]))
        );
        assert_eq!(p(r#"{"prompt": [[4, 5]]}"#), Ok(Prompt::Tokens(vec![4, 5])));
        for bad in [
            r#"{"prompt": ["a", "b"]}"#,
            r#"{"prompt": [-1]}"#,
            r#"{"prompt": [1.5]}"#,
            r#"{"prompt": []}"#,
            r#"{"prompt": [[]]}"#,
            r#"{"prompt": {"a": 1}}"#,
            r#"{"prompt": [1, "a"]}"#,
            r#"{}"#,
            r#"{"prompt": "x", "echo": true}"#,
        ] {
            assert_eq!(p(bad).unwrap_err().status, 400, "{bad}");
        }
    }

    #[test]
    fn response_shapes() {
        let finish = Finish {
            reason: FinishReason::Length,
            stop_string: None,
            prompt_tokens: 5,
            completion_tokens: 3,
            cached_tokens: 2,
            seed: 1,
            prompt_time: Duration::ZERO,
            generation_time: Duration::ZERO,
            memory: None,
            speculation: Default::default(),
        };
        let env = Envelope {
            kind: Kind::Chat,
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
        };
        let r = env.response("abc", &finish);
        assert_eq!(r["object"], "chat.completion");
        assert_eq!(r["choices"][0]["message"]["content"], "abc");
        assert_eq!(r["choices"][0]["finish_reason"], "length");
        assert_eq!(r["usage"]["total_tokens"], 8);
        assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
        let c = env.chunk(true, None, None, true);
        assert_eq!(c["choices"][0]["delta"]["role"], "assistant");
        assert!(c["usage"].is_null() && c.get("usage").is_some());
        let last = env.chunk(false, None, Some("stop"), false);
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert!(last.get("usage").is_none());
        assert_eq!(env.usage_chunk(&finish)["choices"], json!([]));

        let env = Envelope {
            kind: Kind::Completion,
            ..env
        };
        assert_eq!(env.response("x", &finish)["choices"][0]["text"], "x");
        assert_eq!(
            env.chunk(false, Some("y"), None, false)["object"],
            "text_completion"
        );
    }
}
