//! The one generation loop: slots, a FIFO queue, and one batched forward
//! pass per step across every busy slot (continuous batching). `cachefit
//! run` is one slot and one job; `chat` one slot kept across turns (its
//! prefix reuse is the scheduler's); `serve` N slots fed from a channel.
//!
//! A caller submits [`Job`]s ([`Scheduler::submit`], or [`Msg`]s over a
//! std channel to [`Scheduler::run`] on a thread of its own) and gets text,
//! then one end, through the job's [`Sink`]. Between steps a job may join
//! (a free slot takes the head of the queue) or leave (finished, or its
//! sink says it was cancelled), so nothing waits for the slowest
//! generation of a batch.
//!
//! A step builds one batch of [`model::Token`]s:
//!
//! ```text
//! decode:  the token each generating slot sampled last     1 per slot, logits
//!          and its guesses of what follows (prompt lookup,  0..draft_max, logits
//!          `speculate`; only rows matching what is sampled
//!          are kept)
//! prefill: prompt tokens of slots still reading, oldest    up to n_batch in all,
//!          job first, in chunks                            logits on a prompt's last
//! ```
//!
//! and evaluates it with [`Backend::eval`]; each logits row goes to its
//! slot's sampler. Decode tokens come first so a long prompt arriving never
//! stalls the slots that are already streaming by more than one chunk.
//!
//! Each slot keeps the tokens whose K/V its cache holds. A new job goes to
//! the free slot sharing the longest prefix with its prompt (least recently
//! used on a tie) and continues from there; that prefix is reported as
//! `cached_tokens`. At least the prompt's last token is always evaluated,
//! for its logits.
//!
//! The choices of one request ([`Scheduler::submit_choices`], OpenAI's
//! `n`) read the prompt once: the first takes a slot and reads it, the
//! others wait on free slots, and when the prompt's last token is
//! evaluated each gets a copy of the first's cache ([`Backend::copy_seq`])
//! and draws its first token from the same row of logits
//! (`scheduler/choices.rs`).
//!
//! Determinism: every logits row depends only on its own sequence (the
//! model's kernels give bit-identical rows whatever else is in the batch),
//! so a greedy generation is the same alone or among fifteen others, and
//! the same through `run`, `chat` and `serve`.

use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use model::Token;

use crate::backend::Backend;
use crate::constraint::Constraint;
use crate::job::{Finish, FinishReason, Job, JobError, MemoryTarget, MemoryUse};
use crate::logprobs;
use crate::memory::Memories;
use crate::sample::Sampler;
use crate::speculate::{SpecStats, Throttle};
use crate::stats::{SlotInfo, Stats};
use crate::stop::StopConditions;
use crate::text::TextOut;

/// What a submitting thread sends to [`Scheduler::run`].
#[derive(Debug)]
pub enum Msg {
    Job(Box<Job>),
    /// The choices of one request (see [`Scheduler::submit_choices`]).
    Choices(Vec<Job>),
    /// End every queued and running job now (a server's shutdown deadline),
    /// saying why.
    CancelAll(String),
}

/// A job running on a slot.
struct Active {
    job: Box<Job>,
    /// Prompt tokens found in the slot's cache when the job started.
    cached: usize,
    sampler: Sampler,
    stop: StopConditions,
    out: TextOut,
    generated: usize,
    /// The token sampled last, to evaluate next step (none while the
    /// prompt is still being read).
    next: Option<u32>,
    started_at: Instant,
    first_token_at: Option<Instant>,
    /// What the job's memory gave it (see [`Job::memory`]).
    memory: Option<MemoryUse>,
    /// The tokens sampled, for a memory the turn is appended to.
    sampled: Vec<u32>,
    /// Another choice's slot and job id, while this choice waits for
    /// that one to read their shared prompt.
    waits_for: Option<(usize, u64)>,
    /// Structured output: the job's grammar, where its output has got to.
    constraint: Option<Constraint>,
    /// Speculation (see [`crate::speculate`]): this step's guesses after
    /// `next`, evaluated at the positions after `draft_at` (`next`'s),
    /// and how many of their rows were handled (past `draft.len()`: the
    /// rest were rejected, or the job ended).
    draft: Vec<u32>,
    draft_at: usize,
    verified: usize,
    /// Guesses of this step's draft accepted so far.
    draft_accepted: usize,
    throttle: Throttle,
    spec: SpecStats,
}

