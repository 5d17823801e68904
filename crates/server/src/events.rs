//! The engine's output for one request, as the HTTP side awaits it: the
//! job's [`Sink`] sends [`Event`]s down a tokio channel; the handler or
//! the SSE body receives them. A client that goes away drops the receiver,
//! which the sink reports as cancelled, so the engine frees the slot at its
//! next step.

use engine::{Finish, JobError, Sink, TokenLogprob};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// More text (never empty).
    Text(String),
    /// Log-probabilities of the tokens of the next `Text` (or, last, of
    /// tokens that print nothing), for a request that asked.
    Logprobs(Vec<TokenLogprob>),
    Done(Finish),
    Error(JobError),
}

pub struct ChannelSink(UnboundedSender<Event>);

/// A sink and the receiver of its events.
pub fn channel() -> (ChannelSink, UnboundedReceiver<Event>) {
    let (tx, rx) = unbounded_channel();
    (ChannelSink(tx), rx)
}

impl Sink for ChannelSink {
    fn text(&mut self, text: String) {
        let _ = self.0.send(Event::Text(text));
    }

    fn logprobs(&mut self, entries: Vec<TokenLogprob>) {
        let _ = self.0.send(Event::Logprobs(entries));
    }

    fn finish(&mut self, end: Result<Finish, JobError>) {
        let _ = self.0.send(match end {
            Ok(f) => Event::Done(f),
            Err(e) => Event::Error(e),
        });
    }

    fn cancelled(&self) -> bool {
        self.0.is_closed()
    }
}
