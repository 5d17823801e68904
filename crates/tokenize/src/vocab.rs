//! The vocabulary: tokens with their scores and types, the special tokens,
//! and the tokenizer settings, read from GGUF metadata the way llama.cpp's
//! `llama_vocab::impl::load` reads them (its defaults per model type, its
//! pre-tokenizer names, its end-of-generation heuristics).
//!
//! Problems llama.cpp only logs (a special-token id out of range, a merge
//! naming a string that is not a token) are kept as [`Vocab::warnings`];
//! problems that leave no usable vocabulary are [`Error`]s.

use crate::bpe::Bpe;
use crate::error::Error;
use crate::pretokenize::PreTokenizer;
use crate::special::{
    apply_strip_rules, end_of_generation, find_special_by_text, read_special_ids, SpecialTokens,
};
use crate::spm::Spm;
use gguf::{Metadata, Value, ValueType};
use std::collections::HashMap;
use std::fmt;

/// Token attributes: llama.cpp's `llama_token_attr` bit set. The file gives
/// one type per token (`tokenizer.ggml.token_type`); loading adds bits
/// (control for end-of-generation tokens, unused, strip rules).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TokenAttr(u16);

impl TokenAttr {
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    /// Strip whitespace to the left when matched as a special token.
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    /// Strip whitespace to the right when matched as a special token.
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);

    const NAMES: [(TokenAttr, &'static str); 8] = [
        (Self::UNKNOWN, "unknown"),
        (Self::UNUSED, "unused"),
        (Self::NORMAL, "normal"),
        (Self::CONTROL, "control"),
        (Self::USER_DEFINED, "user-defined"),
        (Self::BYTE, "byte"),
        (Self::LSTRIP, "lstrip"),
        (Self::RSTRIP, "rstrip"),
    ];

    /// The attribute for a `tokenizer.ggml.token_type` value; unknown
    /// values are undefined, as in llama.cpp.
    pub fn from_token_type(ty: i32) -> TokenAttr {
        match ty {
            1 => Self::NORMAL,
            2 => Self::UNKNOWN,
            3 => Self::CONTROL,
            4 => Self::USER_DEFINED,
            5 => Self::UNUSED,
            6 => Self::BYTE,
            _ => Self::UNDEFINED,
        }
    }

    pub fn bits(self) -> u16 {
        self.0
    }
    pub fn contains(self, other: TokenAttr) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn intersects(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }
    pub(crate) fn insert(&mut self, other: TokenAttr) {
        self.0 |= other.0;
    }
    pub(crate) fn remove(&mut self, other: TokenAttr) {
        self.0 &= !other.0;
    }
}

impl std::ops::BitOr for TokenAttr {
    type Output = TokenAttr;
    fn bitor(self, rhs: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | rhs.0)
    }
}

impl fmt::Debug for TokenAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Self::NAMES
            .iter()
            .filter(|(a, _)| self.contains(*a))
            .map(|(_, n)| *n)
            .collect();
        if names.is_empty() {
            write!(f, "TokenAttr(undefined)")
        } else {
            write!(f, "TokenAttr({})", names.join("|"))
        }
    }
}

/// `tokenizer.ggml.model`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerModel {
    /// `llama`: SentencePiece-style merges by score, with byte fallback.
    Spm,
    /// `gpt2`: byte-level BPE with ranked merges and a pre-tokenizer.
    Bpe,
}

/// A `tokenizer.ggml.pre` family: the names llama.cpp maps to one splitter
/// and the settings it changes for them.
struct PreConfig {
    names: &'static [&'static str],
    kind: PreTokenizer,
    clean_spaces: bool,
    ignore_merges: bool,
    add_bos: bool,
    no_bos: bool,
}

impl PreConfig {
    const fn new(names: &'static [&'static str], kind: PreTokenizer) -> PreConfig {
        PreConfig {
            names,
            kind,
            clean_spaces: true,
            ignore_merges: false,
            add_bos: false,
            no_bos: false,
        }
    }
    const fn keep_spaces(mut self) -> PreConfig {
        self.clean_spaces = false;
        self
    }
}

