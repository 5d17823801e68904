//! The `pack` stage: documents to token files for the trainer.
//!
//! Each split is one file of `u16` little-endian token ids, its documents
//! back to back, each as `<|bos|>` tokens `<|eos|>`:
//!
//! - `train.bin`: the training corpus with the task passages spread
//!   through it ([`documents::training`]);
//! - `val.bin`: the held-out end of the corpus, one document;
//! - `eval.bin`: the held-out-name passages, one document each.
//!
//! `pack.json` says how to read them (dtype, vocabulary size, special ids)
//! and where they came from: the sha256 of each token file, of the texts
//! and tokenizer that made it, and of the original corpus files.
//! Tokenizing uses our runtime tokenizer (`tokenizer.gguf`), so the model
//! trains on exactly the ids it will see when it runs.

use crate::documents;
use crate::error::{Error, Result};
use crate::files;
use crate::paths;
use crate::vocab::{load_runtime, BOS_ID, EOS_ID, PAD_ID};
use serde_json::json;
use std::path::Path;

/// One packed split.
#[derive(Clone, Debug)]
pub struct SplitReport {
    pub name: &'static str,
    pub file: &'static str,
    pub documents: usize,
    pub tokens: usize,
    pub text_bytes: usize,
}

#[derive(Clone, Debug)]
pub struct PackReport {
    pub vocab_size: usize,
    pub splits: Vec<SplitReport>,
}

/// A split to pack: its documents and the text files they came from.
struct Split<'a> {
    name: &'static str,
    file: &'static str,
    docs: Vec<String>,
    sources: Vec<(&'static str, &'a str)>,
}

/// Tokenize documents as `BOS tokens EOS` each, in order, on all cores.
pub fn encode_documents(
    vocab: &tokenize::Vocab,
    docs: &[String],
    bar: &indicatif::ProgressBar,
) -> Vec<u16> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = docs.len().div_ceil(threads).max(1);
    let parts: Vec<Vec<u16>> = std::thread::scope(|s| {
        let handles: Vec<_> = docs
            .chunks(per)
            .map(|chunk| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    for doc in chunk {
                        out.push(BOS_ID as u16);
                        // Ids fit: `bpe` caps the vocabulary at 2^16.
                        out.extend(vocab.encode(doc, false, false).iter().map(|&id| id as u16));
                        out.push(EOS_ID as u16);
                        bar.inc(doc.len() as u64);
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("tokenizing does not panic"))
            .collect()
    });
    parts.concat()
}

pub fn to_le_bytes(tokens: &[u16]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}

/// Run the stage on the `data` and `bpe` stages' output in `dir`.
pub fn run(dir: &Path, progress: bool) -> Result<PackReport> {
    let tokenizer_path = files::stage_input(dir, paths::TOKENIZER_GGUF, "bpe")?;
    let vocab = load_runtime(&tokenizer_path)?;
    if vocab.len() > crate::bpe::MAX_VOCAB {
        return Err(Error::Invalid {
            path: tokenizer_path,
            problem: format!("{} tokens do not fit u16 ids", vocab.len()),
        });
    }
    let tokenizer_sha = files::sha256_hex(&files::read_bytes(&tokenizer_path)?);
    let data_manifest = files::read_json(&files::stage_input(dir, paths::DATA_MANIFEST, "data")?)?;

    let read = |name: &str| files::read_stage_text(dir, name, "data");
    let (corpus_train, tasks_train) = (read(paths::CORPUS_TRAIN)?, read(paths::TASKS_TRAIN)?);
    let (corpus_val, tasks_eval) = (read(paths::CORPUS_VAL)?, read(paths::TASKS_EVAL)?);
    let splits = [
        Split {
            name: "train",
            file: paths::TRAIN_BIN,
            docs: documents::training(&corpus_train, &tasks_train),
            sources: vec![
                (paths::CORPUS_TRAIN, &corpus_train),
                (paths::TASKS_TRAIN, &tasks_train),
            ],
        },
        Split {
            name: "val",
            file: paths::VAL_BIN,
            docs: documents::validation(&corpus_val),
            sources: vec![(paths::CORPUS_VAL, &corpus_val)],
        },
        Split {
            name: "eval",
            file: paths::EVAL_BIN,
            docs: documents::evaluation(&tasks_eval),
            sources: vec![(paths::TASKS_EVAL, &tasks_eval)],
        },
    ];

    let total_bytes: usize = splits
        .iter()
        .flat_map(|s| s.docs.iter().map(String::len))
        .sum();
    let bar = crate::progress_bar(progress, total_bytes as u64, "tokenizing");
    let mut reports = Vec::new();
    let mut described = serde_json::Map::new();
    for Split {
        name,
        file,
        docs,
        sources,
    } in &splits
    {
        let tokens = encode_documents(&vocab, docs, &bar);
        let bytes = to_le_bytes(&tokens);
        files::write(&dir.join(file), &bytes)?;
        let from: Vec<serde_json::Value> = sources
            .iter()
            .map(|(f, text)| json!({ "file": f, "sha256": files::sha256_hex(text.as_bytes()) }))
            .collect();
        described.insert(
            name.to_string(),
            json!({
                "file": file,
                "documents": docs.len(),
                "tokens": tokens.len(),
                "sha256": files::sha256_hex(&bytes),
                "from": from,
            }),
        );
        reports.push(SplitReport {
            name,
            file,
            documents: docs.len(),
            tokens: tokens.len(),
            text_bytes: docs.iter().map(String::len).sum(),
        });
    }
    bar.finish_and_clear();

    let manifest = json!({
        "stage": "pack",
        "dtype": "u16le",
        "layout": "documents back to back, each <|bos|> tokens <|eos|>",
        "vocab_size": vocab.len(),
        "pad_id": PAD_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "tokenizer": { "file": paths::TOKENIZER_GGUF, "sha256": tokenizer_sha },
        "corpus_sources": data_manifest["sources"],
        "seed": data_manifest["seed"],
        "splits": described,
    });
    files::write_json(&dir.join(paths::PACK_MANIFEST), &manifest)?;
    Ok(PackReport {
        vocab_size: vocab.len(),
        splits: reports,
    })
}

/// The vocabulary size `pack` recorded in `pack.json`.
pub fn vocab_size(dir: &Path) -> Result<usize> {
    let path = files::stage_input(dir, paths::PACK_MANIFEST, "pack")?;
    let v = files::read_json(&path)?;
    v["vocab_size"]
        .as_u64()
        .map(|n| n as usize)
        .ok_or_else(|| Error::Invalid {
            path,
            problem: "has no vocab_size".into(),
        })
}
