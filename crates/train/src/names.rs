//! Invented names from a syllable generator, split for good into training
//! names and held-out names.
//!
//! A name is two or three syllables (onset, vowel, coda), four to nine
//! letters, e.g. `zorvath`, `quellen`. Which side a name falls on is a hash of its letters, not the
//! order it was drawn in, so the two sets are disjoint whatever the seed or
//! however many names a run draws. A name is never a word of the corpus or
//! of the task templates (checked case-insensitively), and never ends in
//! `s`, so a creature's plural (`vellocks`) cannot be another name.

use crate::rng::Rng;
use std::collections::HashSet;

const ONSETS: &[&str] = &[
    "", "b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "qu", "r", "s",
    "sk", "st", "t", "th", "tr", "v", "w", "z",
];
/// Onsets inside a name: single consonants, so syllables join smoothly.
const INNER_ONSETS: &[&str] = &[
    "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "th", "v", "w", "z",
];
/// Plain vowels weighted above the two-letter ones.
const VOWELS: &[&str] = &[
    "a", "a", "a", "e", "e", "e", "i", "i", "o", "o", "o", "u", "u", "ae", "ei", "ou", "y",
];
/// Codas inside a name, before the next syllable's onset (`zor|vath`).
const INNER_CODAS: &[&str] = &["", "", "", "l", "n", "r", "m"];
const CODAS: &[&str] = &[
    "", "", "l", "m", "n", "r", "th", "nd", "rn", "sk", "ck", "lv",
];
/// Longer names read as noise.
const MAX_LEN: usize = 9;

/// One name in this many is held out for evaluation.
const HELD_OUT_ONE_IN: u64 = 8;

/// Which side of the split a name (any case) is on.
pub fn is_held_out(name: &str) -> bool {
    // FNV-1a over the lower-case letters: fixed forever, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b.to_ascii_lowercase() as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.is_multiple_of(HELD_OUT_ONE_IN)
}

/// The side of the split a generator draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Train,
    HeldOut,
}

/// Draws lower-case names from one side of the split.
pub struct NameGen<'a> {
    side: Side,
    /// Lower-case words no name may be.
    forbidden: &'a HashSet<String>,
}

impl<'a> NameGen<'a> {
    pub fn new(side: Side, forbidden: &'a HashSet<String>) -> NameGen<'a> {
        NameGen { side, forbidden }
    }

    /// A fresh lower-case name not in `taken`.
    pub fn draw(&self, rng: &mut Rng, taken: &[String]) -> String {
        loop {
            let name = syllables(rng);
            if (4..=MAX_LEN).contains(&name.len())
                && !name.ends_with('s')
                && (self.side == Side::HeldOut) == is_held_out(&name)
                && !self.forbidden.contains(&name)
                && !taken.contains(&name)
            {
                return name;
            }
        }
    }
}

fn syllables(rng: &mut Rng) -> String {
    // Two syllables three times in four, else three.
    let n = if rng.below(4) == 0 { 3 } else { 2 };
    let mut name = String::new();
    for i in 0..n {
        name.push_str(rng.pick::<&str>(if i == 0 { ONSETS } else { INNER_ONSETS }));
        name.push_str(rng.pick::<&str>(VOWELS));
        name.push_str(rng.pick::<&str>(if i + 1 == n { CODAS } else { INNER_CODAS }));
    }
    name
}

/// `zorvath` → `Zorvath`.
pub fn capitalize(name: &str) -> String {
    let mut cs = name.chars();
    match cs.next() {
        Some(c) => c.to_uppercase().chain(cs).collect(),
        None => String::new(),
    }
}

/// The lower-case words of a text (runs of letters), for the forbidden set
/// and for checking that no held-out name leaks into training text.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphabetic())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_are_disjoint_and_names_are_fresh() {
        let forbidden: HashSet<String> = ["zorvath".to_string()].into();
        let train = NameGen::new(Side::Train, &forbidden);
        let held = NameGen::new(Side::HeldOut, &forbidden);
        let mut rng = Rng::new(3);
        let mut seen = Vec::new();
        for _ in 0..300 {
            let a = train.draw(&mut rng, &seen);
            assert!(!is_held_out(&a) && !a.ends_with('s') && a != "zorvath");
            seen.push(a);
            let b = held.draw(&mut rng, &seen);
            assert!(is_held_out(&b));
            seen.push(b);
        }
        let unique: HashSet<&String> = seen.iter().collect();
        assert_eq!(unique.len(), seen.len());
    }

    #[test]
    fn roughly_one_in_eight_is_held_out() {
        let mut rng = Rng::new(11);
        let names: Vec<String> = (0..8000).map(|_| syllables(&mut rng)).collect();
        let held = names.iter().filter(|n| is_held_out(n)).count();
        assert!((800..1200).contains(&held), "{held}");
    }

    #[test]
    fn words_are_lower_case_letter_runs() {
        let w: Vec<String> = words("Zorvath's bells, ring-ring!").collect();
        assert_eq!(w, ["zorvath", "s", "bells", "ring", "ring"]);
        assert_eq!(capitalize("quellen"), "Quellen");
    }
}
