//! Several choices for one prompt (OpenAI's `n`), with the prompt read once.
//!
//! [`Scheduler::submit_choices`] queues the jobs together; the first (the
//! leader) is an ordinary job, and each other one follows it:
//!
//! - admitted while the leader is still reading the prompt, a follower
//!   takes a free slot and waits ([`Plan::Wait`]: no prompt tokens in any
//!   batch). The step that evaluates the prompt's last token copies the
//!   leader's cache into each waiting follower's slot
//!   ([`Backend::copy_seq`]) and samples every follower from the leader's
//!   row of logits, so the prompt is evaluated once, and each choice
//!   draws with its own sampler (its own seed);
//! - admitted later (more choices than free slots, the rest queued), a
//!   follower copies the longest prefix of its prompt another slot holds
//!   ([`Plan::Copy`]) and evaluates only the prompt's last token, for its
//!   logits;
//! - if the leader stops before its prompt is read (cancelled), a waiting
//!   follower reads the prompt itself.
//!
//! A backend that cannot copy a slot ([`Backend::can_copy_seq`]) runs the
//! choices as independent jobs. Jobs with a long memory never follow (each
//! would append its own turn).

use super::*;

/// How a queued job starts on a free slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// As any job: from what its own slot caches.
    Alone,
    /// Wait for the leader (slot, job id) to read the shared prompt.
    Wait((usize, u64)),
    /// Copy the first `len` positions of slot `src` first.
    Copy { src: usize, len: usize },
}

impl<B: Backend> Scheduler<B> {
    /// Queue `jobs` as the choices of one request: the same prompt and
    /// parameters (a seed each), read once (see the module docs). Their
    /// sinks are their own; the caller tells the choices apart. Counted
    /// in [`Stats::queued`] here; a submitter that counts them itself
    /// sends [`Msg::Choices`].
    pub fn submit_choices(&mut self, jobs: Vec<Job>) {
        self.stats.queued.fetch_add(jobs.len(), Ordering::Relaxed);
        self.queue_choices(jobs);
    }

    pub(super) fn queue_choices(&mut self, jobs: Vec<Job>) {
        let leader = jobs.first().map(|j| j.id);
        for (i, mut job) in jobs.into_iter().enumerate() {
            if i > 0 && job.memory.is_none() {
                job.follows = leader;
            }
            self.queue.push_back(Box::new(job));
        }
    }

    /// How `job` starts on free slot `si`.
    pub(super) fn plan(&self, job: &Job, si: usize) -> Plan {
        let Some(leader) = job.follows else {
            return Plan::Alone;
        };
        if !self.backend.can_copy_seq() || job.prompt.is_empty() {
            return Plan::Alone;
        }
        let reading = self.slots.iter().position(|s| {
            s.active.as_ref().is_some_and(|a| {
                a.job.id == leader && a.first_token_at.is_none() && a.job.prompt == job.prompt
            })
        });
        if let Some(ls) = reading {
            return Plan::Wait((ls, leader));
        }
        // At least the prompt's last token is evaluated, for its logits.
        let cap = job.prompt.len() - 1;
        let own = common_prefix(&self.slots[si].cache, &job.prompt).min(cap);
        let best = self
            .slots
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != si)
            .map(|(i, s)| (common_prefix(&s.cache, &job.prompt).min(cap), i))
            .max();
        match best {
            Some((len, src)) if len > own => Plan::Copy { src, len },
            _ => Plan::Alone,
        }
    }

    /// Ready slot `si`'s cache for `plan`, before the job starts on it.
    pub(super) fn prepare_slot(&mut self, si: usize, plan: &Plan) {
        match *plan {
            Plan::Alone => {}
            // Overwritten by the leader's cache; empty meanwhile, so a
            // follower whose leader goes away reads the whole prompt.
            Plan::Wait(_) => self.slots[si].cache.clear(),
            Plan::Copy { src, len } => {
                let own = common_prefix(&self.slots[si].cache, &self.slots[src].cache[..len]);
                self.backend.copy_seq(src, si, own..len);
                let copied = self.slots[src].cache[own..len].to_vec();
                let cache = &mut self.slots[si].cache;
                cache.truncate(own);
                cache.extend_from_slice(&copied);
            }
        }
    }

    /// A waiting follower whose leader is gone (cancelled, failed) or past
    /// its prompt without it reads the prompt itself.
    pub(super) fn release_orphans(&mut self) {
        for fi in 0..self.slots.len() {
            let Some((ls, id)) = self.slots[fi].active.as_ref().and_then(|a| a.waits_for) else {
                continue;
            };
            let leader_reading = self.slots[ls]
                .active
                .as_ref()
                .is_some_and(|a| a.job.id == id && a.first_token_at.is_none());
            if !leader_reading {
                if let Some(a) = &mut self.slots[fi].active {
                    a.waits_for = None;
                }
            }
        }
    }

    /// The followers waiting on each `(row, slot, job id)` whose prompt
    /// this step read to its end: copy that slot's cache into theirs and
    /// sample each from the same row. Returns the tokens generated; ended
    /// followers go to `ended`.
    pub(super) fn start_followers(
        &mut self,
        leaders: &[(usize, usize, u64)],
        ended: &mut Vec<(Active, FinishReason)>,
    ) -> usize {
        let (n_vocab, n_ctx) = (self.backend.n_vocab(), self.backend.n_ctx());
        let mut generated = 0;
        for &(r, ls, id) in leaders {
            for fi in 0..self.slots.len() {
                let waiting = self.slots[fi]
                    .active
                    .as_ref()
                    .is_some_and(|a| a.waits_for == Some((ls, id)));
                if !waiting {
                    continue;
                }
                // The leader's cache is its prompt (its first token is
                // evaluated next step), which is the follower's too.
                let len = self.slots[ls].cache.len();
                self.backend.copy_seq(ls, fi, 0..len);
                let cache = self.slots[ls].cache.clone();
                let slot = &mut self.slots[fi];
                slot.cache = cache;
                let a = slot.active.as_mut().expect("waiting");
                debug_assert_eq!(a.job.prompt, slot.cache);
                a.waits_for = None;
                a.cached = len;
                self.stats.add_cached(len);
                let row = &self.backend.logits()[r * n_vocab..(r + 1) * n_vocab];
                let end = sample_slot(
                    a,
                    len,
                    row,
                    &mut self.row,
                    &self.backend,
                    n_ctx,
                    self.stream_interval,
                );
                generated += a.generated;
                self.stats.first_token(a.job.queued_at.elapsed());
                if let Some(reason) = end {
                    ended.push((slot.active.take().expect("on its slot"), reason));
                }
            }
        }
        generated
    }
}
