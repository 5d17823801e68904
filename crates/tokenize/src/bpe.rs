//! Byte-level BPE (`tokenizer.ggml.model = gpt2`).
//!
//! The pre-tokenizer cuts the text into words; each word starts as one
//! symbol per UTF-8 byte (the token for that byte's GPT-2 character) and
//! the adjacent pair with the lowest merge rank is merged until no ranked
//! pair is left. As in SPM, a priority queue over a linked list keeps a
//! word O(n log n), so long runs without spaces stay cheap. Merges are
//! keyed by token ids, not strings: a pair of ids names the same strings
//! llama.cpp compares, without building them.

use crate::pretokenize::PreTokenizer;
use crate::unicode::{byte_to_char, char_to_byte};
use crate::vocab::Vocab;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

pub(crate) struct Bpe {
    pub pre: PreTokenizer,
    /// `(left, right)` → (rank, merged token).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Token for each byte's GPT-2 character.
    byte_tokens: [Option<u32>; 256],
    /// Llama 3: a word that is itself a token is taken whole, even if the
    /// merges would build it differently.
    ignore_merges: bool,
}

impl Bpe {
    pub fn new(
        merges: &[&str],
        ids: &HashMap<String, u32>,
        pre: PreTokenizer,
        ignore_merges: bool,
        warnings: &mut Vec<String>,
    ) -> Bpe {
        let mut table = HashMap::with_capacity(merges.len());
        let mut skipped = Vec::new();
        let mut joined = String::new();
        for (rank, line) in merges.iter().enumerate() {
            // `left right`; the search starts at byte 1 so a left part may be a space.
            let split = line.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
            let parts = split.and_then(|p| {
                let (left, right) = (&line[..p], &line[p + 1..]);
                joined.clear();
                joined.push_str(left);
                joined.push_str(right);
                Some((
                    *ids.get(left)?,
                    *ids.get(right)?,
                    *ids.get(joined.as_str())?,
                ))
            });
            match parts {
                // Keep the first (best) rank of a repeated merge, as llama.cpp does.
                Some((l, r, merged)) => {
                    table.entry((l, r)).or_insert((rank as u32, merged));
                }
                None => skipped.push(rank),
            }
        }
        if let Some(&first) = skipped.first() {
            warnings.push(format!(
                "`tokenizer.ggml.merges`: skipped {} merge(s) that are not `left right` with both parts and \
                 their join tokens (first: #{first} {:?})",
                skipped.len(),
                merges[first]
            ));
        }
        let byte_tokens =
            std::array::from_fn(|b| ids.get(byte_to_char(b as u8).to_string().as_str()).copied());
        Bpe {
            pre,
            merges: table,
            byte_tokens,
            ignore_merges,
        }
    }

    pub fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut word = Word::default();
        let mut encoded = String::new();
        for range in self.pre.split(text) {
            let bytes = text[range].as_bytes();
            if self.ignore_merges {
                encoded.clear();
                encoded.extend(bytes.iter().map(|&b| byte_to_char(b)));
                if let Some(id) = vocab.token_id(&encoded) {
                    out.push(id);
                    continue;
                }
            }
            word.encode(self, bytes, out);
        }
    }
}

/// Scratch space for one word, reused across words.
#[derive(Default)]
struct Word {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Reverse<Pair>>,
}

const NIL: usize = usize::MAX;

struct Symbol {
    /// `None` if the vocab lacks the byte's token; such a symbol never
    /// merges and is dropped, as in llama.cpp.
    id: Option<u32>,
    prev: usize,
    next: usize,
    merged_away: bool,
}

impl Word {
    fn encode(&mut self, bpe: &Bpe, bytes: &[u8], out: &mut Vec<u32>) {
        self.symbols.clear();
        self.queue.clear();
        self.symbols
            .extend(bytes.iter().enumerate().map(|(i, &b)| Symbol {
                id: bpe.byte_tokens[b as usize],
                prev: i.wrapping_sub(1),
                next: if i + 1 == bytes.len() { NIL } else { i + 1 },
                merged_away: false,
            }));
        for i in 1..self.symbols.len() {
            self.push_pair(bpe, i - 1, i);
        }

        while let Some(Reverse(pair)) = self.queue.pop() {
            let (l, r) = (&self.symbols[pair.left], &self.symbols[pair.right]);
            // Stale if either side changed since the pair was queued.
            if l.merged_away
                || r.merged_away
                || l.id != Some(pair.ids.0)
                || r.id != Some(pair.ids.1)
            {
                continue;
            }
            let right_next = r.next;
            let left = &mut self.symbols[pair.left];
            left.id = Some(pair.merged);
            left.next = right_next;
            let left_prev = left.prev;
            self.symbols[pair.right].merged_away = true;
            if right_next != NIL {
                self.symbols[right_next].prev = pair.left;
            }
            self.push_pair(bpe, left_prev, pair.left);
            self.push_pair(bpe, pair.left, right_next);
        }

        out.extend(
            self.symbols
                .iter()
                .filter(|s| !s.merged_away)
                .filter_map(|s| s.id),
        );
    }

    fn push_pair(&mut self, bpe: &Bpe, left: usize, right: usize) {
        if left == NIL || right == NIL {
            return;
        }
        let (Some(l), Some(r)) = (self.symbols[left].id, self.symbols[right].id) else {
            return;
        };
        if let Some(&(rank, merged)) = bpe.merges.get(&(l, r)) {
            self.queue.push(Reverse(Pair {
                rank,
                left,
                right,
                ids: (l, r),
                merged,
            }));
        }
    }
}

struct Pair {
    rank: u32,
    left: usize,
    right: usize,
    ids: (u32, u32),
    merged: u32,
}

impl Ord for Pair {
    /// Lowest rank, then leftmost (the queue pops the maximum of `Reverse`).
    fn cmp(&self, other: &Self) -> Ordering {
        (self.rank, self.left).cmp(&(other.rank, other.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

/// A byte-level token's text back to bytes. A character outside the GPT-2
/// map is written as llama.cpp writes it, `[UNK_BYTE_0x…]`.
pub(crate) fn decode_token_text(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}
