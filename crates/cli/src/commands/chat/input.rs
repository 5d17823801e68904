//! What the user types, turned into messages and commands.
//!
//! One line is one message. A line ending in `\` continues on the next
//! (llama.cpp's multiline input), and a block opened by a line starting with
//! `"""` runs until a line ending with `"""` (for pasting text whose lines
//! end in `\`, or that starts with `/`). Outside those, a lone `/word` is a
//! command (`/save` and `/load` take a file name after it). The rules are
//! the same whichever [`LineSource`] the lines come from: a plain reader
//! (piped messages, tests) or the line editor on a terminal
//! ([`super::editor`]).

use std::io::{self, BufRead, Read, Write};
use std::path::PathBuf;

/// Opens and closes a block of lines taken as they are.
pub const FENCE: &str = "\"\"\"";

/// What one read produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    Message(String),
    Command(Command),
    /// End of input (Ctrl-D on a terminal).
    Eof,
    /// Ctrl-C at an empty prompt (only the line editor reports it).
    Interrupted,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// `/clear`: forget the conversation, keep the system prompt.
    Clear,
    /// `/exit` or `/quit`.
    Exit,
    /// `/help`.
    Help,
    /// `/save FILE`: write the conversation as JSON (None: no file given).
    Save(Option<PathBuf>),
    /// `/load FILE`: replace the conversation with a saved one.
    Load(Option<PathBuf>),
    /// A `/word` we do not know, without the slash.
    Unknown(String),
}

/// Which prompt a line is read after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// The start of a message: `> `.
    First,
    /// A continued line or a line of a block: `... `.
    More,
}

impl Prompt {
    pub fn text(self) -> &'static str {
        match self {
            Prompt::First => "> ",
            Prompt::More => "... ",
        }
    }
}

/// One line from a [`LineSource`].
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// The line without its ending, and the bytes it took with it.
    Text {
        text: String,
        bytes: u64,
    },
    Eof,
    /// Ctrl-C on an empty line.
    Interrupted,
}

/// Where lines come from.
pub trait LineSource {
    /// The next line, read after showing `prompt`. A source that reads raw
    /// bytes stops a little past `limit` so an endless line cannot fill
    /// memory (the reader then refuses the message).
    fn read_line(&mut self, prompt: Prompt, limit: u64) -> io::Result<Line>;
}

impl LineSource for Box<dyn LineSource> {
    fn read_line(&mut self, prompt: Prompt, limit: u64) -> io::Result<Line> {
        (**self).read_line(prompt, limit)
    }
}

/// Lines from any `BufRead` (a pipe, a file, a terminal the editor cannot
/// drive), with the prompts on stderr when asked for.
pub struct Plain<R> {
    reader: R,
    prompts: bool,
}

impl<R: BufRead> Plain<R> {
    pub fn new(reader: R, prompts: bool) -> Plain<R> {
        Plain { reader, prompts }
    }
}

impl<R: BufRead> LineSource for Plain<R> {
    /// Bytes that are not UTF-8 become U+FFFD rather than ending the chat.
    fn read_line(&mut self, prompt: Prompt, limit: u64) -> io::Result<Line> {
        if self.prompts {
            let mut err = io::stderr().lock();
            // A prompt that cannot be shown is no reason to stop reading.
            let _ = err.write_all(prompt.text().as_bytes());
            let _ = err.flush();
        }
        let mut buf = Vec::new();
        let n = (&mut self.reader)
            .take(limit.saturating_add(1))
            .read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Ok(Line::Eof);
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        }
        Ok(Line::Text {
            text: String::from_utf8_lossy(&buf).into_owned(),
            bytes: n as u64,
        })
    }
}

pub struct InputReader<S> {
    source: S,
    /// Most bytes one message may take ([`InputReader::with_limit`]).
    max_bytes: u64,
    /// Bytes of the message being read so far.
    used: u64,
}

// Tests read strings; the command builds its source first.
#[cfg(test)]
impl<R: BufRead> InputReader<Plain<R>> {
    /// Read `reader`; `prompts`: show `> ` and `... ` on stderr before lines.
    pub fn new(reader: R, prompts: bool) -> InputReader<Plain<R>> {
        InputReader::from_source(Plain::new(reader, prompts))
    }
}

/// A line the message being read was abandoned at (Ctrl-C at `... `).
struct Abandoned;

