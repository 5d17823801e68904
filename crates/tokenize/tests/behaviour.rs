//! Special tokens, end-of-generation, streaming and long inputs, on
//! SmolLM2's real vocabulary and llama.cpp's test vocabularies.

mod common;

use common::{load, round_trip, vocab_path};
use tokenize::{DecodeOptions, PreTokenizer, StreamDecoder, TokenizerModel, Utf8Buffer, Vocab};

#[test]
fn vocab_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Vocab>();
}

#[test]
fn smollm2_settings_match_llama_cpp() {
    let Some(v) = common::smollm2() else { return };
    // As llama.cpp's print_info reports them for this file.
    assert_eq!(v.model(), TokenizerModel::Bpe);
    assert_eq!(v.pre_tokenizer(), Some(PreTokenizer::Starcoder));
    assert_eq!(v.pre_tokenizer_name(), Some("smollm"));
    assert_eq!(v.len(), 49152);
    let s = v.special_tokens();
    assert_eq!(
        (s.bos, s.eos, s.eot, s.unk, s.pad, s.fim_rep),
        (Some(1), Some(2), Some(0), Some(0), Some(2), Some(4))
    );
    assert_eq!(v.eog_tokens(), [0, 2, 4]);
    assert!(!v.add_bos() && !v.add_eos() && !v.add_space_prefix());
    assert!(v.warnings().is_empty(), "{:?}", v.warnings());
    assert_eq!(v.token_text(2), Some("<|im_end|>"));
}

#[test]
fn test_vocab_end_of_generation_sets_match_llama_cpp() {
    let eog = |f: &str| load(&vocab_path(f)).eog_tokens().to_vec();
    assert_eq!(eog("ggml-vocab-gpt-2.gguf"), [50256]);
    assert_eq!(eog("ggml-vocab-llama-bpe.gguf"), [128001, 128009]);
    assert_eq!(eog("ggml-vocab-llama-spm.gguf"), [2]);
    assert_eq!(eog("ggml-vocab-phi-3.gguf"), [2, 32000, 32007]);
    let eot = |f: &str| load(&vocab_path(f)).special_tokens().eot;
    assert_eq!(eot("ggml-vocab-llama-bpe.gguf"), Some(128009));
    assert_eq!(eot("ggml-vocab-phi-3.gguf"), Some(32007));
}

#[test]
fn special_tokens_are_parsed_only_when_asked() {
    let Some(v) = common::smollm2() else { return };
    let text = "<|im_start|>user\nHi<|im_end|>\n";
    let parsed = v.encode(text, false, true);
    assert_eq!(parsed.first(), Some(&1));
    assert!(parsed.contains(&2));
    // Control tokens print nothing by default, their text on request.
    assert_eq!(v.decode(&parsed), "user\nHi\n");
    let shown = DecodeOptions {
        unparse_special: true,
        ..Default::default()
    };
    assert_eq!(v.decode_with(&parsed, shown), text.as_bytes());

    let plain = v.encode(text, false, false);
    assert!(!plain.contains(&1) && !plain.contains(&2));
    assert!(plain.len() > parsed.len());
    assert_eq!(v.decode(&plain), text);

    // add_special follows the file: SmolLM2 asks for no BOS.
    assert_eq!(v.encode("Hi", true, false), v.encode("Hi", false, false));
}

#[test]
fn spm_adds_bos_and_the_leading_space() {
    let v = load(&vocab_path("ggml-vocab-llama-spm.gguf"));
    let ids = v.encode("Hello world", true, false);
    assert_eq!(ids[0], 1);
    assert_eq!(v.token_text(ids[1]), Some("▁Hello"));
    // llama.cpp's rule: the leading space goes only when the first token is
    // not a BOS it keeps.
    assert_eq!(v.decode(&ids[1..]), "Hello world");
    assert_eq!(v.decode(&ids), " Hello world");
    let drop_bos = DecodeOptions {
        remove_special: true,
        ..Default::default()
    };
    assert_eq!(v.decode_with(&ids, drop_bos), b" Hello world");
    // `<s>` in the text is a control token: text unless parse_special.
    assert_eq!(v.encode("<s>x", false, true)[0], 1);
    assert_ne!(v.encode("<s>x", false, false)[0], 1);
}

