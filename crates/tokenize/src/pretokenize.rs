//! Pre-tokenization for byte-level BPE: cutting text into words before the
//! merges run, as llama.cpp does for each `tokenizer.ggml.pre`.
//!
//! llama.cpp describes each pre-tokenizer as a list of regexes applied one
//! after the other, each splitting the pieces the previous one produced
//! (text between matches stays a piece of its own). The big GPT-2 /
//! llama-3 / Qwen2 patterns have hand-written matchers in llama.cpp
//! because `std::regex` cannot do `(?!\S)`; we port those. The remaining
//! patterns are all "optional one character of a class, then a run of
//! another class", which [`Run`] matches directly, so no regex engine is
//! needed.

use crate::unicode::Flags;
use std::ops::Range;

/// The pre-tokenizers we implement, each covering the `tokenizer.ggml.pre`
/// names llama.cpp maps to it (listed by
/// [`supported_pre_tokenizers`](crate::supported_pre_tokenizers)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// llama.cpp's fallback for `default`: punctuation runs, GPT-2, numbers,
    /// then three-digit groups.
    Default,
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// Single digits, then GPT-2 (StarCoder, SmolLM, Command-R, …).
    Starcoder,
    /// Llama 3: case-insensitive contractions, numbers in groups of up to 3.
    Llama3,
    /// Qwen2: the Llama 3 pattern with single digits.
    Qwen2,
    /// Qwen3.5: Qwen2 with combining marks (`\p{M}`) counted as letters.
    Qwen35,
    /// Falcon: punctuation runs, GPT-2, three-digit groups.
    Falcon,
    /// DeepSeek Coder: newlines, letters, punctuation, CJK runs, digits.
    DeepseekCoder,
}

/// Classes that appear in the simple patterns.
#[derive(Clone, Copy, Debug)]
enum Class {
    /// `\s`
    Whitespace,
    /// `\p{L}`
    Letter,
    /// `\p{N}`
    Number,
    /// `\p{P}`
    Punctuation,
    /// `[\p{P}\$\+<=>\^~\|]`
    PunctuationOrOperator,
    /// `[\p{P}\$\+<=>\^~\|`]`
    PunctuationOrOperatorOrBacktick,
    /// `[0-9]`
    AsciiDigit,
    /// `[\r\n]`
    Newline,
    /// `[一-龥ࠀ-一가-퟿]`
    DeepseekCjk,
}

impl Class {
    fn matches(self, c: char) -> bool {
        match self {
            Class::Whitespace => c.is_whitespace(),
            Class::Letter => Flags::of(c).is_letter(),
            Class::Number => Flags::of(c).is_number(),
            Class::Punctuation => Flags::of(c).is_punctuation(),
            Class::PunctuationOrOperator => {
                matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
                    || Flags::of(c).is_punctuation()
            }
            Class::PunctuationOrOperatorOrBacktick => {
                c == '`' || Class::PunctuationOrOperator.matches(c)
            }
            Class::AsciiDigit => c.is_ascii_digit(),
            Class::Newline => c == '\r' || c == '\n',
            // `一-龥` and `ࠀ-一` meet at 一, so they are one range.
            Class::DeepseekCjk => matches!(c, '\u{0800}'..='\u{9FA5}' | '\u{AC00}'..='\u{D7FF}'),
        }
    }
}

/// The pattern `prefix? body{min,max}` (greedy), e.g. `\s?\p{L}+`.
#[derive(Clone, Copy, Debug)]
struct Run {
    prefix: Option<Class>,
    body: Class,
    min: usize,
    max: usize,
}

impl Run {
    const fn new(body: Class, min: usize, max: usize) -> Run {
        Run {
            prefix: None,
            body,
            min,
            max,
        }
    }
    const fn one_or_more(body: Class) -> Run {
        Run::new(body, 1, usize::MAX)
    }
    const fn prefixed(prefix: Class, body: Class) -> Run {
        Run {
            prefix: Some(prefix),
            body,
            min: 1,
            max: usize::MAX,
        }
    }

    fn body_len(&self, cs: &[char]) -> usize {
        cs.iter()
            .take(self.max)
            .take_while(|&&c| self.body.matches(c))
            .count()
    }

