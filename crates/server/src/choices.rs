//! A request's choices (`n`) and their log-probabilities, as OpenAI shapes
//! them: one engine job per choice ([`engine::Msg::Choices`], the prompt
//! read once), each with its own event channel, gathered here into one
//! response or one stream of chunks.
//!
//! Each choice is what [`Envelope::response`] or [`Envelope::chunk`] makes
//! for one generation, with its `index` and `logprobs` set here; `usage`
//! counts the prompt once and the completion tokens of every choice, as
//! OpenAI does.
//!
//! Log-probabilities: chat's `logprobs.content[]` is `{token, logprob,
//! bytes, top_logprobs: [{token, logprob, bytes}]}`; completions' is
//! `{tokens, token_logprobs, top_logprobs: [{token: logprob}],
//! text_offset}` with `text_offset` in characters of the choice's text. A
//! streamed chunk carries the entries of the tokens whose text it carries.
//! A token that cannot be drawn (`-inf`) is reported as -9999.0, OpenAI's
//! number for it (JSON has no infinity).

use std::task::{Context, Poll};

use engine::{Finish, TokenLogprob};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::{self, Envelope, Kind};
use crate::error::ApiError;
use crate::events::Event;

/// One finished choice.
#[derive(Clone, Debug)]
pub struct Choice {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Finish,
}

/// Everything one choice's channel says, to its end.
pub async fn collect(rx: &mut UnboundedReceiver<Event>) -> Result<Choice, ApiError> {
    let (mut text, mut logprobs) = (String::new(), Vec::new());
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Logprobs(l)) => logprobs.extend(l),
            Some(Event::Done(finish)) => {
                return Ok(Choice {
                    text,
                    logprobs,
                    finish,
                })
            }
            Some(Event::Error(e)) => return Err(ApiError::from_job(&e)),
            None => return Err(ApiError::internal("The engine stopped")),
        }
    }
}

/// The answer of a non-streaming request. `logprobs`: whether the request
/// asked for them.
pub fn response(env: &Envelope, choices: &[Choice], logprobs: bool) -> Value {
    let first = &choices[0];
    let mut body = env.response(&first.text, &first.finish);
    let list: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut choice = if i == 0 {
                body["choices"][0].take()
            } else {
                env.response(&c.text, &c.finish)["choices"][0].take()
            };
            choice["index"] = json!(i);
            if logprobs {
                let mut offsets = Offsets::default();
                choice["logprobs"] = render(env.kind, &c.logprobs, &c.text, &mut offsets);
            }
            choice
        })
        .collect();
    body["choices"] = Value::Array(list);
    body["usage"] = api::usage(&combined(choices.iter().map(|c| &c.finish)));
    body
}

/// One finish standing for all: the first choice's prompt counts (the
/// prompt was read once), every choice's completion tokens add up.
fn combined<'a>(mut finishes: impl Iterator<Item = &'a Finish>) -> Finish {
    let mut f = finishes.next().expect("at least one choice").clone();
    f.completion_tokens += finishes.map(|g| g.completion_tokens).sum::<usize>();
    f
}

/// JSON has no infinity; OpenAI reports an impossible token so.
fn number(lp: f32) -> f64 {
    if lp.is_finite() {
        lp as f64
    } else {
        -9999.0
    }
}

fn token_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Where a choice's text stands: bytes and characters already accounted
/// for, so a byte offset becomes a character offset without recounting.
#[derive(Clone, Copy, Debug, Default)]
struct Offsets {
    bytes: usize,
    chars: usize,
}

impl Offsets {
    /// The character offset of byte `offset`, given `text`, the choice's
    /// text from `self.bytes` on (offsets come in order).
    fn chars_at(&mut self, text: &str, offset: usize) -> usize {
        let upto = offset.saturating_sub(self.bytes).min(text.len());
        let upto = (0..=upto)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        self.chars += text[..upto].chars().count();
        self.bytes += upto;
        self.chars
    }
}

/// A choice's `logprobs` for `entries`, whose text is `text` (from
/// `offsets` on, for completions' `text_offset`).
fn render(kind: Kind, entries: &[TokenLogprob], text: &str, offsets: &mut Offsets) -> Value {
    match kind {
        Kind::Chat => {
            let content: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let top: Vec<Value> = e
                        .top
                        .iter()
                        .map(|t| {
                            json!({
                                "token": token_text(&t.bytes),
                                "logprob": number(t.logprob),
                                "bytes": t.bytes,
                            })
                        })
                        .collect();
                    json!({
                        "token": token_text(&e.bytes),
                        "logprob": number(e.logprob),
                        "bytes": e.bytes,
                        "top_logprobs": top,
                    })
                })
                .collect();
            json!({"content": content, "refusal": null})
        }
        Kind::Completion => {
            let mut rest = text;
            let mut text_offset = Vec::with_capacity(entries.len());
            for e in entries {
                let before = offsets.bytes;
                text_offset.push(offsets.chars_at(rest, e.offset));
                rest = &rest[offsets.bytes - before..];
            }
            let top: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let mut m = Map::new();
                    for t in &e.top {
                        m.insert(token_text(&t.bytes), json!(number(t.logprob)));
                    }
                    Value::Object(m)
                })
                .collect();
            json!({
                "tokens": entries.iter().map(|e| token_text(&e.bytes)).collect::<Vec<_>>(),
                "token_logprobs": entries.iter().map(|e| number(e.logprob)).collect::<Vec<_>>(),
                "top_logprobs": top,
                "text_offset": text_offset,
            })
        }
    }
}

