//! Speculation by prompt lookup gives exactly the output of plain
//! decoding (greedy and sampled, alone and among other slots, at every
//! kind of end), and fewer passes when the text repeats.

use super::*;
use crate::speculate::Lookup;

fn sampled(seed: u32) -> SamplerConfig {
    SamplerConfig {
        temp: 2.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(seed),
        ..SamplerConfig::default()
    }
}

/// A job's text and end.
type Outcome = (String, Result<Finish, JobError>);

fn with_lookup(p: &GenParams, lookup: Option<Lookup>) -> GenParams {
    GenParams {
        lookup,
        ..p.clone()
    }
}

/// Every job's text and finish (speculation counts aside), and the passes
/// it took, on a scheduler of `n_slots` slots.
fn run_all(
    period: Option<usize>,
    n_slots: usize,
    n_ctx: usize,
    n_batch: usize,
    jobs: &[(Vec<u32>, GenParams)],
) -> (Vec<Outcome>, usize) {
    let mut fake = Fake::new(n_slots, n_ctx, n_batch);
    fake.period = period;
    let mut s = Scheduler::new(fake).with_stream_interval(Duration::ZERO);
    let mut recs = Vec::new();
    for (i, (prompt, p)) in jobs.iter().enumerate() {
        let (j, r) = job(i as u64, prompt, p.clone());
        s.submit(j);
        recs.push(r);
    }
    s.run_until_idle();
    let out = recs
        .iter()
        .map(|r| (r.text(), r.end().expect("every job ends")))
        .collect();
    (out, s.backend().calls.len())
}

/// Finishes compared without their timings and speculation counts.
fn comparable(out: &[Outcome]) -> Vec<String> {
    out.iter()
        .map(|(text, end)| match end {
            Ok(f) => format!(
                "{text:?} {:?} {:?} {} {}",
                f.reason, f.stop_string, f.completion_tokens, f.prompt_tokens
            ),
            Err(e) => format!("{text:?} {e:?}"),
        })
        .collect()
}

fn cases() -> Vec<(Vec<u32>, GenParams)> {
    let mut jobs = Vec::new();
    for i in 0..12u32 {
        let prompt: Vec<u32> = (0..(2 + i as usize % 9))
            .map(|k| ((k as u32 * 5 + i) % 13) + 1)
            .collect();
        let mut p = GenParams {
            max_tokens: [1, 2, 7, 40, 200][i as usize % 5],
            ..GenParams::new(if i % 2 == 0 {
                SamplerConfig::greedy()
            } else {
                sampled(i)
            })
        };
        if i % 3 == 0 {
            p.stop = vec!["ca".into()];
        }
        if i % 4 == 1 {
            p.ignore_eos = true;
        }
        jobs.push((prompt, p));
    }
    jobs
}

#[test]
fn lookup_changes_nothing_but_the_passes() {
    let lookups = [
        Lookup::default(),
        Lookup {
            draft_max: 3,
            draft_min: 2,
            ngram_max: 2,
            ngram_min: 1,
        },
        Lookup {
            draft_max: 16,
            draft_min: 1,
            ngram_max: 6,
            ngram_min: 3,
        },
    ];
    for period in [None, Some(3), Some(7)] {
        // One slot with a short context (ends by ContextFull), and four
        // slots sharing passes with a batch that limits the guesses.
        for (n_slots, n_ctx, n_batch) in [(1, 24, 8), (1, 256, 64), (4, 64, 6), (4, 128, 32)] {
            let plain = cases();
            let (want, plain_passes) = run_all(period, n_slots, n_ctx, n_batch, &plain);
            for l in lookups {
                let jobs: Vec<_> = plain
                    .iter()
                    .map(|(pr, p)| (pr.clone(), with_lookup(p, Some(l))))
                    .collect();
                let (got, passes) = run_all(period, n_slots, n_ctx, n_batch, &jobs);
                let what = format!(
                    "period {period:?}, slots {n_slots}, ctx {n_ctx}, batch {n_batch}, {l:?}"
                );
                assert_eq!(comparable(&got), comparable(&want), "{what}");
                if period.is_some() && n_slots == 1 && n_ctx == 256 {
                    assert!(
                        passes * 2 < plain_passes,
                        "{what}: {passes} passes with guesses, {plain_passes} without"
                    );
                }
            }
        }
    }
}

#[test]
fn guesses_are_counted_and_bounded() {
    // A repeating text: nearly every guess is accepted.
    let p = GenParams {
        max_tokens: 100,
        ignore_eos: true,
        lookup: Some(Lookup::default()),
        ..GenParams::new(SamplerConfig::greedy())
    };
    let (out, passes) = run_all(Some(4), 1, 256, 64, &[(vec![1, 2, 3, 4, 5, 6], p.clone())]);
    let f = out[0].1.clone().unwrap();
    assert_eq!(f.completion_tokens, 100);
    let s = f.speculation;
    assert!(s.accepted <= s.drafted && s.drafts <= passes);
    assert!(s.accepted >= 85, "{s:?}");
    assert!(passes <= 14, "{passes} passes");
    // Every pass of it held at most 1 + draft_max tokens.
    let mut fake = Fake::new(1, 256, 64);
    fake.period = Some(4);
    let mut sch = Scheduler::new(fake).with_stream_interval(Duration::ZERO);
    let (j, _r) = job(0, &[1, 2, 3, 4, 5, 6], p.clone());
    sch.submit(j);
    sch.run_until_idle();
    for call in &sch.backend().calls[1..] {
        assert!(
            call.len() <= 1 + Lookup::default().draft_max,
            "{}",
            call.len()
        );
    }

    // A text that never repeats its n-grams: guesses fail, and the
    // throttle keeps the wasted rows to a small share.
    let (out, passes) = run_all(None, 1, 512, 64, &[(vec![1, 2, 3], p.clone())]);
    let f = out[0].1.clone().unwrap();
    let s = f.speculation;
    assert_eq!(f.completion_tokens, 100);
    assert!(passes >= 90, "{passes}");
    assert!(
        s.drafted - s.accepted <= 60,
        "{} wasted guesses in {passes} passes: {s:?}",
        s.drafted - s.accepted
    );
}
