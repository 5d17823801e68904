//! The scheduler against a fake model whose next token is a hash of the
//! whole sequence so far, so any mix-up of positions, slots or caches
//! changes the output.

use super::*;
use crate::job::Sink;
use crate::params::GenParams;
use crate::sample::SamplerConfig;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Mutex};

/// It keeps each slot's tokens by position and checks that a batch only
/// reads positions already written.
struct Fake {
    n_slots: usize,
    n_ctx: usize,
    n_batch: usize,
    seqs: Vec<Vec<Option<u32>>>,
    logits: Vec<f32>,
    calls: Vec<Vec<Token>>,
    pieces: Vec<Vec<u8>>,
    eog: Vec<u32>,
    /// Whether it can copy a slot's cache (`Backend::can_copy_seq`).
    copies: bool,
    /// Next token: the one this many positions back (a text that repeats,
    /// so guesses from the sequence come true), instead of the hash.
    period: Option<usize>,
    /// Every row these logits, whatever the text (a fixed distribution to
    /// sample from), instead of the one-hot-ish rows.
    soft: Option<Vec<f32>>,
    /// A draft model (`Backend::draft`), if any.
    drafter: Option<FakeDraft>,
}

/// How the fake's draft model guesses.
#[derive(Clone, Copy, Debug)]
enum FakeDraft {
    /// The target's own next token, except where a hash of the text says
    /// to err (one in `err_every`, confident or doubting by turns), so
    /// some guesses fail and some are cut by `p_min`.
    Follow { err_every: u64 },
    /// Always this token, with this probability.
    Fixed(u32, f32),
}

const VOCAB: usize = 16;
const EOG: u32 = 15;

impl Fake {
    fn new(n_slots: usize, n_ctx: usize, n_batch: usize) -> Fake {
        Fake {
            n_slots,
            n_ctx,
            n_batch,
            seqs: vec![vec![None; n_ctx]; n_slots],
            logits: Vec::new(),
            calls: Vec::new(),
            // Token i prints as the letter a + i; EOG prints nothing.
            pieces: (0..VOCAB as u8)
                .map(|i| {
                    if i as u32 == EOG {
                        vec![]
                    } else {
                        vec![b'a' + i]
                    }
                })
                .collect(),
            eog: vec![EOG],
            copies: true,
            period: None,
            soft: None,
            drafter: None,
        }
    }

    /// The target's next token after `text` (every position written), as
    /// [`Backend::eval`] computes it.
    fn next_after(&self, text: &[u32]) -> u32 {
        let pos = text.len() - 1;
        match self.period {
            Some(k) if pos + 1 >= k => text[pos + 1 - k],
            _ => {
                let seq: Vec<Option<u32>> = text.iter().map(|&t| Some(t)).collect();
                Fake::next_of(&seq, pos)
            }
        }
    }

    fn next_of(seq: &[Option<u32>], pos: usize) -> u32 {
        let mut h: u64 = 1469598103934665603;
        for t in &seq[..=pos] {
            h = (h ^ t.expect("read a position never written") as u64).wrapping_mul(1099511628211);
        }
        // Bias away from EOG so generations run a while.
        ((h >> 7) % (VOCAB as u64 - 1)) as u32
    }
}

