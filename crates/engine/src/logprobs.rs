//! Log-probabilities of generated tokens (OpenAI's `logprobs`) and
//! `logit_bias`, for the jobs that ask ([`crate::GenParams::logprobs`],
//! [`crate::GenParams::logit_bias`]).
//!
//! Which distribution: the log-softmax over the whole vocabulary of the
//! logits the sampler drew from (after `logit_bias`, the penalties,
//! `ignore_eos`'s ban and a grammar's mask), divided by the temperature.
//! That is "after the sampler's temperature", as the issue and OpenAI put
//! it, and at temperature 1 with no bias or penalty it is the log-softmax
//! of the model's raw logits, which is what llama-server reports by
//! default (its `post_sampling_probs` off). At temperature 0 (greedy) there is no
//! temperature to divide by, so it is the log-softmax of those logits at
//! temperature 1, as llama-server reports for greedy requests. Top-k,
//! top-p and min-p are not applied: they would give most alternatives a
//! probability of 0 and make the numbers depend on settings OpenAI does
//! not have; the chosen token's log-probability is therefore the model's
//! belief in it, not the renormalized chance of that one draw.
//!
//! Cost: one pass over the row for the maximum, one for the sum of
//! exponentials, one for the best `n` (a short sorted list); only for jobs
//! that asked.

use std::cmp::Ordering;

/// One generated token's log-probability and the most likely alternatives
/// at its position, as a [`crate::Sink`] hears them.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    /// What the token prints as (may be part of a UTF-8 character).
    pub bytes: Vec<u8>,
    /// Natural log; `-inf` for a token the sampler could not draw.
    pub logprob: f32,
    /// The most likely tokens, best first (as many as the job asked for,
    /// fewer if fewer can be drawn); the chosen token is among them when it
    /// ranks high enough.
    pub top: Vec<TopLogprob>,
    /// Byte offset of the token's text in the generation's text.
    pub offset: usize,
}

/// An alternative at a token's position.
#[derive(Clone, Debug, PartialEq)]
pub struct TopLogprob {
    pub token: u32,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// Add each `(token, bias)` to that token's logit (ids past the row are
/// skipped: the server rejects them before a job starts).
pub fn apply_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(t, b) in bias {
        if let Some(l) = logits.get_mut(t as usize) {
            *l += b;
        }
    }
}

/// The log-softmax of `logits / temp` (temperature 1 when `temp <= 0`) at
/// `chosen` and at the `n_top` most likely tokens (ties: lowest id first).
/// NaN counts as `-inf`. `piece` gives a token's bytes.
pub fn token_logprob(
    logits: &[f32],
    temp: f32,
    chosen: u32,
    n_top: usize,
    piece: impl Fn(u32) -> Vec<u8>,
) -> TokenLogprob {
    let lp = LogSoftmax::new(logits, temp);
    let top = best(logits, n_top)
        .into_iter()
        .map(|t| TopLogprob {
            token: t,
            bytes: piece(t),
            logprob: lp.at(logits, t),
        })
        .collect();
    TokenLogprob {
        token: chosen,
        bytes: piece(chosen),
        logprob: lp.at(logits, chosen),
        top,
        offset: 0,
    }
}

/// What turns a logit into its log-probability: the scale `1 / temp`,
/// the maximum and the log of the sum of exponentials.
struct LogSoftmax {
    scale: f32,
    max: f32,
    /// ln Σ exp(scale · (l − max)), in f64 so 150k small terms add up.
    log_sum: f64,
    /// How many logits are `+inf` (they share all the probability).
    n_inf: usize,
}

impl LogSoftmax {
    fn new(logits: &[f32], temp: f32) -> LogSoftmax {
        let scale = if temp > 0.0 { 1.0 / temp } else { 1.0 };
        let max = logits
            .iter()
            .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
        let n_inf = logits.iter().filter(|&&l| l == f32::INFINITY).count();
        let log_sum = if max.is_finite() {
            logits
                .iter()
                .filter(|l| !l.is_nan())
                .map(|&l| ((l - max) * scale).exp() as f64)
                .sum::<f64>()
                .ln()
        } else {
            0.0
        };
        LogSoftmax {
            scale,
            max,
            log_sum,
            n_inf,
        }
    }

    fn at(&self, logits: &[f32], token: u32) -> f32 {
        let Some(&l) = logits.get(token as usize) else {
            return f32::NEG_INFINITY;
        };
        if l.is_nan() || l == f32::NEG_INFINITY || self.max == f32::NEG_INFINITY {
            return f32::NEG_INFINITY;
        }
        if self.n_inf > 0 {
            return if l == f32::INFINITY {
                -(self.n_inf as f32).ln()
            } else {
                f32::NEG_INFINITY
            };
        }
        (((l - self.max) * self.scale) as f64 - self.log_sum) as f32
    }
}