impl Active {
    fn finish(&self, reason: FinishReason) -> Finish {
        let now = Instant::now();
        let first = self.first_token_at.unwrap_or(now);
        Finish {
            reason,
            stop_string: self.out.matched().map(str::to_owned),
            prompt_tokens: self.job.prompt.len(),
            cached_tokens: self.cached,
            completion_tokens: self.generated,
            seed: self.sampler.seed(),
            prompt_time: first.duration_since(self.started_at),
            generation_time: now.duration_since(first),
            memory: self.memory.clone(),
            speculation: self.spec,
        }
    }
}

/// Text generated within this long of the last send waits for the next one
/// (or the end), unless [`Scheduler::with_stream_interval`] says otherwise:
/// a model at thousands of tokens per second would otherwise wake a
/// server's HTTP thread and the client once per token, and on a small
/// machine those wake-ups preempt the engine's threads (one lane of a
/// two-lane pass stalled, the other waiting for it). 10 ms is below a
/// screen frame; against 2 ms it gave 4 clients of the built-in model ~20%
/// more tokens/s on the 2-core test machine (docs/PERFORMANCE.md). `run`
/// and `chat` print every token at once (zero).
pub const DEFAULT_STREAM_INTERVAL: Duration = Duration::from_millis(10);

struct Slot {
    /// Tokens whose K/V the slot's cache holds, at positions `0..len`.
    cache: Vec<u32>,
    active: Option<Active>,
    /// Step at which the slot last took a job (for least-recently-used).
    last_used: u64,
}

/// The scheduler and its backend.
pub struct Scheduler<B: Backend> {
    backend: B,
    slots: Vec<Slot>,
    queue: VecDeque<Box<Job>>,
    stats: Arc<Stats>,
    /// A row of logits copied out for a sampler that modifies it.
    row: Vec<f32>,
    /// Which slot each logits row of the current batch belongs to.
    row_slots: Vec<usize>,
    batch: Vec<Token>,
    /// Decode tokens at the head of `batch` (the rest is prompt).
    n_decode: usize,
    steps: u64,
    /// See [`DEFAULT_STREAM_INTERVAL`].
    stream_interval: Duration,
    /// Memory files jobs name by path.
    memories: Option<Memories>,
}

impl<B: Backend> Scheduler<B> {
    /// Panics if the backend's batch cannot hold one token of every slot
    /// (a caller's sizing bug).
    pub fn new(backend: B) -> Scheduler<B> {
        assert!(
            backend.n_batch() >= backend.n_slots() && backend.n_slots() >= 1,
            "a batch must hold one token of every slot"
        );
        let slots = (0..backend.n_slots())
            .map(|_| Slot {
                cache: Vec::new(),
                active: None,
                last_used: 0,
            })
            .collect();
        Scheduler {
            row: Vec::with_capacity(backend.n_vocab()),
            stats: Arc::new(Stats::new(backend.n_slots())),
            backend,
            slots,
            queue: VecDeque::new(),
            row_slots: Vec::new(),
            batch: Vec::new(),
            n_decode: 0,
            steps: 0,
            stream_interval: DEFAULT_STREAM_INTERVAL,
            memories: None,
        }
    }

    /// Open (and make) the memory files jobs name by path
    /// ([`crate::job::MemoryTarget::File`]) through `memories`.
    pub fn with_memories(mut self, memories: Memories) -> Scheduler<B> {
        self.memories = Some(memories);
        self
    }

    /// Send a generation's text at most once per `interval` (zero: every
    /// token at once); the first text and the end always go at once.
    pub fn with_stream_interval(mut self, interval: Duration) -> Scheduler<B> {
        self.stream_interval = interval;
        self
    }

    /// Count into `stats` (made beforehand, for a server that shares them
    /// before the scheduler exists); its slot count must match.
    pub fn with_stats(mut self, stats: Arc<Stats>) -> Scheduler<B> {
        assert_eq!(
            stats.n_slots,
            self.slots.len(),
            "stats for another slot count"
        );
        self.stats = stats;
        self
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The counters, shared with whoever reports them.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// No job queued or running.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.slots.iter().all(|s| s.active.is_none())
    }

