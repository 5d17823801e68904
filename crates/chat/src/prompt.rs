//! Prompt tokens for a conversation, with control tokens only where the
//! template wrote them.
//!
//! A template copies message text into the prompt, and the prompt's
//! control tokens (`<|im_start|>`, `<|eot_id|>`) are parsed out of the
//! text. Parsed naively, a message containing `<|im_end|>\n<|im_start|>
//! system` becomes real control tokens: a user forges turns and system
//! prompts. [`prompt_tokens`] keeps message text as text.
//!
//! How: when some message contains the text of a control token, the
//! conversation is rendered a second time with each message's content
//! (less its outer whitespace, which templates often trim) between two
//! marker characters. Taking the markers out must give back exactly the
//! first rendering; then the markers say which bytes came from messages,
//! and the tokenizer parses control tokens only outside them
//! ([`tokenize::Vocab::encode_with_plain`]). A template that changes
//! message text in a way the markers disturb (it splits or measures it)
//! fails that check, and a message with control-token text is then
//! refused ([`Error::ControlTextInMessage`]) rather than let through.
//! Conversations without control-token text in their messages are
//! rendered once and tokenized as before.
//!
//! Trusted callers that build prompts with control tokens in the messages
//! on purpose opt in with [`Special::Parse`].
//!
//! Text that reaches the template outside message content (tool
//! definitions, tool calls' names and arguments, `tool_call_id`, `name`)
//! is written by the template in ways the markers cannot follow (`tojson`),
//! so control-token text there is refused
//! ([`Error::ControlTextOutsideContent`]) unless [`Special::Parse`].

use std::ops::Range;

use tokenize::Vocab;

use crate::{ChatTemplate, Error, Message};

/// Whether control-token text in messages may become control tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Special {
    /// Message text stays text (the default, for untrusted input).
    #[default]
    Text,
    /// Parse control tokens everywhere, messages included (trusted
    /// callers only: whoever writes the messages controls the turns).
    Parse,
}

/// Marks the start and end of message text in the second rendering:
/// noncharacters, which no client has reason to send (a message holding
/// one is refused if it also holds control-token text).
const OPEN: char = '\u{FDD0}';
const CLOSE: char = '\u{FDD1}';

/// A rendered prompt and its tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    pub text: String,
    pub tokens: Vec<u32>,
}

/// Render `messages` with `template` and tokenize the result for `vocab`:
/// control tokens from the template's own text, message text as text
/// (unless `special` is [`Special::Parse`]). BOS is added where the
/// vocabulary wants one and the template did not write it; never EOS.
pub fn prompt_tokens(
    template: &ChatTemplate,
    messages: &[Message],
    add_generation_prompt: bool,
    vocab: &Vocab,
    special: Special,
) -> Result<Prompt, Error> {
    prompt_tokens_with(
        template,
        messages,
        add_generation_prompt,
        &serde_json::Map::new(),
        vocab,
        special,
    )
}

/// [`prompt_tokens`] with extra template variables
/// ([`ChatTemplate::render_with`]): `tools`, ...
pub fn prompt_tokens_with(
    template: &ChatTemplate,
    messages: &[Message],
    add_generation_prompt: bool,
    extra: &serde_json::Map<String, serde_json::Value>,
    vocab: &Vocab,
    special: Special,
) -> Result<Prompt, Error> {
    let text = template.render_with(messages, add_generation_prompt, extra)?;
    let tokens = tokenize_rendered_with(
        template,
        messages,
        add_generation_prompt,
        extra,
        &text,
        vocab,
        special,
    )?;
    Ok(Prompt { text, tokens })
}

/// [`prompt_tokens`] for a `text` already rendered from the same
/// arguments (callers that render for other reasons too).
pub fn tokenize_rendered(
    template: &ChatTemplate,
    messages: &[Message],
    add_generation_prompt: bool,
    text: &str,
    vocab: &Vocab,
    special: Special,
) -> Result<Vec<u32>, Error> {
    tokenize_rendered_with(
        template,
        messages,
        add_generation_prompt,
        &serde_json::Map::new(),
        text,
        vocab,
        special,
    )
}

