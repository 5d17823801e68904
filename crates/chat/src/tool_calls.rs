//! Tool calls: how a model is shown its tools and writes calls, and
//! parsing the calls back out of what it generated, whole or as it streams.
//!
//! The syntax is the chat template's: a template that takes `tools` also
//! writes earlier calls back into the prompt, in the syntax the model was
//! trained to produce. [`ToolFormat::detect`] reads it off the template
//! source, as llama.cpp's server does:
//!
//! - [`ToolFormat::Hermes`] (Qwen2.5, Hermes 2 Pro, and most ChatML models):
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one
//!   block per call, text around them allowed. Small Qwen models often
//!   leave out the tags and answer with the bare object, or put it in a
//!   ```` ```json ```` code fence: a reply that is nothing but such objects
//!   (fenced or not), each naming a tool it was given, counts too.
//! - [`ToolFormat::Llama3`] (Llama 3.1–3.3): the whole reply is
//!   `{"name": ..., "parameters": {...}}` (after `<|python_tag|>` when the
//!   text shows control tokens), several separated by `;` or newlines.
//!
//! A template that does not render tools (SmolLM2's, the ChatML fallback,
//! Gemma's) gets them the Hermes way ([`prepare`]): the tool list goes into
//! the system message as Qwen2.5's template words it, earlier calls become
//! `<tool_call>` text and tool results `<tool_response>` user turns.
//!
//! The parser lives here, under the engine and the server, so that `run`,
//! `chat` and `serve` read calls the same way: it is one state machine
//! ([`ToolCallParser`]) fed text as it arrives; [`parse`] feeds it a whole
//! reply, so streamed and whole answers always agree. Anything that does
//! not parse (a tag never closed, JSON cut short, a bare object naming no
//! known tool) is plain content, never an error.

use serde_json::{Map, Value};

use crate::message::Message;
use crate::template::ChatTemplate;

/// Opens and closes a Hermes call.
pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";
/// Llama 3.1's marker before a call (a control token: only there when the
/// text shows control tokens).
pub const PYTHON_TAG: &str = "<|python_tag|>";

/// How a model writes its tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
    Hermes,
    /// `{"name": ..., "parameters": {...}}` as the whole reply.
    Llama3,
}

impl ToolFormat {
    /// The syntax a template renders tools and calls in, or None when it
    /// renders no tools (or in a syntax we do not parse).
    pub fn detect(source: &str) -> Option<ToolFormat> {
        if !source.contains("tools") {
            return None;
        }
        if source.contains(OPEN) {
            Some(ToolFormat::Hermes)
        } else if source.contains("<|start_header_id|>ipython<|end_header_id|>") {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }
}

/// One call read from generated text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments as a JSON text (an object), as OpenAI's API carries
    /// them.
    pub arguments: String,
}

/// What a stream of generated text turned out to be, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Text outside calls (never empty).
    Content(String),
    Call(ParsedCall),
}

/// A whole reply: the text outside the calls (None when there is none,
/// or only whitespace around calls), and the calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub content: Option<String>,
    pub calls: Vec<ParsedCall>,
}

/// Parse a whole reply (the same machine as streaming, fed at once).
pub fn parse(format: ToolFormat, known: &[String], text: &str) -> Parsed {
    let mut parser = ToolCallParser::new(format, known.to_vec());
    let mut pieces = parser.push(text);
    pieces.extend(parser.finish());
    let mut out = Parsed::default();
    for piece in pieces {
        match piece {
            Piece::Content(t) => out.content.get_or_insert_with(String::new).push_str(&t),
            Piece::Call(c) => out.calls.push(c),
        }
    }
    out
}

#[derive(Debug)]
enum State {
    /// Nothing but whitespace (and perhaps the start of an opener) yet.
    Start,
    /// Plain text; `held` may be the start of [`OPEN`].
    Text,
    /// Inside `<tool_call>`: the text since the tag.
    InCall,
    /// The reply started with `{`: perhaps calls without tags, decided at
    /// the end.
    Bare,
}

