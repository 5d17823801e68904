//! What a caller hands the scheduler ([`Job`]) and what it gets back
//! through its [`Sink`]: text as it is generated, then one end.
//!
//! `run` writes to stdout from its sink, `chat` the same plus a transcript,
//! the server forwards to a channel. Nothing here knows about HTTP: the
//! server chooses status codes from [`JobError`] and [`FinishReason`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::logprobs::TokenLogprob;
use crate::memory::{MemorySession, View};
use crate::params::GenParams;

/// Where a job's output goes. Called on the scheduler's thread.
pub trait Sink: Send {
    /// More text of the generation (never empty).
    fn text(&mut self, text: String);
    /// Log-probabilities of generated tokens, in order, for a job that
    /// asked ([`GenParams::logprobs`]): sent just before the
    /// [`Sink::text`] that completes their text, or alone at the end for
    /// tokens that print nothing. A token wholly inside a stop string is
    /// never sent (one that starts before it is).
    fn logprobs(&mut self, entries: Vec<TokenLogprob>) {
        let _ = entries;
    }
    /// The end, exactly once: how the generation finished, or why it could
    /// not run.
    fn finish(&mut self, end: Result<Finish, JobError>);
    /// Whoever waits for the output is gone (a client disconnected, Ctrl-C):
    /// the scheduler ends the job at its next step with
    /// [`FinishReason::Cancelled`].
    fn cancelled(&self) -> bool {
        false
    }
}

/// A request for the scheduler: a tokenized prompt, how to generate, and
/// where to send the output.
pub struct Job {
    /// Increasing in arrival order (the queue and prefill go oldest first).
    pub id: u64,
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub sink: Box<dyn Sink>,
    pub queued_at: Instant,
    /// A long memory the prompt sees (and, with `append`, is added to).
    pub memory: Option<JobMemory>,
    /// Another choice of the same request ([`crate::Scheduler::submit_choices`]):
    /// the id of the job whose prompt reading this one shares.
    pub(crate) follows: Option<u64>,
}

/// A job's long memory: the history the prompt sees before itself
/// ([`crate::memory::assemble`], done when the job is admitted), and
/// whether the turn (the prompt and what was generated, with the token
/// that ended it) is appended and committed when it ends.
pub struct JobMemory {
    pub target: MemoryTarget,
    pub append: bool,
    /// Set on admission: the session, the prompt as given (the job's
    /// prompt becomes the memory's context followed by it), and what the
    /// prompt saw.
    pub(crate) session: Option<Arc<Mutex<MemorySession>>>,
    pub(crate) turn: Option<Vec<u32>>,
    pub(crate) view: Option<View>,
}

/// Which memory a job sees.
pub enum MemoryTarget {
    /// One the caller opened.
    Session(Arc<Mutex<MemorySession>>),
    /// A file the scheduler opens (or makes) through its
    /// [`crate::memory::Memories`] (a server's per-conversation files).
    File(std::path::PathBuf),
}

impl JobMemory {
    /// A memory the caller opened.
    pub fn new(session: Arc<Mutex<MemorySession>>, append: bool) -> JobMemory {
        JobMemory::with_target(MemoryTarget::Session(session), append)
    }

    /// The memory file at `path`, opened or made by the scheduler.
    pub fn file(path: std::path::PathBuf, append: bool) -> JobMemory {
        JobMemory::with_target(MemoryTarget::File(path), append)
    }

    fn with_target(target: MemoryTarget, append: bool) -> JobMemory {
        JobMemory {
            target,
            append,
            session: None,
            turn: None,
            view: None,
        }
    }
}

impl Job {
    pub fn new(id: u64, prompt: Vec<u32>, params: GenParams, sink: Box<dyn Sink>) -> Job {
        Job {
            id,
            prompt,
            params,
            sink,
            queued_at: Instant::now(),
            memory: None,
            follows: None,
        }
    }

    pub fn with_memory(mut self, memory: JobMemory) -> Job {
        self.memory = Some(memory);
        self
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.id)
            .field("prompt_tokens", &self.prompt.len())
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model sampled an end-of-generation token.
    EndOfGeneration,
    /// The text reached one of the stop strings (not included in the output).
    StopString,
    /// `max_tokens` were generated.
    Length,
    /// The slot's context is full.
    ContextFull,
    /// The sink said nobody waits any more (Ctrl-C, a client that left).
    Cancelled,
    /// The output is complete: the job's grammar ([`GenParams::constraint`])
    /// allows nothing more.
    GrammarComplete,
}

impl FinishReason {
    /// A short lowercase name for logs and JSON.
    pub fn name(self) -> &'static str {
        match self {
            FinishReason::EndOfGeneration => "eog",
            FinishReason::StopString => "stop",
            FinishReason::Length => "length",
            FinishReason::ContextFull => "context",
            FinishReason::Cancelled => "cancelled",
            FinishReason::GrammarComplete => "grammar",
        }
    }
}

/// The end of a job, with its token counts and times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    pub reason: FinishReason,
    /// The stop string that ended it, for [`FinishReason::StopString`].
    pub stop_string: Option<String>,
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V the slot already held (not evaluated again).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// The seed the sampler drew with (chosen at random when not given).
    pub seed: u32,
    /// From taking a slot to the first sampled token: reading the prompt.
    pub prompt_time: Duration,
    /// From the first sampled token to the end.
    pub generation_time: Duration,
    /// What a long memory gave the prompt, and the tokens appended to it.
    pub memory: Option<MemoryUse>,
    /// What speculative decoding guessed and kept (zeros without it).
    pub speculation: crate::speculate::SpecStats,
}

/// What a job's long memory did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryUse {
    /// Tokens of history when the job started.
    pub history_tokens: u64,
    /// The context the prompt saw: `sinks + hot + recalled` tokens.
    pub view: View,
    /// Tokens appended when the job ended (0 without `append`).
    pub appended: usize,
}

/// Why a job could not run (its sink gets this instead of a [`Finish`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    #[error("the prompt is empty (no tokens)")]
    EmptyPrompt,
    #[error(
        "the prompt is {tokens} tokens, which leaves no room to generate in a context of {n_ctx}"
    )]
    PromptTooLong { tokens: usize, n_ctx: usize },
    #[error("token {token} of the prompt is outside the model's vocabulary of {n_vocab}")]
    TokenOutOfRange { token: u32, n_vocab: usize },
    #[error("{0}")]
    ShuttingDown(String),
    #[error("internal error while generating")]
    Internal,
    #[error("long memory: {0}")]
    Memory(String),
    /// The job's grammar failed while generating (a limit of the parser).
    #[error("structured output: {0}")]
    Constraint(String),
}
