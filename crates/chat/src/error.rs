//! Errors from compiling and rendering a chat template. Each says whether
//! the template itself is broken (with the line), or the template refused
//! the conversation (with the template's own message).

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The template source does not parse.
    #[error("chat template does not parse{}: {detail}", at_line(*.line))]
    Syntax { line: Option<usize>, detail: String },
    /// The template called `raise_exception(message)`, as templates do for
    /// conversations they cannot format (gemma-2 rejects a system turn).
    #[error("chat template rejected the conversation: {message}")]
    Raised { message: String },
    /// Rendering failed for another reason: an undefined attribute, a type
    /// error, or a template that ran past its work budget.
    #[error("chat template failed to render{}: {detail}", at_line(*.line))]
    Render { line: Option<usize>, detail: String },
    /// `tokenizer.chat_template` is present but not a string.
    #[error(transparent)]
    Metadata(#[from] gguf::ErrorKind),
    /// A message holds the text of a control token and the template changes
    /// message text, so it cannot be kept apart as plain text.
    #[error("a `{role}` message contains `{token}`, a control token of this model, and the chat template changes message text in a way that keeps it from being tokenized as plain text; remove it from the message")]
    ControlTextInMessage { role: String, token: String },
    /// Text the template writes outside message content (tools, tool
    /// calls, `tool_call_id`, `name`) holds a control token's text.
    #[error("{what} contains `{token}`, a control token of this model; control-token text is kept as plain text only in message content, so remove it there")]
    ControlTextOutsideContent { what: String, token: String },
    /// An extra template variable collides with one the renderer sets.
    #[error("`{0}` is set by the renderer and cannot be passed as an extra template variable")]
    ReservedVariable(String),
}

fn at_line(line: Option<usize>) -> String {
    match line {
        Some(line) => format!(" at line {line}"),
        None => String::new(),
    }
}