/// Reads calls out of text as it is generated. Text that may still turn
/// out to be part of a call is held back; everything else comes out as
/// [`Piece::Content`] as soon as it is known to be content. Whitespace
/// next to a call is markup, not content: dropped.
#[derive(Debug)]
pub struct ToolCallParser {
    format: ToolFormat,
    known: Vec<String>,
    state: State,
    /// Text not yet given out.
    held: String,
    /// Whitespace after the last content, given out only if more content
    /// follows.
    trailing_ws: String,
    /// A call was given out (whitespace right after it is dropped).
    after_call: bool,
    calls: usize,
}

impl ToolCallParser {
    /// A parser for replies in `format`, to a request with tools named
    /// `known` (a call without tags must name one of them).
    pub fn new(format: ToolFormat, known: Vec<String>) -> ToolCallParser {
        ToolCallParser {
            format,
            known,
            state: State::Start,
            held: String::new(),
            trailing_ws: String::new(),
            after_call: false,
            calls: 0,
        }
    }

    /// How many calls were given out so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// More generated text; what is now known of the reply.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        self.held.push_str(text);
        self.advance(&mut out, false);
        out
    }

    /// The end of the reply: everything still held comes out (an unclosed
    /// call as content).
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        self.advance(&mut out, true);
        if !self.trailing_ws.is_empty() && self.calls == 0 {
            let ws = std::mem::take(&mut self.trailing_ws);
            out.push(Piece::Content(ws));
        }
        self.trailing_ws.clear();
        out
    }

    fn advance(&mut self, out: &mut Vec<Piece>, end: bool) {
        loop {
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    let t = t.strip_prefix(PYTHON_TAG).unwrap_or(t).trim_start();
                    match bare_start(t) {
                        Some(true) => self.state = State::Bare,
                        None if !end => return,
                        _ if !end && (t.is_empty() || self.may_open(t)) => return,
                        _ => self.state = State::Text,
                    }
                }
                State::Bare => {
                    if !end {
                        return;
                    }
                    let text = std::mem::take(&mut self.held);
                    match self.bare_calls(&text) {
                        Some(calls) => {
                            for call in calls {
                                self.call(call, out);
                            }
                            return;
                        }
                        None => {
                            // Not calls: read it again as text (it may
                            // still hold tagged ones).
                            self.held = text;
                            self.state = State::Text;
                        }
                    }
                }
                State::Text => {
                    if self.format != ToolFormat::Hermes {
                        let text = std::mem::take(&mut self.held);
                        self.content(&text, out);
                        return;
                    }
                    match self.held.find(OPEN) {
                        Some(i) => {
                            let before = self.held[..i].to_string();
                            self.content(&before, out);
                            self.held.drain(..i + OPEN.len());
                            self.state = State::InCall;
                        }
                        None => {
                            let keep = if end {
                                0
                            } else {
                                partial_suffix(&self.held, OPEN)
                            };
                            let cut = self.held.len() - keep;
                            let text: String = self.held.drain(..cut).collect();
                            self.content(&text, out);
                            return;
                        }
                    }
                }
                State::InCall => match self.held.find(CLOSE) {
                    Some(i) => {
                        let inner = self.held[..i].to_string();
                        self.held.drain(..i + CLOSE.len());
                        match self.sequence(&inner, false) {
                            Some(calls) => {
                                for call in calls {
                                    self.call(call, out);
                                }
                            }
                            None => self.content(&format!("{OPEN}{inner}{CLOSE}"), out),
                        }
                        self.state = State::Text;
                    }
                    None if end => {
                        let rest = std::mem::take(&mut self.held);
                        self.content(&format!("{OPEN}{rest}"), out);
                        self.state = State::Text;
                        return;
                    }
                    None => return,
                },
            }
        }
    }

    /// Whether `t` (no leading whitespace) could still become an opener.
    fn may_open(&self, t: &str) -> bool {
        let prefix_of = |tag: &str| t.len() < tag.len() && tag.starts_with(t);
        prefix_of(PYTHON_TAG) || (self.format == ToolFormat::Hermes && prefix_of(OPEN))
    }

    fn content(&mut self, text: &str, out: &mut Vec<Piece>) {
        let text = if self.after_call {
            text.trim_start()
        } else {
            text
        };
        if text.is_empty() {
            return;
        }
        self.after_call = false;
        let core = text.trim_end();
        if core.is_empty() {
            self.trailing_ws.push_str(text);
            return;
        }
        let mut piece = std::mem::take(&mut self.trailing_ws);
        piece.push_str(core);
        out.push(Piece::Content(piece));
        self.trailing_ws.push_str(&text[core.len()..]);
    }

    fn call(&mut self, call: ParsedCall, out: &mut Vec<Piece>) {
        self.trailing_ws.clear();
        self.after_call = true;
        self.calls += 1;
        out.push(Piece::Call(call));
    }

    /// A reply that is nothing but calls without tags.
    fn bare_calls(&self, text: &str) -> Option<Vec<ParsedCall>> {
        self.sequence(text, true)
    }

    /// JSON call objects separated by whitespace or `;`, and nothing else.
    /// `untagged`: each must name a known tool and have its arguments.
    /// Code fences (```` ```json ````, ```` ``` ````) around or between
    /// the objects are allowed: small models wrap calls in them.
    fn sequence(&self, text: &str, untagged: bool) -> Option<Vec<ParsedCall>> {
        let mut rest = text.trim();
        rest = rest.strip_prefix(PYTHON_TAG).unwrap_or(rest).trim_start();
        let mut calls = Vec::new();
        loop {
            rest = skip_fences(rest);
            if rest.is_empty() {
                break;
            }
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            let value = values.next()?.ok()?;
            let end = values.byte_offset();
            calls.push(self.call_from(&value, untagged)?);
            rest = rest[end..].trim_start();
            if let Some(r) = rest.strip_prefix(';') {
                rest = r.trim_start();
            }
        }
        (!calls.is_empty()).then_some(calls)
    }

    fn call_from(&self, value: &Value, untagged: bool) -> Option<ParsedCall> {
        let obj = value.as_object()?;
        let name = obj.get("name")?.as_str()?;
        if name.is_empty() {
            return None;
        }
        let args = obj.get("arguments").or_else(|| obj.get("parameters"));
        if untagged && (args.is_none() || !self.known.iter().any(|k| k == name)) {
            return None;
        }
        let arguments = match args {
            None | Some(Value::Null) => "{}".to_string(),
            Some(v @ Value::Object(_)) => v.to_string(),
            // Some models write the arguments as a JSON string.
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(v @ Value::Object(_)) => v.to_string(),
                _ => return None,
            },
            Some(_) => return None,
        };
        Some(ParsedCall {
            name: name.to_string(),
            arguments,
        })
    }
}