impl Backend for Fake {
    fn n_slots(&self) -> usize {
        self.n_slots
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn n_batch(&self) -> usize {
        self.n_batch
    }
    fn n_vocab(&self) -> usize {
        VOCAB
    }
    fn logits(&self) -> &[f32] {
        &self.logits
    }
    fn eval(&mut self, batch: &[Token]) {
        assert!(!batch.is_empty() && batch.len() <= self.n_batch);
        self.logits.clear();
        for t in batch {
            assert!(t.pos < self.n_ctx);
            let seq = &mut self.seqs[t.seq];
            assert!(
                t.pos == 0 || seq[t.pos - 1].is_some(),
                "position {} of slot {} read before {} was written",
                t.pos,
                t.seq,
                t.pos - 1
            );
            seq[t.pos] = Some(t.id);
            // Later positions are stale now.
            for p in seq.iter_mut().skip(t.pos + 1) {
                *p = None;
            }
        }
        for t in batch.iter().filter(|t| t.logits) {
            if let Some(soft) = &self.soft {
                self.logits.extend_from_slice(soft);
                continue;
            }
            let seq = &self.seqs[t.seq];
            let next = match self.period {
                Some(k) if t.pos + 1 >= k => seq[t.pos + 1 - k].expect("written"),
                _ => Fake::next_of(seq, t.pos),
            };
            let mut row = vec![0.0; VOCAB];
            row[next as usize] = 10.0;
            // EOG is always the runner-up, so ignore_eos changes nothing
            // unless EOG would win.
            if next != EOG {
                row[EOG as usize] = 5.0;
            }
            self.logits.extend_from_slice(&row);
        }
        self.calls.push(batch.to_vec());
    }
    fn piece(&self, token: u32) -> &[u8] {
        &self.pieces[token as usize]
    }
    fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }
    fn can_copy_seq(&self) -> bool {
        self.copies
    }
    fn has_draft_model(&self) -> bool {
        self.drafter.is_some()
    }
    fn draft(&mut self, seq: usize, history: &[u32], max: usize, p_min: f32, out: &mut Vec<u32>) {
        out.clear();
        assert!(seq < self.n_slots && !history.is_empty());
        let mut text = history.to_vec();
        while out.len() < max && text.len() < self.n_ctx {
            let (guess, p) = match self.drafter.expect("asked only with a draft model") {
                FakeDraft::Fixed(t, p) => (t, p),
                FakeDraft::Follow { err_every } => {
                    let next = self.next_after(&text);
                    let h = text
                        .iter()
                        .fold(7u64, |h, &t| h.wrapping_mul(31).wrapping_add(u64::from(t)));
                    match h % err_every {
                        0 => ((next + 1) % EOG, 0.9),
                        1 => ((next + 2) % EOG, 0.2),
                        _ => (next, 0.95),
                    }
                }
            };
            if p < p_min || self.eog.contains(&guess) {
                break;
            }
            out.push(guess);
            text.push(guess);
        }
    }
    fn copy_seq(&mut self, src: usize, dst: usize, positions: std::ops::Range<usize>) {
        assert!(self.copies);
        for p in positions {
            assert!(
                self.seqs[src][p].is_some(),
                "copied position {p} never written"
            );
            self.seqs[dst][p] = self.seqs[src][p];
        }
    }
}

/// What a sink heard.
#[derive(Clone, Debug, PartialEq)]
enum Heard {
    Text(String),
    End(Result<Finish, JobError>),
}

/// A sink that records into a shared list and can be cancelled.
#[derive(Clone, Default)]
struct Recorder {
    heard: Arc<Mutex<Vec<Heard>>>,
    cancel: Arc<AtomicBool>,
}

