//! Text to tokens, as llama.cpp's `llama_tokenize`: special tokens written
//! in the text are split out first, then each stretch of plain text goes
//! through the SPM or BPE tokenizer.

use crate::vocab::{Model, TokenAttr, Vocab};
use std::ops::Range;

/// A stretch of the input: plain text, or a special token found in it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

impl Vocab {
    /// Tokenize `text`.
    ///
    /// `add_special` adds BOS / EOS where the vocabulary asks for them
    /// ([`Vocab::add_bos`], [`Vocab::add_eos`]). `parse_special` lets
    /// control tokens written in the text (`<|im_start|>`) become those
    /// tokens; without it they are tokenized as text. User-defined tokens
    /// are matched either way, as in llama.cpp.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_fragments(text, add_special, parse_special, &[])
    }

    /// Tokenize `text` whose control tokens (`<|im_start|>`) are parsed
    /// except where they overlap a `plain` byte range: text a chat template
    /// copied from a message, which must stay text whatever it contains
    /// (otherwise a user writes `<|im_end|>` and forges a turn). Outside
    /// those ranges, and for text without control-token text inside them,
    /// the tokens are those of `encode(text, add_special, true)`: the
    /// ranges do not split the text.
    pub fn encode_with_plain(
        &self,
        text: &str,
        add_special: bool,
        plain: &[Range<usize>],
    ) -> Vec<u32> {
        self.encode_fragments(text, add_special, true, plain)
    }

    /// The text of the first control (or unknown) token written in `text`,
    /// if any: what [`Vocab::encode_with_plain`] keeps as text.
    pub fn control_text_in(&self, text: &str) -> Option<&str> {
        self.special_order
            .iter()
            .map(|&id| &self.tokens[id as usize])
            .filter(|t| t.attr.intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN))
            .map(|t| t.text.as_str())
            .find(|needle| !needle.is_empty() && text.contains(needle))
    }

    fn encode_fragments(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        plain: &[Range<usize>],
    ) -> Vec<u32> {
        let fragments = if text.is_empty() {
            Vec::new()
        } else {
            self.split_special(text, parse_special, plain)
        };
        let bos = self.special.bos.filter(|_| add_special && self.add_bos);
        let eos = self.special.eos.filter(|_| add_special && self.add_eos);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        out.extend(bos);
        match &self.model {
            Model::Spm(spm) => {
                // SentencePiece puts a space before the text, and again after
                // every special token.
                let mut after_special = true;
                let mut escaped = String::new();
                for fragment in &fragments {
                    match fragment {
                        Fragment::Text(range) => {
                            escaped.clear();
                            if self.add_space_prefix && after_special {
                                escaped.push('\u{2581}');
                            }
                            escaped.extend(text[range.clone()].chars().map(|c| {
                                if c == ' ' {
                                    '\u{2581}'
                                } else {
                                    c
                                }
                            }));
                            spm.encode(self, &escaped, &mut out);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(*id);
                            after_special = true;
                        }
                    }
                }
            }
            Model::Bpe(bpe) => {
                for fragment in &fragments {
                    match fragment {
                        Fragment::Text(range) => bpe.encode(self, &text[range.clone()], &mut out),
                        Fragment::Token(id) => out.push(*id),
                    }
                }
            }
        }
        out.extend(eos);
        out
    }

    /// Split special tokens out of `text`, longest token first, each over
    /// all the text the longer ones left (llama.cpp's
    /// `tokenizer_st_partition`).
    /// `plain`: byte ranges where control tokens are not parsed.
    fn split_special(
        &self,
        text: &str,
        parse_special: bool,
        plain: &[Range<usize>],
    ) -> Vec<Fragment> {
        let mut fragments = vec![Fragment::Text(0..text.len())];
        let mut next = Vec::new();
        for &id in &self.special_order {
            let token = &self.tokens[id as usize];
            let control = token
                .attr
                .intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN);
            if !parse_special && control {
                continue;
            }
            let plain = if control { plain } else { &[] };
            let needle = token.text.as_str();
            let found =
                |f: &Fragment| matches!(f, Fragment::Text(r) if text[r.clone()].contains(needle));
            if !fragments.iter().any(found) {
                continue;
            }
            next.clear();
            for fragment in fragments.drain(..) {
                match fragment {
                    Fragment::Text(range) => {
                        split_on(text, range, needle, id, token.attr, plain, &mut next)
                    }
                    token => next.push(token),
                }
            }
            std::mem::swap(&mut fragments, &mut next);
        }
        fragments
    }
}

/// Split `text[range]` at each occurrence of `needle` that overlaps no
/// `plain` range, applying the token's strip rules to the text beside it.
fn split_on(
    text: &str,
    range: Range<usize>,
    needle: &str,
    id: u32,
    attr: TokenAttr,
    plain: &[Range<usize>],
    out: &mut Vec<Fragment>,
) {
    let bytes = text.as_bytes();
    let (mut start, end) = (range.start, range.end);
    let mut search = start;
    while let Some(at) = text[search..end].find(needle) {
        let at = search + at;
        let after = at + needle.len();
        if plain.iter().any(|r| at < r.end && r.start < after) {
            // Stays text; look again from the next character.
            search = at + text[at..].chars().next().map_or(1, char::len_utf8);
            continue;
        }
        let mut left_end = at;
        if attr.contains(TokenAttr::LSTRIP) {
            while left_end > start && is_c_space(bytes[left_end - 1]) {
                left_end -= 1;
            }
        }
        if left_end > start {
            out.push(Fragment::Text(start..left_end));
        }
        out.push(Fragment::Token(id));
        start = after;
        if attr.contains(TokenAttr::RSTRIP) {
            while start < end && is_c_space(bytes[start]) {
                start += 1;
            }
        }
        search = start;
    }
    if start < end {
        out.push(Fragment::Text(start..end));
    }
}

/// C's `isspace`: what llama.cpp strips beside special tokens.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t'..=b'\r')
}
