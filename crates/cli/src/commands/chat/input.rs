//! What the user types, turned into messages and commands.
//!
//! One line is one message. A line ending in `\` continues on the next
//! (llama.cpp's multiline input), and a block opened by a line starting with
//! `"""` runs until a line ending with `"""` (for pasting text whose lines
//! end in `\`, or that starts with `/`). Outside those, a lone `/word` is a
//! command. The reader is generic over `BufRead` so the same rules hold for a
//! terminal and for messages piped in.

use std::io::{self, BufRead, Read, Write};

/// Opens and closes a block of lines taken as they are.
pub const FENCE: &str = "\"\"\"";

/// What one read produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    Message(String),
    Command(Command),
    /// End of input (Ctrl-D on a terminal).
    Eof,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// `/clear`: forget the conversation, keep the system prompt.
    Clear,
    /// `/exit` or `/quit`.
    Exit,
    /// `/help`.
    Help,
    /// A `/word` we do not know, without the slash.
    Unknown(String),
}

pub struct InputReader<R> {
    reader: R,
    /// Show `> ` and `... ` on stderr before lines (on a terminal).
    prompts: bool,
    /// Most bytes one message may take ([`InputReader::with_limit`]).
    max_bytes: u64,
    /// Bytes of the message being read so far.
    used: u64,
}

impl<R: BufRead> InputReader<R> {
    pub fn new(reader: R, prompts: bool) -> InputReader<R> {
        InputReader {
            reader,
            prompts,
            max_bytes: u64::MAX,
            used: 0,
        }
    }

    /// Refuse a message longer than `max_bytes` with an error instead of
    /// reading on (a line of `/dev/zero` has no end).
    pub fn with_limit(mut self, max_bytes: usize) -> InputReader<R> {
        self.max_bytes = max_bytes as u64;
        self
    }

    /// The next message or command; blank messages are skipped.
    pub fn next(&mut self) -> io::Result<Input> {
        loop {
            self.used = 0;
            self.prompt("> ");
            let Some(line) = self.line()? else {
                return Ok(Input::Eof);
            };
            if let Some(command) = command(&line) {
                return Ok(Input::Command(command));
            }
            let text = match line.trim_start().strip_prefix(FENCE) {
                Some(rest) => self.block(rest)?,
                None => self.continued(line)?,
            };
            let text = text.trim_matches(|c| c == '\n' || c == '\r');
            if !text.trim().is_empty() {
                return Ok(Input::Message(text.to_string()));
            }
        }
    }

    /// `first` and the lines after it while each ends with `\`.
    fn continued(&mut self, first: String) -> io::Result<String> {
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
                    return Ok(text);
                }
            }
            self.prompt("... ");
            match self.line()? {
                Some(next) => line = next,
                None => return Ok(text),
            }
        }
    }

    /// The rest of a block whose opening line continued with `rest`.
    fn block(&mut self, rest: &str) -> io::Result<String> {
        if let Some(whole) = rest.trim_end().strip_suffix(FENCE) {
            return Ok(whole.to_string());
        }
        let mut lines = vec![rest.to_string()];
        loop {
            self.prompt("... ");
            let Some(line) = self.line()? else {
                // An unclosed block at the end of input still counts.
                break;
            };
            if let Some(last) = line.trim_end().strip_suffix(FENCE) {
                lines.push(last.to_string());
                break;
            }
            lines.push(line);
        }
        Ok(lines.join("\n"))
    }

    /// One line without its line ending; None at end of input. Bytes that
    /// are not UTF-8 become U+FFFD rather than ending the chat.
    fn line(&mut self) -> io::Result<Option<String>> {
        let mut buf = Vec::new();
        let left = self.max_bytes - self.used;
        let n = (&mut self.reader)
            .take(left.saturating_add(1))
            .read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        self.used += n as u64;
        if self.used > self.max_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a message is longer than {} bytes, more than the context can hold",
                    self.max_bytes
                ),
            ));
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        }
        Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
    }

    fn prompt(&self, text: &str) {
        if self.prompts {
            let mut err = io::stderr().lock();
            // A prompt that cannot be shown is no reason to stop reading.
            let _ = err.write_all(text.as_bytes());
            let _ = err.flush();
        }
    }
}

/// `/word` alone on a line (letters only, so `/usr/bin` is a message).
fn command(line: &str) -> Option<Command> {
    let word = line.trim().strip_prefix('/')?;
    if word.is_empty() || !word.chars().all(|c| c.is_ascii_alphabetic()) {
        return None;
    }
    Some(match word {
        "clear" => Command::Clear,
        "exit" | "quit" => Command::Exit,
        "help" => Command::Help,
        _ => Command::Unknown(word.to_string()),
    })
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
