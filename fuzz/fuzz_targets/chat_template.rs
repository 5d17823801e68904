//! Fuzz the chat-template renderer with hostile templates and messages:
//! the input is a template source, a NUL, then messages separated by 0x01
//! (user, assistant, user, ...). Compiling and rendering give Ok or an
//! error, never a panic or a hang (minijinja's fuel bounds the work); a
//! rendered prompt tokenizes, and its tokens spell it back.
#![no_main]

use std::sync::OnceLock;

use chat::{prompt_tokens, ChatTemplate, Message, Special};
use libfuzzer_sys::fuzz_target;
use tokenize::{DecodeOptions, Vocab};

fn vocab() -> &'static Vocab {
    static VOCAB: OnceLock<Vocab> = OnceLock::new();
    VOCAB.get_or_init(|| {
        let bytes = include_bytes!("../../testdata/vocab/ggml-vocab-gpt-2.gguf");
        let header = gguf::parse_header(bytes, gguf::Limits::default()).unwrap();
        Vocab::from_gguf(&header.metadata).unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (source, rest) = text.split_once('\0').unwrap_or((&text, "hi"));
    let messages: Vec<Message> = rest
        .split('\u{1}')
        .enumerate()
        .map(|(i, m)| Message::new(if i % 2 == 0 { "user" } else { "assistant" }, m))
        .collect();
    let Ok(template) = ChatTemplate::new(source, Some("<s>"), Some("</s>")) else {
        return;
    };
    let vocab = vocab();
    for special in [Special::Text, Special::Parse] {
        if let Ok(p) = prompt_tokens(&template, &messages, true, vocab, special) {
            let opts = DecodeOptions {
                unparse_special: true,
                keep_spaces: true,
                ..Default::default()
            };
            let spelled = vocab.decode_with(&p.tokens, opts);
            assert!(
                spelled.ends_with(p.text.as_bytes()),
                "tokens do not spell the prompt"
            );
        }
    }
});
