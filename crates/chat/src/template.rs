//! A compiled chat template: source, the tokenizer's bos/eos text, and
//! the Hugging Face environment ([`shims`]) it renders in.

use minijinja::Environment;

use crate::context::Context;
use crate::error::Error;
use crate::fallback::Fallback;
use crate::message::Message;
use crate::shims::{self, Clock};

/// The GGUF key holding the model's Jinja chat template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// The name the template has inside its environment (shown in errors).
const NAME: &str = "chat_template";

/// Stack of the thread a render runs on. minijinja recurses, and drops
/// values recursively, once per nesting level; within its fuel a hostile
/// template can nest lists ~700k deep, which takes ~100 MB of stack and
/// would abort the process on a caller's 8 MB main thread or 2 MB async
/// worker. Untouched stack pages cost no memory.
const RENDER_STACK_BYTES: usize = 256 << 20;

/// Most bytes a render may write: this floor plus [`RENDER_PER_INPUT`]
/// times the conversation's own bytes. Fuel bounds a template's steps, not
/// what each step writes: a loop of 52,700 steps that each print a 1 KiB
/// message wrote 63 MB, and tokenizing that took minutes (found by the
/// `chat_template` fuzz target).
const RENDER_FLOOR_BYTES: usize = 1 << 20;

/// See [`RENDER_FLOOR_BYTES`]. Real templates write each message once.
const RENDER_PER_INPUT: usize = 4;