const PRE_CONFIGS: &[PreConfig] = &[
    PreConfig::new(&["default"], PreTokenizer::Default),
    PreConfig {
        ignore_merges: true,
        add_bos: true,
        ..PreConfig::new(
            &[
                "llama3",
                "llama-v3",
                "llama-bpe",
                "falcon3",
                "falcon-h1",
                "pixtral",
                "midm-2.0",
                "lfm2",
                "jina-v5-nano",
            ],
            PreTokenizer::Llama3,
        )
    },
    PreConfig::new(&["dbrx", "smaug-bpe"], PreTokenizer::Llama3),
    PreConfig {
        no_bos: true,
        ..PreConfig::new(&["chatglm-bpe"], PreTokenizer::Llama3)
    },
    PreConfig {
        no_bos: true,
        ignore_merges: true,
        ..PreConfig::new(&["glm4", "glm5"], PreTokenizer::Llama3)
    },
    PreConfig::new(&["deepseek-coder"], PreTokenizer::DeepseekCoder).keep_spaces(),
    PreConfig::new(
        &[
            "starcoder",
            "refact",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        PreTokenizer::Starcoder,
    ),
    PreConfig::new(&["smollm", "command-r"], PreTokenizer::Starcoder).keep_spaces(),
    PreConfig::new(
        &[
            "gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4", "mellum", "gigachat", "a.x-4.0",
        ],
        PreTokenizer::Gpt2,
    ),
    PreConfig::new(&["trillion", "granite-docling"], PreTokenizer::Gpt2).keep_spaces(),
    PreConfig::new(&["stablelm2", "megrez"], PreTokenizer::Qwen2),
    PreConfig::new(&["qwen35"], PreTokenizer::Qwen35).keep_spaces(),
    PreConfig::new(&["falcon"], PreTokenizer::Falcon),
    PreConfig::new(
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "hunyuan",
            "solar-open",
        ],
        PreTokenizer::Qwen2,
    )
    .keep_spaces(),
];

/// All `tokenizer.ggml.pre` names we accept.
pub fn supported_pre_tokenizers() -> Vec<&'static str> {
    PRE_CONFIGS
        .iter()
        .flat_map(|c| c.names.iter().copied())
        .collect()
}

pub(crate) struct Token {
    pub text: String,
    pub score: f32,
    pub attr: TokenAttr,
}

pub(crate) enum Model {
    Spm(Spm),
    Bpe(Bpe),
}

/// A tokenizer vocabulary. Built once from GGUF metadata; encoding and
/// decoding borrow it immutably, so it can be shared across threads.
pub struct Vocab {
    pub(crate) model: Model,
    pub(crate) tokens: Vec<Token>,
    pub(crate) ids: HashMap<String, u32>,
    pub(crate) special: SpecialTokens,
    eog: Vec<u32>,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    pub(crate) add_space_prefix: bool,
    pub(crate) clean_spaces: bool,
    pre_name: Option<String>,
    /// Tokens split out of the text before tokenizing, longest first.
    pub(crate) special_order: Vec<u32>,
    /// `token_to_piece(id, special = true)` for every token.
    pub(crate) pieces: Vec<Box<[u8]>>,
    warnings: Vec<String>,
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

impl Vocab {
    /// Read the vocabulary from a GGUF file's metadata.
    pub fn from_gguf(md: &Metadata) -> Result<Vocab, Error> {
        let mut warnings = Vec::new();
        let pre_name = opt_str(md, KEY_PRE)?;
        let defaults = Defaults::new(md.get_str(KEY_MODEL)?, pre_name, &mut warnings)?;
        let add_space_prefix = md
            .opt("tokenizer.ggml.add_space_prefix", Metadata::get_bool)?
            .unwrap_or(defaults.add_space_prefix);

        let mut tokens = read_tokens(md, &mut warnings)?;
        let ids = index_tokens(&tokens)?;
        let mut special = defaults.special;
        read_special_ids(md, &mut special, tokens.len(), &mut warnings)?;
        let add_bos = md
            .opt("tokenizer.ggml.add_bos_token", Metadata::get_bool)?
            .unwrap_or(defaults.add_bos);
        let add_eos = md
            .opt("tokenizer.ggml.add_eos_token", Metadata::get_bool)?
            .unwrap_or(false);
        find_special_by_text(&mut tokens, &ids, &mut special);
        let eog = end_of_generation(&mut tokens, &ids, &special);

        // Split out of raw text before tokenizing; longest first so that a
        // token containing another wins.
        let mut special_order: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&id| {
                tokens[id as usize]
                    .attr
                    .intersects(TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN)
            })
            .collect();
        special_order.sort_by_key(|&id| std::cmp::Reverse(tokens[id as usize].text.len()));