impl Sink for Recorder {
    fn text(&mut self, text: String) {
        assert!(!text.is_empty(), "empty text event");
        self.heard.lock().unwrap().push(Heard::Text(text));
    }
    fn finish(&mut self, end: Result<Finish, JobError>) {
        let mut h = self.heard.lock().unwrap();
        assert!(
            !h.iter().any(|e| matches!(e, Heard::End(_))),
            "finish called twice"
        );
        h.push(Heard::End(end));
    }
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

impl Recorder {
    fn texts(&self) -> Vec<String> {
        let h = self.heard.lock().unwrap();
        h.iter()
            .filter_map(|e| match e {
                Heard::Text(t) => Some(t.clone()),
                Heard::End(_) => None,
            })
            .collect()
    }
    fn text(&self) -> String {
        self.texts().concat()
    }
    fn end(&self) -> Option<Result<Finish, JobError>> {
        let h = self.heard.lock().unwrap();
        h.iter().find_map(|e| match e {
            Heard::End(f) => Some(f.clone()),
            Heard::Text(_) => None,
        })
    }
    fn finish(&self) -> Finish {
        self.end().expect("ended").expect("finished without error")
    }
}

fn params(max_tokens: usize) -> GenParams {
    GenParams {
        max_tokens,
        ..GenParams::new(SamplerConfig::greedy())
    }
}

fn job(id: u64, prompt: &[u32], p: GenParams) -> (Job, Recorder) {
    let r = Recorder::default();
    (Job::new(id, prompt.to_vec(), p, Box::new(r.clone())), r)
}

fn sched(n_slots: usize, n_ctx: usize, n_batch: usize) -> Scheduler<Fake> {
    Scheduler::new(Fake::new(n_slots, n_ctx, n_batch)).with_stream_interval(Duration::ZERO)
}

/// The text and end a job gets alone on a fresh one-slot scheduler.
fn alone(prompt: &[u32], p: GenParams) -> (String, Finish) {
    let mut s = sched(1, 64, 8);
    let (j, r) = job(0, prompt, p);
    s.submit(j);
    s.run_until_idle();
    (r.text(), r.finish())
}

#[test]
fn batched_generations_equal_one_at_a_time() {
    let prompts: Vec<Vec<u32>> = (0..10)
        .map(|i| {
            (0..(3 + i * 2))
                .map(|k| ((k * 7 + i) % 14) as u32)
                .collect()
        })
        .collect();
    let mut s = sched(4, 64, 8);
    let mut recs = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let (j, r) = job(i as u64, p, params(12));
        s.submit(j);
        recs.push(r);
    }
    s.run_until_idle();
    for (p, r) in prompts.iter().zip(&recs) {
        let (want, want_f) = alone(p, params(12));
        assert_eq!(r.text(), want);
        assert_eq!(r.finish().completion_tokens, want_f.completion_tokens);
    }
    // More than one slot's token went through some pass.
    let calls = &s.backend().calls;
    assert!(calls.iter().any(|b| {
        let mut seqs: Vec<_> = b.iter().map(|t| t.seq).collect();
        seqs.dedup();
        seqs.len() > 1
    }));
    assert!(calls.iter().all(|b| b.len() <= 8));
    assert_eq!(s.stats.queued.load(Ordering::Relaxed), 0);
}

#[test]
fn a_slot_reuses_the_common_prefix() {
    let mut s = sched(1, 64, 8);
    let first: Vec<u32> = (0..20).map(|k| k % 13).collect();
    let (j, r) = job(0, &first, params(5));
    s.submit(j);
    s.run_until_idle();
    assert_eq!(r.finish().cached_tokens, 0);

    let mut second = first[..15].to_vec();
    second.extend([3, 4, 5]);
    let (j, r) = job(1, &second, params(5));
    s.submit(j);
    let calls_before = s.backend().calls.len();
    s.run_until_idle();
    let f = r.finish();
    assert_eq!(f.cached_tokens, 15);
    assert_eq!(f.prompt_tokens, 18);
    // The first pass of the second job starts at position 15.
    assert_eq!(s.backend().calls[calls_before][0].pos, 15);
    let (t, af) = alone(&second, params(5));
    assert_eq!((r.text(), f.completion_tokens), (t, af.completion_tokens));

    // The same prompt again: everything but the last token is cached.
    let (j, r) = job(2, &second, params(5));
    s.submit(j);
    s.run_until_idle();
    assert_eq!(r.finish().cached_tokens, 17);
}

#[test]
fn a_new_job_goes_to_the_slot_with_its_prefix() {
    let mut s = sched(3, 64, 8);
    let a: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
    let b: Vec<u32> = vec![7, 8, 9, 10, 11, 12];
    for (i, p) in [&a, &b].iter().enumerate() {
        let (j, _r) = job(i as u64, p, params(2));
        s.submit(j);
        s.run_until_idle();
    }
    let mut b2 = b.clone();
    b2.push(13);
    let (j, r) = job(5, &b2, params(2));
    s.submit(j);
    s.run_until_idle();
    assert_eq!(r.finish().cached_tokens, b.len());
}

