//! How one job generates ([`GenParams`]), and the one check of sampling
//! settings ([`validate`]) that the CLI flags and the server's request
//! parser share. The check names the setting with a [`SamplingParam`]; each
//! caller says it in its own words (`--temp` on the command line,
//! `temperature` in JSON).

use crate::sample::SamplerConfig;

/// How one job generates.
#[derive(Clone, Debug, PartialEq)]
pub struct GenParams {
    /// Most tokens to generate (`usize::MAX`: until the context is full).
    pub max_tokens: usize,
    pub sampling: SamplerConfig,
    /// Generation ends before the first of these; it is not returned.
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens (they are never
    /// sampled, as llama.cpp's `--ignore-eos` does).
    pub ignore_eos: bool,
    /// End-of-generation tokens besides the vocabulary's own (a chat
    /// template's end of turn the vocabulary does not mark).
    pub extra_eog: Vec<u32>,
    /// Report each generated token's log-probability and this many most
    /// likely alternatives (at most [`MAX_TOP_LOGPROBS`]) through
    /// [`crate::Sink::logprobs`]; `None`: none (see [`crate::logprobs`]).
    pub logprobs: Option<usize>,
    /// Added to these tokens' logits before the sampling chain (OpenAI's
    /// `logit_bias`, [`MAX_LOGIT_BIAS`] either way: -100 bans a token in
    /// practice, +100 forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// Structured output: only tokens this grammar allows are sampled, and
    /// the job ends when its output is complete (see [`crate::constraint`]).
    pub constraint: Option<crate::constraint::Grammar>,
    /// Speculative decoding by prompt lookup (see [`crate::speculate`]):
    /// the same output, sooner when it copies its context.
    pub lookup: Option<crate::speculate::Lookup>,
    /// Speculative decoding with the backend's draft model (see
    /// [`crate::draft`]), where prompt lookup has no guess; nothing without
    /// one.
    pub draft_model: Option<crate::draft::ModelDraft>,
}

/// Most alternatives a token's log-probabilities list (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Largest bias `logit_bias` takes, either way (OpenAI's range).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

impl GenParams {
    /// Sampling as given, no limit but the context, no stop strings.
    pub fn new(sampling: SamplerConfig) -> GenParams {
        GenParams {
            max_tokens: usize::MAX,
            sampling,
            stop: Vec::new(),
            ignore_eos: false,
            extra_eog: Vec::new(),
            logprobs: None,
            logit_bias: Vec::new(),
            constraint: None,
            lookup: None,
            draft_model: None,
        }
    }
}

/// A sampling setting, for naming it in an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplingParam {
    Temperature,
    TopP,
    MinP,
    RepeatPenalty,
    FrequencyPenalty,
    PresencePenalty,
}

impl SamplingParam {
    /// The command-line flag.
    pub fn flag(self) -> &'static str {
        match self {
            SamplingParam::Temperature => "--temp",
            SamplingParam::TopP => "--top-p",
            SamplingParam::MinP => "--min-p",
            SamplingParam::RepeatPenalty => "--repeat-penalty",
            SamplingParam::FrequencyPenalty => "--frequency-penalty",
            SamplingParam::PresencePenalty => "--presence-penalty",
        }
    }

    /// The request field (OpenAI's name, or llama.cpp server's extension).
    pub fn field(self) -> &'static str {
        match self {
            SamplingParam::Temperature => "temperature",
            SamplingParam::TopP => "top_p",
            SamplingParam::MinP => "min_p",
            SamplingParam::RepeatPenalty => "repeat_penalty",
            SamplingParam::FrequencyPenalty => "frequency_penalty",
            SamplingParam::PresencePenalty => "presence_penalty",
        }
    }
}

/// A sampling setting out of its range.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingError {
    pub param: SamplingParam,
    /// What the value must be, e.g. "between 0 and 1".
    pub rule: &'static str,
    pub value: f32,
}

impl SamplingError {
    /// The message, with the setting called `name`.
    pub fn describe(&self, name: &str) -> String {
        format!("{name} must be {}, not {}", self.rule, self.value)
    }
}

/// Check every setting of `c`: finite numbers in the ranges llama.cpp
/// accepts. The first one out of range is the error.
pub fn validate(c: &SamplerConfig) -> Result<(), SamplingError> {
    use SamplingParam::*;
    /// A setting, its value, the rule in words, and the rule.
    type Check = (SamplingParam, f32, &'static str, fn(f32) -> bool);
    let checks: [Check; 6] = [
        (Temperature, c.temp, "a number of at least 0", |v| v >= 0.0),
        (TopP, c.top_p, "between 0 and 1", |v| {
            (0.0..=1.0).contains(&v)
        }),
        (MinP, c.min_p, "between 0 and 1", |v| {
            (0.0..=1.0).contains(&v)
        }),
        (
            RepeatPenalty,
            c.repeat_penalty,
            "a positive number (1 is off)",
            |v| v > 0.0,
        ),
        // Any size, as llama.cpp takes them (OpenAI documents -2..2).
        (FrequencyPenalty, c.frequency_penalty, "a number", |_| true),
        (PresencePenalty, c.presence_penalty, "a number", |_| true),
    ];
    for (param, value, rule, ok) in checks {
        if !value.is_finite() || !ok(value) {
            return Err(SamplingError { param, rule, value });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_greedy_pass() {
        assert_eq!(validate(&SamplerConfig::default()), Ok(()));
        assert_eq!(validate(&SamplerConfig::greedy()), Ok(()));
    }

    #[test]
    fn each_setting_out_of_range_is_named() {
        type Spoil = fn(&mut SamplerConfig);
        let bad: [(Spoil, SamplingParam); 9] = [
            (|c| c.temp = -0.1, SamplingParam::Temperature),
            (|c| c.temp = f32::NAN, SamplingParam::Temperature),
            (|c| c.top_p = 1.5, SamplingParam::TopP),
            (|c| c.min_p = -0.5, SamplingParam::MinP),
            (|c| c.repeat_penalty = 0.0, SamplingParam::RepeatPenalty),
            (
                |c| c.repeat_penalty = f32::INFINITY,
                SamplingParam::RepeatPenalty,
            ),
            (
                |c| c.frequency_penalty = f32::NAN,
                SamplingParam::FrequencyPenalty,
            ),
            (
                |c| c.presence_penalty = f32::NEG_INFINITY,
                SamplingParam::PresencePenalty,
            ),
            (
                |c| c.presence_penalty = f32::NAN,
                SamplingParam::PresencePenalty,
            ),
        ];
        for (set, param) in bad {
            let mut c = SamplerConfig::default();
            set(&mut c);
            let e = validate(&c).expect_err("out of range");
            assert_eq!(e.param, param);
            assert!(e.describe(param.flag()).starts_with(param.flag()));
        }
    }

    #[test]
    fn range_ends_are_accepted() {
        let c = SamplerConfig {
            temp: 0.0,
            top_p: 1.0,
            min_p: 0.0,
            frequency_penalty: -20.0,
            presence_penalty: 5.0,
            ..SamplerConfig::default()
        };
        assert_eq!(validate(&c), Ok(()));
    }
}