        let model = match defaults.pre {
            None => Model::Spm(Spm::new(
                &ids,
                tokens.iter().map(|t| t.text.as_str()),
                special.unk,
            )),
            Some(pre) => Model::Bpe(Bpe::new(
                &md.get_str_array(KEY_MERGES)?,
                &ids,
                pre,
                defaults.ignore_merges,
                &mut warnings,
            )),
        };
        let kind = defaults.model;
        let pieces = tokens.iter().map(|t| piece(kind, t)).collect();

        let name = opt_str(md, "general.name")?.unwrap_or("");
        apply_strip_rules(name, &mut tokens, &ids, &special_order);

        Ok(Vocab {
            model,
            tokens,
            ids,
            special,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces: defaults.clean_spaces,
            pre_name: pre_name.map(str::to_string),
            special_order,
            pieces,
            warnings,
        })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always false: a vocabulary without tokens fails to load.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn model(&self) -> TokenizerModel {
        match self.model {
            Model::Spm(_) => TokenizerModel::Spm,
            Model::Bpe(_) => TokenizerModel::Bpe,
        }
    }

    /// The pre-tokenizer (byte-level BPE only).
    pub fn pre_tokenizer(&self) -> Option<PreTokenizer> {
        match &self.model {
            Model::Spm(_) => None,
            Model::Bpe(bpe) => Some(bpe.pre),
        }
    }

    /// `tokenizer.ggml.pre` as written in the file.
    pub fn pre_tokenizer_name(&self) -> Option<&str> {
        self.pre_name.as_deref()
    }

    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(|t| t.text.as_str())
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    pub fn token_score(&self, id: u32) -> Option<f32> {
        self.tokens.get(id as usize).map(|t| t.score)
    }

    pub fn token_attr(&self, id: u32) -> Option<TokenAttr> {
        self.tokens.get(id as usize).map(|t| t.attr)
    }