impl<S: LineSource> InputReader<S> {
    pub fn from_source(source: S) -> InputReader<S> {
        InputReader {
            source,
            max_bytes: u64::MAX,
            used: 0,
        }
    }

    /// Refuse a message longer than `max_bytes` with an error instead of
    /// reading on (a line of `/dev/zero` has no end).
    pub fn with_limit(mut self, max_bytes: usize) -> InputReader<S> {
        self.max_bytes = max_bytes as u64;
        self
    }

    /// The next message or command; blank messages are skipped, and so is a
    /// message abandoned with Ctrl-C halfway.
    pub fn next(&mut self) -> io::Result<Input> {
        loop {
            self.used = 0;
            let line = match self.line(Prompt::First)? {
                Line::Text { text, .. } => text,
                Line::Eof => return Ok(Input::Eof),
                Line::Interrupted => return Ok(Input::Interrupted),
            };
            if let Some(command) = command(&line) {
                return Ok(Input::Command(command));
            }
            let text = match line.trim_start().strip_prefix(FENCE) {
                Some(rest) => self.block(rest)?,
                None => self.continued(line)?,
            };
            let Ok(text) = text else { continue };
            let text = text.trim_matches(|c| c == '\n' || c == '\r');
            if !text.trim().is_empty() {
                return Ok(Input::Message(text.to_string()));
            }
        }
    }

    /// `first` and the lines after it while each ends with `\`.
    fn continued(&mut self, first: String) -> io::Result<Result<String, Abandoned>> {
        let mut text = String::new();
        let mut line = first;
        loop {
            match line.strip_suffix('\\') {
                Some(head) => {
                    text.push_str(head);
                    text.push('\n');
                }
                None => {
                    text.push_str(&line);
                    return Ok(Ok(text));
                }
            }
            match self.line(Prompt::More)? {
                Line::Text { text: next, .. } => line = next,
                Line::Eof => return Ok(Ok(text)),
                Line::Interrupted => return Ok(Err(Abandoned)),
            }
        }
    }

    /// The rest of a block whose opening line continued with `rest`.
    fn block(&mut self, rest: &str) -> io::Result<Result<String, Abandoned>> {
        if let Some(whole) = rest.trim_end().strip_suffix(FENCE) {
            return Ok(Ok(whole.to_string()));
        }
        let mut lines = vec![rest.to_string()];
        loop {
            let line = match self.line(Prompt::More)? {
                Line::Text { text, .. } => text,
                // An unclosed block at the end of input still counts.
                Line::Eof => break,
                Line::Interrupted => return Ok(Err(Abandoned)),
            };
            if let Some(last) = line.trim_end().strip_suffix(FENCE) {
                lines.push(last.to_string());
                break;
            }
            lines.push(line);
        }
        Ok(Ok(lines.join("\n")))
    }

    /// One line from the source, counted against the message's budget.
    fn line(&mut self, prompt: Prompt) -> io::Result<Line> {
        let left = self.max_bytes - self.used;
        let line = self.source.read_line(prompt, left)?;
        if let Line::Text { bytes, .. } = &line {
            self.used = self.used.saturating_add(*bytes);
            if self.used > self.max_bytes {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "a message is longer than {} bytes, more than the context can hold",
                        self.max_bytes
                    ),
                ));
            }
        }
        Ok(line)
    }
}

/// `/word` alone on a line (letters only, so `/usr/bin` is a message), or
/// `/save FILE` and `/load FILE`. Other words followed by text are
/// messages (`/clear the table`).
fn command(line: &str) -> Option<Command> {
    let rest = line.trim().strip_prefix('/')?;
    let (word, arg) = match rest.split_once(char::is_whitespace) {
        Some((word, arg)) => (word, arg.trim()),
        None => (rest, ""),
    };
    if word.is_empty() || !word.chars().all(|c| c.is_ascii_alphabetic()) {
        return None;
    }
    let file = || (!arg.is_empty()).then(|| expand_home(arg));
    Some(match word {
        "save" => Command::Save(file()),
        "load" => Command::Load(file()),
        _ if !arg.is_empty() => return None,
        "clear" => Command::Clear,
        "exit" | "quit" => Command::Exit,
        "help" => Command::Help,
        _ => Command::Unknown(word.to_string()),
    })
}

