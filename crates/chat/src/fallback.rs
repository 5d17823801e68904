//! The template for models whose GGUF has no `tokenizer.chat_template`:
//! ChatML (`<|im_start|>role\ncontent<|im_end|>\n` per turn, then
//! `<|im_start|>assistant\n` as the generation prompt), the format
//! transformers itself used as its default template. A model trained on
//! another format will answer poorly, so tools announce the fallback on
//! stderr ([`FALLBACK_NOTICE`]) rather than use it silently.

/// Source of the fallback template (also rendered by
/// scripts/chat-templates/render.py, so it is checked against jinja2 too).
pub const CHATML_TEMPLATE: &str = include_str!("chatml.jinja");

/// What a tool prints on stderr when it falls back to ChatML.
pub const FALLBACK_NOTICE: &str =
    "note: the model has no chat template (tokenizer.chat_template); using ChatML";
