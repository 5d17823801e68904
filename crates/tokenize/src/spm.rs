//! SentencePiece-style tokenization (`tokenizer.ggml.model = llama`).
//!
//! Start from single characters and repeatedly merge the adjacent pair
//! whose concatenation is the highest-scoring token (ties: leftmost), until
//! no pair forms a token. A priority queue of candidate pairs over a linked
//! list of symbols keeps this O(n log n); pairs made stale by an earlier
//! merge are skipped when popped. Characters left that are not tokens are
//! spelt as byte tokens `<0xXX>`.
//!
//! llama.cpp runs this over the whole text at once. A queue of a million
//! pairs is slow (its pops miss the cache), so we cut the text before each
//! `▁` that no token can reach across, and run the pieces one by one: a
//! merge never crosses such a cut, and the order of merges within a piece
//! is unchanged, so the tokens are the same.

use crate::vocab::Vocab;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};

const SPACE: char = '\u{2581}';

pub(crate) struct Spm {
    /// Token for each byte: `<0xXX>`, else the byte itself as a token,
    /// else the unknown token (llama.cpp would throw).
    byte_tokens: [Option<u32>; 256],
    /// Characters that some token has right before a `▁` (other than `▁`
    /// itself): the text may not be cut between those and a `▁`.
    joins_space: HashSet<char>,
}

impl Spm {
    pub fn new<'a>(
        ids: &HashMap<String, u32>,
        texts: impl Iterator<Item = &'a str>,
        unk: Option<u32>,
    ) -> Spm {
        let mut joins_space = HashSet::new();
        for text in texts {
            let mut prev = None;
            for c in text.chars() {
                if let (SPACE, Some(p)) = (c, prev) {
                    if p != SPACE {
                        joins_space.insert(p);
                    }
                }
                prev = Some(c);
            }
        }
        let byte_tokens = std::array::from_fn(|b| {
            let hex = format!("<0x{b:02X}>");
            let single = (b < 0x80).then(|| char::from(b as u8).to_string());
            ids.get(&hex)
                .or_else(|| single.and_then(|s| ids.get(&s)))
                .copied()
                .or(unk)
        });
        Spm {
            byte_tokens,
            joins_space,
        }
    }

    /// Tokenize `text`, which already has its spaces escaped as `▁`.
    pub fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut start = 0;
        let mut prev = None;
        for (i, c) in text.char_indices() {
            if c == SPACE && prev.is_some_and(|p| p != SPACE && !self.joins_space.contains(&p)) {
                self.encode_piece(vocab, &text[start..i], out);
                start = i;
            }
            prev = Some(c);
        }
        self.encode_piece(vocab, &text[start..], out);
    }

    fn encode_piece(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .enumerate()
            .map(|(i, (start, c))| Symbol {
                start,
                len: c.len_utf8(),
                prev: i.wrapping_sub(1),
                next: i + 1,
            })
            .collect();
        let Some(last) = symbols.last_mut() else {
            return;
        };
        last.next = NIL;

        let mut queue = BinaryHeap::new();
        let candidate = |symbols: &[Symbol], left: usize, right: usize| -> Option<Bigram> {
            if left == NIL || right == NIL {
                return None;
            }
            let (l, r) = (&symbols[left], &symbols[right]);
            let id = vocab.token_id(&text[l.start..r.start + r.len])?;
            let score = vocab.tokens[id as usize].score;
            Some(Bigram {
                score,
                left,
                right,
                len: l.len + r.len,
            })
        };
        for i in 1..symbols.len() {
            queue.extend(candidate(&symbols, i - 1, i));
        }

        while let Some(b) = queue.pop() {
            let (l, r) = (&symbols[b.left], &symbols[b.right]);
            // Stale: one side was merged away, or grew, since this pair was queued.
            if l.len == 0 || r.len == 0 || l.len + r.len != b.len {
                continue;
            }
            let right_next = r.next;
            symbols[b.left].len = b.len;
            symbols[b.left].next = right_next;
            symbols[b.right].len = 0;
            if right_next != NIL {
                symbols[right_next].prev = b.left;
            }
            queue.extend(candidate(&symbols, symbols[b.left].prev, b.left));
            queue.extend(candidate(&symbols, b.left, right_next));
        }

        // Every merged symbol is a token (pairs are only queued if they
        // are), so only single characters can be missing from the vocab.
        let mut i = 0;
        while i != NIL {
            let s = &symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match vocab.token_id(piece) {
                Some(id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| self.byte_tokens[b as usize])),
            }
            i = s.next;
        }
    }
}

const NIL: usize = usize::MAX;

struct Symbol {
    start: usize,
    /// Bytes; 0 once merged into the symbol on its left.
    len: usize,
    prev: usize,
    next: usize,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Bigram {
    /// Highest score first, then leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}
