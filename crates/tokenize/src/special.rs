//! Special tokens: the ids the metadata names (BOS, EOS, EOT, …), the ones
//! llama.cpp finds by their text when it does not, the end-of-generation
//! set, and the per-model strip rules for special tokens in text.

use crate::error::Error;
use crate::vocab::{Token, TokenAttr};
use gguf::Metadata;
use std::collections::{BTreeSet, HashMap};

/// The special token ids, `None` where the vocabulary has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

type Slot = fn(&mut SpecialTokens) -> &mut Option<u32>;

/// Special-token keys in llama.cpp's order; the last three are deprecated
/// spellings of the FIM keys.
const SPECIAL_KEYS: [(&str, Slot); 17] = [
    ("tokenizer.ggml.bos_token_id", |s| &mut s.bos),
    ("tokenizer.ggml.eos_token_id", |s| &mut s.eos),
    ("tokenizer.ggml.eot_token_id", |s| &mut s.eot),
    ("tokenizer.ggml.eom_token_id", |s| &mut s.eom),
    ("tokenizer.ggml.unknown_token_id", |s| &mut s.unk),
    ("tokenizer.ggml.seperator_token_id", |s| &mut s.sep),
    ("tokenizer.ggml.padding_token_id", |s| &mut s.pad),
    ("tokenizer.ggml.mask_token_id", |s| &mut s.mask),
    ("tokenizer.ggml.fim_pre_token_id", |s| &mut s.fim_pre),
    ("tokenizer.ggml.fim_suf_token_id", |s| &mut s.fim_suf),
    ("tokenizer.ggml.fim_mid_token_id", |s| &mut s.fim_mid),
    ("tokenizer.ggml.fim_pad_token_id", |s| &mut s.fim_pad),
    ("tokenizer.ggml.fim_rep_token_id", |s| &mut s.fim_rep),
    ("tokenizer.ggml.fim_sep_token_id", |s| &mut s.fim_sep),
    ("tokenizer.ggml.prefix_token_id", |s| &mut s.fim_pre),
    ("tokenizer.ggml.suffix_token_id", |s| &mut s.fim_suf),
    ("tokenizer.ggml.middle_token_id", |s| &mut s.fim_mid),
];