#[test]
fn max_tokens_stop_strings_and_eog() {
    let prompt = [1, 2, 3];
    let (text, f) = alone(&prompt, params(6));
    assert_eq!(f.reason, FinishReason::Length);
    assert_eq!(f.completion_tokens, 6);
    assert_eq!(text.len(), 6);

    // Stop on the text's third character: output is what came before.
    let stop = text[2..3].to_string();
    let cut = text.find(&stop).unwrap();
    let (t2, f2) = alone(
        &prompt,
        GenParams {
            stop: vec![stop.clone()],
            ..params(6)
        },
    );
    assert_eq!(t2, text[..cut]);
    assert_eq!(f2.reason, FinishReason::StopString);
    assert_eq!(f2.stop_string.as_deref(), Some(stop.as_str()));

    // Every token ends the generation: nothing is shown.
    let mut s = sched(1, 64, 8);
    s.backend.eog = (0..VOCAB as u32).collect();
    let (j, r) = job(0, &prompt, params(6));
    s.submit(j);
    s.run_until_idle();
    assert_eq!(r.text(), "");
    assert_eq!(r.finish().reason, FinishReason::EndOfGeneration);

    // A job's extra end-of-generation token ends it where the first token
    // would be; with ignore_eos the same job runs to its length.
    let first = text.as_bytes()[0] - b'a';
    let extra = GenParams {
        extra_eog: vec![u32::from(first)],
        ..params(6)
    };
    let (t4, f4) = alone(&prompt, extra.clone());
    assert_eq!(
        (t4.as_str(), f4.reason),
        ("", FinishReason::EndOfGeneration)
    );
    let (t5, f5) = alone(
        &prompt,
        GenParams {
            ignore_eos: true,
            ..extra
        },
    );
    assert_eq!(f5.reason, FinishReason::Length);
    assert_eq!(f5.completion_tokens, 6);
    assert!(!t5.contains(first as char), "{t5}");
}

#[test]
fn ignore_eos_never_samples_an_end_token() {
    // EOG wins every row: without ignore_eos the job ends at once, with it
    // the runner-up is taken each time.
    let mut s = sched(1, 64, 8);
    s.backend.eog = vec![EOG];
    let prompt = [1, 2, 3];
    let (j, r) = job(0, &prompt, params(5));
    s.submit(j);
    s.run_until_idle();
    let normal = r.finish();
    let (j, r) = job(
        1,
        &prompt,
        GenParams {
            ignore_eos: true,
            ..params(40)
        },
    );
    s.submit(j);
    s.run_until_idle();
    let f = r.finish();
    assert_eq!(f.completion_tokens, 40);
    assert_eq!(f.reason, FinishReason::Length);
    assert!(normal.completion_tokens <= 5);
}

#[test]
fn the_stream_interval_groups_text_events() {
    let events = |interval: Duration| {
        let mut s = sched(1, 64, 8).with_stream_interval(interval);
        let (j, r) = job(0, &[1, 2, 3], params(20));
        s.submit(j);
        s.run_until_idle();
        assert_eq!(r.finish().completion_tokens, 20);
        r.texts()
    };
    // Zero: one event per token (every piece of the fake is one letter,
    // and this prompt's generation has no end-of-generation token).
    let each = events(Duration::ZERO);
    assert_eq!(each.len(), 20);
    assert!(each.iter().all(|t| t.len() == 1));
    // An hour: the first token at once, the rest with the end.
    let grouped = events(Duration::from_secs(3600));
    assert_eq!(grouped.len(), 2);
    assert_eq!(grouped[0].len(), 1);
    assert_eq!(grouped.concat(), each.concat());
}

