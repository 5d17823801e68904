//! Speculation by prompt lookup gives exactly the output of plain
//! decoding (greedy and sampled, alone and among other slots, at every
//! kind of end), and fewer passes when the text repeats.

use super::*;
use crate::draft::ModelDraft;
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
    run_on(fake, jobs)
}

/// [`run_all`] on a fake set up by the caller.
fn run_on(fake: Fake, jobs: &[(Vec<u32>, GenParams)]) -> (Vec<Outcome>, usize) {
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

fn with_draft_model(p: &GenParams, draft: ModelDraft) -> GenParams {
    GenParams {
        draft_model: Some(draft),
        ..p.clone()
    }
}

#[test]
fn draft_model_changes_nothing_but_the_passes() {
    let drafts = [
        ModelDraft::default(),
        ModelDraft {
            draft_max: 3,
            draft_min: 2,
            p_min: 0.0,
        },
        ModelDraft {
            draft_max: 16,
            draft_min: 1,
            p_min: 0.95,
        },
    ];
    for period in [None, Some(5)] {
        for (n_slots, n_ctx, n_batch) in [(1, 24, 8), (1, 256, 64), (4, 64, 6), (4, 128, 32)] {
            let plain = cases();
            let (want, plain_passes) = run_all(period, n_slots, n_ctx, n_batch, &plain);
            for err_every in [3, 9] {
                for d in drafts {
                    for lookup in [None, Some(Lookup::default())] {
                        let jobs: Vec<_> = plain
                            .iter()
                            .map(|(pr, p)| {
                                (pr.clone(), with_lookup(&with_draft_model(p, d), lookup))
                            })
                            .collect();
                        let mut fake = Fake::new(n_slots, n_ctx, n_batch);
                        fake.period = period;
                        fake.drafter = Some(FakeDraft::Follow { err_every });
                        let (got, passes) = run_on(fake, &jobs);
                        let what = format!(
                            "period {period:?}, slots {n_slots}, ctx {n_ctx}, batch {n_batch}, err 1/{err_every}, {d:?}, lookup {}",
                            lookup.is_some()
                        );
                        assert_eq!(comparable(&got), comparable(&want), "{what}");
                        // A draft model right 8 times in 9 saves most passes
                        // even where the text never repeats.
                        if lookup.is_none()
                            && err_every == 9
                            && d.draft_max >= 8
                            && d.p_min < 0.9
                            && n_slots == 1
                            && n_ctx == 256
                        {
                            assert!(
                                passes * 2 < plain_passes,
                                "{what}: {passes} passes with a draft model, {plain_passes} without"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_draft_model_the_backend_lacks_changes_nothing() {
    let plain = cases();
    let (want, plain_passes) = run_all(None, 1, 256, 64, &plain);
    let jobs: Vec<_> = plain
        .iter()
        .map(|(pr, p)| (pr.clone(), with_draft_model(p, ModelDraft::default())))
        .collect();
    let (got, passes) = run_all(None, 1, 256, 64, &jobs);
    assert_eq!(comparable(&got), comparable(&want));
    assert_eq!(passes, plain_passes);
}

#[test]
fn draft_probability_floor_cuts_doubtful_guesses() {
    let p = GenParams {
        max_tokens: 60,
        ignore_eos: true,
        draft_model: Some(ModelDraft {
            p_min: 0.5,
            ..ModelDraft::default()
        }),
        ..GenParams::new(SamplerConfig::greedy())
    };
    let mut fake = Fake::new(1, 256, 64);
    fake.drafter = Some(FakeDraft::Fixed(3, 0.4));
    let (out, passes) = run_on(fake, &[(vec![1, 2, 3], p.clone())]);
    let s = out[0].1.clone().unwrap().speculation;
    assert_eq!(s.drafted, 0, "{s:?}");
    assert_eq!(passes, 1 + 59);
}

/// The speculative-sampling rule keeps the target's distribution: with a
/// fixed distribution over four tokens and a draft that always guesses
/// one of them, the tokens drawn follow the distribution (chi-square),
/// and a guess (each the first of its draft, with drafts of one) is kept
/// as often as the target gives it probability.
#[test]
fn sampled_tokens_keep_the_distribution_whatever_the_draft_guesses() {
    let probs = [0.4f64, 0.3, 0.2, 0.1];
    let mut soft = vec![f32::NEG_INFINITY; VOCAB];
    for (i, p) in probs.iter().enumerate() {
        soft[i] = p.ln() as f32;
    }
    for (guess, draft_max) in [(0u32, 1), (3, 1), (0, 4), (3, 4)] {
        let mut counts = [0usize; 4];
        let (mut drafted, mut accepted) = (0, 0);
        for seed in 0..24u32 {
            let p = GenParams {
                max_tokens: 400,
                draft_model: Some(ModelDraft {
                    draft_max,
                    p_min: 0.0,
                    ..ModelDraft::default()
                }),
                ..GenParams::new(SamplerConfig {
                    temp: 1.0,
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                    seed: Some(seed),
                    ..SamplerConfig::default()
                })
            };
            let mut fake = Fake::new(1, 512, 64);
            fake.soft = Some(soft.clone());
            fake.drafter = Some(FakeDraft::Fixed(guess, 1.0));
            let (out, _) = run_on(fake, &[(vec![1, 2], p)]);
            let (text, end) = &out[0];
            let s = end.clone().unwrap().speculation;
            drafted += s.drafted;
            accepted += s.accepted;
            for b in text.bytes() {
                counts[(b - b'a') as usize] += 1;
            }
        }
        let n: usize = counts.iter().sum();
        assert_eq!(n, 24 * 400);
        let chi2: f64 = counts
            .iter()
            .zip(probs)
            .map(|(&c, p)| {
                let e = p * n as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum();
        // 3 degrees of freedom: 16.27 is the 0.1% tail.
        assert!(
            chi2 < 16.27,
            "guess {guess}: counts {counts:?}, chi2 {chi2}"
        );
        if draft_max > 1 {
            continue;
        }
        let rate = accepted as f64 / drafted as f64;
        let want = probs[guess as usize];
        let sd = (want * (1.0 - want) / drafted as f64).sqrt();
        assert!(
            drafted > 500 && (rate - want).abs() < 5.0 * sd,
            "guess {guess}: {accepted} of {drafted} kept, want {want}"
        );
    }
}
