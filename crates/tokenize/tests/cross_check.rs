//! Token ids from llama.cpp itself (`llama-tokenize`), recorded by
//! `tests/fixtures/make_llamacpp_fixtures.py` for the inputs in
//! `tests/fixtures/llamacpp.inp`: llama.cpp's 46 test inputs, ~35 more
//! (chat markup, scripts, emoji, code, odd characters) and 3 kB of
//! Shakespeare.

mod common;

use common::{
    compare, fixture_path, load, metadata, read_inputs, read_outputs, round_trip, vocab_path,
};
use tokenize::Vocab;

fn inputs() -> Vec<String> {
    read_inputs(&fixture_path("llamacpp.inp"))
}

/// Compare `vocab` with `<name>.out`, encoding as `llama-tokenize` did.
fn check(name: &str, vocab: &Vocab, add_special: bool, parse_special: bool) {
    let expected = read_outputs(&fixture_path(&format!("{name}.out")));
    compare(
        name,
        vocab,
        &inputs(),
        &expected,
        add_special,
        parse_special,
    )
    .unwrap();
}

/// SmolLM2-135M-Instruct's own tokenizer (`gpt2` + `smollm`).
#[test]
fn smollm2() {
    let Some(vocab) = common::smollm2() else {
        return;
    };
    check("smollm2", &vocab, false, false);
    check("smollm2-special", &vocab, false, true);
    for input in inputs() {
        assert_eq!(round_trip(&vocab, &input), input);
    }
}

/// Each pre-tokenizer, pinned by running the GPT-2 vocabulary relabelled
/// with its `tokenizer.ggml.pre` name through llama.cpp.
#[test]
fn pre_tokenizers_on_the_gpt2_vocab() {
    let md = metadata(&vocab_path("ggml-vocab-gpt-2.gguf"));
    for pre in ["default", "qwen2", "deepseek-coder", "llama3", "smollm"] {
        let mut md = md.clone();
        md.set("tokenizer.ggml.pre", gguf::Value::String(pre.to_string()));
        let vocab = Vocab::from_gguf(&md).unwrap();
        check(&format!("gpt2-as-{pre}"), &vocab, false, false);
    }
}

/// Special tokens written in the text, with BOS: SPM's space after a
/// special token, Phi-3's whitespace stripping, Llama 3's header tokens.
#[test]
fn special_tokens_with_bos() {
    for (name, file) in [
        ("llama-spm-special-bos", "ggml-vocab-llama-spm.gguf"),
        ("phi-3-special-bos", "ggml-vocab-phi-3.gguf"),
        ("llama-bpe-special-bos", "ggml-vocab-llama-bpe.gguf"),
    ] {
        let vocab = load(&vocab_path(file));
        check(name, &vocab, true, true);
    }
}
