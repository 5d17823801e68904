//! `bpe --from-model FILE`: the `bpe` stage's output made from an existing
//! model's tokenizer instead of a trained BPE, so the pipeline trains a
//! network on that model's token ids (a draft model for speculative
//! decoding needs its target's vocabulary).
//!
//! Every `tokenizer.*` key of the model's GGUF (tokens, types, merges,
//! special ids, `add_bos_token`, pre-tokenizer name, chat template) is
//! copied into `tokenizer.gguf`, a vocab-only GGUF (no tensors); `pack`
//! tokenizes with it as it does with a trained one. `vocab.json` records
//! where it came from and the sha256 of the `tokenizer.gguf` it wrote;
//! `export` copies the same keys into the model while that record matches
//! `tokenizer.gguf` (a later `bpe` run that trains a BPE replaces the file,
//! and the record no longer matches). There is no `tokenizer.json`: the
//! `tokenizers` crate is not needed to read the vocabulary back.

use crate::error::{Error, Result};
use crate::files;
use crate::paths;
use crate::vocab::load_runtime;
use gguf::Value;
use serde_json::json;
use std::path::{Path, PathBuf};

/// Every key a tokenizer owns in GGUF (`tokenizer.ggml.*`,
/// `tokenizer.chat_template`, `tokenizer.huggingface.json` …).
const TOKENIZER_PREFIX: &str = "tokenizer.";

#[derive(Clone, Debug)]
pub struct ImportReport {
    pub source: PathBuf,
    pub vocab_size: usize,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub keys: usize,
    pub has_chat_template: bool,
    /// Tokens of held-out text that decoded back to their text exactly (0
    /// when the `data` stage has not run in the folder).
    pub checked_tokens: usize,
}

/// The `tokenizer.*` keys of the GGUF file at `path`, in file order.
pub fn tokenizer_metadata(path: &Path) -> Result<Vec<(String, Value)>> {
    let file = gguf::GgufFile::open(path)?;
    let keys: Vec<(String, Value)> = file
        .metadata()
        .entries()
        .iter()
        .filter(|(k, _)| k.starts_with(TOKENIZER_PREFIX))
        .cloned()
        .collect();
    if !keys.iter().any(|(k, _)| k == "tokenizer.ggml.tokens") {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            problem: "has no tokenizer (no tokenizer.ggml.tokens key)".into(),
        });
    }
    Ok(keys)
}

/// The tokenizer keys `export` should write, when `dir`'s `tokenizer.gguf`
/// was imported (its sha256 is the one `vocab.json` recorded); `None` when
/// it was trained by `bpe` (or there is no record).
pub fn imported_tokenizer(dir: &Path) -> Result<Option<Vec<(String, Value)>>> {
    let record_path = dir.join(paths::VOCAB_IMPORT);
    let tokenizer_path = dir.join(paths::TOKENIZER_GGUF);
    if !record_path.exists() || !tokenizer_path.exists() {
        return Ok(None);
    }
    let record = files::read_json(&record_path)?;
    let sha = files::sha256_hex(&files::read_bytes(&tokenizer_path)?);
    if record["tokenizer"]["sha256"].as_str() != Some(sha.as_str()) {
        return Ok(None);
    }
    tokenizer_metadata(&tokenizer_path).map(Some)
}

