//! Structured output: a grammar that decides which tokens may come next.
//!
//! A [`ConstraintSpec`] says what the output must be: any JSON object, a
//! JSON Schema, or a grammar (llama.cpp's GBNF, or Lark as llguidance reads
//! it). [`GrammarCompiler`] turns a spec into a [`Grammar`] for one model's
//! vocabulary; a job's [`GenParams`](crate::GenParams) carries the grammar
//! and the scheduler starts a [`Constraint`] from it, which per step gives
//! the allowed tokens, takes the sampled one, and says when the output is
//! complete.
//!
//! The work is llguidance's (the library llama.cpp and mistral.rs use): a
//! byte trie of the vocabulary walked against an Earley parser over a lazy
//! regex lexer, so a mask costs tens of microseconds whatever the vocabulary
//! size. The trie (and llguidance's precomputed slices of it) is built once
//! per model in [`GrammarCompiler::new`]; a server keeps that one compiler
//! for every request. Compiling a spec is per request; starting a
//! constraint from a compiled grammar is a clone.
//!
//! Tokens are given to the trie as llama.cpp gives them: the bytes each
//! prints, and for control tokens their text behind llguidance's 0xFF
//! marker, so no grammar text can ever produce them (a Lark grammar can
//! still name one, `<|im_end|>`). End-of-generation tokens are allowed
//! exactly when the grammar could end here; when nothing more could follow
//! the job ends by itself.
//!
//! JSON whitespace between tokens is bounded (one space, or one or two
//! newlines and up to 20 spaces or tabs, as llama.cpp's JSON grammars): an
//! unbounded run lets a small model loop on newlines until `max_tokens`.
//! A schema's own `x-guidance` options win.

mod gbnf;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};
use serde_json::Value;
use tokenize::Vocab;

pub use gbnf::gbnf_to_lark;

/// What the output must be.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A value valid against this JSON Schema.
    JsonSchema(Value),
    /// A grammar in llama.cpp's GBNF (`root ::= ...`).
    Gbnf(String),
    /// A grammar in llguidance's Lark syntax (`start: ...`).
    Lark(String),
}

impl ConstraintSpec {
    /// A grammar as llama.cpp's `grammar` field and `--grammar` take it:
    /// GBNF, or llguidance's Lark when it starts with `%llguidance`.
    pub fn grammar(text: &str) -> ConstraintSpec {
        if text.trim_start().starts_with("%llguidance") {
            ConstraintSpec::Lark(text.to_string())
        } else {
            ConstraintSpec::Gbnf(text.to_string())
        }
    }

    /// What kind of spec this is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::JsonObject => "JSON object",
            ConstraintSpec::JsonSchema(_) => "JSON schema",
            ConstraintSpec::Gbnf(_) => "GBNF grammar",
            ConstraintSpec::Lark(_) => "Lark grammar",
        }
    }
}

/// Why a spec could not be compiled, or a constraint could not go on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// The vocabulary could not be made into a token trie.
    #[error("structured output is not available for this vocabulary: {0}")]
    Vocab(String),
    /// The spec is not valid (or not supported): what it is and the problem.
    #[error("invalid {kind}: {message}")]
    Invalid { kind: &'static str, message: String },
    /// The grammar failed while generating (a limit of the parser reached).
    #[error("the output grammar failed: {0}")]
    Failed(String),
}

/// Whitespace allowed between JSON tokens (see the module docs).
const JSON_WHITESPACE: &str = r"(?: |\n{1,2}[ \t]{0,20})";

/// Error messages are cut to this many bytes (llguidance's can quote a
/// whole grammar).
const MAX_MESSAGE: usize = 600;

/// Compiles specs for one model's vocabulary; holds the token trie. Build
/// it once per model and share it (it is `Send + Sync`).
pub struct GrammarCompiler {
    factory: ParserFactory,
    n_vocab: usize,
    eos: u32,
    build_time: Duration,
}

