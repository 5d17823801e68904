//! The `pack` stage: documents to token files for the trainer.
//!
//! Each split is one file of `u16` little-endian token ids, its documents
//! back to back, each as `<|bos|>` tokens `<|eos|>`:
//!
//! - `train.bin`: the training corpus with the task passages spread
//!   through it ([`documents::training`]);
//! - `val.bin`: the held-out end of each corpus file, one document each;
//! - `val.STEM.bin`, one per corpus file (`val.tinyshakespeare.bin`): that
//!   file's document of `val.bin` alone, so validation can be scored per
//!   source (`val.bin` is these files back to back, in corpus order);
//! - `eval.bin`: the held-out-name passages, one document each.
//!
//! `pack.json` says how to read them (dtype, vocabulary size, special ids)
//! and where they came from: the sha256 of each token file, of the texts
//! and tokenizer that made it, and of the original corpus files; its
//! `sources` list has each per-source file's text bytes and tokens.
//! Tokenizing uses our runtime tokenizer (`tokenizer.gguf`), so the model
//! trains on exactly the ids it will see when it runs.
//!
//! With an imported vocabulary (`bpe --from-model`) the documents are
//! wrapped in that tokenizer's own BOS and EOS. `--distilled FILE` adds a
//! teacher's generations ([`distill`]): their training part (repeated
//! `--distilled-repeat` times) after the corpus in `train.bin`, their
//! held-out part as `val.distilled.bin`, first in `val.bin` (so
//! `train --eval-windows N` scores the teacher's text).

use crate::distill::{self, Distilled};
use crate::documents;
use crate::error::{Error, Result};
use crate::files;
use crate::paths;
use crate::vocab::{load_runtime, BOS_ID, EOS_ID, PAD_ID};
use serde_json::json;
use std::path::Path;
use std::path::PathBuf;

/// One packed split.
#[derive(Clone, Debug)]
pub struct SplitReport {
    pub name: String,
    pub file: String,
    pub documents: usize,
    pub tokens: usize,
    pub text_bytes: usize,
}

#[derive(Clone, Debug)]
pub struct PackReport {
    pub vocab_size: usize,
    /// train, val, eval.
    pub splits: Vec<SplitReport>,
    /// One per corpus file: its part of `val.bin` (named `val.STEM`).
    pub sources: Vec<SplitReport>,
}

/// A split to pack: its documents and the text files they came from.
struct Split<'a> {
    name: &'static str,
    file: &'static str,
    docs: Vec<String>,
    sources: Vec<(&'static str, &'a str)>,
}

/// What `pack` adds to the corpus.
#[derive(Clone, Debug, Default)]
pub struct PackOptions {
    /// A teacher's generations ([`distill`]).
    pub distilled: Option<PathBuf>,
    /// How many times their training part goes into `train.bin` (≥ 1).
    pub distilled_repeat: usize,
}

/// The ids documents are wrapped in: the tokenizer's BOS and EOS (ours are
/// 1 and 2; an imported one's may differ); one stands in for the other
/// when the tokenizer has only one.
fn frame_ids(vocab: &tokenize::Vocab) -> (u16, u16) {
    match (vocab.bos(), vocab.eos()) {
        (Some(b), Some(e)) => (b as u16, e as u16),
        (Some(x), None) | (None, Some(x)) => (x as u16, x as u16),
        (None, None) => (BOS_ID as u16, EOS_ID as u16),
    }
}

/// Tokenize documents as `BOS tokens EOS` each, in order, on all cores.
pub fn encode_documents(
    vocab: &tokenize::Vocab,
    docs: &[String],
    bar: &indicatif::ProgressBar,
) -> Vec<u16> {
    encode_each(vocab, docs, bar).concat()
}

