//! The engine: everything between a model's logits and the text a caller
//! sees, once, for `run`, `chat` and `serve` alike.
//!
//! - [`scheduler`]: the generation loop. Slots each with a KV cache, a
//!   queue, one batched forward pass per step over every busy slot, prefix
//!   reuse, cancellation. `run` is one slot and one job, `chat` one slot
//!   kept across turns, `serve` N slots fed from a channel.
//! - [`job`]: what a caller submits ([`Job`]) and hears back through its
//!   [`Sink`]: text, then a [`Finish`] (with one [`FinishReason`]) or a
//!   [`JobError`]. Callers choose how to show those (exit codes, HTTP
//!   statuses); nothing here knows about HTTP or async.
//! - [`backend`]: what the scheduler needs from a model ([`Backend`]) and
//!   the real one over `model`'s forward pass ([`ModelBackend`]).
//! - [`constraint`]: structured output. A JSON schema or grammar compiled
//!   for the model's vocabulary ([`GrammarCompiler`], once per model) masks
//!   each step's logits and ends the job when the output is complete.
//! - [`embed`]: a text's vector, pooled from the last hidden states
//!   (`/v1/embeddings`), on a state of its own.
//! - [`logprobs`]: each generated token's log-probability and the best
//!   alternatives, for jobs that ask, and `logit_bias`.
//! - [`params`]: how a job generates ([`GenParams`]) and the one check of
//!   sampling settings the CLI and the server share ([`validate`]).
//! - [`prompt`]: text to prompt tokens, plain or through a chat template,
//!   and the ends of a chat turn a template implies.
//! - [`sample`], [`stop`], [`rng`]: the sampling chain with llama.cpp's
//!   semantics and the stop conditions that never leak a stop string.
//! - [`speculate`]: speculative decoding by prompt lookup: guesses from
//!   the sequence itself, checked in one batched pass; [`draft`]: guesses
//!   from a smaller draft model (`-md`), checked the same way.
//! - [`stats`]: counters for a server's `/metrics`.
//!
//! Running one prompt to the end:
//!
//! ```ignore
//! let mut scheduler = Scheduler::new(ModelBackend::new(cfg, &model, state, pool, None, &vocab))
//!     .with_stream_interval(Duration::ZERO);
//! let prompt = engine::prompt::completion_tokens(&vocab, "ROMEO:");
//! scheduler.submit(Job::new(0, prompt, GenParams::new(SamplerConfig::default()), Box::new(sink)));
//! scheduler.run_until_idle(); // the sink got the text and the finish
//! ```

pub mod backend;
pub mod constraint;
pub mod draft;
pub mod embed;
pub mod job;
pub mod logprobs;
pub mod memory;
pub mod params;
pub mod prompt;
pub mod rng;
pub mod sample;
pub mod scheduler;
pub mod speculate;
pub mod stats;
pub mod stop;
mod text;

pub use backend::{Backend, MemoryHost, ModelBackend};
pub use constraint::{Constraint, ConstraintError, ConstraintSpec, Grammar, GrammarCompiler};
pub use job::{Finish, FinishReason, Job, JobError, JobMemory, MemoryTarget, MemoryUse, Sink};
pub use logprobs::{TokenLogprob, TopLogprob};
pub use params::{validate, GenParams, SamplingError, SamplingParam};
pub use sample::{argmax, SampleError, Sampler, SamplerConfig};
pub use scheduler::{Msg, Scheduler, DEFAULT_STREAM_INTERVAL};
pub use stats::{SlotInfo, Snapshot, Stats};
pub use stop::{StopConditions, StopMatcher};