    /// Queue a job (counted in [`Stats::queued`] here; a submitter that
    /// counts it itself, to refuse work past a bound, sends [`Msg::Job`]
    /// to [`Scheduler::run`] instead).
    pub fn submit(&mut self, job: Job) {
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        self.queue.push_back(Box::new(job));
    }

    /// Step until every job has ended. A step that panics fails its jobs
    /// and the panic is not resumed.
    pub fn run_until_idle(&mut self) {
        while !self.is_idle() {
            self.step_catching();
        }
    }

    /// Serve `rx` until every sender is gone and the last job has ended.
    /// Blocks while idle.
    pub fn run(mut self, rx: Receiver<Msg>) {
        let mut open = true;
        loop {
            if self.is_idle() {
                if !open {
                    return;
                }
                match rx.recv() {
                    Ok(m) => self.on_msg(m),
                    Err(_) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(m) => self.on_msg(m),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.step_catching();
        }
    }

    /// Take a message from a submitting thread (which counted the job in
    /// [`Stats::queued`]).
    pub fn on_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Job(job) => self.queue.push_back(job),
            Msg::Choices(jobs) => self.queue_choices(jobs),
            Msg::CancelAll(why) => self.cancel_all(&why),
        }
    }

    /// One step; a panic inside it fails the running jobs and forgets the
    /// caches (they may be half written) instead of unwinding further.
    fn step_catching(&mut self) {
        if panic::catch_unwind(AssertUnwindSafe(|| self.step())).is_err() {
            self.recover_from_panic();
        }
    }

    /// One scheduling step: drop jobs whose sink was cancelled, start
    /// queued jobs on free slots, evaluate one batch, sample every slot
    /// that has logits. Returns false if there was nothing to evaluate.
    pub fn step(&mut self) -> bool {
        self.reap_cancelled();
        self.admit();
        self.stats
            .active
            .store(self.busy_slots(), Ordering::Relaxed);
        self.build_batch();
        if self.batch.is_empty() {
            self.publish_slots();
            return false;
        }
        self.steps += 1;
        let t0 = Instant::now();
        self.backend.eval(&self.batch);
        // The model file changed under the pass (`mapguard` mapped zeros
        // over it): its logits are garbage, so no job may sample them.
        if let Some(fault) = mapguard::faulted() {
            self.cancel_all(&fault.to_string());
            return true;
        }
        let eval_time = t0.elapsed();
        let (n_vocab, n_ctx) = (self.backend.n_vocab(), self.backend.n_ctx());
        let logits = self.backend.logits();
        assert_eq!(
            logits.len(),
            self.row_slots.len() * n_vocab,
            "the backend returned the wrong number of logits rows"
        );
        let mut generated = 0;
        let mut ended_jobs = Vec::new();
        // Prompts read to their end this step, for the choices waiting on them.
        let mut leaders = Vec::new();
        for (r, &si) in self.row_slots.iter().enumerate() {
            let row = &logits[r * n_vocab..(r + 1) * n_vocab];
            let slot = &mut self.slots[si];
            // A row after a rejected guess, or after the job ended at an
            // earlier row of its draft.
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            let drafted = !a.draft.is_empty();
            if drafted && a.verified > a.draft.len() {
                continue;
            }
            // Positions holding what was evaluated up to this row.
            let cached = if drafted {
                a.draft_at + a.verified + 1
            } else {
                slot.cache.len()
            };
            let (first, before) = (a.first_token_at.is_none(), a.generated);
            let ended = sample_slot(
                a,
                cached,
                row,
                &mut self.row,
                &self.backend,
                n_ctx,
                self.stream_interval,
            );
            generated += a.generated - before;
            if first {
                self.stats.first_token(a.job.queued_at.elapsed());
                leaders.push((r, si, a.job.id));
            }
            if drafted {
                verify_guess(a, ended.is_some(), &mut slot.cache, cached);
            }
            if let Some(reason) = ended {
                ended_jobs.push((slot.active.take().expect("still on its slot"), reason));
            }
        }
        generated += self.start_followers(&leaders, &mut ended_jobs);
        for (a, reason) in ended_jobs {
            self.end(a, reason);
        }
        let prompt_tokens = self.batch.len() - self.n_decode;
        self.stats
            .record_step(self.batch.len(), prompt_tokens, generated, eval_time);
        self.publish_slots();
        self.stats
            .active
            .store(self.busy_slots(), Ordering::Relaxed);
        true
    }

