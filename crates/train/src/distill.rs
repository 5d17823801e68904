//! Distilled text for `pack --distilled FILE`: what a teacher model said,
//! as the exact token ids it generated, to train a draft model on.
//!
//! The file is JSON lines, one generation each:
//!
//! ```json
//! {"prompt": "<|im_start|>user\nSummarise …<|im_end|>\n<|im_start|>assistant\n",
//!  "ids": [504, 3437, …], "stop": "eog"}
//! ```
//!
//! `prompt` is the text `cachefit run -p` (or the server's
//! `/v1/completions`) was given, tokenized here as `run` tokenizes a
//! prompt (the vocabulary's BOS rule, control tokens written as text
//! parsed), so a document is the sequence the teacher read and wrote:
//! prompt tokens, then `ids` (from `run --json --logprobs 0`: the
//! teacher's own ids) or, instead, `"text"`, what it wrote, tokenized here
//! (the server returns text; a re-tokenization is the teacher's ids except
//! where it chose a non-canonical split), then EOS when it stopped at an
//! end-of-generation token (`"stop": "eog"`). No BOS/EOS is
//! added around it otherwise: the prompt's chat markers are its framing.
//! Every `val_every`-th generation is held out for validation.

use crate::error::{Error, Result};
use crate::files;
use std::path::{Path, PathBuf};

/// Every this many generations, one goes to validation.
pub const VAL_EVERY: usize = 10;
/// The name of the distilled text's validation file: `val.distilled.bin`.
pub const STEM: &str = "distilled";

/// The distilled documents, tokenized.
#[derive(Clone, Debug)]
pub struct Distilled {
    pub path: PathBuf,
    pub sha256: String,
    pub train: Vec<Vec<u16>>,
    pub val: Vec<Vec<u16>>,
    /// Bytes of text the training and validation documents hold (prompt
    /// text and the decoded generations).
    pub train_bytes: usize,
    pub val_bytes: usize,
    /// Generated tokens (teacher output, without prompts) in all documents.
    pub generated_tokens: usize,
}

/// Read and tokenize `path` with `vocab`.
pub fn load(path: &Path, vocab: &tokenize::Vocab) -> Result<Distilled> {
    let text = files::read_text(path)?;
    let bad = |line: usize, problem: String| Error::Invalid {
        path: path.to_path_buf(),
        problem: format!("line {line}: {problem}"),
    };
    let eos = vocab.eos();
    let mut out = Distilled {
        path: path.to_path_buf(),
        sha256: files::sha256_hex(text.as_bytes()),
        train: Vec::new(),
        val: Vec::new(),
        train_bytes: 0,
        val_bytes: 0,
        generated_tokens: 0,
    };
    let mut n = 0;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(line_no, format!("not JSON: {e}")))?;
        let prompt = v["prompt"]
            .as_str()
            .ok_or_else(|| bad(line_no, "no \"prompt\" string".into()))?;
        let ids: Vec<serde_json::Value> = match (v["ids"].as_array(), v["text"].as_str()) {
            (Some(ids), _) => ids.clone(),
            // Control tokens the teacher wrote come back as their text.
            (None, Some(text)) => vocab
                .encode(text, false, true)
                .into_iter()
                .map(serde_json::Value::from)
                .collect(),
            (None, None) => return Err(bad(line_no, "no \"ids\" array or \"text\" string".into())),
        };
        let mut doc: Vec<u16> = Vec::with_capacity(ids.len() + prompt.len() / 3);
        let mut generated = Vec::with_capacity(ids.len());
        // As `run` reads a prompt (engine::prompt::completion_tokens).
        for id in vocab.encode(prompt, true, true) {
            doc.push(id as u16);
        }
        for id in &ids {
            let id = id
                .as_u64()
                .filter(|&id| (id as usize) < vocab.len())
                .ok_or_else(|| {
                    bad(
                        line_no,
                        format!(
                            "id {id} is not a token of the vocabulary ({} tokens): was it made \
                             by another model?",
                            vocab.len()
                        ),
                    )
                })?;
            generated.push(id as u32);
            doc.push(id as u16);
        }
        if v["stop"] == "eog" {
            if let Some(eos) = eos {
                doc.push(eos as u16);
            }
        }
        let bytes = prompt.len()
            + vocab
                .decode_with(
                    &generated,
                    tokenize::DecodeOptions {
                        keep_spaces: true,
                        ..Default::default()
                    },
                )
                .len();
        out.generated_tokens += generated.len();
        n += 1;
        if n % VAL_EVERY == 0 {
            out.val_bytes += bytes;
            out.val.push(doc);
        } else {
            out.train_bytes += bytes;
            out.train.push(doc);
        }
    }
    if out.train.is_empty() {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            problem: "holds no generations (one JSON object per line)".into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> tokenize::Vocab {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.gguf");
        let json = r#"{
            "added_tokens": [
                {"id": 0, "content": "<|pad|>", "special": true},
                {"id": 1, "content": "<|bos|>", "special": true},
                {"id": 2, "content": "<|eos|>", "special": true}
            ],
            "model": {"type": "BPE",
                "vocab": {"<|pad|>": 0, "<|bos|>": 1, "<|eos|>": 2, "a": 3, "b": 4, "Ġ": 5, "ab": 6, "Ġab": 7},
                "merges": [["a", "b"], "Ġ ab"]}
        }"#;
        crate::Vocabulary::from_tokenizer_json(json)
            .unwrap()
            .write_gguf(&path)
            .unwrap();
        crate::vocab::load_runtime(&path).unwrap()
    }

    #[test]
    fn documents_are_prompt_tokens_then_the_teachers_ids() {
        let v = vocab();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        let mut lines = String::new();
        for i in 0..20 {
            let stop = if i % 2 == 0 { "eog" } else { "length" };
            lines.push_str(&format!(
                "{{\"prompt\": \"<|bos|>ab\", \"ids\": [7, 3], \"stop\": \"{stop}\"}}\n"
            ));
        }
        std::fs::write(&path, lines).unwrap();
        let d = load(&path, &v).unwrap();
        assert_eq!((d.train.len(), d.val.len()), (18, 2));
        // BOS from the vocabulary's rule, the control token parsed from
        // the prompt text, the ids as given, EOS when it stopped there.
        assert_eq!(d.train[0], [1, 1, 6, 7, 3, 2]);
        assert_eq!(d.train[1], [1, 1, 6, 7, 3]);
        assert_eq!(d.generated_tokens, 40);
        assert_eq!(d.train_bytes, 18 * ("<|bos|>ab".len() + " aba".len()));

        // Text instead of ids: tokenized, a control token's text parsed.
        std::fs::write(&path, "{\"prompt\": \"a\", \"text\": \" ab<|eos|>\"}\n").unwrap();
        assert_eq!(load(&path, &v).unwrap().train, [vec![1, 3, 7, 2]]);
    }

    #[test]
    fn foreign_ids_and_bad_lines_are_errors() {
        let v = vocab();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        std::fs::write(&path, "{\"prompt\": \"a\", \"ids\": [3, 49151]}\n").unwrap();
        let e = load(&path, &v).unwrap_err().to_string();
        assert!(e.contains("line 1: id 49151 is not a token"), "{e}");
        std::fs::write(&path, "{\"prompt\": \"a\"}\n").unwrap();
        let e = load(&path, &v).unwrap_err().to_string();
        assert!(e.contains("no \"ids\" array or \"text\" string"), "{e}");
        std::fs::write(&path, "\n").unwrap();
        assert!(load(&path, &v).is_err());
    }
}
