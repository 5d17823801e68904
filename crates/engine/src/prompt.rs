//! From what a user wrote to the tokens a job starts from, the same way for
//! `run`, `chat` and `serve`: a plain prompt, or a conversation rendered
//! through the model's chat template, and the ends of a chat turn the
//! template implies.

use chat::ChatTemplate;
use tokenize::Vocab;

/// Tokens of a plain-text prompt (`run`, `/v1/completions`): the
/// vocabulary's own BOS where it wants one; control tokens written in the
/// text are parsed, as llama.cpp's tools do.
pub fn completion_tokens(vocab: &Vocab, text: &str) -> Vec<u32> {
    vocab.encode(text, true, true)
}

/// Tokens of a document added to a memory: plain text. Nothing in it
/// becomes a control token (a document is data, not instructions), and no
/// BOS (it continues a history).
pub fn document_tokens(vocab: &Vocab, text: &str) -> Vec<u32> {
    vocab.encode(text, false, false)
}

/// Tokens of a prompt rendered by a chat template (`chat`,
/// `/v1/chat/completions`). The template writes the model's control tokens
/// as text, so they are parsed; BOS is added where the model wants one and
/// the template did not write it, and never EOS (which the vocabulary's
/// `add_special` would append for some models).
pub fn chat_tokens(vocab: &Vocab, rendered: &str) -> Vec<u32> {
    let mut tokens = vocab.encode(rendered, false, true);
    if let Some(bos) = vocab.bos().filter(|_| vocab.add_bos()) {
        if tokens.first() != Some(&bos) {
            tokens.insert(0, bos);
        }
    }
    tokens
}

/// What ends a reply in a chat besides the vocabulary's end-of-generation
/// tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TurnEnd {
    /// Extra end-of-generation tokens.
    pub eog: Vec<u32>,
    /// Extra stop strings.
    pub stop: Vec<String>,
}

/// The ends of a reply that `template` implies: with a fallback (a model
/// without a template of its own) the model may not know its turn end
/// (`<|im_end|>`, Gemma's `<end_of_turn>`) as an end-of-generation token,
/// or even as a token, so both the token and the text stop it; a template without an end-of-turn token
/// (the built-in model's `Q:`/`A:` format) stops where the next user turn
/// would begin.
pub fn turn_end(template: &ChatTemplate, vocab: &Vocab) -> TurnEnd {
    let mut end = TurnEnd::default();
    if let Some(fallback) = template.fallback_kind() {
        let turn_end = fallback.turn_end();
        end.eog.extend(vocab.token_id(turn_end));
        end.stop.push(turn_end.to_string());
    }
    end.stop.extend(template.turn_stop());
    end
}