    /// What each slot holds and does, for a server's `/slots`.
    fn publish_slots(&self) {
        let slots = self.slots.iter().enumerate().map(|(id, s)| {
            let a = s.active.as_ref();
            SlotInfo {
                id,
                cached_tokens: s.cache.len(),
                job: a.map(|a| a.job.id),
                prompt_tokens: a.map_or(0, |a| a.job.prompt.len()),
                generated_tokens: a.map_or(0, |a| a.generated),
            }
        });
        self.stats.set_slots(slots);
    }

    fn busy_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.active.is_some()).count()
    }

    /// End every job now.
    fn cancel_all(&mut self, why: &str) {
        let error = || Err(JobError::ShuttingDown(why.to_string()));
        for mut job in self.queue.drain(..) {
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            job.sink.finish(error());
        }
        for slot in &mut self.slots {
            if let Some(mut a) = slot.active.take() {
                self.stats.finish_job(a.job.queued_at.elapsed());
                a.job.sink.finish(error());
            }
        }
        self.stats.active.store(0, Ordering::Relaxed);
    }

    fn recover_from_panic(&mut self) {
        eprintln!("cachefit: error: the engine step panicked; failing the running requests");
        for slot in &mut self.slots {
            slot.cache.clear();
            if let Some(mut a) = slot.active.take() {
                self.stats.finish_job(a.job.queued_at.elapsed());
                a.job.sink.finish(Err(JobError::Internal));
            }
        }
        self.stats.active.store(0, Ordering::Relaxed);
    }

    /// End the jobs whose sink says nobody waits any more: queued ones
    /// without running, running ones with what they wrote so far.
    fn reap_cancelled(&mut self) {
        let mut i = 0;
        while i < self.queue.len() {
            if self.queue[i].sink.cancelled() {
                let mut job = self.queue.remove(i).expect("in range");
                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                self.stats.cancelled(1);
                let finish = Finish {
                    reason: FinishReason::Cancelled,
                    stop_string: None,
                    prompt_tokens: job.prompt.len(),
                    cached_tokens: 0,
                    completion_tokens: 0,
                    seed: job.params.sampling.seed.unwrap_or(0),
                    prompt_time: Duration::ZERO,
                    generation_time: Duration::ZERO,
                    memory: None,
                    speculation: SpecStats::default(),
                };
                job.sink.finish(Ok(finish));
            } else {
                i += 1;
            }
        }
        let mut ended = Vec::new();
        for slot in &mut self.slots {
            if slot.active.as_ref().is_some_and(|a| a.job.sink.cancelled()) {
                let mut a = slot.active.take().expect("checked");
                self.stats.cancelled(1);
                // A prompt cut short left positions past the cache's tokens
                // half read; the cache vector says what is really there.
                a.out.flush(a.job.sink.as_mut());
                ended.push(a);
            }
        }
        for a in ended {
            self.end(a, FinishReason::Cancelled);
        }
    }

    /// A job's end: its memory gets the turn (when it asked), its sink the
    /// rest of the text and the finish.
    fn end(&mut self, mut a: Active, reason: FinishReason) {
        self.stats.finish_job(a.job.queued_at.elapsed());
        let mut finish = a.finish(reason);
        a.out.send_pending(a.job.sink.as_mut());
        if let Some(why) = a.constraint.as_ref().and_then(Constraint::failure) {
            a.job
                .sink
                .finish(Err(JobError::Constraint(why.to_string())));
            return;
        }
        let appended = a.job.memory.as_ref().filter(|m| m.append).map(|m| {
            let mut turn = m.turn.clone().unwrap_or_default();
            turn.extend_from_slice(&a.sampled);
            append_turn(&mut self.backend, m, &turn).map(|()| turn.len())
        });
        match appended {
            Some(Err(e)) => a.job.sink.finish(Err(e)),
            Some(Ok(n)) => {
                if let Some(m) = finish.memory.as_mut() {
                    m.appended = n;
                }
                a.job.sink.finish(Ok(finish));
            }
            None => a.job.sink.finish(Ok(finish)),
        }
    }

    /// Start queued jobs, oldest first, on free slots.
    fn admit(&mut self) {
        while self.slots.iter().any(|s| s.active.is_none()) {
            // A memory job's prompt becomes its context and itself first,
            // so the slot with that prefix can be found.
            let Some(head) = self.queue.front_mut() else {
                break;
            };
            if let Err(e) = prepare_memory(&mut self.backend, &mut self.memories, head) {
                let mut job = self.queue.pop_front().expect("front exists");
                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                job.sink.finish(Err(e));
                continue;
            }
            let job = self.queue.front().expect("front exists");
            let prompt = &job.prompt;
            let best = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.active.is_none())
                .max_by_key(|(_, s)| {
                    (
                        common_prefix(&s.cache, prompt),
                        std::cmp::Reverse(s.last_used),
                    )
                })
                .map(|(i, _)| i);
            let Some(si) = best else { break };
            let job = self.queue.pop_front().expect("front exists");
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            let plan = self.plan(&job, si);
            self.prepare_slot(si, &plan);
            self.start(si, job);
            if let (choices::Plan::Wait(leader), Some(a)) = (plan, &mut self.slots[si].active) {
                a.waits_for = Some(leader);
            }
        }
    }

    /// Why a prompt cannot run on a slot, if it cannot.
    fn check_prompt(&self, prompt: &[u32]) -> Result<(), JobError> {
        let (n_ctx, n_vocab) = (self.backend.n_ctx(), self.backend.n_vocab());
        if prompt.is_empty() {
            return Err(JobError::EmptyPrompt);
        }
        if prompt.len() >= n_ctx {
            return Err(JobError::PromptTooLong {
                tokens: prompt.len(),
                n_ctx,
            });
        }
        if let Some(&token) = prompt.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(JobError::TokenOutOfRange { token, n_vocab });
        }
        Ok(())
    }

    fn start(&mut self, si: usize, mut job: Box<Job>) {
        if let Err(e) = self.check_prompt(&job.prompt) {
            job.sink.finish(Err(e));
            return;
        }
        let slot = &mut self.slots[si];
        let cached = common_prefix(&slot.cache, &job.prompt).min(job.prompt.len() - 1);
        slot.cache.truncate(cached);
        slot.last_used = self.steps;
        let p = &job.params;
        let mut sampler = Sampler::new(p.sampling.clone());
        // The prompt counts for the penalties, as in llama.cpp.
        for &t in &job.prompt {
            sampler.accept(t);
        }
        let mut eog_tokens = self.backend.eog_tokens().to_vec();
        eog_tokens.extend(&p.extra_eog);
        let stop = StopConditions {
            eog_tokens,
            stop_strings: p.stop.clone(),
            ignore_eos: p.ignore_eos,
        };
        self.stats.start_job(job.prompt.len(), cached);
        let memory = job.memory.as_ref().and_then(|m| {
            let view = m.view.clone()?;
            let history_tokens = m
                .session
                .as_ref()
                .and_then(|s| s.lock().ok().map(|s| s.tokens()))
                .unwrap_or(0);
            Some(MemoryUse {
                history_tokens,
                view,
                appended: 0,
            })
        });
        slot.active = Some(Active {
            memory,
            sampled: Vec::new(),
            waits_for: None,
            constraint: job.params.constraint.as_ref().map(|g| g.start()),
            out: TextOut::new(&stop),
            stop,
            cached,
            sampler,
            generated: 0,
            next: None,
            started_at: Instant::now(),
            first_token_at: None,
            draft: Vec::new(),
            draft_at: 0,
            verified: 0,
            draft_accepted: 0,
            throttle: Throttle::default(),
            spec: SpecStats::default(),
            job,
        });
    }

    /// Fill `batch`: each generating slot's next token, then prompt chunks
    /// oldest job first, up to `n_batch` tokens.
    fn build_batch(&mut self) {
        self.batch.clear();
        self.row_slots.clear();
        self.release_orphans();
        let (n_batch, n_ctx) = (self.backend.n_batch(), self.backend.n_ctx());
        let decoding = self
            .slots
            .iter()
            .filter(|s| s.active.as_ref().is_some_and(|a| a.next.is_some()))
            .count();
        // Batch room past one token per decoding slot, for guesses, and
        // logits rows past one per slot (a decoding slot's token, or a
        // reading slot's prompt end).
        let mut spare = n_batch
            .saturating_sub(decoding)
            .min(self.backend.logit_rows().saturating_sub(self.slots.len()));
        for (si, slot) in self.slots.iter_mut().enumerate() {
            let Some(a) = &mut slot.active else { continue };
            if let Some(tok) = a.next.take() {
                let pos = slot.cache.len();
                self.batch.push(Token {
                    id: tok,
                    seq: si,
                    pos,
                    logits: true,
                });
                self.row_slots.push(si);
                slot.cache.push(tok);
                a.draft.clear();
                a.draft_at = pos;
                a.verified = 0;
                a.draft_accepted = 0;
                let lookup = a.job.params.lookup;
                let model = a
                    .job
                    .params
                    .draft_model
                    .filter(|_| self.backend.has_draft_model());
                let (draft_max, draft_min) = match (lookup, model) {
                    (None, None) => continue,
                    (Some(l), None) => (l.draft_max, l.draft_min),
                    (None, Some(m)) => (m.draft_max, m.draft_min),
                    (Some(l), Some(m)) => {
                        (l.draft_max.max(m.draft_max), l.draft_min.min(m.draft_min))
                    }
                };
                // Guesses stay inside the context and the job's token
                // budget: the step samples at most one token more than it
                // accepts guesses.
                let left = a.job.params.max_tokens.saturating_sub(a.generated);
                let room = spare
                    .min(a.throttle.limit(draft_max).max(draft_min))
                    .min(n_ctx.saturating_sub(pos + 1))
                    .min(left.saturating_sub(1));
                if room == 0 || !a.throttle.may_draft() {
                    continue;
                }
                // Prompt lookup first: free to ask, and where it matches,
                // usually right; the draft model where it has nothing.
                if let Some(l) = lookup {
                    l.draft(&slot.cache, room.min(l.draft_max), &mut a.draft);
                }
                if let Some(m) = model.filter(|_| a.draft.is_empty()) {
                    let max = room.min(m.draft_max);
                    self.backend
                        .draft(si, &slot.cache, max, m.p_min, &mut a.draft);
                    if a.draft.len() < m.draft_min {
                        a.draft.clear();
                    }
                }
                for (i, &id) in a.draft.iter().enumerate() {
                    self.batch.push(Token {
                        id,
                        seq: si,
                        pos: pos + 1 + i,
                        logits: true,
                    });
                    self.row_slots.push(si);
                }
                slot.cache.extend_from_slice(&a.draft);
                spare -= a.draft.len();
                a.spec.drafts += usize::from(!a.draft.is_empty());
                a.spec.drafted += a.draft.len();
            }
        }
        self.n_decode = self.batch.len();
        let mut reading: Vec<(u64, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(si, s)| {
                let a = s.active.as_ref()?;
                (s.cache.len() < a.job.prompt.len() && a.waits_for.is_none())
                    .then_some((a.job.id, si))
            })
            .collect();
        reading.sort_unstable();
        for (_, si) in reading {
            let room = n_batch - self.batch.len();
            if room == 0 {
                break;
            }
            let slot = &mut self.slots[si];
            let prompt = &slot.active.as_ref().expect("reading").job.prompt;
            let from = slot.cache.len();
            let to = prompt.len().min(from + room);
            for (pos, &id) in prompt.iter().enumerate().take(to).skip(from) {
                let last = pos + 1 == prompt.len();
                self.batch.push(Token {
                    id,
                    seq: si,
                    pos,
                    logits: last,
                });
                if last {
                    self.row_slots.push(si);
                }
            }
            slot.cache.extend_from_slice(&prompt[from..to]);
        }
    }
}