    /// Length of the match starting at `cs[0]`, as a backtracking engine
    /// would find it: with the prefix if that works, else without.
    fn match_len(&self, cs: &[char]) -> Option<usize> {
        if let (Some(prefix), Some(&c)) = (self.prefix, cs.first()) {
            if prefix.matches(c) {
                let n = self.body_len(&cs[1..]);
                if n >= self.min {
                    return Some(1 + n);
                }
            }
        }
        let n = self.body_len(cs);
        (n >= self.min && n > 0).then_some(n)
    }
}

/// One splitting pass.
#[derive(Clone, Copy, Debug)]
enum Step {
    Gpt2,
    /// Llama 3 / Qwen2 / Qwen3.5: the longest digit group, and whether
    /// combining marks join letters.
    Llama3 {
        max_digits: usize,
        marks: bool,
    },
    Run(Run),
}

const DEFAULT_STEPS: &[Step] = &[
    Step::Run(Run::one_or_more(Class::PunctuationOrOperator)),
    Step::Gpt2,
    Step::Run(Run::one_or_more(Class::Number)),
    Step::Run(Run::new(Class::AsciiDigit, 3, 3)),
];
const STARCODER_STEPS: &[Step] = &[Step::Run(Run::new(Class::Number, 1, 1)), Step::Gpt2];
const FALCON_STEPS: &[Step] = &[
    Step::Run(Run::one_or_more(Class::PunctuationOrOperatorOrBacktick)),
    Step::Gpt2,
    Step::Run(Run::new(Class::AsciiDigit, 3, 3)),
];
const DEEPSEEK_CODER_STEPS: &[Step] = &[
    Step::Run(Run::new(Class::Newline, 1, 1)),
    Step::Run(Run::prefixed(Class::Whitespace, Class::Letter)),
    Step::Run(Run::prefixed(Class::Whitespace, Class::Punctuation)),
    Step::Run(Run::one_or_more(Class::DeepseekCjk)),
    Step::Run(Run::new(Class::Number, 1, 1)),
];

impl PreTokenizer {
    fn steps(self) -> &'static [Step] {
        match self {
            PreTokenizer::Default => DEFAULT_STEPS,
            PreTokenizer::Gpt2 => &[Step::Gpt2],
            PreTokenizer::Starcoder => STARCODER_STEPS,
            PreTokenizer::Llama3 => &[Step::Llama3 {
                max_digits: 3,
                marks: false,
            }],
            PreTokenizer::Qwen2 => &[Step::Llama3 {
                max_digits: 1,
                marks: false,
            }],
            PreTokenizer::Qwen35 => &[Step::Llama3 {
                max_digits: 1,
                marks: true,
            }],
            PreTokenizer::Falcon => FALCON_STEPS,
            PreTokenizer::DeepseekCoder => DEEPSEEK_CODER_STEPS,
        }
    }

    /// Cut `text` into words; the byte ranges cover `text` in order.
    pub fn split(self, text: &str) -> Vec<Range<usize>> {
        let chars: Vec<char> = text.chars().collect();
        // One piece, the whole text, to start with.
        let mut pieces: Vec<Range<usize>> = std::iter::once(0..chars.len()).collect();
        let mut next = Vec::new();
        for step in self.steps() {
            next.clear();
            for piece in &pieces {
                let seg = Segment {
                    cs: &chars[piece.clone()],
                    base: piece.start,
                };
                let mut out = Pieces {
                    out: &mut next,
                    prev: piece.start,
                };
                match *step {
                    Step::Gpt2 => split_gpt2(&seg, &mut out),
                    Step::Llama3 { max_digits, marks } => {
                        split_llama3(&seg, max_digits, marks, &mut out)
                    }
                    Step::Run(run) => split_run(&seg, run, &mut out),
                }
                out.end_at(piece.end);
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        // Character indices to byte offsets.
        let mut starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        starts.push(text.len());
        pieces
            .into_iter()
            .map(|r| starts[r.start]..starts[r.end])
            .collect()
    }
}

/// One piece being split further. Positions are absolute character
/// indices; reading past either end yields nothing.
struct Segment<'a> {
    cs: &'a [char],
    base: usize,
}

