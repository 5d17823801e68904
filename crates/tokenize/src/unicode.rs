//! Character classes for pre-tokenization and GPT-2's byte↔character map.
//!
//! llama.cpp reduces every code point to one category bit (`\p{L}`, `\p{N}`,
//! …) plus a whitespace bit; the pre-tokenizers only ever ask those
//! questions, so that is all we model. Categories come from the Unicode
//! general category, whitespace is the `White_Space` property (exactly the
//! set llama.cpp hard-codes, and what `char::is_whitespace` tests).

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// llama.cpp's `unicode_cpt_flags`, reduced to what the splitters use.
/// `Flags::NONE` stands for "past the end of the segment", which no class
/// matches (llama.cpp returns all-zero flags there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags(u16);

impl Flags {
    pub const NONE: Flags = Flags(0);
    const UNDEFINED: u16 = 1 << 0;
    const NUMBER: u16 = 1 << 1;
    const LETTER: u16 = 1 << 2;
    const SEPARATOR: u16 = 1 << 3;
    const MARK: u16 = 1 << 4;
    const PUNCTUATION: u16 = 1 << 5;
    const SYMBOL: u16 = 1 << 6;
    const CONTROL: u16 = 1 << 7;
    const WHITESPACE: u16 = 1 << 8;

    pub fn of(c: char) -> Flags {
        let category = match get_general_category(c) {
            G::UppercaseLetter
            | G::LowercaseLetter
            | G::TitlecaseLetter
            | G::ModifierLetter
            | G::OtherLetter => Self::LETTER,
            G::DecimalNumber | G::LetterNumber | G::OtherNumber => Self::NUMBER,
            G::NonspacingMark | G::SpacingMark | G::EnclosingMark => Self::MARK,
            G::ConnectorPunctuation
            | G::DashPunctuation
            | G::OpenPunctuation
            | G::ClosePunctuation
            | G::InitialPunctuation
            | G::FinalPunctuation
            | G::OtherPunctuation => Self::PUNCTUATION,
            G::MathSymbol | G::CurrencySymbol | G::ModifierSymbol | G::OtherSymbol => Self::SYMBOL,
            G::SpaceSeparator | G::LineSeparator | G::ParagraphSeparator => Self::SEPARATOR,
            G::Control | G::Format | G::Surrogate | G::PrivateUse => Self::CONTROL,
            // Unassigned, and any category a later Unicode adds.
            _ => Self::UNDEFINED,
        };
        let ws = if c.is_whitespace() {
            Self::WHITESPACE
        } else {
            0
        };
        Flags(category | ws)
    }

    /// Flags of `c`, or `NONE` when there is no character.
    pub fn of_opt(c: Option<char>) -> Flags {
        c.map_or(Flags::NONE, Flags::of)
    }

    pub fn is_none(self) -> bool {
        self.0 == 0
    }
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub fn is_mark(self) -> bool {
        self.0 & Self::MARK != 0
    }
    pub fn is_punctuation(self) -> bool {
        self.0 & Self::PUNCTUATION != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
}

/// Bytes GPT-2 keeps as their own character; the rest are shifted to
/// U+0100.. so that every byte has a visible, non-space character.
const fn keeps_own_char(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

const BYTE_TO_CHAR: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut shifted = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let cp = if keeps_own_char(b as u8) {
            b as u32
        } else {
            shifted += 1;
            255 + shifted
        };
        table[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => panic!("byte map code points are all valid"),
        };
        b += 1;
    }
    table
};

/// The character GPT-2's byte-level BPE writes for `byte`.
pub(crate) fn byte_to_char(byte: u8) -> char {
    BYTE_TO_CHAR[byte as usize]
}

/// Inverse of [`byte_to_char`]; `None` for characters outside the map.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 && keeps_own_char(cp as u8) {
        return Some(cp as u8);
    }
    if !(256..256 + 68).contains(&cp) {
        return None;
    }
    // The n-th byte that does not keep its own character maps to 256 + n.
    let n = (cp - 256) as usize;
    (0u8..=255).filter(|&b| !keeps_own_char(b)).nth(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_round_trips_and_matches_gpt2() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b), "byte {b:#x}");
        }
        // The well-known ones: space is `Ġ`, newline `Ċ`, 0xAD is the last shifted.
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte('€'), None);
    }

    #[test]
    fn flags_follow_categories_and_white_space() {
        assert!(
            Flags::of('a').is_letter() && Flags::of('ж').is_letter() && Flags::of('天').is_letter()
        );
        assert!(
            Flags::of('7').is_number() && Flags::of('½').is_number() && Flags::of('٣').is_number()
        );
        assert!(Flags::of('!').is_punctuation() && Flags::of('、').is_punctuation());
        assert!(!Flags::of('$').is_punctuation() && !Flags::of('$').is_letter());
        for c in [
            '\t', '\n', '\x0B', '\x0C', '\r', ' ', '\u{85}', '\u{A0}', '\u{3000}',
        ] {
            assert!(Flags::of(c).is_whitespace(), "{c:?}");
        }
        // Python's `\s` also takes the information separators; llama.cpp does not.
        assert!(!Flags::of('\x1C').is_whitespace());
        assert!(Flags::NONE.is_none() && !Flags::of('\u{E000}').is_none());
    }
}
