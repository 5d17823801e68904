//! A trained byte-level BPE as GGUF metadata, written the way GPT-2's
//! vocabulary is, so our `tokenize` crate (and llama.cpp) load it as any
//! other `gpt2` vocabulary.
//!
//! | key | value |
//! | --- | --- |
//! | `tokenizer.ggml.model` | `gpt2` |
//! | `tokenizer.ggml.pre` | `gpt-2`: GPT-2's split regex, which is what the `tokenizers` ByteLevel pre-tokenizer runs |
//! | `tokenizer.ggml.tokens` | token texts in GPT-2's byte-to-character map (`Ġ` for a space) |
//! | `tokenizer.ggml.token_type` | 3 (control) for `<\|pad\|>`, `<\|bos\|>`, `<\|eos\|>`, else 1 (normal) |
//! | `tokenizer.ggml.merges` | `"left right"` by rank |
//! | `tokenizer.ggml.{padding,bos,eos}_token_id` | 0, 1, 2 |
//! | `tokenizer.ggml.add_bos_token` | true: every training document starts with BOS, so prompts do too |
//! | `tokenizer.ggml.add_eos_token` | false |
//!
//! The input is the `tokenizer.json` the `bpe` stage saves, so the export
//! stage needs only that file, not the `tokenizers` crate.

use crate::error::{Error, Result};
use gguf::{Value, ValueType};
use serde_json::Value as Json;
use std::path::Path;

/// The special tokens, in id order: PAD = 0, BOS = 1, EOS = 2.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|pad|>", "<|bos|>", "<|eos|>"];
pub const PAD_ID: u32 = 0;
pub const BOS_ID: u32 = 1;
pub const EOS_ID: u32 = 2;
/// `tokenizer.ggml.pre`: llama.cpp's name for GPT-2's split regex.
pub const PRE_TOKENIZER: &str = "gpt-2";

const TYPE_NORMAL: i32 = 1;
const TYPE_CONTROL: i32 = 3;

/// A byte-level BPE vocabulary: tokens by id, merges by rank.
#[derive(Clone, Debug, PartialEq)]
pub struct Vocabulary {
    /// Token texts, index = id, in GPT-2's byte-to-character map.
    pub tokens: Vec<String>,
    /// Whether each token is a special (control) token.
    pub special: Vec<bool>,
    /// `(left, right)` pairs, highest priority first.
    pub merges: Vec<(String, String)>,
}

impl Vocabulary {
    /// Read the vocabulary out of a `tokenizers` JSON file's text (a BPE
    /// model; merges as `"a b"` strings or `["a", "b"]` pairs, both of
    /// which `tokenizers` writes depending on its version).
    pub fn from_tokenizer_json(text: &str) -> std::result::Result<Vocabulary, String> {
        let root: Json = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
        let model = &root["model"];
        if model["type"] != "BPE" {
            return Err(format!("model type is {}, expected \"BPE\"", model["type"]));
        }
        let vocab = model["vocab"]
            .as_object()
            .ok_or("`model.vocab` is not an object")?;
        let mut tokens: Vec<Option<String>> = vec![None; vocab.len()];
        let mut special = vec![false; vocab.len()];
        let mut place =
            |text: &str, id: &Json, is_special: bool| -> std::result::Result<(), String> {
                let id = id
                    .as_u64()
                    .ok_or_else(|| format!("token {text:?}: id {id} is not a number"))?
                    as usize;
                if id >= tokens.len() {
                    tokens.resize(id + 1, None);
                    special.resize(id + 1, false);
                }
                match &tokens[id] {
                    Some(t) if t != text => {
                        return Err(format!("id {id} is both {t:?} and {text:?}"));
                    }
                    _ => tokens[id] = Some(text.to_string()),
                }
                special[id] |= is_special;
                Ok(())
            };
        for (text, id) in vocab {
            place(text, id, false)?;
        }
        // Special tokens are added tokens; `tokenizers` may also list them
        // in the model's vocab (the BPE trainer does).
        for added in root["added_tokens"].as_array().into_iter().flatten() {
            let text = added["content"]
                .as_str()
                .ok_or("an added token has no `content`")?;
            place(text, &added["id"], added["special"] == true)?;
        }
        let tokens = tokens
            .into_iter()
            .enumerate()
            .map(|(id, t)| t.ok_or_else(|| format!("no token has id {id}")))
            .collect::<std::result::Result<Vec<String>, String>>()?;

        let mut merges = Vec::new();
        for (rank, m) in model["merges"]
            .as_array()
            .ok_or("`model.merges` is not an array")?
            .iter()
            .enumerate()
        {
            let pair = match m {
                Json::String(s) => s
                    .split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string())),
                Json::Array(ab) if ab.len() == 2 => match (ab[0].as_str(), ab[1].as_str()) {
                    (Some(a), Some(b)) => Some((a.to_string(), b.to_string())),
                    _ => None,
                },
                _ => None,
            };
            let (a, b) = pair.ok_or_else(|| format!("merge {rank} is not a pair: {m}"))?;
            // GGUF writes a merge as "a b": a side holding a space could
            // not be read back (byte-level tokens never do).
            if a.contains(' ') || b.contains(' ') {
                return Err(format!("merge {rank} ({a:?}, {b:?}) contains a space"));
            }
            merges.push((a, b));
        }

        let v = Vocabulary {
            tokens,
            special,
            merges,
        };
        for (id, text) in SPECIAL_TOKENS.iter().enumerate() {
            if v.tokens.get(id).map(String::as_str) != Some(*text) || !v.special[id] {
                return Err(format!("token {id} is not the special token {text:?}"));
            }
        }
        Ok(v)
    }

    /// Read `tokenizer.json` from disk.
    pub fn load(path: &Path) -> Result<Vocabulary> {
        let text = crate::files::read_text(path)?;
        Vocabulary::from_tokenizer_json(&text).map_err(|problem| Error::Invalid {
            path: path.to_path_buf(),
            problem,
        })
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Write a vocab-only GGUF file (metadata, no tensors), like
    /// llama.cpp's `ggml-vocab-*.gguf` test files.
    pub fn write_gguf(&self, path: &Path) -> Result<()> {
        let mut md = gguf::Metadata::new();
        for (k, v) in vocab_metadata(self) {
            md.set(k, v);
        }
        let mut bytes = Vec::new();
        gguf::Builder::new(md)
            .write_header(&mut bytes)
            .and_then(|w| w.finish())
            .map_err(|kind| gguf::Error::new(path, kind))?;
        crate::files::write(path, &bytes)
    }
}