#[test]
fn the_context_ends_a_generation() {
    let mut s = sched(1, 10, 4);
    let (j, r) = job(0, &[1, 2, 3, 4, 5, 6, 7], params(100));
    s.submit(j);
    s.run_until_idle();
    let f = r.finish();
    assert_eq!(f.reason, FinishReason::ContextFull);
    // Positions 7, 8, 9 take generated tokens 1..3; the 4th is sampled
    // from position 9's logits and has nowhere to go.
    assert_eq!(f.completion_tokens, 4);

    let (j, r) = job(1, &[1; 10], params(5));
    s.submit(j);
    s.run_until_idle();
    assert_eq!(
        r.end(),
        Some(Err(JobError::PromptTooLong {
            tokens: 10,
            n_ctx: 10
        }))
    );
    for (prompt, want) in [
        (vec![], JobError::EmptyPrompt),
        (
            vec![1, 99],
            JobError::TokenOutOfRange {
                token: 99,
                n_vocab: VOCAB,
            },
        ),
    ] {
        let (j, r) = job(2, &prompt, params(5));
        s.submit(j);
        s.run_until_idle();
        assert_eq!(r.end(), Some(Err(want)));
    }
}

#[test]
fn a_cancelled_job_frees_its_slot_and_keeps_its_text() {
    let mut s = sched(1, 64, 8);
    let (j, r) = job(0, &[1, 2, 3], params(50));
    s.submit(j);
    let (j2, r2) = job(1, &[4, 5, 6], params(3));
    s.submit(j2);
    s.step();
    s.step();
    s.step();
    r.cancel.store(true, Ordering::Relaxed);
    s.run_until_idle();
    let f = r.finish();
    assert_eq!(f.reason, FinishReason::Cancelled);
    // Three steps: the prompt and two decodes, each sampling a token.
    assert_eq!(f.completion_tokens, 3);
    assert_eq!(r.text().len(), 3);
    assert_eq!(r2.finish().completion_tokens, 3);
    // The first job stopped within a step of its cancel.
    assert!(s.backend().calls.len() <= 3 + 1 + 3);
    assert_eq!(s.stats.active.load(Ordering::Relaxed), 0);

    // A queued job cancelled before it starts ends without running.
    let (j, r) = job(2, &[7, 8], params(3));
    r.cancel.store(true, Ordering::Relaxed);
    let calls = s.backend().calls.len();
    s.submit(j);
    s.run_until_idle();
    assert_eq!(r.finish().reason, FinishReason::Cancelled);
    assert_eq!(s.backend().calls.len(), calls);
}

#[test]
fn cancel_during_a_long_prompt_stops_between_chunks() {
    let mut s = sched(1, 256, 4);
    let (j, r) = job(0, &[3; 100], params(5));
    s.submit(j);
    s.step();
    s.step();
    r.cancel.store(true, Ordering::Relaxed);
    s.run_until_idle();
    assert_eq!(s.backend().calls.len(), 2);
    assert_eq!(r.finish().reason, FinishReason::Cancelled);
    // The next job reuses only what was really read.
    let (j, r) = job(1, &[3; 20], params(2));
    s.submit(j);
    s.run_until_idle();
    assert_eq!(r.finish().cached_tokens, 8);
}

#[test]
fn queued_jobs_wait_for_a_slot_and_prefill_is_chunked() {
    let mut s = sched(2, 64, 4);
    let mut recs = Vec::new();
    for i in 0..5 {
        let (j, r) = job(i, &[1 + i as u32; 9], params(3));
        s.submit(j);
        recs.push(r);
    }
    s.step();
    assert_eq!(s.stats.queued.load(Ordering::Relaxed), 3);
    s.run_until_idle();
    for r in &recs {
        assert_eq!(r.finish().completion_tokens, 3);
    }
    assert!(s.backend().calls.iter().all(|b| b.len() <= 4));
}

#[test]
fn cancel_all_ends_everything() {
    let mut s = sched(1, 64, 8);
    let (j, r) = job(0, &[1, 2, 3], params(50));
    s.submit(j);
    let (j2, r2) = job(1, &[4, 5, 6], params(3));
    s.submit(j2);
    s.step();
    s.on_msg(Msg::CancelAll("shutting down".into()));
    assert!(s.is_idle());
    for r in [r, r2] {
        assert_eq!(
            r.end(),
            Some(Err(JobError::ShuttingDown("shutting down".into())))
        );
    }
}

