//! Choices of one request (`n`) reading their prompt once, `logit_bias`,
//! and log-probabilities through the sink.

use super::*;
use crate::logprobs::TokenLogprob;

/// Sampling loose enough on the fake's rows (next 10, EOG 5, others 0)
/// that seeds give different texts: at temperature 3 the next token has
/// ~60%, the end ~11%.
fn varied(seed: u32, max_tokens: usize) -> GenParams {
    GenParams {
        max_tokens,
        ..GenParams::new(SamplerConfig {
            temp: 3.0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(seed),
            ..SamplerConfig::default()
        })
    }
}

fn prompt_tokens_evaluated(s: &Scheduler<Fake>) -> u64 {
    s.stats().snapshot().prompt_tokens_evaluated
}

/// `n` choices of `prompt` with seeds `seed, seed + 1, ...`.
fn choices(n: usize, prompt: &[u32], seed: u32, max_tokens: usize) -> (Vec<Job>, Vec<Recorder>) {
    (0..n)
        .map(|i| job(i as u64, prompt, varied(seed + i as u32, max_tokens)))
        .unzip()
}

/// Each choice's text and end equal those of its job alone.
fn check_alone(prompt: &[u32], seed: u32, max_tokens: usize, recs: &[Recorder]) {
    for (i, r) in recs.iter().enumerate() {
        let (text, f) = alone(prompt, varied(seed + i as u32, max_tokens));
        assert_eq!(r.text(), text, "choice {i}");
        let got = r.finish();
        assert_eq!(
            (got.reason, got.completion_tokens),
            (f.reason, f.completion_tokens)
        );
        assert_eq!(got.prompt_tokens, prompt.len());
    }
}

#[test]
fn three_choices_read_the_prompt_once() {
    let prompt: Vec<u32> = (1..=10).collect();
    // Batches of 4: the prompt takes three steps, the followers wait.
    let mut s = sched(3, 64, 4);
    let (jobs, recs) = choices(3, &prompt, 40, 12);
    s.submit_choices(jobs);
    s.run_until_idle();
    assert_eq!(prompt_tokens_evaluated(&s), 10);
    check_alone(&prompt, 40, 12, &recs);
    let cached: Vec<usize> = recs.iter().map(|r| r.finish().cached_tokens).collect();
    assert_eq!(cached, vec![0, 10, 10]);
    let texts: std::collections::HashSet<String> = recs.iter().map(Recorder::text).collect();
    assert!(texts.len() > 1, "the seeds gave one text: {texts:?}");
    assert_eq!(s.stats.queued.load(Ordering::Relaxed), 0);
}

#[test]
fn more_choices_than_slots_queue_and_copy_the_prompt() {
    let prompt: Vec<u32> = (3..13).collect();
    let mut s = sched(2, 64, 4);
    let (jobs, recs) = choices(4, &prompt, 7, 6);
    s.submit_choices(jobs);
    s.run_until_idle();
    // Read once; the two later choices evaluate only the last prompt
    // token, for their own row of logits.
    assert_eq!(prompt_tokens_evaluated(&s), 10 + 1 + 1);
    check_alone(&prompt, 7, 6, &recs);
    let cached: Vec<usize> = recs.iter().map(|r| r.finish().cached_tokens).collect();
    assert_eq!(cached, vec![0, 10, 9, 9]);
}

#[test]
fn a_later_choice_copies_the_prompt_from_a_busy_slot() {
    // Another job holds slot 1 for one more step, so the second choice
    // waits in the queue while the leader reads the prompt; it then
    // copies the prompt from the leader's slot, which is generating.
    let prompt: Vec<u32> = (0..10).map(|i| (i * 3 % 14) as u32).collect();
    let mut s = sched(2, 64, 16);
    let (other, _) = job(100, &[9, 9, 9], params(2));
    s.submit(other);
    s.step();
    let (jobs, recs): (Vec<_>, Vec<_>) = (0..2).map(|i| job(i + 1, &prompt, params(20))).unzip();
    s.submit_choices(jobs);
    s.run_until_idle();
    assert_eq!(prompt_tokens_evaluated(&s), 3 + 10 + 1);
    let (text, _) = alone(&prompt, params(20));
    for r in &recs {
        assert_eq!(r.text(), text);
    }
    assert_eq!(recs[1].finish().cached_tokens, 9);
}

#[test]
fn a_choice_whose_leader_is_cancelled_reads_the_prompt_itself() {
    let prompt: Vec<u32> = (1..=10).collect();
    let mut s = sched(3, 64, 4);
    let (jobs, recs) = choices(2, &prompt, 3, 8);
    s.submit_choices(jobs);
    s.step(); // the leader read 4 prompt tokens
    recs[0].cancel.store(true, Ordering::Relaxed);
    s.run_until_idle();
    assert_eq!(recs[0].finish().reason, FinishReason::Cancelled);
    assert_eq!(prompt_tokens_evaluated(&s), 4 + 10);
    let (text, _) = alone(&prompt, varied(4, 8));
    assert_eq!(recs[1].text(), text);
}