/// One choice of a stream, as far as it has gone.
struct Streaming {
    rx: UnboundedReceiver<Event>,
    /// Entries waiting for the text they go with.
    pending: Vec<TokenLogprob>,
    offsets: Offsets,
    finish: Option<Finish>,
    /// Reads tool calls out of the text, for a request with tools.
    tools: Option<crate::tools::ToolStream>,
}

/// The chunks of a streamed request's choices, as their events arrive.
pub struct ChoiceStream {
    choices: Vec<Streaming>,
    env: Envelope,
    include_usage: bool,
    logprobs: bool,
    started: bool,
}

/// What one poll produced.
pub enum Polled {
    /// Events in SSE form (possibly none yet: wait).
    Chunks(String),
    /// The last events, `[DONE]` included; nothing follows.
    End(String),
}

fn sse_event(out: &mut String, v: &Value) {
    out.push_str("data: ");
    out.push_str(&v.to_string());
    out.push_str("\n\n");
}

impl ChoiceStream {
    pub fn new(
        rxs: Vec<UnboundedReceiver<Event>>,
        env: Envelope,
        include_usage: bool,
        logprobs: bool,
    ) -> ChoiceStream {
        ChoiceStream {
            choices: rxs
                .into_iter()
                .map(|rx| Streaming {
                    rx,
                    pending: Vec::new(),
                    offsets: Offsets::default(),
                    finish: None,
                    tools: None,
                })
                .collect(),
            env,
            include_usage,
            logprobs,
            started: false,
        }
    }

    /// Read each choice's text for tool calls ([`crate::tools`]): content
    /// goes out as it is known to be content, a call as `delta.tool_calls`
    /// chunks once it is whole, and the choice finishes with `tool_calls`.
    pub fn with_tools(mut self, reader: Option<&crate::tools::ToolReader>) -> ChoiceStream {
        for c in &mut self.choices {
            c.tools = reader.map(crate::tools::ToolReader::stream);
        }
        self
    }

    /// Choice `i`'s `text` (None: its end) through its tool reader.
    fn tool_text(&mut self, i: usize, text: Option<&str>, out: &mut String) {
        use crate::tools::Delta;
        let Some(reader) = self.choices[i].tools.as_mut() else {
            return;
        };
        let deltas = match text {
            Some(t) => reader.text(t),
            None => reader.finish(),
        };
        for delta in deltas {
            match delta {
                Delta::Content(t) => {
                    let entries = std::mem::take(&mut self.choices[i].pending);
                    let c = self.chunk(i, Some(&t), None, &entries);
                    sse_event(out, &c);
                }
                Delta::Call { index, call } => {
                    for calls in crate::tools::call_deltas(index, &call) {
                        let mut c = self.env.chunk(false, None, None, self.include_usage);
                        c["choices"][0]["index"] = json!(i);
                        c["choices"][0]["delta"]["tool_calls"] = calls;
                        sse_event(out, &c);
                    }
                }
            }
        }
    }

    /// A chunk of choice `i`: text and/or the end, with `entries`, and
    /// the choice's offsets moved past the text.
    fn chunk(
        &mut self,
        i: usize,
        text: Option<&str>,
        finish: Option<&str>,
        entries: &[TokenLogprob],
    ) -> Value {
        let mut c = self.env.chunk(false, text, finish, self.include_usage);
        let choice = &mut c["choices"][0];
        choice["index"] = json!(i);
        let text = text.unwrap_or("");
        let offsets = &mut self.choices[i].offsets;
        if self.logprobs && !entries.is_empty() {
            let mut at = *offsets;
            choice["logprobs"] = render(self.env.kind, entries, text, &mut at);
        }
        offsets.chars_at(text, usize::MAX);
        c
    }