impl fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("n_vocab", &self.n_vocab)
            .field("build_time", &self.build_time)
            .finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// The trie of `vocab`'s tokens, for logits rows of `n_vocab` (ids the
    /// vocabulary does not have are never allowed).
    pub fn new(vocab: &Vocab, n_vocab: usize) -> Result<GrammarCompiler, ConstraintError> {
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| token_bytes(vocab, id))
            .collect();
        // The trie's end token is never text (the mask always bans it; the
        // model's end tokens are handled apart): the vocabulary's own end,
        // else any control or empty token.
        let is_text = |t: u32| {
            words[t as usize]
                .first()
                .is_some_and(|&b| b != TokTrie::SPECIAL_TOKEN_MARKER)
        };
        let eos = vocab
            .eos()
            .into_iter()
            .chain(vocab.eog_tokens().iter().copied())
            .find(|&t| (t as usize) < n_vocab)
            .or_else(|| (0..n_vocab as u32).find(|&t| !is_text(t)))
            .unwrap_or(0);
        GrammarCompiler::from_token_bytes(words, eos)
    }

    /// The trie of tokens given by their bytes (id = index), control tokens
    /// as `0xFF` followed by their text; `eos` is the trie's end token.
    pub fn from_token_bytes(
        words: Vec<Vec<u8>>,
        eos: u32,
    ) -> Result<GrammarCompiler, ConstraintError> {
        let start = Instant::now();
        let n_vocab = words.len();
        if n_vocab == 0 || eos as usize >= n_vocab {
            return Err(ConstraintError::Vocab(format!(
                "end token {eos} outside a vocabulary of {n_vocab}"
            )));
        }
        let info = TokRxInfo::new(n_vocab as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: Arc<dyn TokenizerEnv + Sync> = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Vocab(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            // Errors name the problem, not the whole parser state.
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(GrammarCompiler {
            factory,
            n_vocab,
            eos,
            build_time: start.elapsed(),
        })
    }

    /// Width of the masks (the model's logits row).
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// How long building the trie took.
    pub fn build_time(&self) -> Duration {
        self.build_time
    }

    /// Compile `spec` for this vocabulary.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Grammar, ConstraintError> {
        let kind = spec.kind();
        let invalid = |message: String| ConstraintError::Invalid {
            kind,
            message: shorten(message),
        };
        let grammar = match spec {
            ConstraintSpec::JsonObject => TopLevelGrammar::from_json_schema(json_options(
                serde_json::json!({"type": "object"}),
            )),
            ConstraintSpec::JsonSchema(schema) => {
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(invalid("a schema must be an object or a boolean".into()));
                }
                TopLevelGrammar::from_json_schema(json_options(schema.clone()))
            }
            ConstraintSpec::Gbnf(text) => {
                TopLevelGrammar::from_lark(gbnf_to_lark(text).map_err(invalid)?)
            }
            ConstraintSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| invalid(e.to_string()))?;
        let grammar = Grammar {
            spec: Arc::new(spec.clone()),
            parser: Arc::new(parser),
            eos: self.eos,
        };
        // A grammar that allows nothing at its start is no use to anyone:
        // say so now rather than fail the job.
        let mut probe = grammar.start();
        let mask = probe.allowed().map_err(|e| invalid(e.to_string()))?;
        if mask.is_zero() && !probe.is_complete() {
            return Err(invalid("it allows no token of this vocabulary".into()));
        }
        Ok(grammar)
    }
}

/// The bytes token `id` stands for in the trie (llama.cpp's rule).
fn token_bytes(vocab: &Vocab, id: u32) -> Vec<u8> {
    let plain = vocab.token_to_piece(id, false);
    if !plain.is_empty() {
        return plain.to_vec();
    }
    let special = vocab.token_to_piece(id, true);
    if special.is_empty() {
        return Vec::new();
    }
    let mut w = Vec::with_capacity(special.len() + 1);
    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
    w.extend_from_slice(special);
    w
}