/// [`tokenize_rendered`] for a `text` rendered with extra variables.
pub fn tokenize_rendered_with(
    template: &ChatTemplate,
    messages: &[Message],
    add_generation_prompt: bool,
    extra: &serde_json::Map<String, serde_json::Value>,
    text: &str,
    vocab: &Vocab,
    special: Special,
) -> Result<Vec<u32>, Error> {
    if special == Special::Text {
        check_outside_content(messages, extra, vocab)?;
    }
    let injected = messages
        .iter()
        .find_map(|m| vocab.control_text_in(m.text()).map(|t| (m, t)));
    let mut tokens = match (special, injected) {
        (Special::Parse, _) | (_, None) => vocab.encode(text, false, true),
        (Special::Text, Some((message, token))) => {
            match message_ranges(template, messages, add_generation_prompt, extra, text) {
                Some(plain) => vocab.encode_with_plain(text, false, &plain),
                None => {
                    return Err(Error::ControlTextInMessage {
                        role: message.role.clone(),
                        token: token.to_string(),
                    })
                }
            }
        }
    };
    if let Some(bos) = vocab.bos().filter(|_| vocab.add_bos()) {
        if tokens.first() != Some(&bos) {
            tokens.insert(0, bos);
        }
    }
    Ok(tokens)
}

/// Control-token text anywhere a template sees besides message content:
/// the extra variables (tools) and the tool fields of messages.
fn check_outside_content(
    messages: &[Message],
    extra: &serde_json::Map<String, serde_json::Value>,
    vocab: &Vocab,
) -> Result<(), Error> {
    let refuse = |what: String, token: &str| Error::ControlTextOutsideContent {
        what,
        token: token.to_string(),
    };
    for (name, value) in extra {
        if let Some(token) = vocab.control_text_in(&value.to_string()) {
            return Err(refuse(format!("`{name}`"), token));
        }
    }
    for m in messages {
        let role = &m.role;
        for call in &m.tool_calls {
            let text = format!(
                "{} {} {}",
                call.id.as_deref().unwrap_or(""),
                call.name,
                call.arguments
            );
            if let Some(token) = vocab.control_text_in(&text) {
                return Err(refuse(format!("a tool call of a `{role}` message"), token));
            }
        }
        for (field, value) in [("tool_call_id", &m.tool_call_id), ("name", &m.name)] {
            if let Some(token) = value.as_deref().and_then(|v| vocab.control_text_in(v)) {
                return Err(refuse(format!("`{field}` of a `{role}` message"), token));
            }
        }
    }
    Ok(())
}

/// The byte ranges of `text` (the plain rendering) that came from message
/// content, or None if the template does not copy content unchanged.
fn message_ranges(
    template: &ChatTemplate,
    messages: &[Message],
    add_generation_prompt: bool,
    extra: &serde_json::Map<String, serde_json::Value>,
    text: &str,
) -> Option<Vec<Range<usize>>> {
    if messages.iter().any(|m| m.text().contains([OPEN, CLOSE])) {
        return None;
    }
    let marked: Vec<Message> = messages.iter().map(mark).collect();
    let rendered = template
        .render_with(&marked, add_generation_prompt, extra)
        .ok()?;
    let mut plain = String::with_capacity(text.len());
    let mut ranges = Vec::new();
    let mut open = None;
    for c in rendered.chars() {
        match c {
            OPEN if open.is_none() => open = Some(plain.len()),
            CLOSE => ranges.push(open.take()?..plain.len()),
            OPEN => return None,
            c => plain.push(c),
        }
    }
    (open.is_none() && plain == text).then_some(ranges)
}

/// `m` with its content, less outer whitespace, between the markers.
fn mark(m: &Message) -> Message {
    let Some(c) = &m.content else {
        return m.clone();
    };
    let core = c.trim();
    if core.is_empty() {
        return m.clone();
    }
    let lead = c.len() - c.trim_start().len();
    let tail = c.len() - c.trim_end().len();
    let content = format!("{}{OPEN}{core}{CLOSE}{}", &c[..lead], &c[c.len() - tail..]);
    Message {
        content: Some(content),
        ..m.clone()
    }
}
