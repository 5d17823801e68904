//! Vocabularies built by hand, broken in the ways real files are: loading
//! either fails with an error naming the key or token, or succeeds with a
//! warning; nothing panics, and encoding and decoding still work.

use gguf::{Metadata, Value, ValueType};
use tokenize::{Error, Vocab};

fn strings(items: &[&str]) -> Value {
    Value::Array(
        ValueType::String,
        items.iter().map(|s| Value::String(s.to_string())).collect(),
    )
}

/// A byte-level BPE vocab: the 256 byte characters, plus `he`, `ll`, `hell`,
/// `hello`, and `<|end|>` (control).
fn bpe() -> Metadata {
    let mut tokens: Vec<String> = (0u8..=255)
        .map(|b| {
            // GPT-2's byte map, spelled out independently of the crate.
            let keeps = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
            let shifted = (0u8..b)
                .filter(|&x| !matches!(x, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF))
                .count();
            char::from_u32(if keeps {
                b as u32
            } else {
                256 + shifted as u32
            })
            .unwrap()
            .to_string()
        })
        .collect();
    tokens.extend(["he", "ll", "hell", "hello", "<|end|>"].map(String::from));
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut types = vec![Value::I32(1); tokens.len()];
    *types.last_mut().unwrap() = Value::I32(3);
    let mut md = Metadata::new();
    md.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    md.set("tokenizer.ggml.pre", Value::String("gpt-2".into()));
    md.set("tokenizer.ggml.tokens", strings(&refs));
    md.set(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::I32, types),
    );
    md.set(
        "tokenizer.ggml.merges",
        strings(&["h e", "l l", "he ll", "hell o"]),
    );
    md.set("tokenizer.ggml.eos_token_id", Value::U32(260));
    md
}

