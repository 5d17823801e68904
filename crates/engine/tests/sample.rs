//! Sampling chain against hand-computed values, llama.cpp goldens and
//! brute-force references.

use std::collections::BTreeSet;

use engine::rng::Mt19937;
use engine::{argmax, SampleError, Sampler, SamplerConfig};

/// Small deterministic generator for test data (not the sampler's RNG).
struct Lcg(u64);
impl Lcg {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    /// Uniform in [-range, range), quantised to 1/8 so ties happen.
    fn logit(&mut self, range: f32) -> f32 {
        let steps = (range * 16.0) as u32;
        (self.next_u32() % steps) as f32 / 8.0 - range
    }
}

/// No filtering: the draw sees softmax(logits / temp) over the whole vocab.
fn plain(temp: f32, seed: u32) -> SamplerConfig {
    SamplerConfig {
        temp,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(seed),
        ..SamplerConfig::default()
    }
}

fn kept(s: &Sampler) -> BTreeSet<u32> {
    s.last_candidates().map(|(id, _)| id).collect()
}

#[test]
fn defaults_match_llama_cpp() {
    let c = SamplerConfig::default();
    assert_eq!(c.temp, 0.8);
    assert_eq!(c.top_k, 40);
    assert_eq!(c.top_p, 0.95);
    assert_eq!(c.min_p, 0.05);
    assert_eq!(c.repeat_penalty, 1.0);
    assert_eq!(c.frequency_penalty, 0.0);
    assert_eq!(c.presence_penalty, 0.0);
    assert_eq!(c.penalty_last_n, 64);
    assert_eq!(c.min_keep, 0);
    assert_eq!(c.seed, None);
}

#[test]
fn greedy_is_argmax_with_ties_to_lowest_id() {
    let mut s = Sampler::new(SamplerConfig::greedy());
    assert_eq!(s.sample(&mut [0.5, 3.0, -1.0, 2.0]), 1);
    assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(s.sample(&mut [7.0, 7.0, 7.0]), 0);
    assert_eq!(s.sample(&mut [-5.0, -2.0, -2.0, -9.0]), 1);
    assert_eq!(s.sample(&mut [-0.0, 0.0]), 0);
    // Negative temperature is greedy too.
    let mut s = Sampler::new(SamplerConfig {
        temp: -1.0,
        ..SamplerConfig::default()
    });
    assert_eq!(s.sample(&mut [0.0, 1.0, 1.0]), 1);
    assert_eq!(s.last_candidates().count(), 0);
}

#[test]
fn top_k_1_equals_greedy() {
    let mut rng = Lcg(7);
    for seed in 0..200u32 {
        let logits: Vec<f32> = (0..97).map(|_| rng.logit(2.0)).collect();
        let mut greedy = Sampler::new(SamplerConfig::greedy());
        let mut top1 = Sampler::new(SamplerConfig {
            top_k: 1,
            seed: Some(seed),
            ..SamplerConfig::default()
        });
        let want = argmax(&logits).unwrap();
        assert_eq!(greedy.sample(&mut logits.clone()), want);
        assert_eq!(top1.sample(&mut logits.clone()), want, "seed {seed}");
    }
}

#[test]
fn same_seed_same_sequence_different_seed_different() {
    let logits: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 * 0.1).collect();
    let run = |seed: u32| -> Vec<u32> {
        let mut s = Sampler::new(SamplerConfig {
            seed: Some(seed),
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            temp: 1.0,
            ..SamplerConfig::default()
        });
        (0..100)
            .map(|_| {
                let t = s.sample(&mut logits.clone());
                s.accept(t);
                t
            })
            .collect()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));

    // reset() replays from the same seed.
    let mut s = Sampler::new(plain(1.0, 9));
    let first: Vec<u32> = (0..50).map(|_| s.sample(&mut logits.clone())).collect();
    s.reset();
    let again: Vec<u32> = (0..50).map(|_| s.sample(&mut logits.clone())).collect();
    assert_eq!(first, again);

    // A random seed is reported and reproduces the run.
    let mut r = Sampler::new(SamplerConfig::default());
    let seed = r.seed();
    let a: Vec<u32> = (0..50).map(|_| r.sample(&mut logits.clone())).collect();
    let mut r2 = Sampler::new(SamplerConfig {
        seed: Some(seed),
        ..SamplerConfig::default()
    });
    let b: Vec<u32> = (0..50).map(|_| r2.sample(&mut logits.clone())).collect();
    assert_eq!(a, b);
}