/// The render's output, refusing to grow past `limit` bytes.
struct CappedOutput {
    out: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            self.exceeded = true;
            return Err(std::io::Error::other("the rendered prompt is too long"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Bytes of the conversation a render starts from (for its output limit).
fn input_bytes(messages: &[Message], extra: &serde_json::Map<String, serde_json::Value>) -> usize {
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    let messages: usize = (messages.iter())
        .map(|m| {
            let calls: usize = (m.tool_calls.iter())
                .map(|c| c.name.len() + text(&c.id) + c.arguments.to_string().len())
                .sum();
            m.role.len() + text(&m.content) + text(&m.tool_call_id) + text(&m.name) + calls
        })
        .sum();
    messages + serde_json::Value::Object(extra.clone()).to_string().len()
}

pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template as given (for llama-server's `/props`).
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    fallback: Option<Fallback>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compile `source`. `bos_token`/`eos_token` are the tokenizer's token
    /// text (`<|begin_of_text|>`, ...); None leaves the variable undefined,
    /// as transformers does for a tokenizer without that token.
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<ChatTemplate, Error> {
        let mut env = Environment::new();
        shims::install(&mut env).map_err(|e| Error::Render {
            line: None,
            detail: describe(&e),
        })?;
        let given = source.to_string();
        let source = shims::rewrite_generation_tags(source).into_owned();
        env.add_template_owned(NAME, source)
            .map_err(|e| Error::Syntax {
                line: e.line(),
                detail: describe(&e),
            })?;
        Ok(ChatTemplate {
            env,
            source: given,
            bos_token: bos_token.map(str::to_string),
            eos_token: eos_token.map(str::to_string),
            fallback: None,
        })
    }

    /// The ChatML fallback ([`crate::fallback`]) for a model without a
    /// template.
    pub fn chatml_fallback(
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<ChatTemplate, Error> {
        ChatTemplate::fallback(Fallback::ChatMl, bos_token, eos_token)
    }

    /// A fallback template ([`crate::fallback`]) for a model without one.
    pub fn fallback(
        which: Fallback,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<ChatTemplate, Error> {
        let mut template = ChatTemplate::new(which.source(), bos_token, eos_token)?;
        template.fallback = Some(which);
        Ok(template)
    }

    /// `template` if the model has one (non-empty), else the ChatML
    /// fallback; check [`ChatTemplate::is_fallback`] to announce it.
    pub fn or_fallback(
        template: Option<&str>,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<ChatTemplate, Error> {
        match template.filter(|t| !t.trim().is_empty()) {
            Some(source) => ChatTemplate::new(source, bos_token, eos_token),
            None => ChatTemplate::chatml_fallback(bos_token, eos_token),
        }
    }

    /// The template in `tokenizer.chat_template`, or when the key is
    /// absent or empty the fallback for the file's architecture (Gemma's
    /// for Gemma, else ChatML). Take bos/eos from the vocabulary:
    /// `vocab.bos().and_then(|id| vocab.token_text(id))`.
    pub fn from_gguf(
        metadata: &gguf::Metadata,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<ChatTemplate, Error> {
        let source = match metadata.get(CHAT_TEMPLATE_KEY) {
            Some(_) => Some(metadata.get_str(CHAT_TEMPLATE_KEY)?),
            None => None,
        };
        match source.filter(|t| !t.trim().is_empty()) {
            Some(source) => ChatTemplate::new(source, bos_token, eos_token),
            None => {
                let arch = metadata.get_str("general.architecture").ok();
                ChatTemplate::fallback(Fallback::for_architecture(arch), bos_token, eos_token)
            }
        }
    }

    /// Pin what `strftime_now` returns (it reads the local clock otherwise),
    /// for reproducible prompts.
    pub fn with_now(mut self, now: jiff::civil::DateTime) -> ChatTemplate {
        shims::set_clock(&mut self.env, Clock::Fixed(now));
        self
    }

    /// The template's source, as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The syntax this template shows tools and calls in, None when it
    /// renders no tools ([`crate::tool_calls`]).
    pub fn tool_format(&self) -> Option<crate::ToolFormat> {
        let template = self.env.get_template(NAME).ok()?;
        crate::ToolFormat::detect(template.source())
    }

    /// Whether this is a fallback rather than the model's own.
    pub fn is_fallback(&self) -> bool {
        self.fallback.is_some()
    }

    /// Which fallback this is, if it is one.
    pub fn fallback_kind(&self) -> Option<Fallback> {
        self.fallback
    }

    /// What to print on stderr when this is a fallback.
    pub fn fallback_notice(&self) -> Option<&'static str> {
        self.fallback.map(Fallback::notice)
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// What the template writes between an assistant reply and the next user
    /// message (the reply's end marker and the next turn's header), with
    /// trailing whitespace trimmed: `"\nQ:"` for a `Q:`/`A:` format,
    /// `"<|im_end|>\n<|im_start|>user"` for ChatML. A model that keeps
    /// writing past its answer writes this next, so chat stops on it.
    /// `None` when it is only whitespace or the probe does not render.
    pub fn turn_stop(&self) -> Option<String> {
        const REPLY: &str = "\u{E000}reply\u{E000}";
        const NEXT: &str = "\u{E001}next\u{E001}";
        let messages = [
            Message::user("hi"),
            Message::assistant(REPLY),
            Message::user(NEXT),
        ];
        let text = self.render(&messages, false).ok()?;
        let start = text.find(REPLY)? + REPLY.len();
        let between = &text[start..start + text[start..].find(NEXT)?];
        let stop = between.trim_end();
        (!stop.trim().is_empty()).then(|| stop.to_string())
    }

    /// The prompt for `messages`; with `add_generation_prompt`, ending with
    /// the header that makes the model answer as the assistant.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// [`ChatTemplate::render`] with extra template variables, as keyword
    /// arguments to `apply_chat_template`: `tools` (a list of JSON schemas),
    /// `documents`, `enable_thinking`, `date_string`, ... They may override
    /// `bos_token`/`eos_token`, not `messages` or `add_generation_prompt`.
    /// Object keys reach the template in the map's order (serde_json's
    /// `preserve_order`: as given).
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, Error> {
        let context = Context {
            messages,
            add_generation_prompt,
            bos_token: self.bos_token(),
            eos_token: self.eos_token(),
            extra,
        }
        .to_value()?;
        // Errors become ours inside the thread: a minijinja error can hold
        // template values, and dropping a deep one needs the big stack.
        let input = input_bytes(messages, extra);
        let limit = RENDER_FLOOR_BYTES.saturating_add(input.saturating_mul(RENDER_PER_INPUT));
        let render = || {
            let template = self.env.get_template(NAME).map_err(render_error)?;
            let mut out = CappedOutput {
                out: Vec::new(),
                limit,
                exceeded: false,
            };
            let rendered = template.render_captured_to(context, &mut out);
            if out.exceeded {
                return Err(Error::Render {
                    line: None,
                    detail: format!(
                        "the rendered prompt passed {limit} bytes ({RENDER_FLOOR_BYTES} plus {RENDER_PER_INPUT}× the conversation's {input}): the template repeats its input"
                    ),
                });
            }
            drop(rendered.map_err(render_error)?);
            String::from_utf8(out.out).map_err(|e| Error::Render {
                line: None,
                detail: format!("the template wrote invalid UTF-8: {e}"),
            })
        };
        let rendered = std::thread::scope(|scope| {
            let thread = std::thread::Builder::new()
                .name("chat-template".into())
                .stack_size(RENDER_STACK_BYTES)
                .spawn_scoped(scope, render)
                .map_err(|e| Error::Render {
                    line: None,
                    detail: format!("cannot start the render thread: {e}"),
                })?;
            // A panic inside the engine is a bug there; still, an error.
            thread.join().map_err(|_| Error::Render {
                line: None,
                detail: "the template engine panicked".into(),
            })
        })?;
        rendered
    }
}

fn render_error(err: minijinja::Error) -> Error {
    match shims::raised_message(&err) {
        Some(message) => Error::Raised { message },
        None => Error::Render {
            line: err.line(),
            detail: describe(&err),
        },
    }
}

/// "kind: detail" without minijinja's "(in chat_template:3)" suffix: our
/// errors carry the line themselves.
fn describe(err: &minijinja::Error) -> String {
    match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    }
}