/// Sample the job's next token from `logits` (copied into `scratch` if the
/// sampler modifies them), send its text, and say whether (and why) the
/// job ended. `cached` is how many positions the slot's cache holds.
fn sample_slot<B: Backend>(
    a: &mut Active,
    cached: usize,
    logits: &[f32],
    scratch: &mut Vec<f32>,
    backend: &B,
    n_ctx: usize,
    interval: Duration,
) -> Option<FinishReason> {
    // Structured output: the grammar allows nothing more (or failed,
    // which `end` reports).
    let allow_eog = !a.stop.ignore_eos;
    if let Some(c) = a.constraint.as_mut() {
        if !c.can_continue(&a.stop.eog_tokens, allow_eog) {
            a.out.flush(a.job.sink.as_mut());
            return Some(FinishReason::GrammarComplete);
        }
    }
    let (tok, modified) = draw(a, logits, scratch);
    let logprob = a.job.params.logprobs.map(|n| {
        let row: &[f32] = if modified { scratch } else { logits };
        let temp = a.sampler.config().temp;
        logprobs::token_logprob(row, temp, tok, n, |t| backend.piece(t).to_vec())
    });
    if a.first_token_at.is_none() {
        a.first_token_at = Some(Instant::now());
    }
    if a.job.memory.as_ref().is_some_and(|m| m.append) {
        a.sampled.push(tok);
    }
    let sink = a.job.sink.as_mut();
    if a.stop.stops_at(tok) {
        a.out.flush(sink);
        return Some(FinishReason::EndOfGeneration);
    }
    a.sampler.accept(tok);
    a.generated += 1;
    if a.out.push(backend.piece(tok), logprob, sink, interval) {
        return Some(FinishReason::StopString);
    }
    if a.constraint.as_ref().is_some_and(Constraint::is_complete) {
        a.out.flush(sink);
        return Some(FinishReason::GrammarComplete);
    }
    if a.generated >= a.job.params.max_tokens {
        a.out.flush(sink);
        return Some(FinishReason::Length);
    }
    if cached >= n_ctx {
        a.out.flush(sink);
        return Some(FinishReason::ContextFull);
    }
    a.next = Some(tok);
    None
}