/// Candidates for EOT, found by text when the metadata does not name it.
/// llama.cpp takes whichever its hash map yields first; we take the first
/// here that is not EOS (EOS ends generation anyway), else EOS. That
/// agrees with llama.cpp on every vocabulary we test against (GPT-2,
/// Llama 3, Phi-3, SmolLM2).
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Other special tokens llama.cpp finds by their text when the metadata
/// does not name them (first present candidate wins).
const FOUND_BY_TEXT: [(Slot, &[&str]); 7] = [
    (|s| &mut s.eom, &["<|eom_id|>"]),
    (
        |s| &mut s.fim_pre,
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        |s| &mut s.fim_suf,
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        |s| &mut s.fim_mid,
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    (
        |s| &mut s.fim_pad,
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    ),
    (
        |s| &mut s.fim_rep,
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    (|s| &mut s.fim_sep, &["<|file_sep|>"]),
];

/// Tokens that end generation, by text (llama.cpp's list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Special-token ids from the metadata. An out-of-range id is ignored (as
/// llama.cpp does), leaving the default, itself dropped if out of range.
pub(crate) fn read_special_ids(
    md: &Metadata,
    special: &mut SpecialTokens,
    n: usize,
    warnings: &mut Vec<String>,
) -> Result<(), Error> {
    for (key, slot) in SPECIAL_KEYS {
        let id = slot(special);
        if let Some(default) = id.filter(|&d| d as usize >= n) {
            warnings.push(format!(
                "default `{key}` = {default} is out of range ({n} tokens): none"
            ));
            *id = None;
        }
        match read_token_id(md, key)? {
            Some(new) if (new as usize) < n => *id = Some(new),
            Some(new) => warnings.push(format!(
                "`{key}` = {new} is out of range ({n} tokens): ignored"
            )),
            None if md.get(key).is_some() => warnings.push(format!("`{key}` is negative: ignored")),
            None => {}
        }
    }
    Ok(())
}

/// Special tokens the metadata does not name, found by their text; llama.cpp
/// marks them control so they are never printed as text. Control tokens
/// named "unused" are marked unused.
pub(crate) fn find_special_by_text(
    tokens: &mut [Token],
    ids: &HashMap<String, u32>,
    special: &mut SpecialTokens,
) {
    if special.eot.is_none() {
        let mut found = EOT_TEXTS.iter().filter_map(|t| ids.get(*t).copied());
        let first = found.clone().next();
        special.eot = found.find(|&id| Some(id) != special.eos).or(first);
        if let Some(id) = special.eot {
            tokens[id as usize].attr.insert(TokenAttr::CONTROL);
        }
    }
    for (slot, texts) in FOUND_BY_TEXT {
        let id = slot(special);
        if id.is_none() {
            if let Some(found) = texts.iter().find_map(|t| ids.get(*t).copied()) {
                *id = Some(found);
                tokens[found as usize].attr.insert(TokenAttr::CONTROL);
            }
        }
    }
    for t in tokens.iter_mut() {
        if t.attr.contains(TokenAttr::CONTROL) && t.text.contains("unused") {
            t.attr.insert(TokenAttr::UNUSED);
        }
    }
}

/// llama.cpp's per-model fix, chosen by `general.name`: Phi-3's added tokens
/// swallow the whitespace after them, except these three.
pub(crate) fn apply_strip_rules(
    name: &str,
    tokens: &mut [Token],
    ids: &HashMap<String, u32>,
    special_order: &[u32],
) {
    let name = name.to_lowercase();
    if !(name.contains("phi-3") || name.contains("phi3")) {
        return;
    }
    for &id in special_order {
        tokens[id as usize].attr.insert(TokenAttr::RSTRIP);
    }
    for (text, on) in [
        ("</s>", true),
        ("<unk>", false),
        ("<s>", false),
        ("<|endoftext|>", false),
    ] {
        if let Some(&id) = ids.get(text) {
            let attr = &mut tokens[id as usize].attr;
            if on {
                attr.insert(TokenAttr::RSTRIP)
            } else {
                attr.remove(TokenAttr::RSTRIP)
            }
        }
    }
}

/// A token id key: `Ok(None)` when absent or negative, an error when it is
/// not an integer.
fn read_token_id(md: &Metadata, key: &'static str) -> Result<Option<u32>, Error> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    if let Some(x) = v.as_u64() {
        return Ok(Some(u32::try_from(x).unwrap_or(u32::MAX)));
    }
    if v.as_i64().is_some() {
        return Ok(None);
    }
    Err(Error::WrongType {
        key,
        expected: "a token id (integer)",
        found: v.type_description(),
    })
}

/// The end-of-generation set, with llama.cpp's fix-ups; marks the tokens
/// control as it goes.
pub(crate) fn end_of_generation(
    tokens: &mut [Token],
    ids: &HashMap<String, u32>,
    special: &SpecialTokens,
) -> Vec<u32> {
    let mut eog = BTreeSet::new();
    eog.extend(
        [special.fim_pad, special.fim_rep, special.fim_sep]
            .into_iter()
            .flatten(),
    );
    for text in EOG_TEXTS {
        if let Some(&id) = ids.get(*text) {
            eog.insert(id);
            tokens[id as usize].attr.insert(TokenAttr::CONTROL);
        }
    }
    // gpt-oss: these must render as text.
    for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&id) = ids.get(text) {
            tokens[id as usize].attr = TokenAttr::USER_DEFINED;
        }
    }
    eog.extend(
        [special.eos, special.eot, special.eom]
            .into_iter()
            .flatten(),
    );

    let has =
        |eog: &BTreeSet<u32>, text: &str| ids.get(text).filter(|id| eog.contains(id)).copied();
    // o200k_harmony and solar-open: `<|end|>` ends a message, not generation.
    if let Some(end) = has(&eog, "<|end|>") {
        let call = has(&eog, "<|call|>").or(has(&eog, "<|calls|>")).is_some();
        if call && (has(&eog, "<|return|>").is_some() || has(&eog, "<|flush|>").is_some()) {
            eog.remove(&end);
            tokens[end as usize].attr = TokenAttr::USER_DEFINED;
        }
    }
    // Gemma 4 and PLaMo have an ordinary `</s>`.
    if let Some(s) = has(&eog, "</s>") {
        if has(&eog, "<|tool_response>").is_some() || has(&eog, "<|plamo:eos|>").is_some() {
            eog.remove(&s);
            tokens[s as usize].attr = TokenAttr::NORMAL;
        }
    }
    eog.into_iter().collect()
}