impl Segment<'_> {
    fn end(&self) -> usize {
        self.base + self.cs.len()
    }
    fn get(&self, pos: usize) -> Option<char> {
        pos.checked_sub(self.base)
            .and_then(|i| self.cs.get(i))
            .copied()
    }
    fn flags(&self, pos: usize) -> Flags {
        Flags::of_opt(self.get(pos))
    }
}

/// Collects pieces: every call closes the piece since the previous one.
struct Pieces<'a> {
    out: &'a mut Vec<Range<usize>>,
    prev: usize,
}

impl Pieces<'_> {
    fn end_at(&mut self, end: usize) {
        if end > self.prev {
            self.out.push(self.prev..end);
        }
        self.prev = end;
    }
}

fn split_run(seg: &Segment, run: Run, out: &mut Pieces) {
    let mut i = 0;
    while i < seg.cs.len() {
        match run.match_len(&seg.cs[i..]) {
            Some(n) => {
                out.end_at(seg.base + i); // the unmatched text before
                out.end_at(seg.base + i + n);
                i += n;
            }
            None => i += 1,
        }
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d` (case-sensitive): length of the contraction at `pos`.
fn contraction_len(seg: &Segment, pos: usize, fold_case: bool) -> Option<usize> {
    if seg.get(pos) != Some('\'') {
        return None;
    }
    // Only ASCII letters matter here: no other code point lowercases to one
    // of `s t m d r e v l`.
    let lower = |c: Option<char>| c.map(|c| if fold_case { c.to_ascii_lowercase() } else { c });
    let (a, b) = (lower(seg.get(pos + 1)), lower(seg.get(pos + 2)));
    match (a, b) {
        (Some('s' | 't' | 'm' | 'd'), _) => Some(2),
        (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => Some(3),
        _ => None,
    }
}

/// Whitespace handling shared by GPT-2 and Llama 3: `\s+(?!\S)|\s+` leaves
/// the last space of a run to prefix the next word.
fn whitespace_run_end(seg: &Segment, pos: usize, n_spaces: usize) -> Option<usize> {
    if n_spaces > 1 && seg.get(pos + n_spaces).is_some() {
        Some(pos + n_spaces - 1)
    } else if n_spaces > 0 {
        Some(pos + n_spaces)
    } else {
        None
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn split_gpt2(seg: &Segment, out: &mut Pieces) {
    let end = seg.end();
    let mut pos = seg.base;
    while pos < end {
        let c = seg.get(pos);
        if let Some(n) = contraction_len(seg, pos, false) {
            pos += n;
            out.end_at(pos);
            continue;
        }
        // ` ?X+` for the three classes: a space joins the run after it.
        let space = c == Some(' ');
        let first = if space {
            seg.flags(pos + 1)
        } else {
            seg.flags(pos)
        };
        let other =
            |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number() || f.is_none());
        let class: Option<fn(Flags) -> bool> = if first.is_letter() {
            Some(Flags::is_letter)
        } else if first.is_number() {
            Some(Flags::is_number)
        } else if other(first) {
            Some(other)
        } else {
            None
        };
        if let Some(class) = class {
            pos += space as usize;
            while class(seg.flags(pos)) {
                pos += 1;
            }
            out.end_at(pos);
            continue;
        }
        let n_spaces = (pos..end)
            .take_while(|&p| seg.flags(p).is_whitespace())
            .count();
        pos = whitespace_run_end(seg, pos, n_spaces).unwrap_or(pos + 1);
        out.end_at(pos);
    }
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}|
///  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` with D = `max_digits`;
/// with `marks`, `\p{L}` reads `[\p{L}\p{M}]` throughout (Qwen3.5).
fn split_llama3(seg: &Segment, max_digits: usize, marks: bool, out: &mut Pieces) {
    let end = seg.end();
    let letter = |f: Flags| f.is_letter() || (marks && f.is_mark());
    let is_newline = |c: Option<char>| matches!(c, Some('\r' | '\n'));
    let mut pos = seg.base;
    while pos < end {
        let c = seg.get(pos);
        let flags = seg.flags(pos);
        if let Some(n) = contraction_len(seg, pos, true) {
            pos += n;
            out.end_at(pos);
            continue;
        }
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if !(is_newline(c) || flags.is_number()) && (letter(flags) || letter(seg.flags(pos + 1))) {
            pos += 1;
            while letter(seg.flags(pos)) {
                pos += 1;
            }
            out.end_at(pos);
            continue;
        }
        // `\p{N}{1,D}`, repeated: a long number becomes groups of D digits.
        if flags.is_number() {
            let mut group = pos;
            while seg.flags(pos).is_number() {
                pos += 1;
                if pos - group >= max_digits {
                    out.end_at(pos);
                    group = pos;
                }
            }
            out.end_at(pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`; llama.cpp tests the first character's
        // own flags for "is a character", which only fails past the end.
        let mut f2 = if c == Some(' ') {
            seg.flags(pos + 1)
        } else {
            flags
        };
        let other = |f: Flags| !(f.is_whitespace() || letter(f) || f.is_number() || f.is_none());
        if other(f2) && !flags.is_none() {
            pos += (c == Some(' ')) as usize;
            while other(f2) {
                pos += 1;
                f2 = seg.flags(pos);
            }
            while is_newline(seg.get(pos)) {
                pos += 1;
            }
            out.end_at(pos);
            continue;
        }
        // `\s*[\r\n]+`: whitespace up to and including the last newline of the run.
        let n_spaces = (pos..end)
            .take_while(|&p| seg.flags(p).is_whitespace())
            .count();
        let last_newline = (pos..pos + n_spaces)
            .rev()
            .find(|&p| is_newline(seg.get(p)));
        if let Some(p) = last_newline {
            pos = p + 1;
            out.end_at(pos);
            continue;
        }
        pos = whitespace_run_end(seg, pos, n_spaces).unwrap_or(pos + 1);
        out.end_at(pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreTokenizer, text: &str) -> Vec<&str> {
        pre.split(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn gpt2_keeps_one_space_for_the_next_word() {
        assert_eq!(
            words(PreTokenizer::Gpt2, "Hello   world's 123!!\n\n"),
            ["Hello", "  ", " world", "'s", " 123", "!!", "\n\n"]
        );
        assert_eq!(words(PreTokenizer::Gpt2, "I'M ok"), ["I", "'", "M", " ok"]);
    }

    #[test]
    fn llama3_groups_digits_and_folds_contractions() {
        assert_eq!(
            words(PreTokenizer::Llama3, "I'M 1234567"),
            ["I", "'M", " ", "123", "456", "7"]
        );
        assert_eq!(
            words(PreTokenizer::Llama3, "a \n\n b"),
            ["a", " \n\n", " b"]
        );
        assert_eq!(
            words(PreTokenizer::Llama3, "x.)\n\ny"),
            ["x", ".)\n\n", "y"]
        );
        assert_eq!(
            words(PreTokenizer::Qwen2, "x 123"),
            ["x", " ", "1", "2", "3"]
        );
    }

    #[test]
    fn default_and_starcoder_stack_their_passes() {
        // Punctuation runs first, then GPT-2, then numbers, then 3-digit groups.
        assert_eq!(
            words(PreTokenizer::Default, "a+=b 12345"),
            ["a", "+=", "b", " ", "123", "45"]
        );
        assert_eq!(words(PreTokenizer::Starcoder, "x 12"), ["x", " ", "1", "2"]);
    }

    #[test]
    fn deepseek_coder_splits_cjk_and_newlines() {
        // Later passes split earlier matches too: ` 你好` (space + letters)
        // loses its space to the CJK pass.
        assert_eq!(
            words(PreTokenizer::DeepseekCoder, "hi 你好\n!? 42"),
            ["hi", " ", "你好", "\n", "!?", " ", "4", "2"]
        );
    }

    #[test]
    fn pieces_cover_the_text() {
        let text = "  mixed: 你好, world!\r\n\t 1234 'll 🦙 ";
        for pre in [
            PreTokenizer::Default,
            PreTokenizer::Gpt2,
            PreTokenizer::Starcoder,
            PreTokenizer::Llama3,
            PreTokenizer::Qwen2,
            PreTokenizer::Qwen35,
            PreTokenizer::Falcon,
            PreTokenizer::DeepseekCoder,
        ] {
            assert_eq!(words(pre, text).concat(), text, "{pre:?}");
        }
    }
}