#[test]
fn uniform_draws_match_libstdcpp() {
    // std::mt19937 rng(42); std::uniform_real_distribution<double> d(0, 1);
    // bit patterns of d(rng) x4, from g++ 13 / libstdc++.
    let mut rng = Mt19937::new(42);
    let want = [
        0x3fe97d47b66bfc3c_u64,
        0x3fc77aca8779b102,
        0x3fe8f33a88f76c7f,
        0x3fe3196582932836,
    ];
    for w in want {
        assert_eq!(rng.next_f64().to_bits(), w);
    }
}

#[test]
fn draws_match_llama_cpp_dist_for_a_seed() {
    // llama.cpp's dist loop over sorted candidates ids [7,3,0,5,1,9] with
    // logits [2.5,2,1.25,0.5,-1,-3]/0.8, std::mt19937(1234), 32 draws,
    // compiled with g++ (see the loop in llama_sampler_dist_apply).
    let want = [
        7, 3, 3, 3, 0, 7, 7, 3, 7, 7, 7, 7, 7, 3, 7, 7, 7, 7, 7, 7, 3, 0, 5, 7, 7, 7, 7, 3, 7, 7,
        3, 5,
    ];
    let mut logits = vec![f32::NEG_INFINITY; 10];
    for (id, l) in [
        (7, 2.5),
        (3, 2.0),
        (0, 1.25),
        (5, 0.5),
        (1, -1.0),
        (9, -3.0),
    ] {
        logits[id] = l;
    }
    let mut s = Sampler::new(SamplerConfig {
        temp: 0.8,
        top_k: 40,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(1234),
        ..SamplerConfig::default()
    });
    let got: Vec<u32> = (0..32).map(|_| s.sample(&mut logits.clone())).collect();
    assert_eq!(got, want);
}