/// Each document as `BOS tokens EOS`, in order, on all cores.
fn encode_each(
    vocab: &tokenize::Vocab,
    docs: &[String],
    bar: &indicatif::ProgressBar,
) -> Vec<Vec<u16>> {
    let (bos, eos) = frame_ids(vocab);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = docs.len().div_ceil(threads).max(1);
    let parts: Vec<Vec<Vec<u16>>> = std::thread::scope(|s| {
        let handles: Vec<_> = docs
            .chunks(per)
            .map(|chunk| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    for doc in chunk {
                        let mut tokens = vec![bos];
                        // Ids fit: `bpe` caps the vocabulary at 2^16.
                        tokens.extend(vocab.encode(doc, false, false).iter().map(|&id| id as u16));
                        tokens.push(eos);
                        bar.inc(doc.len() as u64);
                        out.push(tokens);
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

/// A corpus file's held-out part, as `data` recorded it.
struct ValSource<'a> {
    stem: String,
    corpus: serde_json::Value,
    text: &'a str,
}

/// Each corpus file's part of `corpus.val.txt`, from the ranges in
/// `data.json`.
fn val_sources<'a>(
    dir: &Path,
    manifest: &serde_json::Value,
    corpus_val: &'a str,
) -> Result<Vec<ValSource<'a>>> {
    let manifest_path = dir.join(paths::DATA_MANIFEST);
    let invalid = |problem: String| Error::Invalid {
        path: manifest_path.clone(),
        problem,
    };
    let sources = manifest["sources"]
        .as_array()
        .ok_or_else(|| invalid("has no sources list".into()))?;
    let mut out = Vec::new();
    for source in sources {
        let (Some(stem), Some(start), Some(len)) = (
            source["stem"].as_str(),
            source["val_start"].as_u64(),
            source["val_bytes"].as_u64(),
        ) else {
            return Err(invalid(
                "has no per-file validation ranges (an older `cachefit-train data` wrote it): \
                 run `cachefit-train data` again"
                    .into(),
            ));
        };
        let (start, end) = (start as usize, (start + len) as usize);
        let text = corpus_val.get(start..end).ok_or_else(|| Error::Invalid {
            path: dir.join(paths::CORPUS_VAL),
            problem: format!(
                "bytes {start}..{end} (the validation text of `{stem}` in data.json) are not \
                 in it: run `cachefit-train data` again"
            ),
        })?;
        out.push(ValSource {
            stem: stem.to_string(),
            corpus: source["path"].clone(),
            text,
        });
    }
    let held_out: usize = out.iter().map(|s| s.text.len()).sum();
    let joins = out
        .iter()
        .filter(|s| !s.text.is_empty())
        .count()
        .saturating_sub(1);
    if held_out + joins != corpus_val.len() {
        return Err(Error::Invalid {
            path: dir.join(paths::CORPUS_VAL),
            problem: format!(
                "holds {} bytes, data.json's per-file ranges cover {}: run `cachefit-train data` again",
                corpus_val.len(),
                held_out + joins
            ),
        });
    }
    Ok(out)
}

pub fn to_le_bytes(tokens: &[u16]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}

/// Run the stage on the `data` and `bpe` stages' output in `dir`.
pub fn run(dir: &Path, progress: bool) -> Result<PackReport> {
    run_with(dir, &PackOptions::default(), progress)
}

/// [`run`], with distilled text added as `options` says.
pub fn run_with(dir: &Path, options: &PackOptions, progress: bool) -> Result<PackReport> {
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
    let val_sources = val_sources(dir, &data_manifest, &corpus_val)?;
    let distilled = match &options.distilled {
        Some(path) => {
            if val_sources.iter().any(|s| s.stem == distill::STEM) {
                return Err(Error::Config(format!(
                    "a corpus file is named `{}`, as the distilled text's validation file is: \
                     rename it",
                    distill::STEM
                )));
            }
            if options.distilled_repeat == 0 {
                return Err(Error::Config(
                    "--distilled-repeat must be at least 1".into(),
                ));
            }
            Some(distill::load(path, &vocab)?)
        }
        None => None,
    };
    let tails: Vec<&str> = val_sources.iter().map(|s| s.text).collect();
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
            docs: documents::validation(&tails),
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
    let mut source_reports = Vec::new();
    let mut sources_json = Vec::new();
    for Split {
        name,
        file,
        docs,
        sources,
    } in &splits
    {
        let per_doc = encode_each(&vocab, docs, &bar);
        let mut extra = (Vec::new(), 0, 0); // distilled tokens, documents, text bytes
        if let (Some(d), "val") = (&distilled, *name) {
            let report = write_distilled_val(dir, d, &mut sources_json)?;
            extra = (d.val.concat(), d.val.len(), d.val_bytes);
            source_reports.push(report);
        }
        if let (Some(d), "train") = (&distilled, *name) {
            extra = (
                d.train.concat().repeat(options.distilled_repeat),
                d.train.len() * options.distilled_repeat,
                d.train_bytes * options.distilled_repeat,
            );
        }
        if *name == "val" {
            // The validation documents are the non-empty tails, in order.
            let mut docs_tokens = docs.iter().zip(&per_doc);
            for source in &val_sources {
                let (text, tokens) = if source.text.is_empty() {
                    ("", &[][..])
                } else {
                    let (doc, tokens) = docs_tokens.next().expect("one document per tail");
                    (doc.as_str(), &tokens[..])
                };
                let file = format!("val.{}.bin", source.stem);
                let bytes = to_le_bytes(tokens);
                files::write(&dir.join(&file), &bytes)?;
                let report = SplitReport {
                    name: format!("val.{}", source.stem),
                    file,
                    documents: usize::from(!text.is_empty()),
                    tokens: tokens.len(),
                    text_bytes: text.len(),
                };
                sources_json.push(json!({
                    "name": source.stem,
                    "corpus": source.corpus,
                    "file": report.file,
                    "documents": report.documents,
                    "tokens": report.tokens,
                    "text_bytes": report.text_bytes,
                    "sha256": files::sha256_hex(&bytes),
                }));
                source_reports.push(report);
            }
        }
        // Distilled validation text first, distilled training text last.
        let tokens = match *name {
            "val" => [extra.0, per_doc.concat()].concat(),
            _ => [per_doc.concat(), extra.0].concat(),
        };
        let bytes = to_le_bytes(&tokens);
        files::write(&dir.join(file), &bytes)?;
        let mut from: Vec<serde_json::Value> = sources
            .iter()
            .map(|(f, text)| json!({ "file": f, "sha256": files::sha256_hex(text.as_bytes()) }))
            .collect();
        if let (Some(d), "train" | "val") = (&distilled, *name) {
            from.push(json!({ "file": d.path.display().to_string(), "sha256": d.sha256 }));
        }
        let text_bytes = docs.iter().map(String::len).sum::<usize>() + extra.2;
        let documents = docs.len() + extra.1;
        described.insert(
            name.to_string(),
            json!({
                "file": file,
                "documents": documents,
                "tokens": tokens.len(),
                "text_bytes": text_bytes,
                "sha256": files::sha256_hex(&bytes),
                "from": from,
            }),
        );
        reports.push(SplitReport {
            name: name.to_string(),
            file: file.to_string(),
            documents,
            tokens: tokens.len(),
            text_bytes,
        });
    }
    bar.finish_and_clear();

    let mut manifest = json!({
        "stage": "pack",
        "dtype": "u16le",
        "layout": "documents back to back, each <|bos|> tokens <|eos|>",
        "vocab_size": vocab.len(),
        "pad_id": vocab.special_tokens().pad.unwrap_or(PAD_ID),
        "bos_id": frame_ids(&vocab).0,
        "eos_id": frame_ids(&vocab).1,
        "tokenizer": { "file": paths::TOKENIZER_GGUF, "sha256": tokenizer_sha },
        "corpus_sources": data_manifest["sources"],
        "seed": data_manifest["seed"],
        "splits": described,
        "sources": sources_json,
    });
    if let Some(d) = &distilled {
        manifest["distilled"] = json!({
            "file": d.path.display().to_string(),
            "sha256": d.sha256,
            "repeat": options.distilled_repeat,
            "train_documents": d.train.len(),
            "train_tokens": d.train.iter().map(Vec::len).sum::<usize>(),
            "val_documents": d.val.len(),
            "generated_tokens": d.generated_tokens,
        });
    }
    files::write_json(&dir.join(paths::PACK_MANIFEST), &manifest)?;
    Ok(PackReport {
        vocab_size: vocab.len(),
        splits: reports,
        sources: source_reports,
    })
}

/// `val.distilled.bin`: the teacher's held-out generations.
fn write_distilled_val(
    dir: &Path,
    d: &Distilled,
    sources_json: &mut Vec<serde_json::Value>,
) -> Result<SplitReport> {
    let tokens = d.val.concat();
    let file = format!("val.{}.bin", distill::STEM);
    let bytes = to_le_bytes(&tokens);
    files::write(&dir.join(&file), &bytes)?;
    sources_json.push(json!({
        "name": distill::STEM,
        "corpus": d.path.display().to_string(),
        "file": file,
        "documents": d.val.len(),
        "tokens": tokens.len(),
        "text_bytes": d.val_bytes,
        "sha256": files::sha256_hex(&bytes),
    }));
    Ok(SplitReport {
        name: format!("val.{}", distill::STEM),
        file,
        documents: d.val.len(),
        tokens: tokens.len(),
        text_bytes: d.val_bytes,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{self, DataConfig};

    fn paragraphs(prefix: &str, n: usize) -> String {
        (0..n)
            .map(|i| format!("{prefix} speaks line {i} of the tale.\n\n"))
            .collect()
    }

    fn tokens(path: &Path) -> Vec<u16> {
        std::fs::read(path)
            .unwrap()
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect()
    }

    #[test]
    fn each_corpus_file_gets_its_own_validation_tokens() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("north.txt"), tmp.path().join("south.txt"));
        std::fs::write(&a, paragraphs("North", 30)).unwrap();
        std::fs::write(&b, paragraphs("South", 60)).unwrap();
        let out = tmp.path().join("out");
        let config = DataConfig {
            corpus: vec![a, b],
            eval_passages: 5,
            ..DataConfig::default()
        };
        data::run(&config, &out, false).unwrap();
        crate::bpe::run(300, &out, false).unwrap();
        let report = run(&out, false).unwrap();

        let names: Vec<&str> = report.sources.iter().map(|s| s.file.as_str()).collect();
        assert_eq!(names, ["val.north.bin", "val.south.bin"]);
        let (north, south) = (tokens(&out.join(names[0])), tokens(&out.join(names[1])));
        // val.bin is the per-source files back to back.
        assert_eq!(
            tokens(&out.join(paths::VAL_BIN)),
            [north.clone(), south.clone()].concat()
        );
        assert_eq!(report.splits[1].documents, 2);

        // Each decodes to its own file's tail, and pack.json agrees.
        let vocab = load_runtime(&out.join(paths::TOKENIZER_GGUF)).unwrap();
        let manifest = files::read_json(&out.join(paths::PACK_MANIFEST)).unwrap();
        for (i, (toks, who)) in [(&north, "North"), (&south, "South")]
            .into_iter()
            .enumerate()
        {
            assert_eq!(
                (toks[0], *toks.last().unwrap()),
                (BOS_ID as u16, EOS_ID as u16)
            );
            let ids: Vec<u32> = toks[1..toks.len() - 1].iter().map(|&t| t as u32).collect();
            let opts = tokenize::DecodeOptions {
                keep_spaces: true,
                ..Default::default()
            };
            let text = String::from_utf8(vocab.decode_with(&ids, opts)).unwrap();
            assert!(
                text.starts_with(who) && !text.contains(if i == 0 { "South" } else { "North" })
            );
            assert!(text.ends_with("of the tale.\n"));
            let entry = &manifest["sources"][i];
            assert_eq!(entry["text_bytes"], text.len());
            assert_eq!(entry["tokens"], toks.len());
            assert_eq!(report.sources[i].text_bytes, text.len());
        }
        let val_bytes = manifest["splits"]["val"]["text_bytes"].as_u64().unwrap();
        assert_eq!(
            val_bytes as usize,
            report.sources.iter().map(|s| s.text_bytes).sum::<usize>()
        );
    }

    #[test]
    fn a_data_manifest_without_ranges_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let corpus = tmp.path().join("c.txt");
        std::fs::write(&corpus, paragraphs("West", 30)).unwrap();
        let out = tmp.path().join("out");
        let config = DataConfig {
            corpus: vec![corpus],
            eval_passages: 2,
            ..DataConfig::default()
        };
        data::run(&config, &out, false).unwrap();
        crate::bpe::run(300, &out, false).unwrap();
        let path = out.join(paths::DATA_MANIFEST);
        let mut manifest = files::read_json(&path).unwrap();
        manifest["sources"][0]
            .as_object_mut()
            .unwrap()
            .remove("val_start");
        files::write_json(&path, &manifest).unwrap();
        let err = run(&out, false).unwrap_err().to_string();
        assert!(err.contains("run `cachefit-train data` again"), "{err}");
    }
}