/// Whether a reply starting with `t` (no leading whitespace) may be calls
/// without tags: an object, or a JSON code fence opening on one. None:
/// too little yet to tell.
fn bare_start(t: &str) -> Option<bool> {
    if t.starts_with('{') {
        return Some(true);
    }
    if t.len() < 3 {
        return if !t.is_empty() && "```".starts_with(t) {
            None
        } else {
            Some(false)
        };
    }
    let Some(after) = t.strip_prefix("```") else {
        return Some(false);
    };
    let Some(nl) = after.find('\n') else {
        // The fence's language is still coming (a short word).
        return if after.len() <= 8 && "json".starts_with(after.trim_end()) {
            None
        } else {
            Some(false)
        };
    };
    if !matches!(after[..nl].trim(), "" | "json") {
        return Some(false);
    }
    let body = after[nl + 1..].trim_start();
    if body.is_empty() {
        None
    } else {
        Some(body.starts_with('{'))
    }
}

/// `text` past any code-fence markers and whitespace.
fn skip_fences(mut text: &str) -> &str {
    loop {
        text = text.trim_start();
        match text
            .strip_prefix("```json")
            .or_else(|| text.strip_prefix("```"))
        {
            Some(rest) => text = rest,
            None => return text,
        }
    }
}

/// The length of the longest end of `text` that begins `tag` (held back:
/// the rest of the tag may follow).
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