/// Run the stage: write `dir/tokenizer.gguf` and `dir/vocab.json` from the
/// tokenizer of `model`.
pub fn run(model: &Path, dir: &Path) -> Result<ImportReport> {
    let keys = tokenizer_metadata(model)?;
    let mut md = gguf::Metadata::new();
    for (k, v) in &keys {
        md.set(k.clone(), v.clone());
    }
    // Loaded as the runtime will load it: a tokenizer our runtime cannot
    // read (an unknown pre-tokenizer, say) is refused here, not at `pack`.
    let source_vocab = tokenize::Vocab::from_gguf(&md).map_err(|err| Error::Vocab {
        path: model.to_path_buf(),
        err,
    })?;
    if source_vocab.len() > crate::bpe::MAX_VOCAB {
        return Err(Error::Invalid {
            path: model.to_path_buf(),
            problem: format!(
                "its vocabulary has {} tokens; the pipeline stores ids as u16 (at most {})",
                source_vocab.len(),
                crate::bpe::MAX_VOCAB
            ),
        });
    }
    if source_vocab.bos().is_none() && source_vocab.eos().is_none() {
        return Err(Error::Invalid {
            path: model.to_path_buf(),
            problem: "its tokenizer names neither a BOS nor an EOS token, which `pack` puts \
                      around documents"
                .into(),
        });
    }
    files::create_dir(dir)?;
    let gguf_path = dir.join(paths::TOKENIZER_GGUF);
    let mut bytes = Vec::new();
    gguf::Builder::new(md)
        .write_header(&mut bytes)
        .and_then(|w| w.finish())
        .map_err(|kind| gguf::Error::new(&gguf_path, kind))?;
    files::write(&gguf_path, &bytes)?;

    // What `pack` will read must be the model's vocabulary, token by token.
    let written = load_runtime(&gguf_path)?;
    for id in 0..source_vocab.len() as u32 {
        if written.token_text(id) != source_vocab.token_text(id)
            || written.token_attr(id) != source_vocab.token_attr(id)
        {
            return Err(Error::Mismatch {
                what: gguf_path.display().to_string(),
                detail: format!("token {id} differs from the model's after writing"),
            });
        }
    }
    let checked_tokens = check_round_trip(dir, &written)?;

    let has_chat_template = keys.iter().any(|(k, _)| k == "tokenizer.chat_template");
    let record = json!({
        "stage": "bpe",
        "imported_from": {
            "path": model.display().to_string(),
            "sha256": files::sha256_hex(&files::read_bytes(model)?),
            "general.name": gguf::GgufFile::open(model)?
                .metadata()
                .get_str("general.name")
                .ok(),
        },
        "tokenizer": { "file": paths::TOKENIZER_GGUF, "sha256": files::sha256_hex(&bytes) },
        "vocab_size": written.len(),
        "model": format!("{:?}", written.model()),
        "pre_tokenizer": written.pre_tokenizer_name(),
        "bos_id": written.bos(),
        "eos_id": written.eos(),
        "add_bos_token": written.add_bos(),
        "chat_template": has_chat_template,
        "keys": keys.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        "checked_tokens": checked_tokens,
    });
    files::write_json(&dir.join(paths::VOCAB_IMPORT), &record)?;
    Ok(ImportReport {
        source: model.to_path_buf(),
        vocab_size: written.len(),
        bos: written.bos(),
        eos: written.eos(),
        keys: keys.len(),
        has_chat_template,
        checked_tokens,
    })
}

/// Encode the `data` stage's held-out texts (when present) and decode them
/// back: the vocabulary must be able to represent the corpus exactly, or
/// the network would train on text that is not the corpus.
fn check_round_trip(dir: &Path, vocab: &tokenize::Vocab) -> Result<usize> {
    let mut total = 0;
    for name in [paths::CORPUS_VAL, paths::TASKS_EVAL] {
        let path = dir.join(name);
        if !path.exists() {
            continue;
        }
        let text = files::read_text(&path)?;
        let ids = vocab.encode(&text, false, false);
        let back = vocab.decode_with(
            &ids,
            tokenize::DecodeOptions {
                keep_spaces: true,
                ..Default::default()
            },
        );
        if back != text.as_bytes() {
            let at = back
                .iter()
                .zip(text.as_bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(back.len().min(text.len()));
            return Err(Error::Mismatch {
                what: name.to_string(),
                detail: format!(
                    "the imported tokenizer does not give the text back (first difference at \
                     byte {at})"
                ),
            });
        }
        total += ids.len();
    }
    Ok(total)
}