#[test]
fn run_serves_a_channel_and_returns_when_it_closes() {
    let s = sched(2, 64, 8);
    let stats = s.stats();
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::spawn(move || s.run(rx));
    let mut recs = Vec::new();
    for i in 0..4 {
        let (j, r) = job(i, &[2, 3, i as u32], params(4));
        stats.queued.fetch_add(1, Ordering::Relaxed);
        tx.send(Msg::Job(Box::new(j))).unwrap();
        recs.push(r);
    }
    drop(tx);
    thread.join().unwrap();
    for r in &recs {
        assert_eq!(r.finish().completion_tokens, 4);
    }
}

/// A backend whose evaluation panics on a chosen call.
struct Panicky(Fake, usize);

impl Backend for Panicky {
    fn n_slots(&self) -> usize {
        self.0.n_slots()
    }
    fn n_ctx(&self) -> usize {
        self.0.n_ctx()
    }
    fn n_batch(&self) -> usize {
        self.0.n_batch()
    }
    fn n_vocab(&self) -> usize {
        self.0.n_vocab()
    }
    fn eval(&mut self, batch: &[Token]) {
        if self.0.calls.len() == self.1 {
            self.0.calls.push(vec![]);
            panic!("planted");
        }
        self.0.eval(batch)
    }
    fn logits(&self) -> &[f32] {
        self.0.logits()
    }
    fn piece(&self, token: u32) -> &[u8] {
        self.0.piece(token)
    }
    fn eog_tokens(&self) -> &[u32] {
        self.0.eog_tokens()
    }
}

#[test]
fn a_panicking_step_fails_its_jobs_and_the_next_job_runs() {
    let mut s = Scheduler::new(Panicky(Fake::new(1, 64, 8), 2));
    let (j, r) = job(0, &[1, 2, 3], params(10));
    s.submit(j);
    s.run_until_idle();
    assert_eq!(r.end(), Some(Err(JobError::Internal)));
    let (j, r) = job(1, &[1, 2, 3], params(4));
    s.submit(j);
    s.run_until_idle();
    assert_eq!(r.finish().completion_tokens, 4);
    assert_eq!(r.finish().cached_tokens, 0);
}

#[test]
fn characters_split_across_tokens_are_never_split_in_the_text() {
    let mut s = sched(1, 64, 8);
    // Tokens 0..4 carry parts of "é" (C3 A9) and "€" (E2 82 AC); the rest
    // are letters. Any order of them must come out as whole characters,
    // with U+FFFD where the bytes cannot form one, as a lossy decode of
    // all the bytes at once would.
    let parts: [&[u8]; 4] = [&[0xC3], &[0xA9], &[0xE2], &[0x82, 0xAC]];
    for (t, p) in parts.iter().enumerate() {
        s.backend.pieces[t] = p.to_vec();
    }
    let prompt = [5, 6, 7];
    let (j, r) = job(0, &prompt, params(30));
    s.submit(j);
    s.run_until_idle();
    // The tokens the fake model generates, replayed.
    let mut seq: Vec<Option<u32>> = prompt.iter().map(|&t| Some(t)).collect();
    let mut bytes = Vec::new();
    for _ in 0..30 {
        let t = Fake::next_of(&seq, seq.len() - 1);
        bytes.extend_from_slice(&s.backend.pieces[t as usize]);
        seq.push(Some(t));
    }
    assert!(
        bytes.iter().any(|&b| b >= 0x80),
        "the test needs split characters"
    );
    assert_eq!(r.text(), String::from_utf8_lossy(&bytes));
}

#[test]
fn common_prefix_lengths() {
    assert_eq!(common_prefix(&[], &[1]), 0);
    assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
    assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
}

mod choices;
mod speculate;
