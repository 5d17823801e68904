//! Corpus cleaning: what a book file carries that a model should not learn.
//!
//! In order: a byte-order mark goes; `\r\n` and lone `\r` become `\n`; a
//! Project Gutenberg file is cut to the text between its header and footer
//! markers; in every line tabs and other spaces become one plain space,
//! runs of spaces collapse, invisible characters (zero-width spaces, soft
//! hyphens, control characters) go, and the line is trimmed; runs of blank
//! lines become one, so paragraphs are separated by exactly one blank line
//! and the text ends with a single `\n`.
//!
//! Gutenberg markers, matched case-insensitively after the leading `*`s:
//! the header ends at `START OF THE PROJECT GUTENBERG EBOOK …` (or `THIS`)
//! and, in files from the 1990s, at `*END*THE SMALL PRINT! …`; the footer
//! starts at `END OF THE PROJECT GUTENBERG EBOOK …`, `END OF THIS PROJECT
//! GUTENBERG …` or `End of Project Gutenberg's …`, whichever comes first.

/// Where the Gutenberg markers were found (1-based line numbers of the
/// cleaned-up line endings), for the manifest and the user.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GutenbergCut {
    /// The line that ends the header (kept out), if any.
    pub header_end: Option<usize>,
    /// The line that starts the footer (kept out), if any.
    pub footer_start: Option<usize>,
}

impl GutenbergCut {
    pub fn found(&self) -> bool {
        self.header_end.is_some() || self.footer_start.is_some()
    }
}

/// Cleaned text and what was cut.
#[derive(Clone, Debug)]
pub struct Cleaned {
    pub text: String,
    pub gutenberg: GutenbergCut,
}

pub fn clean(raw: &str) -> Cleaned {
    let raw = raw.strip_prefix('\u{feff}').unwrap_or(raw);
    let unified = raw.replace("\r\n", "\n").replace('\r', "\n");
    let lines: Vec<&str> = unified.split('\n').collect();
    let gutenberg = find_gutenberg(&lines);
    let start = gutenberg.header_end.unwrap_or(0);
    let end = gutenberg.footer_start.map_or(lines.len(), |line| line - 1);

    let mut text = String::with_capacity(unified.len());
    let mut blank_run = true; // no blank lines at the start
    for line in &lines[start..end] {
        let line = clean_line(line);
        if line.is_empty() {
            blank_run = true;
            continue;
        }
        if blank_run && !text.is_empty() {
            text.push('\n');
        }
        blank_run = false;
        text.push_str(&line);
        text.push('\n');
    }
    Cleaned { text, gutenberg }
}

fn clean_line(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut pending_space = false;
    for c in line.chars() {
        if is_invisible(c) {
            continue;
        }
        if c.is_whitespace() {
            pending_space = true;
            continue;
        }
        if c.is_control() {
            continue;
        }
        if pending_space && !out.is_empty() {
            out.push(' ');
        }
        pending_space = false;
        out.push(c);
    }
    out
}

/// Characters that render as nothing: zero-width space and joiners, the
/// byte-order mark, the soft hyphen, the word joiner.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{200b}' | '\u{200c}' | '\u{200d}' | '\u{2060}' | '\u{feff}' | '\u{00ad}'
    )
}

/// The marker text of a line: upper case, without the `*`s and spaces
/// around it, inner whitespace collapsed.
fn marker_text(line: &str) -> String {
    line.trim()
        .trim_start_matches(['*', ' '])
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_uppercase()
}

fn is_header_end(line: &str) -> bool {
    let m = marker_text(line);
    m.starts_with("START OF THE PROJECT GUTENBERG")
        || m.starts_with("START OF THIS PROJECT GUTENBERG")
        || line.to_uppercase().contains("*END*THE SMALL PRINT")
        || line.to_uppercase().contains("*END THE SMALL PRINT")
}

fn is_footer_start(line: &str) -> bool {
    let m = marker_text(line);
    m.starts_with("END OF THE PROJECT GUTENBERG")
        || m.starts_with("END OF THIS PROJECT GUTENBERG")
        || m.starts_with("END OF PROJECT GUTENBERG")
}

fn find_gutenberg(lines: &[&str]) -> GutenbergCut {
    // The header ends at its last marker: old files have both a START line
    // and, after it, the small print.
    let mut header_end = None;
    for (i, line) in lines.iter().enumerate() {
        if is_footer_start(line) && header_end.is_some() {
            break;
        }
        if is_header_end(line) {
            header_end = Some(i + 1);
        }
    }
    let from = header_end.unwrap_or(0);
    let footer_start = lines[from..]
        .iter()
        .position(|l| is_footer_start(l))
        .map(|i| from + i + 1);
    GutenbergCut {
        header_end,
        footer_start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_line_endings_and_whitespace() {
        let raw = "\u{feff}\r\n\r\nFirst  Citizen:\t\r\nBefore we\u{a0}proceed \u{200b}any further.   \r\rAll:\rSpeak,\x07 speak.\n\n\n\n";
        assert_eq!(
            clean(raw).text,
            "First Citizen:\nBefore we proceed any further.\n\nAll:\nSpeak, speak.\n"
        );
    }

    #[test]
    fn blank_lines_collapse_and_text_ends_with_one_newline() {
        assert_eq!(clean("a\n \n\t\n\nb").text, "a\n\nb\n");
        assert_eq!(clean("").text, "");
        assert_eq!(clean(" \n\n").text, "");
    }

    #[test]
    fn cuts_modern_gutenberg_markers() {
        let raw = "The Project Gutenberg eBook of Tiny Book\n\
                   This eBook is for the use of anyone anywhere.\n\
                   *** START OF THE PROJECT GUTENBERG EBOOK TINY BOOK ***\n\
                   \n\
                   CHAPTER I\n\
                   It was a dark night.\n\
                   \n\
                   *** END OF THE PROJECT GUTENBERG EBOOK TINY BOOK ***\n\
                   Section 1. General Terms of Use\n";
        let cleaned = clean(raw);
        assert_eq!(cleaned.text, "CHAPTER I\nIt was a dark night.\n");
        assert_eq!(
            cleaned.gutenberg,
            GutenbergCut {
                header_end: Some(3),
                footer_start: Some(8)
            }
        );
    }

    #[test]
    fn cuts_old_small_print_and_this_project_variants() {
        let raw = "**The Project Gutenberg Etext of Old Book**\n\
                   **Welcome To The World of Free Plain Vanilla Electronic Texts**\n\
                   *END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\
                   Once upon a time.\n\
                   End of Project Gutenberg's Old Book, by Someone\n\
                   *** END OF THIS PROJECT GUTENBERG EBOOK OLD BOOK ***\n";
        let cleaned = clean(raw);
        assert_eq!(cleaned.text, "Once upon a time.\n");
        assert_eq!(cleaned.gutenberg.header_end, Some(3));
        assert_eq!(cleaned.gutenberg.footer_start, Some(5));

        let raw = "header\n***START OF THIS PROJECT GUTENBERG EBOOK X***\nbody\n";
        assert_eq!(clean(raw).text, "body\n");
    }

    #[test]
    fn plain_text_is_not_cut() {
        let cleaned = clean("To be, or not to be.\nThe end of it.\n");
        assert!(!cleaned.gutenberg.found());
        assert_eq!(cleaned.text, "To be, or not to be.\nThe end of it.\n");
    }
}