/// After sampling the row at `a.verified` of a slot's draft: keep going
/// while the sampled token is the next guess (its row, evaluated with the
/// guess, holds the following logits); at the first difference, at the
/// draft's end or when the job `ended`, the draft is done and the cache
/// keeps the `cached` positions evaluated up to this row.
fn verify_guess(a: &mut Active, ended: bool, cache: &mut Vec<u32>, cached: usize) {
    let j = a.verified;
    let accepted = !ended && j < a.draft.len() && a.next == Some(a.draft[j]);
    if accepted {
        // Already evaluated, as the guess.
        a.next = None;
        a.draft_accepted += 1;
        a.spec.accepted += 1;
        a.verified += 1;
        return;
    }
    cache.truncate(cached);
    a.verified = a.draft.len() + 1;
    a.throttle.record(a.draft_accepted, a.draft.len());
}

/// The sampler's pick from `logits`, and whether it drew from a modified
/// copy in `scratch` (the job's `logit_bias`, end tokens banned by
/// `ignore_eos`, penalties) rather than from `logits` as they are.
fn draw(a: &mut Active, logits: &[f32], scratch: &mut Vec<f32>) -> (u32, bool) {
    let p = &a.job.params;
    // Structured output, plain greedy: the best token the grammar allows,
    // the row neither copied nor written (the mask is `can_continue`'s).
    if let Some(c) = a.constraint.as_mut() {
        if p.logit_bias.is_empty() && p.logprobs.is_none() && a.sampler.is_plain_greedy() {
            let allow_eog = !a.stop.ignore_eos;
            if let Ok(Some(tok)) = c.argmax(logits, &a.stop.eog_tokens, allow_eog) {
                c.advance(tok, &a.stop.eog_tokens);
                return (tok, false);
            }
        }
    }
    // Log-probabilities are of the row drawn from, so with `ignore_eos`
    // they need the row with the end tokens banned.
    if !p.logit_bias.is_empty()
        || (a.stop.ignore_eos && p.logprobs.is_some())
        || a.constraint.is_some()
    {
        scratch.clear();
        scratch.extend_from_slice(logits);
        logprobs::apply_bias(scratch, &p.logit_bias);
        a.stop.suppress_eog(scratch);
        let Some(c) = a.constraint.as_mut() else {
            return (a.sampler.sample(scratch), true);
        };
        // Structured output: only what the grammar allows (the mask was
        // computed by `can_continue`, so this cannot fail).
        let allow_eog = !a.stop.ignore_eos;
        let _ = c.mask(scratch, &a.stop.eog_tokens, allow_eog);
        let tok = a.sampler.sample(scratch);
        c.advance(tok, &a.stop.eog_tokens);
        return (tok, true);
    }
    if a.stop.ignore_eos {
        // End-of-generation tokens are never drawn (llama.cpp's logit bias).
        // Greedy: the argmax stands unless it is one of them, so the row is
        // copied only then (the copy was 1% of the built-in model's
        // instructions per token).
        let greedy = a.sampler.is_plain_greedy();
        return match greedy.then(|| a.sampler.sample_from(logits, scratch)) {
            Some(t) if !a.stop.is_eog(t) => (t, false),
            _ => {
                scratch.clear();
                scratch.extend_from_slice(logits);
                a.stop.suppress_eog(scratch);
                (a.sampler.sample(scratch), true)
            }
        };
    }
    let t = a.sampler.sample_from(logits, scratch);
    (t, !a.sampler.is_plain_greedy())
}

