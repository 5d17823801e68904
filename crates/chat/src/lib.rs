//! Chat templates: turning a conversation into the prompt text a model was
//! trained on, by rendering the GGUF's `tokenizer.chat_template` (Jinja)
//! the way Hugging Face's `apply_chat_template` does.
//!
//! The engine is minijinja; [`shims`] adds what transformers adds to jinja2
//! (`raise_exception`, a non-escaping `tojson`, `strftime_now`,
//! trim_blocks/lstrip_blocks, loop controls) and what Python does where
//! templates can see it (string methods, how `None` and lists print, see
//! [`python`] and [`json`]). Tests render real templates and compare them
//! byte for byte with Python jinja2 (scripts/chat-templates/render.py).
//!
//! A model without a template gets ChatML ([`fallback`]); tools check
//! [`ChatTemplate::is_fallback`] and print [`ChatTemplate::fallback_notice`] on stderr.
//!
//! [`prompt_tokens`] renders and tokenizes, keeping message text as text
//! so that a message cannot forge control tokens ([`prompt`]).
//!
//! Tools ([`tool_calls`]): requests' tool lists go through the template
//! when it renders them (Qwen2.5's, Llama 3.x's) or the Hermes way when it
//! does not, and the calls a model writes are parsed back out, whole or as
//! they stream, for `run`, `chat` and `serve` alike.
//!
//! Layout: [`template`] (compile, render), [`prompt`], [`message`], [`tool_calls`], [`context`] (the
//! variables a template sees), [`shims`], [`python`], [`json`],
//! [`fallback`], [`error`].
//!
//! ```
//! use chat::{ChatTemplate, Message};
//! let template = ChatTemplate::or_fallback(None, None, None)?;
//! let prompt = template.render(&[Message::user("Hi")], true)?;
//! assert_eq!(prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
//! # Ok::<(), chat::Error>(())
//! ```

pub mod context;
pub mod error;
pub mod fallback;
pub mod json;
pub mod message;
pub mod prompt;
pub mod python;
pub mod shims;
pub mod template;
pub mod tool_calls;

pub use error::Error;
pub use fallback::{Fallback, CHATML_TEMPLATE, FALLBACK_NOTICE, GEMMA_TEMPLATE};
pub use message::{Message, ToolCall};
pub use prompt::{
    prompt_tokens, prompt_tokens_with, tokenize_rendered, tokenize_rendered_with, Prompt, Special,
};
pub use template::{ChatTemplate, CHAT_TEMPLATE_KEY};
pub use tool_calls::{ParsedCall, ToolCallParser, ToolFormat};

/// A civil (zone-less) date and time, for [`ChatTemplate::with_now`].
pub use jiff::civil::DateTime;