/// `~/x` as the shell would have it (the command line is not a shell).
fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(text: &str) -> Vec<Input> {
        let mut r = InputReader::new(text.as_bytes(), false);
        let mut out = Vec::new();
        loop {
            let input = r.next().unwrap();
            let eof = input == Input::Eof;
            out.push(input);
            if eof {
                return out;
            }
        }
    }

    fn msg(s: &str) -> Input {
        Input::Message(s.to_string())
    }

    /// Issue 19: `chat < /dev/zero` read one endless line.
    #[test]
    fn a_message_over_the_limit_is_an_error_not_a_growing_buffer() {
        let endless = std::io::BufReader::new(std::io::repeat(0));
        let mut r = InputReader::new(endless, false).with_limit(1000);
        let e = r.next().unwrap_err();
        assert!(e.to_string().contains("longer than 1000 bytes"), "{e}");
        // A fenced block counts every line.
        let block = format!("{FENCE}\n{}{FENCE}\n", "line\n".repeat(300));
        let mut r = InputReader::new(block.as_bytes(), false).with_limit(1000);
        assert!(r.next().is_err());
        // Each message has its own budget.
        let two = format!("{}\n{}\n", "a".repeat(900), "b".repeat(900));
        let mut r = InputReader::new(two.as_bytes(), false).with_limit(1000);
        assert_eq!(r.next().unwrap(), msg(&"a".repeat(900)));
        assert_eq!(r.next().unwrap(), msg(&"b".repeat(900)));
    }

    #[test]
    fn lines_commands_and_blanks() {
        assert_eq!(
            read_all("hi\r\n\n   \n/clear\n /exit \n/quit\n/help\n/what\n/usr/bin\nlast"),
            vec![
                msg("hi"),
                Input::Command(Command::Clear),
                Input::Command(Command::Exit),
                Input::Command(Command::Exit),
                Input::Command(Command::Help),
                Input::Command(Command::Unknown("what".into())),
                msg("/usr/bin"),
                msg("last"),
                Input::Eof,
            ]
        );
    }

    #[test]
    fn save_and_load_take_a_file() {
        assert_eq!(
            read_all("/save chat.json\n /load  my chat.json \n/save\n/load\n/clear the table\n"),
            vec![
                Input::Command(Command::Save(Some("chat.json".into()))),
                Input::Command(Command::Load(Some("my chat.json".into()))),
                Input::Command(Command::Save(None)),
                Input::Command(Command::Load(None)),
                msg("/clear the table"),
                Input::Eof,
            ]
        );
    }

    /// Lines handed over one by one, as the line editor does.
    struct Scripted(Vec<Line>);

    impl LineSource for Scripted {
        fn read_line(&mut self, _: Prompt, _: u64) -> io::Result<Line> {
            Ok(if self.0.is_empty() {
                Line::Eof
            } else {
                self.0.remove(0)
            })
        }
    }

    #[test]
    fn ctrl_c_abandons_a_message_or_reports_the_empty_prompt() {
        let text = |t: &str| Line::Text {
            text: t.into(),
            bytes: t.len() as u64 + 1,
        };
        let lines = vec![
            text("half\\"),
            Line::Interrupted,
            text("\"\"\"block"),
            Line::Interrupted,
            text("whole"),
            Line::Interrupted,
        ];
        let mut r = InputReader::from_source(Scripted(lines));
        assert_eq!(r.next().unwrap(), msg("whole"));
        assert_eq!(r.next().unwrap(), Input::Interrupted);
        assert_eq!(r.next().unwrap(), Input::Eof);
    }

    #[test]
    fn backslash_continues() {
        assert_eq!(
            read_all("one\\\ntwo\\\nthree\nfour\\"),
            vec![msg("one\ntwo\nthree"), msg("four"), Input::Eof]
        );
        // A continued line is never a command.
        assert_eq!(
            read_all("/clear\\\nplease\n"),
            vec![msg("/clear\nplease"), Input::Eof]
        );
    }

    #[test]
    fn fenced_blocks() {
        assert_eq!(
            read_all("\"\"\"\nfn f() {\\\n/clear\n}\n\"\"\"\nafter\n"),
            vec![msg("fn f() {\\\n/clear\n}"), msg("after"), Input::Eof]
        );
        assert_eq!(
            read_all("\"\"\"first\nlast\"\"\"\n\"\"\"one line\"\"\"\n\"\"\"unclosed\nend"),
            vec![
                msg("first\nlast"),
                msg("one line"),
                msg("unclosed\nend"),
                Input::Eof
            ]
        );
    }
}