    /// Control tokens (BOS, EOS, chat markers): never printed as text
    /// unless asked for.
    pub fn is_control(&self, id: u32) -> bool {
        self.token_attr(id)
            .is_some_and(|a| a.contains(TokenAttr::CONTROL))
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    pub fn bos(&self) -> Option<u32> {
        self.special.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.special.eos
    }

    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether SPM encoding puts a space before the text.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// All tokens that end generation (EOS, EOT, EOM, chat-turn ends, …),
    /// ascending.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// What loading tolerated but a user may want to know.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

fn read_tokens(md: &Metadata, warnings: &mut Vec<String>) -> Result<Vec<Token>, Error> {
    let texts = md.get_str_array(KEY_TOKENS)?;
    let n = texts.len();
    if n == 0 {
        return Err(Error::NoTokens);
    }
    let scores = match md.get(KEY_SCORES) {
        None => vec![0.0; n],
        Some(_) => {
            let (ty, items) = md.get_array(KEY_SCORES)?;
            if items.len() < n {
                return Err(Error::LengthMismatch {
                    key: KEY_SCORES,
                    found: items.len(),
                    expected: n,
                });
            }
            let score = |v: &Value| match v {
                Value::F32(x) => Some(*x),
                Value::I32(x) => Some(*x as f32),
                _ => None,
            };
            let scores: Option<Vec<f32>> = items[..n].iter().map(score).collect();
            scores.ok_or_else(|| Error::WrongType {
                key: KEY_SCORES,
                expected: "array of f32 or i32",
                found: format!("array of {}", ty.name()),
            })?
        }
    };
    let types = match md.get(KEY_TYPES) {
        None => None,
        Some(_) => {
            let (ty, items) = md.get_array(KEY_TYPES)?;
            if ty != ValueType::I32 {
                return Err(Error::WrongType {
                    key: KEY_TYPES,
                    expected: "array of i32",
                    found: format!("array of {}", ty.name()),
                });
            }
            if items.len() < n {
                return Err(Error::LengthMismatch {
                    key: KEY_TYPES,
                    found: items.len(),
                    expected: n,
                });
            }
            Some(
                items[..n]
                    .iter()
                    .map(|v| if let Value::I32(t) = v { *t } else { 0 })
                    .collect::<Vec<i32>>(),
            )
        }
    };
    let tokens = texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            // Empty strings cannot be matched or looked up; llama.cpp renames them.
            let text = if text.is_empty() {
                warnings.push(format!(
                    "`{KEY_TOKENS}`: token {i} is empty, named [EMPTY_{i}]"
                ));
                format!("[EMPTY_{i}]")
            } else {
                text.to_string()
            };
            let attr = types
                .as_ref()
                .map_or(TokenAttr::NORMAL, |t| TokenAttr::from_token_type(t[i]));
            Token {
                text,
                score: scores[i],
                attr,
            }
        })
        .collect();
    Ok(tokens)
}

/// What the model type and pre-tokenizer decide before the metadata's
/// own keys override it (llama.cpp's defaults).
struct Defaults {
    model: TokenizerModel,
    /// `None` for SPM.
    pre: Option<PreTokenizer>,
    special: SpecialTokens,
    add_space_prefix: bool,
    add_bos: bool,
    clean_spaces: bool,
    ignore_merges: bool,
}

impl Defaults {
    fn new(
        model: &str,
        pre_name: Option<&str>,
        warnings: &mut Vec<String>,
    ) -> Result<Defaults, Error> {
        match model {
            "llama" => Ok(Defaults {
                model: TokenizerModel::Spm,
                pre: None,
                special: SpecialTokens {
                    bos: Some(1),
                    eos: Some(2),
                    unk: Some(0),
                    ..Default::default()
                },
                add_space_prefix: true,
                add_bos: true,
                clean_spaces: false,
                ignore_merges: false,
            }),
            "gpt2" => {
                let config = match pre_name {
                    Some(name) => PRE_CONFIGS
                        .iter()
                        .find(|c| c.names.contains(&name))
                        .ok_or_else(|| Error::UnknownPreTokenizer {
                            name: name.to_string(),
                            supported: supported_pre_tokenizers().join(", "),
                        })?,
                    None => {
                        warnings.push(format!(
                            "`{KEY_PRE}` is missing: using `default`, which may not split \
                             words as the model's tokenizer does"
                        ));
                        &PRE_CONFIGS[0]
                    }
                };
                Ok(Defaults {
                    model: TokenizerModel::Bpe,
                    pre: Some(config.kind),
                    special: SpecialTokens {
                        bos: (!config.no_bos).then_some(11),
                        eos: Some(11),
                        ..Default::default()
                    },
                    add_space_prefix: false,
                    add_bos: config.add_bos,
                    clean_spaces: config.clean_spaces,
                    ignore_merges: config.ignore_merges,
                })
            }
            other => Err(Error::UnknownModel(other.to_string())),
        }
    }
}

fn opt_str<'m>(md: &'m Metadata, key: &str) -> Result<Option<&'m str>, Error> {
    match md.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(md.get_str(key)?)),
    }
}

/// Text → id. Duplicate texts are an error (llama.cpp aborts on them).
fn index_tokens(tokens: &[Token]) -> Result<HashMap<String, u32>, Error> {
    let mut ids = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if let Some(&first) = ids.get(t.text.as_str()) {
            return Err(Error::DuplicateToken {
                id: i as u32,
                first,
                text: t.text.clone(),
            });
        }
        ids.insert(t.text.clone(), i as u32);
    }
    Ok(ids)
}

/// The bytes a token stands for when special tokens are shown
/// (llama.cpp's `token_to_piece(id, special = true)`).
fn piece(kind: TokenizerModel, t: &Token) -> Box<[u8]> {
    let text = t.text.as_str();
    if t.attr
        .intersects(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED)
    {
        return text.as_bytes().into();
    }
    if t.attr.contains(TokenAttr::NORMAL) {
        return match kind {
            TokenizerModel::Spm => text.replace('\u{2581}', " ").into_bytes().into(),
            TokenizerModel::Bpe => crate::bpe::decode_token_text(text).into(),
        };
    }
    if t.attr.contains(TokenAttr::BYTE) {
        // `<0xXX>`; anything else is taken as its own text rather than guessed at.
        return match parse_byte_token(text) {
            Some(b) => Box::new([b]),
            None => text.as_bytes().into(),
        };
    }
    // Unused and undefined tokens print nothing.
    Box::default()
}

/// The byte of an SPM byte token `<0xXX>`.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