/// A conversation and the template variables that show it `tools`, and
/// the syntax to read the reply in.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolPrompt {
    pub messages: Vec<Message>,
    pub extra: Map<String, Value>,
    pub format: ToolFormat,
}

/// Show `tools` (OpenAI function specs, `{"type": "function", "function":
/// {...}}`) to the model: through the template when it renders tools,
/// else the Hermes way ([`lower_to_hermes`]). With no tools, only the
/// conversation's tool turns are taken care of (a template that renders
/// tools is not handed an empty list: Llama 3's would show it).
pub fn prepare(template: &ChatTemplate, messages: &[Message], tools: &[Value]) -> ToolPrompt {
    match template.tool_format() {
        Some(format) => {
            let mut extra = Map::new();
            if !tools.is_empty() {
                extra.insert("tools".into(), Value::Array(tools.to_vec()));
            }
            ToolPrompt {
                messages: messages.to_vec(),
                extra,
                format,
            }
        }
        None => ToolPrompt {
            messages: lower_to_hermes(messages, tools),
            extra: Map::new(),
            format: ToolFormat::Hermes,
        },
    }
}

/// Qwen2.5's words for its tool list (the Hermes convention), for
/// templates that have none.
pub fn hermes_system_prompt(tools: &[Value]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        s.push('\n');
        s.push_str(&python_json(tool));
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// The conversation as plain turns for a template without tools: the tool
/// list (if any) after the system message (or as one), each assistant call as a
/// `<tool_call>` block after its text, and `tool` results as user turns
/// of `<tool_response>` blocks (consecutive ones in one turn), as Qwen2.5's
/// template writes them.
pub fn lower_to_hermes(messages: &[Message], tools: &[Value]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    // No tools: nothing to add; a system turn is lowered as is below.
    if !tools.is_empty() {
        let prompt = hermes_system_prompt(tools);
        match messages.first() {
            Some(m) if m.role == "system" => {
                let text = m.text();
                let joined = if text.is_empty() {
                    prompt
                } else {
                    format!("{text}\n\n{prompt}")
                };
                out.push(Message::system(joined));
            }
            _ => out.push(Message::system(prompt)),
        }
    }
    let skip =
        usize::from(!tools.is_empty() && messages.first().is_some_and(|m| m.role == "system"));
    let mut previous_tool = false;
    for m in &messages[skip..] {
        if m.role == "tool" {
            let block = format!("<tool_response>\n{}\n</tool_response>", m.text());
            match out.last_mut() {
                Some(last) if previous_tool => {
                    let text = last.content.get_or_insert_with(String::new);
                    text.push('\n');
                    text.push_str(&block);
                }
                _ => out.push(Message::user(block)),
            }
            previous_tool = true;
            continue;
        }
        previous_tool = false;
        if m.tool_calls.is_empty() {
            out.push(Message {
                content: Some(m.text().to_string()),
                tool_calls: Vec::new(),
                tool_call_id: None,
                name: None,
                role: m.role.clone(),
            });
            continue;
        }
        let mut text = m.text().to_string();
        for call in &m.tool_calls {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&format!(
                "{OPEN}\n{{\"name\": {}, \"arguments\": {}}}\n{CLOSE}",
                python_json(&Value::String(call.name.clone())),
                python_json(&call.arguments)
            ));
        }
        out.push(Message::new(m.role.clone(), text));
    }
    out
}

