//! When generation ends: end-of-generation tokens and stop strings.
//!
//! Stop strings are matched on the decoded text as it streams. The matcher
//! holds back any tail of the text that could still grow into a stop string
//! and releases it once it cannot, so a client never sees part of a stop
//! string, and never sees the stop string itself: output ends right before
//! the first stop string to complete. Matching is on bytes of valid UTF-8, so a held-back
//! split always falls on a character boundary.

/// Everything that ends a generation besides the token budget.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopConditions {
    /// End-of-generation token ids (EOS, EOT, ...; e.g. `Vocab::eog_tokens`).
    pub eog_tokens: Vec<u32>,
    /// Generation stops before the first occurrence of any of these.
    pub stop_strings: Vec<String>,
    /// Keep generating past EOG tokens. Like llama.cpp, pair it with
    /// [`StopConditions::suppress_eog`] so EOG tokens are never sampled.
    pub ignore_eos: bool,
}

impl StopConditions {
    /// Whether `token` is an end-of-generation token.
    pub fn is_eog(&self, token: u32) -> bool {
        self.eog_tokens.contains(&token)
    }

    /// Whether sampling `token` ends the generation (an EOG token and
    /// `ignore_eos` off). The token itself should not be shown.
    pub fn stops_at(&self, token: u32) -> bool {
        !self.ignore_eos && self.is_eog(token)
    }

    /// With `ignore_eos`, sets EOG tokens' logits to `-inf` (llama.cpp's
    /// logit bias for `ignore_eos`); otherwise does nothing. Call before
    /// sampling.
    pub fn suppress_eog(&self, logits: &mut [f32]) {
        if !self.ignore_eos {
            return;
        }
        for &t in &self.eog_tokens {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// A fresh streaming matcher for this generation's stop strings.
    pub fn matcher(&self) -> StopMatcher {
        StopMatcher::new(&self.stop_strings)
    }
}

/// Streaming stop-string matcher over generated text.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released: a suffix that is a proper prefix
    /// of some stop string.
    held: String,
    /// Index into `stops` of the string that matched.
    matched: Option<usize>,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new<S: AsRef<str>>(stops: &[S]) -> Self {
        Self {
            stops: stops
                .iter()
                .map(|s| s.as_ref().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// Feeds a chunk of generated text and appends to `out` whatever can be
    /// shown. Returns `true` once a stop string has matched: the text before
    /// it has been released, the rest is dropped, and later chunks are ignored.
    pub fn push(&mut self, chunk: &str, out: &mut String) -> bool {
        if self.matched.is_some() {
            return true;
        }
        self.held.push_str(chunk);

        // The match that completes first, as it would streaming byte by byte
        // (so the result does not depend on how the text was chunked); on a
        // tie the one starting earlier, then the first listed.
        let mut best: Option<(usize, usize, usize)> = None; // (end, start, stop index)
        for (i, s) in self.stops.iter().enumerate() {
            if let Some(start) = self.held.find(s.as_str()) {
                let end = start + s.len();
                if best.is_none_or(|(e, st, _)| (end, start) < (e, st)) {
                    best = Some((end, start, i));
                }
            }
        }
        if let Some((_, pos, i)) = best {
            out.push_str(&self.held[..pos]);
            self.held.clear();
            self.matched = Some(i);
            return true;
        }

        let hold = self.longest_partial();
        let release = self.held.len() - hold;
        debug_assert!(self.held.is_char_boundary(release));
        out.push_str(&self.held[..release]);
        self.held.drain(..release);
        false
    }

    /// Ends the stream: releases any held-back text into `out` (unless a stop
    /// string matched, in which case there is none).
    pub fn finish(&mut self, out: &mut String) {
        out.push_str(&self.held);
        self.held.clear();
    }

    /// The stop string that matched, if any.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Bytes currently held back.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Ready for a new generation with the same stop strings.
    pub fn reset(&mut self) {
        self.held.clear();
        self.matched = None;
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a
    /// stop string. Stop strings begin at a character start, so a suffix
    /// that matches one starts on a character boundary.
    fn longest_partial(&self) -> usize {
        let held = self.held.as_bytes();
        let mut best = 0;
        for s in &self.stops {
            let s = s.as_bytes();
            let max = (s.len() - 1).min(held.len());
            for len in (best + 1..=max).rev() {
                if held.ends_with(&s[..len]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}
