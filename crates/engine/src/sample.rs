//! The sampling chain: logits in, one token id out.
//!
//! Same samplers, order and arithmetic as llama.cpp's default chain
//! (`common_sampler` with mirostat off): penalties → top-k → top-p → min-p →
//! temperature → `dist`. Top-p and min-p therefore see the logits at
//! temperature 1; temperature only reshapes the final draw. The draw uses
//! `std::mt19937` and `uniform_real_distribution<double>` re-implemented in
//! [`crate::rng`], so a seed is reproducible across platforms and, when the
//! candidates are in the same order (no tied logits), picks the same token
//! llama.cpp picks for that seed.
//!
//! `temp <= 0` is greedy: penalties, then argmax over the logits slice
//! without building candidates. Ties go to the lowest id (llama.cpp leaves
//! the tie order to an unstable partial sort).
//!
//! Non-finite logits: NaN counts as `-inf`; `-inf` tokens are never drawn.
//! `+inf` tokens win outright (shared uniformly if several). When no token
//! is left (all `-inf`/NaN, or an empty slice), [`Sampler::try_sample`]
//! returns [`SampleError::NoCandidates`] and [`Sampler::sample`] returns
//! token 0.
//!
//! Cost: buffers are reused, so nothing is allocated per call after the
//! first. With the default chain (top-k 40) the k best come from one pass
//! through a small heap: about 0.1 ms for a 152k vocabulary, the same as a
//! greedy argmax. With `top_k = 0` every token becomes a candidate; top-p
//! then sorts only as much of the ranking as the nucleus needs, which for a
//! flat distribution over a large vocabulary can still take milliseconds
//! (`examples/sample_bench.rs`).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use crate::rng::Mt19937;

/// Sampling parameters. `Default` gives llama.cpp's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Temperature; `<= 0` samples greedily (argmax).
    pub temp: f32,
    /// Keep the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Nucleus: keep the smallest prefix whose probability reaches `top_p`; `>= 1` disables.
    pub top_p: f32,
    /// Drop tokens with probability below `min_p` times the best one's; `<= 0` disables.
    pub min_p: f32,
    /// Top-p and min-p keep at least this many candidates (llama.cpp `min_keep`).
    pub min_keep: usize,
    /// Divide positive logits (multiply non-positive ones) of recent tokens; 1 disables.
    pub repeat_penalty: f32,
    /// Subtract `count * frequency_penalty` from recent tokens' logits; 0 disables.
    pub frequency_penalty: f32,
    /// Subtract `presence_penalty` once from every recent token's logit; 0 disables.
    pub presence_penalty: f32,
    /// How many accepted tokens the penalties look back over; 0 disables penalties.
    pub penalty_last_n: usize,
    /// RNG seed; `None` picks a random one (read it back with [`Sampler::seed`]).
    pub seed: Option<u32>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            min_keep: 0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: None,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding with no penalties.
    pub fn greedy() -> Self {
        Self {
            temp: 0.0,
            ..Self::default()
        }
    }

    fn penalties_enabled(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.frequency_penalty != 0.0
                || self.presence_penalty != 0.0)
    }
}

/// Why no token could be sampled.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SampleError {
    #[error("no token can be sampled: the logits are empty or all -inf/NaN")]
    NoCandidates,
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: u32,
    logit: f32,
    p: f32,
}

/// Descending logit, then ascending id: a total order (NaNs never get in),
/// so partial selection is deterministic.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit
        .partial_cmp(&a.logit)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

/// A candidate ordered by rank, worst greatest: a `BinaryHeap` of these
/// keeps the worst of the current top k on top.
#[derive(Clone, Copy, Debug)]
struct Ranked(Candidate);

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        by_logit_desc(&self.0, &other.0)
    }
}

/// Above this top-k, selecting from a full candidate array beats the heap.
const HEAP_TOP_K_MAX: usize = 4096;

/// Unnormalised softmax weight of `logit` against the maximum `max`.
/// With a `+inf` maximum only the `+inf` tokens carry weight.
fn weight(logit: f32, max: f32) -> f32 {
    if max == f32::INFINITY {
        if logit == f32::INFINITY {
            1.0
        } else {
            0.0
        }
    } else {
        (logit - max).exp()
    }
}