/// JSON as the templates' `tojson` writes it (Python's `json.dumps`: `", "`
/// and `": "` separators, non-ASCII as is).
fn python_json(v: &Value) -> String {
    let value = crate::context::json_value(v);
    crate::json::dumps(&value, &crate::json::JsonOptions::new(None))
        .unwrap_or_else(|_| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn known() -> Vec<String> {
        vec!["get_weather".to_string(), "get_time".to_string()]
    }

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    fn hermes(text: &str) -> Parsed {
        parse(ToolFormat::Hermes, &known(), text)
    }

    #[test]
    fn one_hermes_call() {
        let p = hermes("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
        assert_eq!(p.content, None);
        assert_eq!(p.calls, vec![call("get_weather", r#"{"city":"Paris"}"#)]);
    }

    #[test]
    fn several_calls_with_text_around() {
        let p = hermes(
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
             <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nDone.",
        );
        assert_eq!(p.content.as_deref(), Some("Let me check.Done."));
        assert_eq!(
            p.calls,
            vec![
                call("get_weather", r#"{"city":"Paris"}"#),
                call("get_time", "{}")
            ]
        );
    }

    #[test]
    fn calls_to_unknown_tools_in_tags_still_parse() {
        let p = hermes("<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": 1}}</tool_call>");
        assert_eq!(p.calls, vec![call("search", r#"{"q":1}"#)]);
    }

    #[test]
    fn bare_objects_naming_known_tools_are_calls() {
        let p = hermes("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}");
        assert_eq!(p.calls, vec![call("get_weather", r#"{"city":"Paris"}"#)]);
        let p = hermes(
            " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n{\"name\": \"get_time\", \"arguments\": {}}\n",
        );
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.content, None);
    }

    #[test]
    fn calls_in_code_fences() {
        let p = hermes("```json\n{\n  \"name\": \"get_time\",\n  \"arguments\": {}\n}\n```");
        assert_eq!(p.calls, vec![call("get_time", "{}")]);
        assert_eq!(p.content, None);
        let p = hermes(
            "```\n{\"name\": \"get_time\", \"arguments\": {}}\n```\n```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n```\n",
        );
        assert_eq!(p.calls.len(), 2);
        // Code that is not a call stays code.
        for text in [
            "```python\nprint(1)\n```",
            "```json\n{\"a\": 1}\n```",
            "```json\n[1, 2]\n```",
            "```",
            "``",
            "```json\n{\"name\": \"get_time\", \"arguments\": {}}\n``` and then",
        ] {
            let p = hermes(text);
            assert!(p.calls.is_empty(), "{text}");
            assert_eq!(p.content.as_deref(), Some(text), "{text}");
        }
    }

    #[test]
    fn bare_json_that_is_not_a_call_is_content() {
        for text in [
            "{\"name\": \"Bob\", \"arguments\": {}}",
            "{\"name\": \"get_weather\"}",
            "{\"city\": \"Paris\"}",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} and more",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": ",
            "{not json",
        ] {
            let p = hermes(text);
            assert!(p.calls.is_empty(), "{text}");
            assert_eq!(p.content.as_deref(), Some(text), "{text}");
        }
    }

    #[test]
    fn malformed_tags_are_content_never_a_panic() {
        for text in [
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            "<tool_call>\n{\"name\": \"get_weather\", \"argum",
            "<tool_call>",
            "<tool_",
            "<tool_call>\nnot json\n</tool_call>",
            "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": 5}\n</tool_call>",
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": [1]}\n</tool_call>",
            "</tool_call>",
            "text <tool_call> more",
            "Ünïcödé <tool_cal",
        ] {
            let p = hermes(text);
            assert!(p.calls.is_empty(), "{text}");
            assert_eq!(p.content.as_deref(), Some(text), "{text}");
        }
        // A good call after a broken one still counts.
        let p = hermes(
            "<tool_call>oops</tool_call><tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>",
        );
        assert_eq!(p.content.as_deref(), Some("<tool_call>oops</tool_call>"));
        assert_eq!(p.calls, vec![call("get_time", "{}")]);
    }

    #[test]
    fn string_arguments_are_taken_when_they_are_an_object() {
        let p = hermes(
            "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}</tool_call>",
        );
        assert_eq!(p.calls, vec![call("get_weather", r#"{"city":"Rome"}"#)]);
        let p =
            hermes("<tool_call>{\"name\": \"get_weather\", \"arguments\": \"Rome\"}</tool_call>");
        assert!(p.calls.is_empty());
    }

    #[test]
    fn plain_text_passes_unchanged() {
        for text in [
            "",
            "Hello!",
            "  two  spaces  \n",
            "a < b and <tool> too",
            "\n",
        ] {
            let p = hermes(text);
            assert!(p.calls.is_empty());
            assert_eq!(p.content.as_deref().unwrap_or(""), text);
        }
    }

    #[test]
    fn llama3_calls() {
        let known = known();
        let p = parse(
            ToolFormat::Llama3,
            &known,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        );
        assert_eq!(p.calls, vec![call("get_weather", r#"{"city":"Paris"}"#)]);
        let p = parse(
            ToolFormat::Llama3,
            &known,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"get_time\", \"parameters\": {}}",
        );
        assert_eq!(p.calls.len(), 2);
        // Tags mean nothing to Llama 3, and prose is prose.
        for text in [
            "The weather is fine.",
            "<tool_call>{\"name\": \"get_time\", \"parameters\": {}}</tool_call>",
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}",
        ] {
            let p = parse(ToolFormat::Llama3, &known, text);
            assert!(p.calls.is_empty(), "{text}");
            assert_eq!(p.content.as_deref(), Some(text));
        }
    }

    /// Fed in pieces of every size, the stream gives what the whole text
    /// gives, and never lets part of a tag out as content.
    #[test]
    fn streaming_agrees_with_whole_parsing() {
        let texts = [
            "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            "It is <tool_ hm, no. <tool_call>broken",
            "```json\n{\n  \"name\": \"get_time\",\n  \"arguments\": {}\n}\n```",
            "```python\nprint(1)\n```",
            "plain answer, no tools",
        ];
        for text in texts {
            let whole = hermes(text);
            for size in 1..8 {
                let mut parser = ToolCallParser::new(ToolFormat::Hermes, known());
                let mut pieces = Vec::new();
                let chars: Vec<char> = text.chars().collect();
                for chunk in chars.chunks(size) {
                    let chunk: String = chunk.iter().collect();
                    let got = parser.push(&chunk);
                    // No piece of a tag before it is known to be text.
                    for p in &got {
                        if let Piece::Content(c) = p {
                            let whole_content = whole.content.as_deref().unwrap_or("");
                            assert!(
                                !c.contains('<') || whole_content.contains(c.as_str()),
                                "{c:?}"
                            );
                        }
                    }
                    pieces.extend(got);
                }
                pieces.extend(parser.finish());
                let mut streamed = Parsed::default();
                for p in pieces {
                    match p {
                        Piece::Content(t) => {
                            assert!(!t.is_empty());
                            streamed
                                .content
                                .get_or_insert_with(String::new)
                                .push_str(&t)
                        }
                        Piece::Call(c) => streamed.calls.push(c),
                    }
                }
                assert_eq!(streamed, whole, "{text:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn content_before_a_call_streams_before_it_ends() {
        let mut parser = ToolCallParser::new(ToolFormat::Hermes, known());
        assert_eq!(
            parser.push("Checking the weather"),
            vec![Piece::Content("Checking the weather".into())]
        );
        assert_eq!(
            parser.push(" now\n<tool"),
            vec![Piece::Content(" now".into())]
        );
        assert_eq!(parser.push("_call>\n{\"name\": \"get_time\""), vec![]);
        assert_eq!(
            parser.push(", \"arguments\": {}}\n</tool_call>"),
            vec![Piece::Call(call("get_time", "{}"))]
        );
        assert_eq!(parser.finish(), vec![]);
        assert_eq!(parser.calls(), 1);
    }

    #[test]
    fn formats_are_detected_from_templates() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/templates/");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}{f}")).unwrap();
        assert_eq!(
            ToolFormat::detect(&read("Qwen-Qwen2.5-7B-Instruct.jinja")),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::detect(&read("meta-llama-Llama-3.2-3B-Instruct.jinja")),
            Some(ToolFormat::Llama3)
        );
        for f in [
            "HuggingFaceTB-SmolLM2-135M-Instruct.jinja",
            "HuggingFaceTB-SmolLM3-3B.jinja",
            "microsoft-Phi-3.5-mini-instruct.jinja",
            "google-gemma-2-2b-it.jinja",
        ] {
            assert_eq!(ToolFormat::detect(&read(f)), None, "{f}");
        }
        assert_eq!(ToolFormat::detect(crate::CHATML_TEMPLATE), None);
    }

    fn weather_tool() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}})
    }

    #[test]
    fn lowering_for_templates_without_tools() {
        use crate::message::ToolCall;
        let messages = vec![
            Message::system("Be brief."),
            Message::user("Weather in Paris and Oslo?"),
            Message::tool_calls(vec![
                ToolCall::from_openai(
                    Some("a".into()),
                    "get_weather".into(),
                    r#"{"city": "Paris"}"#,
                ),
                ToolCall::from_openai(
                    Some("b".into()),
                    "get_weather".into(),
                    r#"{"city": "Oslo"}"#,
                ),
            ]),
            Message::tool("a", "rain"),
            Message::tool("b", "snow"),
        ];
        let lowered = lower_to_hermes(&messages, &[weather_tool()]);
        assert_eq!(lowered.len(), 4);
        assert!(lowered[0].text().starts_with("Be brief.\n\n# Tools\n"));
        assert!(lowered[0]
            .text()
            .contains("\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}}\n</tools>"));
        assert_eq!(
            lowered[2],
            Message::assistant(
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
                 <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"
            )
        );
        assert_eq!(
            lowered[3],
            Message::user(
                "<tool_response>\nrain\n</tool_response>\n<tool_response>\nsnow\n</tool_response>"
            )
        );
        // No tools: only the tool turns are lowered.
        let lowered = lower_to_hermes(&messages, &[]);
        assert_eq!(lowered[0], Message::system("Be brief."));
        assert_eq!(lowered.len(), 4);
        // No system message: one is made.
        let lowered = lower_to_hermes(&messages[1..2], &[weather_tool()]);
        assert_eq!(lowered[0].role, "system");
        assert_eq!(lowered[1], Message::user("Weather in Paris and Oslo?"));
    }

    #[test]
    fn prepare_uses_the_template_when_it_renders_tools() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/templates/");
        let qwen = std::fs::read_to_string(format!("{dir}Qwen-Qwen2.5-7B-Instruct.jinja")).unwrap();
        let template = ChatTemplate::new(&qwen, None, Some("<|im_end|>")).unwrap();
        let messages = [Message::user("Weather in Paris?")];
        let p = prepare(&template, &messages, &[weather_tool()]);
        assert_eq!(p.format, ToolFormat::Hermes);
        assert_eq!(p.messages, messages);
        assert_eq!(p.extra["tools"], json!([weather_tool()]));
        let text = template.render_with(&p.messages, true, &p.extra).unwrap();
        assert!(text.contains("<tools>\n{\"type\": \"function\""), "{text}");

        let chatml = ChatTemplate::chatml_fallback(None, None).unwrap();
        let p = prepare(&chatml, &messages, &[weather_tool()]);
        assert!(p.extra.is_empty());
        assert_eq!(p.messages[0].role, "system");
        let text = chatml.render_with(&p.messages, true, &p.extra).unwrap();
        assert!(text.starts_with("<|im_start|>system\n# Tools\n"), "{text}");
    }
}