/// A SentencePiece vocab without byte tokens.
fn spm() -> Metadata {
    let mut md = Metadata::new();
    md.set("tokenizer.ggml.model", Value::String("llama".into()));
    md.set(
        "tokenizer.ggml.tokens",
        strings(&["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "▁ab"]),
    );
    md.set(
        "tokenizer.ggml.scores",
        Value::Array(
            ValueType::F32,
            [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -1.5, -1.0, -0.5]
                .map(Value::F32)
                .to_vec(),
        ),
    );
    md.set(
        "tokenizer.ggml.token_type",
        Value::Array(
            ValueType::I32,
            [2, 3, 3, 1, 1, 1, 1, 1, 1].map(Value::I32).to_vec(),
        ),
    );
    md
}

fn load(md: &Metadata) -> Vocab {
    Vocab::from_gguf(md).unwrap_or_else(|e| panic!("{e}"))
}

fn error(md: &Metadata) -> String {
    match Vocab::from_gguf(md) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn well_formed_hand_made_vocabs_work() {
    let v = load(&bpe());
    assert!(v.warnings().is_empty(), "{:?}", v.warnings());
    assert_eq!(v.encode("hello", false, false), [259]);
    assert_eq!(v.encode("hello<|end|>", false, true), [259, 260]);
    assert_eq!(
        v.decode(&v.encode("hello hello", false, false)),
        "hello hello"
    );
    assert_eq!(v.eos(), Some(260));
    assert!(v.is_eog(260) && v.is_control(260));

    let v = load(&spm());
    assert_eq!(v.encode("ab", true, false), [1, 8]);
    assert_eq!(v.decode(&[8]), "ab");
}

#[test]
fn unknown_model_and_pre_tokenizer_are_named() {
    let mut md = bpe();
    md.set("tokenizer.ggml.pre", Value::String("no-such-pre".into()));
    let e = error(&md);
    assert!(
        e.contains("`no-such-pre`") && e.contains("tokenizer.ggml.pre"),
        "{e}"
    );
    assert!(
        e.contains("smollm")
            && e.contains("llama-bpe")
            && e.contains("qwen2")
            && e.contains("deepseek-coder"),
        "{e}"
    );

    md.set("tokenizer.ggml.model", Value::String("t5".into()));
    let e = error(&md);
    assert!(e.contains("`t5`") && e.contains("llama, gpt2"), "{e}");
}

#[test]
fn missing_and_mistyped_keys_are_named() {
    let mut md = bpe();
    md.remove("tokenizer.ggml.merges");
    assert!(error(&md).contains("`tokenizer.ggml.merges` is missing"));

    let mut md = bpe();
    md.remove("tokenizer.ggml.tokens");
    assert!(error(&md).contains("`tokenizer.ggml.tokens` is missing"));

    let mut md = bpe();
    md.set(
        "tokenizer.ggml.tokens",
        Value::Array(ValueType::String, vec![]),
    );
    assert!(matches!(Vocab::from_gguf(&md), Err(Error::NoTokens)));

    let mut md = bpe();
    md.set(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::U8, vec![Value::U8(1)]),
    );
    let e = error(&md);
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains("u8"),
        "{e}"
    );

    let mut md = spm();
    md.set(
        "tokenizer.ggml.scores",
        Value::Array(ValueType::F32, vec![Value::F32(0.0); 3]),
    );
    let e = error(&md);
    assert!(
        e.contains("tokenizer.ggml.scores") && e.contains("3 entries"),
        "{e}"
    );

    let mut md = bpe();
    md.set("tokenizer.ggml.eos_token_id", Value::String("260".into()));
    assert!(error(&md).contains("tokenizer.ggml.eos_token_id"));

    let mut md = bpe();
    md.set("tokenizer.ggml.add_bos_token", Value::U32(1));
    assert!(error(&md).contains("tokenizer.ggml.add_bos_token"));
}

#[test]
fn duplicate_tokens_are_an_error_naming_both_ids() {
    let mut md = spm();
    md.set(
        "tokenizer.ggml.tokens",
        strings(&["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "a", "▁ab"]),
    );
    let e = error(&md);
    assert!(e.contains("token 7 \"a\"") && e.contains("token 4"), "{e}");
}

#[test]
fn bad_merges_are_skipped_with_a_warning() {
    let mut md = bpe();
    md.set(
        "tokenizer.ggml.merges",
        strings(&["h e", "x y", "nospace", "l l", "he ll", "hell o", "q z"]),
    );
    let v = load(&md);
    assert_eq!(v.warnings().len(), 1, "{:?}", v.warnings());
    assert!(
        v.warnings()[0].contains("3 merge(s)") && v.warnings()[0].contains("x y"),
        "{:?}",
        v.warnings()
    );
    assert_eq!(v.encode("hello", false, false), [259]);
}

#[test]
fn out_of_range_special_ids_are_ignored_with_a_warning() {
    let mut md = bpe();
    md.set("tokenizer.ggml.eos_token_id", Value::U32(99_999));
    md.set("tokenizer.ggml.bos_token_id", Value::U64(u64::MAX));
    md.set("tokenizer.ggml.padding_token_id", Value::I32(-1));
    md.set("tokenizer.ggml.add_bos_token", Value::Bool(true));
    md.set("tokenizer.ggml.add_eos_token", Value::Bool(true));
    let v = load(&md);
    let w = v.warnings().join("\n");
    assert!(w.contains("eos_token_id` = 99999"), "{w}");
    assert!(w.contains("padding_token_id` is negative"), "{w}");
    // Ignored ids leave gpt2's default, 11, in place.
    assert_eq!(v.bos(), Some(11));
    assert_eq!(v.eos(), Some(11));
    assert_eq!(v.special_tokens().pad, None);
    assert_eq!(v.encode("he", true, false), [11, 256, 11]);

    // A vocabulary too small for a default drops it (SPM's EOS is 2), and
    // add_special then adds nothing rather than failing.
    let mut md = spm();
    md.set("tokenizer.ggml.tokens", strings(&["a", "b"]));
    md.set(
        "tokenizer.ggml.scores",
        Value::Array(ValueType::F32, vec![Value::F32(0.0); 2]),
    );
    md.set(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::I32, vec![Value::I32(1); 2]),
    );
    let v = load(&md);
    assert_eq!((v.bos(), v.eos()), (Some(1), None));
    assert!(
        v.warnings()
            .iter()
            .any(|w| w.contains("default `tokenizer.ggml.eos_token_id` = 2")),
        "{:?}",
        v.warnings()
    );
    md.set("tokenizer.ggml.add_eos_token", Value::Bool(true));
    // BOS, then `▁` (no such token, no byte tokens: three bytes of <unk>, id 0), `a`, `b`.
    assert_eq!(load(&md).encode("ab", true, false), [1, 0, 0, 0, 0, 1]);
}

#[test]
fn odd_tokens_do_not_panic() {
    let mut md = spm();
    md.set(
        "tokenizer.ggml.tokens",
        strings(&["<unk>", "<s>", "</s>", "", "<0xZZ>", "b", "▁a", "ab", "▁ab"]),
    );
    md.set(
        "tokenizer.ggml.token_type",
        Value::Array(
            ValueType::I32,
            [2, 3, 3, 99, 6, 5, 1, 1, 1].map(Value::I32).to_vec(),
        ),
    );
    let v = load(&md);
    assert_eq!(v.token_text(3), Some("[EMPTY_3]"));
    assert!(v.warnings().iter().any(|w| w.contains("token 3 is empty")));
    // No byte tokens: characters outside the vocab become <unk>.
    assert_eq!(v.encode("a€", false, false), [6, 0, 0, 0]);
    // A byte token that is not `<0xXX>` prints its text; unknown types print nothing.
    assert_eq!(v.token_to_piece(4, false), b"<0xZZ>");
    assert_eq!(v.token_to_piece(3, false), b"");
    // Ids past the end decode to nothing.
    assert_eq!(v.decode(&[8, 1_000_000, u32::MAX]), "ab");
    assert_eq!(v.stream_decoder().push(u32::MAX), "");
}

#[test]
fn spm_keeps_together_what_a_token_spans() {
    // `b▁` joins a word to the space after it, so "b a" may not be cut
    // before its space: the best merge is `b▁`, as on the whole text.
    let mut md = spm();
    md.set(
        "tokenizer.ggml.tokens",
        strings(&["<unk>", "<s>", "</s>", "▁", "a", "b", "b▁", "▁a", "▁b"]),
    );
    md.set(
        "tokenizer.ggml.scores",
        Value::Array(
            ValueType::F32,
            [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, 10.0, -1.5, -1.0]
                .map(Value::F32)
                .to_vec(),
        ),
    );
    let v = load(&md);
    assert_eq!(v.encode("b a", false, false), [3, 6, 4]);
    assert_eq!(v.decode(&[3, 6, 4]), "b a");
    // Without such a token the text is cut before each space, with the same result.
    assert_eq!(load(&spm()).encode("ab ab a", false, false), [8, 8, 6]);
}
