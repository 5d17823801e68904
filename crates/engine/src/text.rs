//! A generation's text on its way to the sink: token bytes to whole UTF-8
//! characters, stop strings held back until they cannot match (and never
//! shown when they do), and text grouped so a sink hears from us at most
//! once per stream interval. One path for `run`, `chat` and `serve`.
//!
//! A job's token log-probabilities travel with the text: each token
//! covers a span of the decoded text (empty while its bytes end inside a
//! character), and its entry goes out with the text that completes its
//! span, so a streamed chunk carries its own tokens.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokenize::Utf8Buffer;

use crate::job::Sink;
use crate::logprobs::TokenLogprob;
use crate::stop::{StopConditions, StopMatcher};

pub(crate) struct TextOut {
    utf8: Utf8Buffer,
    matcher: StopMatcher,
    /// Text not yet sent, and when text last went out.
    pending: String,
    sent_at: Option<Instant>,
    /// Bytes of text decoded so far, and of it shown (queued or sent):
    /// the shown text is always a prefix of the decoded text.
    decoded: usize,
    shown: usize,
    /// Log-probabilities not yet sent, each with the end of its token's
    /// span (its start is the entry's `offset`).
    entries: VecDeque<(TokenLogprob, usize)>,
    /// The text has ended (flushed, or cut by a stop string): every entry
    /// still held goes out with the last send.
    ended: bool,
}

impl TextOut {
    pub(crate) fn new(stop: &StopConditions) -> TextOut {
        TextOut {
            utf8: Utf8Buffer::default(),
            matcher: stop.matcher(),
            pending: String::new(),
            sent_at: None,
            decoded: 0,
            shown: 0,
            entries: VecDeque::new(),
            ended: false,
        }
    }

    /// Add a token's bytes (and its log-probabilities, if the job asked).
    /// Returns true when a stop string completed: the text before it has
    /// been sent, nothing after it will be.
    pub(crate) fn push(
        &mut self,
        piece: &[u8],
        logprob: Option<TokenLogprob>,
        sink: &mut dyn Sink,
        interval: Duration,
    ) -> bool {
        let text = self.utf8.push(piece);
        if let Some(mut e) = logprob {
            e.offset = self.decoded;
            self.entries.push_back((e, self.decoded + text.len()));
        }
        self.decoded += text.len();
        let mut shown = String::new();
        if self.matcher.push(&text, &mut shown) {
            self.show(&shown);
            // Tokens wholly inside the stop string are not part of the text.
            let cut = self.shown;
            self.entries.retain(|(e, _)| e.offset < cut);
            self.ended = true;
            self.send_pending(sink);
            return true;
        }
        self.show(&shown);
        if self.sent_at.is_none_or(|t| t.elapsed() >= interval) {
            self.send_pending(sink);
        }
        false
    }

    /// The end of a generation that no stop string cut: release what was
    /// held back (an incomplete character as U+FFFD) and send everything.
    pub(crate) fn flush(&mut self, sink: &mut dyn Sink) {
        let rest = self.utf8.finish();
        let mut shown = String::new();
        if !self.matcher.push(&rest, &mut shown) {
            self.matcher.finish(&mut shown);
        }
        self.show(&shown);
        self.ended = true;
        self.send_pending(sink);
    }

    fn show(&mut self, text: &str) {
        self.pending.push_str(text);
        self.shown += text.len();
    }

    /// Send the queued text, if any, after the log-probabilities of the
    /// tokens it completes.
    pub(crate) fn send_pending(&mut self, sink: &mut dyn Sink) {
        // A token is done when its span is shown, and a token of no text
        // so far (bytes ending inside a character) waits for the text
        // after it, so it goes out with the character it starts.
        let shown = self.shown;
        let done =
            |&(ref e, end): &(TokenLogprob, usize)| end < shown || (end == shown && e.offset < end);
        let n = if self.ended {
            self.entries.len()
        } else {
            self.entries.iter().take_while(|x| done(x)).count()
        };
        if n > 0 {
            sink.logprobs(self.entries.drain(..n).map(|(e, _)| e).collect());
        }
        if !self.pending.is_empty() {
            sink.text(std::mem::take(&mut self.pending));
            self.sent_at = Some(Instant::now());
        }
    }

    /// The stop string that ended the text, if one did.
    pub(crate) fn matched(&self) -> Option<&str> {
        self.matcher.matched()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Finish, JobError};

    #[derive(Default)]
    struct Events(Vec<String>);

    impl Sink for Events {
        fn text(&mut self, text: String) {
            self.0.push(format!("text {text}"));
        }
        fn logprobs(&mut self, entries: Vec<TokenLogprob>) {
            let at: Vec<String> = entries
                .iter()
                .map(|e| format!("{}@{}", e.token, e.offset))
                .collect();
            self.0.push(format!("logprobs {}", at.join(" ")));
        }
        fn finish(&mut self, _: Result<Finish, JobError>) {}
    }

    fn entry(token: u32) -> Option<TokenLogprob> {
        Some(TokenLogprob {
            token,
            bytes: Vec::new(),
            logprob: 0.0,
            top: Vec::new(),
            offset: usize::MAX,
        })
    }

    fn out(stops: &[&str]) -> TextOut {
        TextOut::new(&StopConditions {
            stop_strings: stops.iter().map(|s| s.to_string()).collect(),
            ..StopConditions::default()
        })
    }

    #[test]
    fn a_character_split_over_tokens_carries_all_its_tokens() {
        let (mut o, mut sink) = (out(&[]), Events::default());
        for (t, piece) in [&[0xE2u8][..], &[0x82], &[0xAC], b"a"].iter().enumerate() {
            o.push(piece, entry(t as u32), &mut sink, Duration::ZERO);
        }
        o.flush(&mut sink);
        assert_eq!(
            sink.0,
            ["logprobs 0@0 1@0 2@0", "text €", "logprobs 3@3", "text a"]
        );
    }

    #[test]
    fn tokens_inside_a_stop_string_are_dropped() {
        let (mut o, mut sink) = (out(&["bc"]), Events::default());
        o.push(b"a", entry(0), &mut sink, Duration::ZERO);
        o.push(b"b", entry(1), &mut sink, Duration::ZERO);
        assert!(o.push(b"cd", entry(2), &mut sink, Duration::ZERO));
        assert_eq!(sink.0, ["logprobs 0@0", "text a"]);
        // A token that starts before the stop string stays, its text cut.
        let (mut o, mut sink) = (out(&["bc"]), Events::default());
        o.push(b"ab", entry(0), &mut sink, Duration::ZERO);
        assert!(o.push(b"c", entry(1), &mut sink, Duration::ZERO));
        assert_eq!(sink.0, ["text a", "logprobs 0@0"]);
    }

    #[test]
    fn held_text_holds_its_entries_until_the_end() {
        let (mut o, mut sink) = (out(&["xyz"]), Events::default());
        o.push(b"a", entry(0), &mut sink, Duration::ZERO);
        o.push(b"x", entry(1), &mut sink, Duration::ZERO);
        o.push(b"y", entry(2), &mut sink, Duration::ZERO);
        assert_eq!(sink.0, ["logprobs 0@0", "text a"]);
        o.flush(&mut sink);
        assert_eq!(sink.0[2..], ["logprobs 1@1 2@2", "text xy"]);
    }
}