/// The `tokenizer.ggml.*` keys of `vocab`, to add to a model's GGUF
/// metadata (or write alone with [`Vocabulary::write_gguf`]).
pub fn vocab_metadata(vocab: &Vocabulary) -> Vec<(String, Value)> {
    let strings = |items: Vec<String>| {
        Value::Array(
            ValueType::String,
            items.into_iter().map(Value::String).collect(),
        )
    };
    let types = vocab
        .special
        .iter()
        .map(|&s| Value::I32(if s { TYPE_CONTROL } else { TYPE_NORMAL }))
        .collect();
    let merges = vocab
        .merges
        .iter()
        .map(|(a, b)| format!("{a} {b}"))
        .collect();
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        (
            "tokenizer.ggml.pre".into(),
            Value::String(PRE_TOKENIZER.into()),
        ),
        (
            "tokenizer.ggml.tokens".into(),
            strings(vocab.tokens.clone()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(ValueType::I32, types),
        ),
        ("tokenizer.ggml.merges".into(), strings(merges)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(BOS_ID)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(EOS_ID)),
        ("tokenizer.ggml.padding_token_id".into(), Value::U32(PAD_ID)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(true)),
        ("tokenizer.ggml.add_eos_token".into(), Value::Bool(false)),
    ]
}

/// Load our runtime tokenizer from a GGUF file's metadata.
pub fn load_runtime(path: &Path) -> Result<tokenize::Vocab> {
    let file = gguf::GgufFile::open(path)?;
    tokenize::Vocab::from_gguf(file.metadata()).map_err(|err| Error::Vocab {
        path: path.to_path_buf(),
        err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"{
        "added_tokens": [
            {"id": 0, "content": "<|pad|>", "special": true},
            {"id": 1, "content": "<|bos|>", "special": true},
            {"id": 2, "content": "<|eos|>", "special": true}
        ],
        "model": {
            "type": "BPE",
            "vocab": {"<|pad|>": 0, "<|bos|>": 1, "<|eos|>": 2, "a": 3, "b": 4, "Ġ": 5, "ab": 6, "Ġab": 7},
            "merges": [["a", "b"], "Ġ ab"]
        }
    }"#;

    #[test]
    fn reads_both_merge_spellings_and_the_specials() {
        let v = Vocabulary::from_tokenizer_json(TINY).unwrap();
        assert_eq!(v.len(), 8);
        assert_eq!(
            v.special,
            [true, true, true, false, false, false, false, false]
        );
        assert_eq!(
            v.merges,
            [("a".into(), "b".into()), ("Ġ".into(), "ab".into())]
        );
    }

    #[test]
    fn rejects_gaps_and_wrong_specials() {
        let gap = TINY.replace(r#""Ġab": 7"#, r#""Ġab": 9"#);
        let err = Vocabulary::from_tokenizer_json(&gap).unwrap_err();
        assert_eq!(err, "no token has id 7");
        let swapped = TINY.replace(r#""content": "<|bos|>""#, r#""content": "<s>""#);
        assert!(Vocabulary::from_tokenizer_json(&swapped).is_err());
        assert!(Vocabulary::from_tokenizer_json("{}").is_err());
    }

    #[test]
    fn metadata_loads_as_a_gpt2_vocabulary() {
        let v = Vocabulary::from_tokenizer_json(TINY).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.gguf");
        v.write_gguf(&path).unwrap();
        // (Its only warnings: llama.cpp's default BOS/EOS id 11 does not
        // exist in 8 tokens, before the file's own ids replace it.)
        let rt = load_runtime(&path).unwrap();
        assert_eq!((rt.bos(), rt.eos()), (Some(1), Some(2)));
        assert_eq!(rt.special_tokens().pad, Some(0));
        assert_eq!(rt.encode(" ab", true, false), [1, 7]);
        assert!(rt.is_control(0) && rt.is_control(2) && !rt.is_control(3));
    }
}