#[test]
fn temperature_shapes_the_distribution() {
    let logits = [1.0f32, 2.0, 0.5, -0.3];
    for temp in [0.5f32, 1.0, 2.0] {
        let mut s = Sampler::new(plain(temp, 2024));
        let n = 100_000;
        let mut hits = [0usize; 4];
        for _ in 0..n {
            hits[s.sample(&mut logits.clone()) as usize] += 1;
        }
        let w: Vec<f64> = logits.iter().map(|&l| ((l / temp) as f64).exp()).collect();
        let z: f64 = w.iter().sum();
        for i in 0..4 {
            let want = w[i] / z;
            let got = hits[i] as f64 / n as f64;
            // 6 standard deviations at most: sqrt(0.25 / 1e5) ≈ 0.0016.
            assert!(
                (got - want).abs() < 0.01,
                "T={temp} token {i}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn top_p_keeps_the_nucleus() {
    // Probabilities 0.5, 0.25, 0.15, 0.1 (ids shuffled).
    let mut logits = [0.15f32.ln(), 0.5f32.ln(), 0.1f32.ln(), 0.25f32.ln()];
    let cases: [(f32, &[u32]); 5] = [
        (0.4, &[1]),
        (0.7, &[1, 3]),
        (0.85, &[1, 3, 0]),
        (0.95, &[1, 3, 0, 2]),
        (1.0, &[0, 1, 2, 3]),
    ];
    for (p, want) in cases {
        let mut s = Sampler::new(SamplerConfig {
            top_p: p,
            top_k: 0,
            min_p: 0.0,
            seed: Some(1),
            ..SamplerConfig::default()
        });
        s.sample(&mut logits);
        let got = kept(&s);
        assert_eq!(got, want.iter().copied().collect(), "top_p {p}");
    }
    // min_keep overrides a tiny nucleus.
    let mut s = Sampler::new(SamplerConfig {
        top_p: 0.1,
        top_k: 0,
        min_p: 0.0,
        min_keep: 3,
        seed: Some(1),
        ..SamplerConfig::default()
    });
    s.sample(&mut logits);
    assert_eq!(kept(&s), [1, 3, 0].into_iter().collect());
}

#[test]
fn min_p_keeps_tokens_within_a_factor_of_the_best() {
    // Probability ratios to the best: 1, e^-1 = 0.368, e^-2 = 0.135, ...
    let logits = [-2.0f32, 0.0, -4.0, -1.0, -3.0];
    let cases: [(f32, &[u32]); 4] = [
        (0.5, &[1]),
        (0.3, &[1, 3]),
        (0.1, &[1, 3, 0]),
        (0.01, &[0, 1, 2, 3, 4]),
    ];
    for top_k in [0usize, 40] {
        for (p, want) in cases {
            let mut s = Sampler::new(SamplerConfig {
                min_p: p,
                top_k,
                top_p: 1.0,
                seed: Some(3),
                ..SamplerConfig::default()
            });
            s.sample(&mut logits.clone());
            assert_eq!(
                kept(&s),
                want.iter().copied().collect(),
                "min_p {p} top_k {top_k}"
            );
        }
    }
    // min_keep: at least two even though only the best passes.
    let mut s = Sampler::new(SamplerConfig {
        min_p: 0.9,
        min_keep: 2,
        top_k: 0,
        top_p: 1.0,
        seed: Some(3),
        ..SamplerConfig::default()
    });
    s.sample(&mut logits.clone());
    assert_eq!(kept(&s), [1, 3].into_iter().collect());
}

#[test]
fn top_k_keeps_the_k_best_with_ties_by_id() {
    let mut logits = [1.0f32, 5.0, 3.0, 3.0, 3.0, -2.0, 4.0];
    let mut s = Sampler::new(SamplerConfig {
        top_k: 3,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(5),
        ..SamplerConfig::default()
    });
    s.sample(&mut logits);
    let order: Vec<u32> = s.last_candidates().map(|(id, _)| id).collect();
    assert_eq!(order, [1, 6, 2]);
}

/// The chain's candidate set against a brute-force top-k → top-p → min-p on
/// large random vocabularies (including nuclei larger than top-p's 256-long
/// sorted head).
#[test]
fn filters_match_brute_force_on_large_vocab() {
    let mut rng = Lcg(99);
    for (vocab, range, top_k, top_p, min_p, min_keep) in [
        (5000usize, 8.0f32, 0usize, 0.9f32, 0.0f32, 0usize),
        (5000, 1.0, 0, 0.9, 0.0, 0), // flat: a wide nucleus
        (5000, 1.0, 0, 0.5, 0.3, 0),
        (3000, 4.0, 100, 0.8, 0.05, 0),
        (800, 4.0, 0, 0.7, 0.0, 0),
        (20000, 16.0, 0, 0.95, 0.05, 0),
        (20000, 16.0, 0, 0.95, 0.0, 0),
        (20000, 16.0, 0, 0.2, 0.0, 3000), // min_keep reaches past the head
        (5000, 0.125, 0, 0.9, 0.0, 0),    // all logits equal
    ] {
        let logits: Vec<f32> = (0..vocab).map(|_| rng.logit(range)).collect();

        // Reference: same float operations in the same order.
        let mut ids: Vec<u32> = (0..vocab as u32).collect();
        let rank = |a: &u32, b: &u32| {
            logits[*b as usize]
                .partial_cmp(&logits[*a as usize])
                .unwrap()
                .then(a.cmp(b))
        };
        if top_k > 0 {
            ids.sort_by(rank);
            ids.truncate(top_k);
        }
        {
            let max = ids
                .iter()
                .map(|&i| logits[i as usize])
                .fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = ids
                .iter()
                .map(|&i| (logits[i as usize] - max).exp())
                .collect();
            let z: f32 = w.iter().sum();
            let mut p: Vec<(u32, f32)> = ids.iter().zip(&w).map(|(&i, &w)| (i, w / z)).collect();
            p.sort_by(|a, b| rank(&a.0, &b.0));
            let mut cum = 0.0f32;
            let mut keep = p.len();
            for (i, &(_, pi)) in p.iter().enumerate() {
                cum += pi;
                if cum >= top_p && i + 1 >= min_keep {
                    keep = i + 1;
                    break;
                }
            }
            ids = p[..keep].iter().map(|&(i, _)| i).collect();
        }
        let best = logits[ids[0] as usize];
        let bound = best + min_p.ln();
        if min_p > 0.0 {
            ids.retain(|&i| logits[i as usize] >= bound);
        }
        let want: BTreeSet<u32> = ids.into_iter().collect();

        let mut s = Sampler::new(SamplerConfig {
            top_k,
            top_p,
            min_p,
            min_keep,
            seed: Some(11),
            ..SamplerConfig::default()
        });
        let tok = s.sample(&mut logits.clone());
        let got = kept(&s);
        assert_eq!(
            got, want,
            "vocab {vocab} range {range} k {top_k} p {top_p} min_p {min_p} min_keep {min_keep}"
        );
        assert!(got.contains(&tok));
        let total: f64 = s.last_candidates().map(|(_, p)| p as f64).sum();
        assert!((total - 1.0).abs() < 1e-4);
    }
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative() {
    let mut s = Sampler::new(SamplerConfig {
        temp: 0.0,
        repeat_penalty: 2.0,
        ..SamplerConfig::default()
    });
    for t in [0, 1, 2, 1] {
        s.accept(t);
    }
    let mut logits = [3.0f32, -1.5, 0.0, 4.0];
    assert_eq!(s.sample(&mut logits), 3);
    // Count does not matter for the repeat penalty.
    assert_eq!(logits, [1.5, -3.0, 0.0, 4.0]);
}

#[test]
fn frequency_and_presence_penalties_subtract() {
    let mut s = Sampler::new(SamplerConfig {
        temp: 0.0,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..SamplerConfig::default()
    });
    for t in [2, 2, 2, 1] {
        s.accept(t);
    }
    let mut logits = [1.0f32, 1.0, 3.0, -1.0];
    s.sample(&mut logits);
    // token 2: 3 - (3*0.5 + 0.25); token 1: 1 - (0.5 + 0.25).
    assert_eq!(logits, [1.0, 0.25, 1.25, -1.0]);

    // All three together, llama.cpp order: repeat first, then subtract.
    let mut s = Sampler::new(SamplerConfig {
        temp: 0.0,
        repeat_penalty: 1.25,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..SamplerConfig::default()
    });
    s.accept(0);
    s.accept(0);
    s.accept(1);
    let mut logits = [2.5f32, -2.0, 9.0];
    s.sample(&mut logits);
    assert_eq!(logits, [2.5 / 1.25 - 1.25, -2.5 - 0.75, 9.0]);
}

#[test]
fn penalty_window_is_last_n() {
    let mut s = Sampler::new(SamplerConfig {
        temp: 0.0,
        frequency_penalty: 1.0,
        penalty_last_n: 3,
        ..SamplerConfig::default()
    });
    for t in [5, 6, 7, 5, 8] {
        s.accept(t);
    }
    // Window is [7, 5, 8]: the first 5 and the 6 fell out.
    let mut logits = [0.0f32; 10];
    s.sample(&mut logits);
    let mut want = [0.0f32; 10];
    want[5] = -1.0;
    want[7] = -1.0;
    want[8] = -1.0;
    assert_eq!(logits, want);

    // reset() empties the window.
    s.reset();
    let mut logits = [0.0f32; 10];
    s.sample(&mut logits);
    assert_eq!(logits, [0.0; 10]);

    // penalty_last_n = 0 disables penalties entirely.
    let mut s = Sampler::new(SamplerConfig {
        temp: 0.0,
        repeat_penalty: 3.0,
        penalty_last_n: 0,
        ..SamplerConfig::default()
    });
    s.accept(0);
    let mut logits = [2.0f32, 1.0];
    assert_eq!(s.sample(&mut logits), 0);
    assert_eq!(logits, [2.0, 1.0]);
}

#[test]
fn penalties_change_the_greedy_choice() {
    let mut s = Sampler::new(SamplerConfig {
        temp: 0.0,
        repeat_penalty: 1.5,
        ..SamplerConfig::default()
    });
    s.accept(0);
    assert_eq!(s.sample(&mut [3.0, 2.5, 1.0]), 1); // 3 / 1.5 = 2 < 2.5
                                                   // Out-of-range history tokens are ignored.
    s.accept(1_000_000);
    assert_eq!(s.sample(&mut [3.0, 2.5, 1.0]), 1);
}

#[test]
fn non_finite_logits_do_not_panic() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let configs = [
        SamplerConfig::greedy(),
        plain(1.0, 1),
        SamplerConfig {
            seed: Some(1),
            ..SamplerConfig::default()
        },
        SamplerConfig {
            seed: Some(1),
            top_k: 0,
            ..SamplerConfig::default()
        },
    ];
    for cfg in configs {
        let mut s = Sampler::new(cfg.clone());
        // NaN counts as -inf.
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [nan, 1.0, nan, -inf]), 1, "{cfg:?}");
        }
        // +inf wins outright, shared among several.
        for _ in 0..20 {
            let t = s.sample(&mut [1.0, inf, 2.0, inf, nan]);
            assert!(t == 1 || t == 3, "{cfg:?}: {t}");
        }
        // Nothing samplable: an error from try_sample, token 0 from sample.
        assert_eq!(
            s.try_sample(&mut [nan, -inf, nan]),
            Err(SampleError::NoCandidates)
        );
        assert_eq!(s.sample(&mut [-inf, -inf]), 0);
        assert_eq!(s.try_sample(&mut []), Err(SampleError::NoCandidates));
        // Huge finite logits overflow to inf under a small temperature.
        let t = Sampler::new(SamplerConfig {
            temp: 1e-30,
            ..cfg.clone()
        })
        .sample(&mut [f32::MAX, -f32::MAX, 0.0]);
        assert_eq!(t, 0);
    }
    // Small top-k over a larger vocab (the one-pass heap selection) with
    // fewer finite logits than k, and with none.
    let mut logits = vec![nan; 100];
    logits[40] = -inf;
    logits[57] = 0.5;
    for seed in 0..20 {
        let mut s = Sampler::new(SamplerConfig {
            top_k: 2,
            seed: Some(seed),
            ..SamplerConfig::default()
        });
        assert_eq!(s.sample(&mut logits.clone()), 57);
        assert_eq!(kept(&s), [57].into_iter().collect());
        let mut none = vec![-inf; 100];
        none[3] = nan;
        assert_eq!(s.try_sample(&mut none), Err(SampleError::NoCandidates));
    }

    // With penalties on as well.
    let mut s = Sampler::new(SamplerConfig {
        repeat_penalty: 1.3,
        frequency_penalty: 0.2,
        seed: Some(2),
        ..SamplerConfig::default()
    });
    s.accept(0);
    s.accept(1);
    assert_eq!(s.sample(&mut [nan, inf, 0.0]), 1);
}