/// A sampling chain with its penalty history and RNG.
pub struct Sampler {
    config: SamplerConfig,
    seed: u32,
    rng: Box<Mt19937>,
    /// The last `penalty_last_n` accepted tokens, oldest first.
    history: VecDeque<u32>,
    /// Occurrences of each token in `history`.
    counts: HashMap<u32, u32>,
    /// Reused candidate buffer, (≤ vocab,).
    cands: Vec<Candidate>,
    /// Reused top-k heap, (≤ top_k,).
    heap: BinaryHeap<Ranked>,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Self {
        let seed = config.seed.unwrap_or_else(random_seed);
        let window = config.penalty_last_n.min(1 << 16);
        Self {
            seed,
            rng: Box::new(Mt19937::new(seed)),
            history: VecDeque::with_capacity(window),
            counts: HashMap::with_capacity(window),
            cands: Vec::new(),
            heap: BinaryHeap::new(),
            config,
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// The seed in use (the random one if the config gave none).
    pub fn seed(&self) -> u32 {
        self.seed
    }

    /// Token ids and probabilities of the candidates the last draw chose
    /// from (after top-k/top-p/min-p and temperature), best first unless no
    /// filter sorted them. Empty after a greedy sample.
    pub fn last_candidates(&self) -> impl Iterator<Item = (u32, f32)> + '_ {
        let sum: f64 = self.cands.iter().map(|c| c.p as f64).sum();
        self.cands
            .iter()
            .map(move |c| (c.id, (c.p as f64 / sum) as f32))
    }

    /// Records a token for the penalties. Call it for every generated token
    /// (and for prompt tokens too, to penalise repeats of the prompt as
    /// llama-cli does).
    pub fn accept(&mut self, token: u32) {
        let n = self.config.penalty_last_n;
        if n == 0 {
            return;
        }
        if self.history.len() >= n {
            if let Some(old) = self.history.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.history.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// Forgets the penalty history and restarts the RNG from the same seed,
    /// so a reset sampler repeats its first run exactly.
    pub fn reset(&mut self) {
        self.history.clear();
        self.counts.clear();
        *self.rng = Mt19937::new(self.seed);
    }

    /// Picks the next token. The logits are modified (penalties applied in
    /// place). Returns token 0 when nothing can be sampled; see
    /// [`Sampler::try_sample`] to tell that case apart.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.try_sample(logits).unwrap_or(0)
    }

    /// Greedy with no penalties: the pick is the plain argmax, and the
    /// logits are not modified.
    pub fn is_plain_greedy(&self) -> bool {
        self.config.temp <= 0.0 && !self.config.penalties_enabled()
    }

    /// [`Sampler::sample`] on logits the caller keeps: copied into
    /// `scratch` only when the chain would modify them (penalties, or any
    /// sampling but plain greedy). A server samples every slot's row this
    /// way without a 4096-float copy per token.
    pub fn sample_from(&mut self, logits: &[f32], scratch: &mut Vec<f32>) -> u32 {
        if self.is_plain_greedy() {
            self.cands.clear();
            return argmax(logits).unwrap_or(0);
        }
        scratch.clear();
        scratch.extend_from_slice(logits);
        self.sample(scratch)
    }

    /// Picks the next token, or fails when every logit is `-inf`/NaN or the
    /// slice is empty.
    pub fn try_sample(&mut self, logits: &mut [f32]) -> Result<u32, SampleError> {
        self.apply_penalties(logits);
        if self.config.temp <= 0.0 {
            self.cands.clear();
            return argmax(logits).ok_or(SampleError::NoCandidates);
        }

        // Candidates: every token that can still be drawn, or with a small
        // top-k only the k best, picked in one pass through a heap (a 150k
        // vocab then costs a scan, not a 150k-element selection).
        let k = self.config.top_k;
        self.cands.clear();
        let mut sorted = if k > 0 && k <= HEAP_TOP_K_MAX && k < logits.len() {
            self.heap_top_k(logits, k);
            self.cands.sort_unstable_by(by_logit_desc);
            true
        } else {
            self.cands.reserve(logits.len());
            self.cands.extend(
                logits
                    .iter()
                    .enumerate()
                    .filter_map(|(id, &l)| candidate(id, l)),
            );
            !self.cands.is_empty() && top_k(&mut self.cands, k)
        };
        if self.cands.is_empty() {
            return Err(SampleError::NoCandidates);
        }

        top_p(
            &mut self.cands,
            &mut sorted,
            self.config.top_p,
            self.config.min_keep,
        );
        min_p(
            &mut self.cands,
            &mut sorted,
            self.config.min_p,
            self.config.min_keep,
        );
        let temp = self.config.temp;
        for c in self.cands.iter_mut() {
            c.logit /= temp;
        }
        Ok(dist(&mut self.cands, sorted, &mut self.rng))
    }

    /// Fills `cands` with the `k` best samplable tokens (unsorted).
    fn heap_top_k(&mut self, logits: &[f32], k: usize) {
        let heap = &mut self.heap;
        heap.clear();
        // Logit of the worst kept candidate once the heap is full; anything
        // below it cannot get in, which settles most tokens with one compare.
        let mut floor = f32::NEG_INFINITY;
        for (id, &l) in logits.iter().enumerate() {
            if l < floor {
                continue;
            }
            let Some(c) = candidate(id, l) else { continue };
            if heap.len() < k {
                heap.push(Ranked(c));
                if heap.len() == k {
                    floor = heap.peek().map_or(floor, |w| w.0.logit);
                }
            } else if heap.peek().is_some_and(|w| Ranked(c) < *w) {
                if let Some(mut worst) = heap.peek_mut() {
                    *worst = Ranked(c); // sifts down when `worst` drops
                }
                floor = heap.peek().map_or(floor, |w| w.0.logit);
            }
        }
        self.cands.extend(heap.drain().map(|r| r.0));
    }

    /// llama.cpp `penalties`: applied to the logits of tokens seen in the
    /// last `penalty_last_n` accepted tokens; everything else is untouched.
    fn apply_penalties(&self, logits: &mut [f32]) {
        if !self.config.penalties_enabled() {
            return;
        }
        let cfg = &self.config;
        for (&token, &count) in &self.counts {
            let Some(logit) = logits.get_mut(token as usize) else {
                continue;
            };
            // Dividing a negative logit would make the token more likely,
            // so non-positive logits are multiplied instead.
            if *logit <= 0.0 {
                *logit *= cfg.repeat_penalty;
            } else {
                *logit /= cfg.repeat_penalty;
            }
            *logit -= count as f32 * cfg.frequency_penalty + cfg.presence_penalty;
        }
    }
}

/// A drawable candidate for token `id`, or `None` for NaN and `-inf`.
fn candidate(id: usize, logit: f32) -> Option<Candidate> {
    if logit.is_nan() || logit == f32::NEG_INFINITY {
        return None;
    }
    // `+ 0.0` turns -0.0 into 0.0 so it ties with 0.0 by id.
    Some(Candidate {
        id: id as u32,
        logit: logit + 0.0,
        p: 0.0,
    })
}

/// Index of the largest logit, lowest id on ties, NaN ignored; `None` if
/// every logit is `-inf` or NaN.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    // Two passes: the maximum (NaN never compares greater), then its first
    // position. Eight independent running maxima break the compare-select
    // dependency chain so the first pass vectorises.
    let pick = |m: f32, l: f32| if l > m { l } else { m };
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = logits.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &l) in lanes.iter_mut().zip(c) {
            *m = pick(*m, l);
        }
    }
    let max = tail
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &l| pick(m, l));
    if max == f32::NEG_INFINITY {
        return None;
    }
    // The first chunk holding the maximum (a compare-or over the chunk
    // vectorises; `position` stops early and does not), then its place.
    let chunk = logits
        .chunks(16)
        .position(|c| c.iter().fold(false, |hit, &l| hit | (l == max)))?;
    let at = logits[16 * chunk..].iter().position(|&l| l == max)?;
    Some((16 * chunk + at) as u32)
}

