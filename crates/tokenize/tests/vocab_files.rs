//! llama.cpp's own tokenizer test vectors (`testdata/vocab/*.gguf` with
//! `.inp` / `.out`), read the way `tests/test-tokenizer-0.cpp` reads them.

mod common;

use common::{check_vectors, vocab_path};

#[test]
fn gpt_2() {
    check_vectors(&vocab_path("ggml-vocab-gpt-2.gguf")).unwrap();
}

#[test]
fn llama_bpe() {
    check_vectors(&vocab_path("ggml-vocab-llama-bpe.gguf")).unwrap();
}

#[test]
fn llama_spm() {
    check_vectors(&vocab_path("ggml-vocab-llama-spm.gguf")).unwrap();
}

#[test]
fn phi_3() {
    check_vectors(&vocab_path("ggml-vocab-phi-3.gguf")).unwrap();
}

/// More of llama.cpp's vocab files, when `CACHEFIT_LLAMA_VOCABS` names its
/// `models/` folder: every one whose tokenizer we support must pass; the
/// others are listed.
#[test]
fn llama_cpp_models_folder() {
    let Some(dir) = std::env::var_os("CACHEFIT_LLAMA_VOCABS") else {
        eprintln!("CACHEFIT_LLAMA_VOCABS not set: skipping llama.cpp's other vocab files");
        return;
    };
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .filter(|p| p.with_extension("gguf.out").exists())
        .collect();
    files.sort();
    let mut failures = Vec::new();
    for path in files {
        match check_vectors(&path) {
            Ok(_) => {}
            Err(e) if e.contains("unknown") => eprintln!("unsupported: {e}"),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