/// Turn a memory job's prompt into `[memory context | prompt]` (once: on
/// its first try at admission), its view kept for the finish.
fn prepare_memory<B: Backend>(
    backend: &mut B,
    memories: &mut Option<Memories>,
    job: &mut Job,
) -> Result<(), JobError> {
    let n_ctx = backend.n_ctx();
    let Some(m) = job.memory.as_mut().filter(|m| m.turn.is_none()) else {
        return Ok(());
    };
    let reserve = job.params.max_tokens.min(n_ctx / 4);
    let memory_err = |e: crate::memory::MemoryError| JobError::Memory(e.to_string());
    let mut host = backend.memory_host().map_err(memory_err)?;
    let shared = match &m.target {
        MemoryTarget::Session(s) => s.clone(),
        MemoryTarget::File(path) => {
            let memories = memories.as_mut().ok_or_else(|| {
                JobError::Memory("this engine was not given memory files to open".into())
            })?;
            let vocab = host.vocab;
            memories
                .session(path, host.encoder.as_mut(), &|t| {
                    crate::prompt::document_tokens(vocab, t)
                })
                .map_err(memory_err)?
        }
    };
    m.session = Some(shared.clone());
    let session = shared
        .lock()
        .map_err(|_| JobError::Memory("a memory session was poisoned by a panic".into()))?;
    let (tokens, view) = crate::memory::assemble(
        &session,
        host.encoder.as_mut(),
        host.vocab,
        &job.prompt,
        n_ctx,
        reserve,
    )
    .map_err(memory_err)?;
    drop(session);
    m.turn = Some(std::mem::replace(&mut job.prompt, tokens));
    m.view = Some(view);
    Ok(())
}

/// Append a finished turn to its memory and commit it.
fn append_turn<B: Backend>(
    backend: &mut B,
    m: &crate::job::JobMemory,
    turn: &[u32],
) -> Result<(), JobError> {
    let memory_err = |e: crate::memory::MemoryError| JobError::Memory(e.to_string());
    let mut host = backend.memory_host().map_err(memory_err)?;
    let shared = m
        .session
        .as_ref()
        .ok_or_else(|| JobError::Memory("the job's memory was never opened".into()))?;
    let mut session = shared
        .lock()
        .map_err(|_| JobError::Memory("a memory session was poisoned by a panic".into()))?;
    session
        .append(host.encoder.as_mut(), turn, false)
        .and_then(|()| session.commit())
        .map_err(memory_err)
}

/// Length of the longest common prefix.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

mod choices;
#[cfg(test)]
mod tests;
