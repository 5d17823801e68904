//! Fuzz the tokenizers: any text encodes without panicking (control tokens
//! parsed or not), and encoding then decoding gives the text back where
//! the vocabulary allows it (byte-level BPE: always; SentencePiece with
//! byte fallback: always, the added leading space removed by decode, except
//! for text holding U+2581, the character it writes spaces as).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tokenize::{DecodeOptions, TokenizerModel, Vocab};

fn vocabs() -> &'static [Vocab] {
    static VOCABS: OnceLock<Vec<Vocab>> = OnceLock::new();
    VOCABS.get_or_init(|| {
        let files: [&[u8]; 3] = [
            include_bytes!("../../testdata/vocab/ggml-vocab-gpt-2.gguf"),
            include_bytes!("../../testdata/vocab/ggml-vocab-llama-bpe.gguf"),
            include_bytes!("../../testdata/vocab/ggml-vocab-llama-spm.gguf"),
        ];
        files
            .iter()
            .map(|bytes| {
                let header = gguf::parse_header(bytes, gguf::Limits::default()).unwrap();
                Vocab::from_gguf(&header.metadata).unwrap()
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for vocab in vocabs() {
        let ids = vocab.encode(text, true, true);
        assert!(ids.iter().all(|&id| (id as usize) < vocab.len()));
        let _ = vocab.decode(&ids);
        let plain = vocab.encode_with_plain(text, false, &[0..text.len()]);
        assert!(plain.iter().all(|&id| !vocab.is_control(id)), "control token from plain text");
        let ids = vocab.encode(text, false, false);
        let back = match vocab.model() {
            TokenizerModel::Bpe => String::from_utf8(vocab.decode_with(
                &ids,
                DecodeOptions {
                    keep_spaces: true,
                    ..Default::default()
                },
            ))
            .expect("valid UTF-8 in, valid UTF-8 out"),
            TokenizerModel::Spm if text.contains('\u{2581}') => continue,
            TokenizerModel::Spm => vocab.decode(&ids),
        };
        assert_eq!(back, text, "{:?}", vocab.pre_tokenizer_name());
    }
});