#[test]
fn large_vocab_default_chain_is_fast() {
    let vocab = 151_936;
    let mut rng = Lcg(5);
    let logits: Vec<f32> = (0..vocab).map(|_| rng.logit(12.0)).collect();
    let mut s = Sampler::new(SamplerConfig {
        seed: Some(1),
        repeat_penalty: 1.1,
        ..SamplerConfig::default()
    });
    let mut buf = logits.clone();
    let start = std::time::Instant::now();
    let n = 50;
    for _ in 0..n {
        buf.copy_from_slice(&logits);
        let t = s.sample(&mut buf);
        s.accept(t);
    }
    let per = start.elapsed() / n;
    eprintln!("default chain, vocab {vocab}: {per:?} per token");
    // Generous bound for a debug build on a busy machine; release is ~1 ms.
    assert!(per < std::time::Duration::from_millis(100), "{per:?}");
}

/// The first index of the largest non-NaN logit, or None if there is none
/// above `-inf`: what `argmax` must return, written the plain way.
fn argmax_reference(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || l == f32::NEG_INFINITY {
            continue;
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
}

#[test]
fn argmax_matches_a_plain_scan_on_every_length_and_odd_values() {
    let mut rng = Lcg(11);
    for len in (0..80).chain([255, 256, 257, 4095, 4096, 4097]) {
        for trial in 0..20 {
            let mut logits: Vec<f32> = (0..len).map(|_| rng.logit(1.0)).collect();
            // Some trials salt in NaN and infinities.
            if trial % 4 == 1 && len > 0 {
                for _ in 0..3 {
                    let i = rng.next_u32() as usize % len;
                    logits[i] =
                        [f32::NAN, f32::NEG_INFINITY, f32::INFINITY][rng.next_u32() as usize % 3];
                }
            }
            if trial % 4 == 2 {
                logits.iter_mut().for_each(|l| *l = f32::NEG_INFINITY);
            }
            assert_eq!(
                argmax(&logits),
                argmax_reference(&logits),
                "len {len} trial {trial}"
            );
        }
    }
}

#[test]
fn sample_from_equals_sample_and_keeps_the_logits() {
    let penalised = SamplerConfig {
        temp: 0.0,
        repeat_penalty: 1.3,
        presence_penalty: 0.5,
        ..SamplerConfig::default()
    };
    let random = SamplerConfig {
        seed: Some(5),
        ..SamplerConfig::default()
    };
    for config in [SamplerConfig::greedy(), penalised, random] {
        let (mut a, mut b) = (Sampler::new(config.clone()), Sampler::new(config));
        let mut rng = Lcg(3);
        let mut scratch = Vec::new();
        for step in 0..200 {
            let logits: Vec<f32> = (0..301).map(|_| rng.logit(3.0)).collect();
            let kept = logits.clone();
            let want = a.sample(&mut logits.clone());
            let got = b.sample_from(&logits, &mut scratch);
            assert_eq!(got, want, "step {step}");
            assert_eq!(logits, kept);
            assert_eq!(kept_ids(&a), kept_ids(&b));
            a.accept(want);
            b.accept(got);
        }
    }
}

fn kept_ids(s: &Sampler) -> Vec<u32> {
    s.last_candidates().map(|(id, _)| id).collect()
}