#[test]
fn bpe_decode_cleans_spaces_where_the_vocab_asks() {
    // GPT-2 and Llama 3 ask for llama.cpp's clean-up; SmolLM2 does not.
    let v = load(&vocab_path("ggml-vocab-gpt-2.gguf"));
    let ids = v.encode("Hello , world ! I 'm ok .", false, false);
    assert_eq!(v.decode(&ids), "Hello, world! I'm ok.");
    let exact = DecodeOptions {
        keep_spaces: true,
        ..Default::default()
    };
    assert_eq!(v.decode_with(&ids, exact), b"Hello , world ! I 'm ok .");
}

/// Feed tokens one at a time; every chunk is whole characters, and the
/// chunks add up to the text. Returns how many pushes held bytes back.
fn stream(v: &Vocab, text: &str) -> usize {
    let ids = v.encode(text, false, false);
    let mut dec = StreamDecoder::new(v);
    let mut out = String::new();
    let mut held = 0;
    for &id in &ids {
        out.push_str(&dec.push(id));
        held += !dec.pending().is_empty() as usize;
    }
    out.push_str(&dec.finish());
    let expected = match v.model() {
        TokenizerModel::Spm => format!(" {text}"), // pieces keep SPM's leading space
        TokenizerModel::Bpe => text.to_string(),
    };
    assert_eq!(out, expected);
    held
}

#[test]
fn stream_decoder_holds_characters_split_across_tokens() {
    let text = "emoji 🦙🚀😶‍🌫️ and CJK 我想在apple工作 ok";
    // Byte-level BPE splits rare characters into byte tokens; SPM falls
    // back to <0xXX> tokens. Either way some characters span tokens.
    assert!(stream(&load(&vocab_path("ggml-vocab-gpt-2.gguf")), text) > 0);
    assert!(stream(&load(&vocab_path("ggml-vocab-llama-spm.gguf")), text) > 0);
    if let Some(v) = common::smollm2() {
        assert!(stream(&v, text) > 0);
    }
}

#[test]
fn utf8_buffer_replaces_only_what_can_never_be_valid() {
    let mut b = Utf8Buffer::default();
    let llama = "🦙".as_bytes();
    assert_eq!(b.push(&llama[..1]), "");
    assert_eq!(b.push(&llama[1..3]), "");
    assert_eq!(b.push(&llama[3..]), "🦙");
    // A lone continuation byte can never become valid: replaced at once.
    assert_eq!(b.push(b"a\x80b"), "a\u{FFFD}b");
    // A lead byte followed by a non-continuation: replaced, then the rest.
    assert_eq!(b.push(b"\xE6x"), "\u{FFFD}x");
    // Incomplete at the end of the stream: replaced by finish.
    assert_eq!(b.push("我".as_bytes().split_at(2).0), "");
    assert_eq!(b.finish(), "\u{FFFD}");
    assert_eq!(b.finish(), "");
}

/// A deterministic stream of awkward strings: ASCII, whitespace runs,
/// punctuation, Latin with marks, Cyrillic, CJK, emoji, controls.
fn random_texts(n: usize) -> Vec<String> {
    const ALPHABET: &[&str] = &[
        "a",
        "Z",
        "q",
        "7",
        "0",
        " ",
        " ",
        "  ",
        "\n",
        "\t",
        "\r\n",
        "'",
        "'s",
        "'LL",
        ".",
        ",",
        "!",
        "?",
        "$",
        "+",
        "<",
        "`",
        "é",
        "e\u{301}",
        "ß",
        "ж",
        "Ω",
        "我",
        "工作",
        "한",
        "١",
        "½",
        "²",
        "🦙",
        "😶‍🌫️",
        "\u{3000}",
        "\u{A0}",
        "\u{0}",
        "\u{7F}",
        "\u{E000}",
        "<|",
        "|>",
        "<s>",
        "<unk",
    ];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n)
        .map(|_| {
            let len = (next() % 40) as usize;
            (0..len)
                .map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize])
                .collect()
        })
        .collect()
}