/// `schema` with bounded whitespace, unless it sets its own options.
fn json_options(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }));
    }
    schema
}

fn shorten(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// A compiled spec, ready to start constraints from. Cheap to clone; two
/// grammars are equal when their specs are.
#[derive(Clone)]
pub struct Grammar {
    spec: Arc<ConstraintSpec>,
    parser: Arc<TokenParser>,
    eos: u32,
}

impl Grammar {
    pub fn spec(&self) -> &ConstraintSpec {
        &self.spec
    }

    /// A fresh constraint at the start of the output. Constraints started
    /// from one grammar share its lexer's cache of states (llguidance's
    /// shallow clone, the one its `Matcher` makes for servers; a mutex
    /// guards it), so a state one job found is there for the next, and
    /// starting copies no cache.
    pub fn start(&self) -> Constraint {
        Constraint {
            matcher: Matcher::new(Ok(TokenParser::clone(&self.parser))),
            mask: None,
            accepting: None,
            eos: self.eos,
            failure: None,
        }
    }
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Grammar").field(&self.spec).finish()
    }
}

impl PartialEq for Grammar {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec
    }
}

/// One output's progress through a grammar.
pub struct Constraint {
    matcher: Matcher,
    /// The allowed tokens at this point, once computed.
    mask: Option<SimpleVob>,
    /// Whether the grammar could end at this point, once asked.
    accepting: Option<bool>,
    /// The trie's end token.
    eos: u32,
    failure: Option<String>,
}

impl Constraint {
    /// The tokens allowed next (computed once per position). The trie's own
    /// end token is set when the grammar could end here.
    pub fn allowed(&mut self) -> Result<&SimpleVob, ConstraintError> {
        if self.mask.is_none() {
            let mask = self
                .matcher
                .compute_mask()
                .map_err(|e| ConstraintError::Failed(shorten(e.to_string())))?;
            self.mask = Some(mask);
        }
        Ok(self.mask.as_ref().expect("computed above"))
    }

    /// Set every logit of `row` the grammar does not allow to −∞. The
    /// end-of-generation tokens `eog` keep theirs when the grammar could
    /// end here and `allow_eog`, else they are −∞ too.
    pub fn mask(
        &mut self,
        row: &mut [f32],
        eog: &[u32],
        allow_eog: bool,
    ) -> Result<(), ConstraintError> {
        let accepting = allow_eog && self.is_accepting();
        // A handful of ids: kept aside while the mask goes over the row.
        let ends: Vec<(usize, f32)> = eog
            .iter()
            .filter_map(|&t| Some((t as usize, *row.get(t as usize)?)))
            .collect();
        let words = self.allowed()?.as_slice();
        // (n_vocab,) logits, 32 ids per mask word.
        for (chunk, &bits) in row.chunks_mut(32).zip(words) {
            match bits {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                _ => {
                    // A select per lane, no branch: the compiler vectorizes it.
                    for (j, l) in chunk.iter_mut().enumerate() {
                        *l = if (bits >> j) & 1 != 0 {
                            *l
                        } else {
                            f32::NEG_INFINITY
                        };
                    }
                }
            }
        }
        if row.len() > words.len() * 32 {
            row[words.len() * 32..].fill(f32::NEG_INFINITY);
        }
        // The trie's one end token stands for all of the model's.
        if let Some(l) = row.get_mut(self.eos as usize) {
            *l = f32::NEG_INFINITY;
        }
        for (t, l) in ends {
            row[t] = if accepting { l } else { f32::NEG_INFINITY };
        }
        Ok(())
    }