/// Keeps the `k` best candidates, sorted. Returns whether the candidates are
/// now sorted (they are unless `k` is 0).
fn top_k(cands: &mut Vec<Candidate>, k: usize) -> bool {
    if k == 0 {
        return false;
    }
    if k < cands.len() {
        cands.select_nth_unstable_by(k - 1, by_logit_desc);
        cands.truncate(k);
    }
    cands.sort_unstable_by(by_logit_desc);
    true
}

/// Fills `p` with the softmax of the candidates' logits.
fn softmax(cands: &mut [Candidate], sorted: bool) {
    let max = if sorted {
        cands[0].logit
    } else {
        cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit))
    };
    let mut sum = 0.0f32;
    for c in cands.iter_mut() {
        c.p = weight(c.logit, max);
        sum += c.p;
    }
    for c in cands.iter_mut() {
        c.p /= sum;
    }
}

/// llama.cpp `top_p`: softmax, then keep the shortest best-first prefix
/// whose cumulative probability reaches `p` (and at least `min_keep`).
fn top_p(cands: &mut Vec<Candidate>, sorted: &mut bool, p: f32, min_keep: usize) {
    if p >= 1.0 {
        return;
    }
    softmax(cands, *sorted);

    // Unsorted: sort only a head that a histogram says holds the nucleus;
    // the rest is sorted only if the exact scan runs past it (it all ranks
    // below the head, so head + rest is the full ranking).
    let n = cands.len();
    let mut sorted_len = n;
    if !*sorted {
        sorted_len = if n > 1024 { nucleus_head(cands, p) } else { n };
        cands[..sorted_len].sort_unstable_by(by_logit_desc);
        *sorted = true; // the kept prefix will be
    }

    let mut cum = 0.0f32;
    let mut keep = n;
    for i in 0..n {
        if i == sorted_len {
            cands[sorted_len..].sort_unstable_by(by_logit_desc);
            sorted_len = n;
        }
        cum += cands[i].p;
        if cum >= p && i + 1 >= min_keep {
            keep = i + 1;
            break;
        }
    }
    cands.truncate(keep);
}

