//! The template for models whose GGUF has no `tokenizer.chat_template`:
//! Gemma's turn format for the Gemma architectures (Gemma 3 270M ships
//! without a template), else ChatML (`<|im_start|>role\ncontent<|im_end|>\n`
//! per turn, then `<|im_start|>assistant\n` as the generation prompt), the
//! format transformers itself used as its default template. A model trained
//! on another format will answer poorly, so tools announce the fallback on
//! stderr ([`Fallback::notice`]) rather than use it silently.

/// Source of the fallback template (also rendered by
/// scripts/chat-templates/render.py, so it is checked against jinja2 too).
pub const CHATML_TEMPLATE: &str = include_str!("chatml.jinja");

/// What a tool prints on stderr when it falls back to ChatML.
pub const FALLBACK_NOTICE: &str =
    "note: the model has no chat template (tokenizer.chat_template); using ChatML";

/// Source of the Gemma fallback (`<start_of_turn>user` … `<end_of_turn>`).
pub const GEMMA_TEMPLATE: &str = include_str!("gemma.jinja");

/// Which fallback a model gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    ChatMl,
    Gemma,
}

impl Fallback {
    /// The fallback for a file's `general.architecture`.
    pub fn for_architecture(arch: Option<&str>) -> Fallback {
        match arch {
            Some("gemma" | "gemma2" | "gemma3") => Fallback::Gemma,
            _ => Fallback::ChatMl,
        }
    }

    pub fn source(self) -> &'static str {
        match self {
            Fallback::ChatMl => CHATML_TEMPLATE,
            Fallback::Gemma => GEMMA_TEMPLATE,
        }
    }

    /// The text that ends a turn in this format.
    pub fn turn_end(self) -> &'static str {
        match self {
            Fallback::ChatMl => "<|im_end|>",
            Fallback::Gemma => "<end_of_turn>",
        }
    }

    /// What a tool prints on stderr when it uses this fallback.
    pub fn notice(self) -> &'static str {
        match self {
            Fallback::ChatMl => FALLBACK_NOTICE,
            Fallback::Gemma => {
                "note: the model has no chat template (tokenizer.chat_template); using Gemma's turn format"
            }
        }
    }
}