#[test]
fn a_backend_that_cannot_copy_runs_the_choices_apart() {
    let prompt: Vec<u32> = (1..=10).collect();
    let mut s = sched(3, 64, 32);
    s.backend.copies = false;
    let (jobs, recs) = choices(3, &prompt, 40, 12);
    s.submit_choices(jobs);
    s.run_until_idle();
    assert_eq!(prompt_tokens_evaluated(&s), 30);
    check_alone(&prompt, 40, 12, &recs);
}

#[test]
fn logit_bias_forces_and_bans() {
    let prompt = [1, 2, 3];
    // +100 on token 3: every token is 3 ("d"), whatever the fake prefers.
    let forced = GenParams {
        logit_bias: vec![(3, 100.0)],
        ..params(6)
    };
    assert_eq!(alone(&prompt, forced).0, "dddddd");
    // Sampled too.
    let forced = GenParams {
        logit_bias: vec![(3, 100.0)],
        ..varied(5, 6)
    };
    assert_eq!(alone(&prompt, forced).0, "dddddd");
    // -100 on the greedy token (and the end, the fake's runner-up): never
    // drawn.
    let (greedy, _) = alone(&prompt, params(1));
    let t0 = (greedy.as_bytes()[0] - b'a') as u32;
    let banned = GenParams {
        logit_bias: vec![(t0, -100.0), (EOG, -100.0)],
        ..params(1)
    };
    let (text, f) = alone(&prompt, banned);
    assert_eq!(f.completion_tokens, 1);
    assert_ne!(text, greedy);
}

/// Text (`Ok`) or log-probabilities (`Err`), as a sink heard them.
type Event = Result<String, Vec<TokenLogprob>>;

/// A sink that keeps text and log-probabilities in arrival order.
#[derive(Clone, Default)]
struct Both {
    events: Arc<Mutex<Vec<Event>>>,
}

impl Sink for Both {
    fn text(&mut self, text: String) {
        self.events.lock().unwrap().push(Ok(text));
    }
    fn logprobs(&mut self, entries: Vec<TokenLogprob>) {
        assert!(!entries.is_empty());
        self.events.lock().unwrap().push(Err(entries));
    }
    fn finish(&mut self, _: Result<Finish, JobError>) {}
}

#[test]
fn logprobs_arrive_with_their_text_and_stop_at_a_stop_string() {
    let prompt = [1, 2, 3];
    let p = GenParams {
        logprobs: Some(3),
        ..params(10)
    };
    let (full, _) = alone(&prompt, params(10));
    assert_eq!(full.len(), 10);
    let run = |p: GenParams| {
        let mut s = sched(1, 64, 8);
        let both = Both::default();
        s.submit(Job::new(0, prompt.to_vec(), p, Box::new(both.clone())));
        s.run_until_idle();
        let events = both.events.lock().unwrap().clone();
        events
    };
    let events = run(p.clone());
    // Each text event comes right after the entries of its tokens (one
    // byte each here).
    let mut text = String::new();
    let mut entries: Vec<TokenLogprob> = Vec::new();
    for e in &events {
        match e {
            Err(es) => entries.extend(es.iter().cloned()),
            Ok(t) => {
                text.push_str(t);
                assert_eq!(entries.len(), text.len(), "{events:?}");
            }
        }
    }
    assert_eq!(text, full);
    // The fake's row: the token 10, the end 5, the 14 others 0.
    let lse = (10f64.exp() + 5f64.exp() + 14.0).ln();
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.bytes, full.as_bytes()[i..=i]);
        assert_eq!(e.offset, i);
        assert!((e.logprob as f64 - (10.0 - lse)).abs() < 1e-5);
        let top: Vec<u32> = e.top.iter().map(|t| t.token).collect();
        assert_eq!(top[..2], [e.token, EOG]);
        assert_eq!(top.len(), 3);
        assert!((e.top[1].logprob as f64 - (5.0 - lse)).abs() < 1e-5);
    }
    // A stop string: the text and the entries end before it.
    let stop = full[4..6].to_string();
    let cut = full.find(&stop).unwrap();
    let events = run(GenParams {
        stop: vec![stop],
        ..p
    });
    let text: String = events.iter().filter_map(|e| e.clone().ok()).collect();
    let entries: Vec<TokenLogprob> = events
        .iter()
        .filter_map(|e| e.clone().err())
        .flatten()
        .collect();
    assert_eq!(text, full[..cut]);
    assert_eq!(entries.len(), cut);
}
