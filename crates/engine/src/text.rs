//! A generation's text on its way to the sink: token bytes to whole UTF-8
//! characters, stop strings held back until they cannot match (and never
//! shown when they do), and text grouped so a sink hears from us at most
//! once per stream interval. One path for `run`, `chat` and `serve`.

use std::time::{Duration, Instant};

use tokenize::Utf8Buffer;

use crate::job::Sink;
use crate::stop::{StopConditions, StopMatcher};

pub(crate) struct TextOut {
    utf8: Utf8Buffer,
    matcher: StopMatcher,
    /// Text not yet sent, and when text last went out.
    pending: String,
    sent_at: Option<Instant>,
}

impl TextOut {
    pub(crate) fn new(stop: &StopConditions) -> TextOut {
        TextOut {
            utf8: Utf8Buffer::default(),
            matcher: stop.matcher(),
            pending: String::new(),
            sent_at: None,
        }
    }

    /// Add a token's bytes. Returns true when a stop string completed: the
    /// text before it has been sent, nothing after it will be.
    pub(crate) fn push(&mut self, piece: &[u8], sink: &mut dyn Sink, interval: Duration) -> bool {
        let text = self.utf8.push(piece);
        let mut shown = String::new();
        if self.matcher.push(&text, &mut shown) {
            self.pending.push_str(&shown);
            self.send_pending(sink);
            return true;
        }
        self.pending.push_str(&shown);
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
        self.pending.push_str(&shown);
        self.send_pending(sink);
    }

    /// Send the queued text, if any.
    pub(crate) fn send_pending(&mut self, sink: &mut dyn Sink) {
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