#[test]
fn random_text_round_trips() {
    let mut vocabs = vec![
        load(&vocab_path("ggml-vocab-gpt-2.gguf")),
        load(&vocab_path("ggml-vocab-llama-bpe.gguf")),
        load(&vocab_path("ggml-vocab-llama-spm.gguf")),
    ];
    vocabs.extend(common::smollm2());
    for v in &vocabs {
        for text in random_texts(500) {
            assert_eq!(round_trip(v, &text), text, "{:?}", v.pre_tokenizer());
        }
    }
}

/// About 1 MB of text: Shakespeare from the shared data folder, or the
/// fixture inputs repeated where that is missing.
fn megabyte() -> String {
    let shared = testkit::workspace_root()
        .parent()
        .map(|p| p.join("shared/data/tinyshakespeare.txt"));
    if let Some(text) = shared.and_then(|p| std::fs::read_to_string(p).ok()) {
        return text;
    }
    eprintln!("tinyshakespeare.txt not found: using repeated fixture inputs");
    let seed = std::fs::read_to_string(common::fixture_path("llamacpp.inp")).unwrap();
    seed.repeat(1_000_000 / seed.len() + 1)
}

/// Long inputs complete and round-trip (no timing assertion: the point is
/// that nothing is quadratic). SPM has no pre-tokenizer, so its whole input
/// is one merge problem; the BPE run includes one 200 kB "word".
#[test]
fn a_megabyte_encodes_and_round_trips() {
    let text = megabyte();
    let mut vocabs = vec![load(&vocab_path("ggml-vocab-llama-spm.gguf"))];
    vocabs.extend(common::smollm2());
    for v in &vocabs {
        let start = std::time::Instant::now();
        let ids = v.encode(&text, false, false);
        let took = start.elapsed();
        assert_eq!(round_trip(v, &text), text);
        eprintln!(
            "{:?}: {} bytes -> {} tokens in {took:.2?}",
            v.model(),
            text.len(),
            ids.len()
        );
    }
    let gpt2 = load(&vocab_path("ggml-vocab-gpt-2.gguf"));
    let word = "abcdefghij".repeat(20_000);
    let ids = gpt2.encode(&word, false, false);
    assert_eq!(gpt2.decode(&ids), word);
}

/// Issue 19: control tokens written inside a "plain" range (text a chat
/// template copied from a message) stay text; outside, they are parsed;
/// ranges without control text change nothing.
#[test]
fn control_tokens_in_plain_ranges_stay_text() {
    for file in ["ggml-vocab-llama-bpe.gguf", "ggml-vocab-llama-spm.gguf"] {
        let v = load(&vocab_path(file));
        let ctl = v.token_text(v.eos().unwrap()).unwrap().to_string();
        assert!(v.is_control(v.eos().unwrap()), "{file}");
        let text = format!("a{ctl}b{ctl}c");
        let second = text.find("b").unwrap()..text.len();
        let parsed = v.encode(&text, false, true);
        let guarded = v.encode_with_plain(&text, false, std::slice::from_ref(&second));
        let count = |ids: &[u32]| ids.iter().filter(|&&t| v.is_control(t)).count();
        assert_eq!(count(&parsed), 2, "{file}");
        assert_eq!(count(&guarded), 1, "{file}");
        // A range overlapping only part of the token also keeps it text.
        let at = text.rfind(&ctl).unwrap();
        let one_byte = at + 1..at + 2;
        let partial = v.encode_with_plain(&text, false, std::slice::from_ref(&one_byte));
        assert_eq!(count(&partial), 1, "{file}");
        // No control text inside the ranges: the same tokens as encode.
        assert_eq!(v.encode_with_plain(&text, false, &[]), parsed, "{file}");
        let first = 0..1;
        assert_eq!(
            v.encode_with_plain(&text, false, std::slice::from_ref(&first)),
            parsed,
            "{file}"
        );
        assert_eq!(v.control_text_in("x y"), None);
        assert_eq!(v.control_text_in(&text), Some(ctl.as_str()));
        // Nothing is lost: the pieces spell the text (SentencePiece adds a
        // space after a control token, as llama.cpp does).
        let opts = DecodeOptions {
            unparse_special: true,
            keep_spaces: true,
            ..Default::default()
        };
        let spelled = String::from_utf8(v.decode_with(&guarded, opts)).unwrap();
        let unspaced = |s: &str| s.replace(' ', "");
        assert_eq!(unspaced(&spelled), unspaced(&text), "{file}");
    }
}