/// Moves to the front the candidates of the highest logit buckets that
/// together carry a bit more than probability `p` (a 512-bucket histogram
/// over the logit range) and returns how many. Bucketing is monotone in the
/// logit, so the head is exactly the top of the ranking.
fn nucleus_head(cands: &mut [Candidate], p: f32) -> usize {
    const BUCKETS: usize = 512;
    let (lo, hi) = cands
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), c| {
            (lo.min(c.logit), hi.max(c.logit))
        });
    let span = hi - lo;
    if !span.is_finite() || span <= 0.0 {
        return cands.len(); // +inf logits, overflow, or all equal
    }
    let scale = (BUCKETS - 1) as f32 / span;
    let bucket = |l: f32| (((l - lo) * scale) as usize).min(BUCKETS - 1);

    let mut mass = [0.0f64; BUCKETS];
    for c in cands.iter() {
        mass[bucket(c.logit)] += c.p as f64;
    }
    // Margin for the exact scan's f32 sums; falling short only costs a sort.
    let target = p as f64 + 1e-3;
    let mut acc = 0.0;
    let mut cut = 0;
    for b in (0..BUCKETS).rev() {
        acc += mass[b];
        if acc >= target {
            cut = b;
            break;
        }
    }

    let mut head = 0;
    for i in 0..cands.len() {
        if bucket(cands[i].logit) >= cut {
            cands.swap(i, head);
            head += 1;
        }
    }
    head
}

/// llama.cpp `min_p`: keep candidates whose logit is at least
/// `max + ln(p)`, i.e. probability at least `p` times the best one's.
fn min_p(cands: &mut Vec<Candidate>, sorted: &mut bool, p: f32, min_keep: usize) {
    if p <= 0.0 || cands.is_empty() {
        return;
    }
    let max = if *sorted {
        cands[0].logit
    } else {
        cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit))
    };
    let min_logit = max + p.ln();

    let passing = cands.iter().filter(|c| c.logit >= min_logit).count();
    if !*sorted && passing > 0 && passing >= min_keep {
        cands.retain(|c| c.logit >= min_logit);
        return;
    }
    // Sorted (or too few pass): the best is always kept, then down the
    // ranking until a logit falls below the bound with `min_keep` met.
    if !*sorted {
        cands.sort_unstable_by(by_logit_desc);
        *sorted = true;
    }
    let mut i = 1;
    while i < cands.len() && !(cands[i].logit < min_logit && i >= min_keep) {
        i += 1;
    }
    cands.truncate(i);
}

/// llama.cpp `dist`: softmax and one uniform draw, walking the cumulative
/// sum in candidate order. Always consumes exactly one draw.
fn dist(cands: &mut [Candidate], sorted: bool, rng: &mut Mt19937) -> u32 {
    if cands.len() == 1 {
        // llama.cpp draws even here, keeping the stream aligned.
        rng.next_f64();
        cands[0].p = 1.0;
        return cands[0].id;
    }
    let max = if sorted {
        cands[0].logit
    } else {
        cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit))
    };
    let mut sum = 0.0f64;
    for c in cands.iter_mut() {
        c.p = weight(c.logit, max);
        sum += c.p as f64;
    }
    let target = sum * rng.next_f64();
    let mut run = 0.0f64;
    for c in cands.iter() {
        run += c.p as f64;
        // `p > 0` keeps a zero-weight token from winning a draw of exactly 0.
        if c.p > 0.0 && run >= target {
            return c.id;
        }
    }
    // Rounding left the target out of reach: take the best candidate.
    cands
        .iter()
        .copied()
        .min_by(by_logit_desc)
        .map_or(cands[0].id, |c| c.id)
}

/// A seed from the OS-seeded hasher keys and the clock; no extra crates.
pub fn random_seed() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    let x = h.finish();
    (x ^ (x >> 32)) as u32
}