    /// Everything ready now, in SSE form.
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Polled {
        let mut out = String::new();
        if !self.started {
            self.started = true;
            if self.env.kind == Kind::Chat {
                for i in 0..self.choices.len() {
                    let mut c = self.env.chunk(true, None, None, self.include_usage);
                    c["choices"][0]["index"] = json!(i);
                    sse_event(&mut out, &c);
                }
            }
        }
        for i in 0..self.choices.len() {
            while self.choices[i].finish.is_none() {
                let event = match self.choices[i].rx.poll_recv(cx) {
                    Poll::Ready(e) => e,
                    Poll::Pending => break,
                };
                match event {
                    Some(Event::Logprobs(l)) => self.choices[i].pending.extend(l),
                    Some(Event::Text(t)) if self.choices[i].tools.is_some() => {
                        self.tool_text(i, Some(&t), &mut out);
                    }
                    Some(Event::Text(t)) => {
                        let entries = std::mem::take(&mut self.choices[i].pending);
                        let c = self.chunk(i, Some(&t), None, &entries);
                        sse_event(&mut out, &c);
                    }
                    Some(Event::Done(finish)) => {
                        self.tool_text(i, None, &mut out);
                        // Tokens that printed nothing go in a chunk of their own.
                        let entries = std::mem::take(&mut self.choices[i].pending);
                        if !entries.is_empty() {
                            let c = self.chunk(i, None, None, &entries);
                            sse_event(&mut out, &c);
                        }
                        let called = self.choices[i].tools.as_ref().is_some_and(|t| t.called());
                        let reason = if called {
                            "tool_calls"
                        } else {
                            api::finish_reason(finish.reason)
                        };
                        let c = self.chunk(i, None, Some(reason), &[]);
                        sse_event(&mut out, &c);
                        self.choices[i].finish = Some(finish);
                    }
                    Some(Event::Error(e)) => {
                        sse_event(&mut out, &ApiError::from_job(&e).body());
                        return Polled::End(out);
                    }
                    None => {
                        sse_event(&mut out, &ApiError::internal("The engine stopped").body());
                        return Polled::End(out);
                    }
                }
            }
        }
        if self.choices.iter().all(|c| c.finish.is_some()) {
            if self.include_usage {
                let all = combined(self.choices.iter().filter_map(|c| c.finish.as_ref()));
                sse_event(&mut out, &self.env.usage_chunk(&all));
            }
            out.push_str("data: [DONE]\n\n");
            return Polled::End(out);
        }
        Polled::Chunks(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::{FinishReason, TopLogprob};
    use std::time::Duration;

    fn finish(completion: usize) -> Finish {
        Finish {
            reason: FinishReason::Length,
            stop_string: None,
            prompt_tokens: 5,
            cached_tokens: 1,
            completion_tokens: completion,
            seed: 1,
            prompt_time: Duration::ZERO,
            generation_time: Duration::ZERO,
            memory: None,
            speculation: Default::default(),
        }
    }

    fn entry(bytes: &[u8], offset: usize, lp: f32) -> TokenLogprob {
        TokenLogprob {
            token: 7,
            bytes: bytes.to_vec(),
            logprob: lp,
            top: vec![
                TopLogprob {
                    token: 7,
                    bytes: bytes.to_vec(),
                    logprob: lp,
                },
                TopLogprob {
                    token: 9,
                    bytes: b"z".to_vec(),
                    logprob: f32::NEG_INFINITY,
                },
            ],
            offset,
        }
    }

    fn env(kind: Kind) -> Envelope {
        Envelope {
            kind,
            id: "x-1".into(),
            created: 7,
            model: "m".into(),
        }
    }

    fn choices() -> Vec<Choice> {
        vec![
            Choice {
                text: "é!".into(),
                logprobs: vec![entry("é".as_bytes(), 0, -0.5), entry(b"!", 2, -1.5)],
                finish: finish(2),
            },
            Choice {
                text: "ab".into(),
                logprobs: vec![entry(b"ab", 0, -0.25)],
                finish: finish(1),
            },
        ]
    }

    #[test]
    fn chat_choices_logprobs_and_usage() {
        let r = response(&env(Kind::Chat), &choices(), true);
        assert_eq!(r["choices"][1]["index"], 1);
        assert_eq!(r["choices"][1]["message"]["content"], "ab");
        let c = &r["choices"][0]["logprobs"]["content"];
        assert_eq!(c[0]["token"], "é");
        assert_eq!(c[0]["bytes"], json!([195, 169]));
        assert_eq!(c[0]["logprob"], -0.5);
        assert_eq!(c[1]["top_logprobs"][1]["logprob"], -9999.0);
        assert_eq!(c[1]["top_logprobs"][1]["token"], "z");
        assert_eq!(r["usage"]["prompt_tokens"], 5);
        assert_eq!(r["usage"]["completion_tokens"], 3);
        assert_eq!(r["usage"]["total_tokens"], 8);
        // Not asked: null, as before.
        let r = response(&env(Kind::Chat), &choices(), false);
        assert!(r["choices"][0]["logprobs"].is_null());
    }

    #[test]
    fn completion_logprobs_count_offsets_in_characters() {
        let r = response(&env(Kind::Completion), &choices(), true);
        let l = &r["choices"][0]["logprobs"];
        assert_eq!(l["tokens"], json!(["é", "!"]));
        assert_eq!(l["token_logprobs"], json!([-0.5, -1.5]));
        assert_eq!(l["text_offset"], json!([0, 1]));
        assert_eq!(l["top_logprobs"][1], json!({"!": -1.5, "z": -9999.0}));
        assert_eq!(r["choices"][1]["text"], "ab");
    }

    #[test]
    fn offsets_carry_over_chunks() {
        let mut o = Offsets::default();
        assert_eq!(o.chars_at("éé", 2), 1);
        // The text is what follows the bytes counted so far.
        o.chars_at("é", usize::MAX);
        assert_eq!((o.bytes, o.chars), (4, 2));
        assert_eq!(o.chars_at("aé", 5), 3);
    }
}