/// The `n` tokens with the largest logits, best first, lowest id on ties;
/// `-inf` and NaN never.
fn best(logits: &[f32], n: usize) -> Vec<u32> {
    let mut top: Vec<(f32, u32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return Vec::new();
    }
    let worse = |a: &(f32, u32), b: &(f32, u32)| -> Ordering {
        b.0.partial_cmp(&a.0)
            .unwrap_or(Ordering::Equal)
            .then(a.1.cmp(&b.1))
    };
    for (id, &l) in logits.iter().enumerate() {
        if l.is_nan() || l == f32::NEG_INFINITY {
            continue;
        }
        // Full and this one ranks below the last: most tokens stop here.
        if top.len() == n && top.last().is_some_and(|w| l <= w.0) {
            continue;
        }
        let c = (l, id as u32);
        let at = top.partition_point(|x| worse(x, &c) == Ordering::Less);
        top.insert(at, c);
        top.truncate(n);
    }
    top.into_iter().map(|(_, id)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook log-softmax in f64.
    fn reference(logits: &[f32], temp: f64) -> Vec<f64> {
        let z: Vec<f64> = logits.iter().map(|&l| l as f64 / temp).collect();
        let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + z.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        z.iter().map(|x| x - lse).collect()
    }

    fn piece(t: u32) -> Vec<u8> {
        format!("<{t}>").into_bytes()
    }

    #[test]
    fn matches_a_log_softmax_at_any_temperature() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919 % 1000) as f32 / 37.0).sin() * 8.0)
            .collect();
        for (temp, as_temp) in [(1.0, 1.0), (0.7, 0.7), (1.6, 1.6), (0.0, 1.0)] {
            let want = reference(&logits, as_temp);
            for chosen in [0u32, 17, 999] {
                let e = token_logprob(&logits, temp, chosen, 5, piece);
                assert!(
                    (e.logprob as f64 - want[chosen as usize]).abs() < 1e-4,
                    "temp {temp} token {chosen}: {} vs {}",
                    e.logprob,
                    want[chosen as usize]
                );
                assert_eq!(e.bytes, piece(chosen));
                // The top 5 are the 5 best, best first, with their values.
                let mut order: Vec<usize> = (0..logits.len()).collect();
                order.sort_by(|&a, &b| want[b].partial_cmp(&want[a]).unwrap());
                let ids: Vec<u32> = e.top.iter().map(|t| t.token).collect();
                assert_eq!(
                    ids,
                    order[..5].iter().map(|&i| i as u32).collect::<Vec<_>>()
                );
                for t in &e.top {
                    assert!((t.logprob as f64 - want[t.token as usize]).abs() < 1e-4);
                    assert_eq!(t.bytes, piece(t.token));
                }
            }
            // Probabilities sum to one.
            let sum: f64 = (0..logits.len() as u32)
                .map(|t| (token_logprob(&logits, temp, t, 0, piece).logprob as f64).exp())
                .sum();
            assert!((sum - 1.0).abs() < 1e-3, "{sum}");
        }
    }

    #[test]
    fn bias_moves_the_distribution() {
        let mut logits = vec![1.0f32, 3.0, 2.0, 0.5];
        apply_bias(&mut logits, &[(0, 100.0), (1, -100.0), (99, 5.0)]);
        assert_eq!(logits, vec![101.0, -97.0, 2.0, 0.5]);
        let e = token_logprob(&logits, 1.0, 0, 2, piece);
        assert!(e.logprob > -1e-6 && e.logprob <= 0.0, "{}", e.logprob);
        assert_eq!(
            e.top.iter().map(|t| t.token).collect::<Vec<_>>(),
            vec![0, 2]
        );
    }

    #[test]
    fn banned_ties_and_infinities() {
        let logits = [f32::NEG_INFINITY, 2.0, f32::NAN, 2.0, 1.0];
        let e = token_logprob(&logits, 1.0, 0, 10, piece);
        assert_eq!(e.logprob, f32::NEG_INFINITY);
        // -inf and NaN are never alternatives; ties go to the lower id.
        assert_eq!(
            e.top.iter().map(|t| t.token).collect::<Vec<_>>(),
            vec![1, 3, 4]
        );
        assert_eq!(e.top[0].logprob, e.top[1].logprob);
        let inf = [0.0, f32::INFINITY, f32::INFINITY];
        let e = token_logprob(&inf, 1.0, 1, 3, piece);
        assert!((e.logprob - (0.5f32).ln()).abs() < 1e-6);
        assert_eq!(
            token_logprob(&inf, 1.0, 0, 0, piece).logprob,
            f32::NEG_INFINITY
        );
        let none = [f32::NEG_INFINITY; 3];
        let e = token_logprob(&none, 1.0, 0, 3, piece);
        assert_eq!(e.logprob, f32::NEG_INFINITY);
        assert!(e.top.is_empty());
    }
}