    /// The greedy pick: the allowed token with the largest logit (the
    /// lowest id on a tie, NaN never), end tokens as in
    /// [`Constraint::mask`]: what the sampler's greedy argmax over the
    /// masked row picks, without copying or writing the row. `None` when
    /// nothing is allowed.
    pub fn argmax(
        &mut self,
        logits: &[f32],
        eog: &[u32],
        allow_eog: bool,
    ) -> Result<Option<u32>, ConstraintError> {
        let accepting = allow_eog && self.is_accepting();
        let eos = self.eos as usize;
        let words = self.allowed()?.as_slice();
        let mut best: Option<(usize, f32)> = None;
        let mut consider = |t: usize, l: f32| {
            if l.is_nan() || l == f32::NEG_INFINITY {
                return;
            }
            if best.is_none_or(|(bt, bl)| l > bl || (l == bl && t < bt)) {
                best = Some((t, l));
            }
        };
        // The end tokens are decided apart: their bits are cleared word by
        // word (a handful of ids, not a test per allowed token).
        let mut ends: Vec<(usize, u32)> = eog
            .iter()
            .map(|&t| t as usize)
            .chain([eos])
            .map(|t| (t / 32, 1u32 << (t % 32)))
            .collect();
        ends.sort_unstable();
        let mut next_end = 0;
        // (n_vocab,) logits, 32 ids per mask word; ascending ids, so a
        // tie keeps the first.
        for (w, (chunk, &bits)) in logits.chunks(32).zip(words).enumerate() {
            let mut bits = bits;
            while next_end < ends.len() && ends[next_end].0 <= w {
                if ends[next_end].0 == w {
                    bits &= !ends[next_end].1;
                }
                next_end += 1;
            }
            while bits != 0 {
                let j = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(&l) = chunk.get(j) {
                    consider(w * 32 + j, l);
                }
            }
        }
        if accepting {
            for &t in eog {
                if let Some(&l) = logits.get(t as usize) {
                    consider(t as usize, l);
                }
            }
        }
        Ok(best.map(|(t, _)| t as u32))
    }

    /// [`Constraint::mask`] on a copy of `raw` in `out`.
    pub fn mask_into(
        &mut self,
        raw: &[f32],
        out: &mut Vec<f32>,
        eog: &[u32],
        allow_eog: bool,
    ) -> Result<(), ConstraintError> {
        out.clear();
        out.extend_from_slice(raw);
        self.mask(out, eog, allow_eog)
    }

    /// Whether a token can still be sampled: the output is not complete,
    /// the grammar has not failed, and it allows some token (an end token
    /// counts only when `allow_eog` and there is one). Computes the mask.
    pub fn can_continue(&mut self, eog: &[u32], allow_eog: bool) -> bool {
        if self.is_complete() || self.failure.is_some() {
            return false;
        }
        let accepting = self.is_accepting();
        let eos = self.eos;
        match self.allowed() {
            Ok(mask) => {
                let (word, bit) = (eos as usize / 32, eos % 32);
                let any = mask.as_slice().iter().enumerate().any(|(i, &w)| {
                    let w = if i == word { w & !(1 << bit) } else { w };
                    w != 0
                });
                any || (accepting && allow_eog && !eog.is_empty())
            }
            Err(e) => {
                self.failure = Some(e.to_string());
                false
            }
        }
    }

    /// Advance past a sampled `token`; end-of-generation tokens `eog` are
    /// not part of the output. A failure is kept for
    /// [`Constraint::failure`].
    pub fn advance(&mut self, token: u32, eog: &[u32]) {
        if eog.contains(&token) || self.failure.is_some() {
            return;
        }
        if let Err(e) = self.commit(token) {
            self.failure = Some(e.to_string());
        }
    }

    /// Why the grammar failed while generating, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Whether `token` is allowed next.
    pub fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        Ok(self.allowed()?.is_allowed(token))
    }

    /// Whether the grammar could end here (an end-of-generation token is
    /// allowed).
    pub fn is_accepting(&mut self) -> bool {
        *self
            .accepting
            .get_or_insert_with(|| self.matcher.is_accepting().unwrap_or(false))
    }

    /// Advance past the sampled `token` (not an end-of-generation token).
    pub fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        self.mask = None;
        self.accepting = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Failed(shorten(e.to_string())))
    }

    /// Nothing more can follow: the output is complete.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }
}

#[cfg(test)]
mod tests;
