//! Structured output through the scheduler, on a fake model whose logits
//! are noise: every token the grammar allows is possible, so the output is
//! valid only because the mask made it so. Greedy and sampled, several
//! slots batched, the job ending when the JSON closes.

use std::sync::{Arc, Mutex};

use engine::{
    Backend, ConstraintSpec, Finish, FinishReason, GenParams, GrammarCompiler, Job, JobError,
    SamplerConfig, Scheduler, Sink,
};
use model::Token;

/// Bytes 0..256, some BPE-like pieces, then the end token.
fn pieces() -> Vec<Vec<u8>> {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for p in [
        "{\"", "\":", "\": ", "name", "age", "true", "false", "null", "12", ", \"", "\"}", "}",
        "[\"", "\"]", "abc", " the", "é",
    ] {
        words.push(p.as_bytes().to_vec());
    }
    words
}

struct Noise {
    pieces: Vec<Vec<u8>>,
    eog: Vec<u32>,
    logits: Vec<f32>,
    n_slots: usize,
}

impl Backend for Noise {
    fn n_slots(&self) -> usize {
        self.n_slots
    }
    fn n_ctx(&self) -> usize {
        512
    }
    fn n_batch(&self) -> usize {
        64
    }
    fn n_vocab(&self) -> usize {
        self.pieces.len() + 1
    }
    fn eval(&mut self, batch: &[Token]) {
        self.logits.clear();
        let n = self.n_vocab();
        for t in batch.iter().filter(|t| t.logits) {
            // A hash of (sequence, position, token) per id; the end token
            // is always the most likely, so it is drawn the moment the
            // grammar allows it (when it does not, the job must end on
            // its own).
            let mut h = (t.seq as u64 * 7919 + t.pos as u64) * 1_000_003 + t.id as u64;
            for i in 0..n {
                h = h
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = ((h >> 40) as f32 / (1u64 << 24) as f32) * 8.0;
                self.logits.push(if i == n - 1 { 20.0 } else { v });
            }
        }
    }
    fn logits(&self) -> &[f32] {
        &self.logits
    }
    fn piece(&self, token: u32) -> &[u8] {
        self.pieces.get(token as usize).map_or(&[], |p| p)
    }
    fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }
}

/// The text so far and the end.
type Output = (String, Option<Result<Finish, JobError>>);

#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Output>>);

impl Sink for Collect {
    fn text(&mut self, text: String) {
        self.0.lock().unwrap().0.push_str(&text);
    }
    fn finish(&mut self, end: Result<Finish, JobError>) {
        self.0.lock().unwrap().1 = Some(end);
    }
}

fn scheduler(n_slots: usize) -> (Scheduler<Noise>, GrammarCompiler) {
    let pieces = pieces();
    let eos = pieces.len() as u32;
    let mut words = pieces.clone();
    words.push(b"\xff<|end|>".to_vec());
    let compiler = GrammarCompiler::from_token_bytes(words, eos).expect("a trie");
    let backend = Noise {
        pieces,
        eog: vec![eos],
        logits: Vec::new(),
        n_slots,
    };
    (
        Scheduler::new(backend).with_stream_interval(std::time::Duration::ZERO),
        compiler,
    )
}

fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "tags": {"type": "array", "items": {"enum": ["abc", "the"]}, "maxItems": 2}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    })
}

#[test]
fn every_output_is_valid_and_ends_when_the_json_closes() {
    let (mut s, compiler) = scheduler(4);
    let grammar = compiler
        .compile(&ConstraintSpec::JsonSchema(schema()))
        .expect("compiles");
    let mut sinks = Vec::new();
    for i in 0..12u32 {
        let sampling = if i % 2 == 0 {
            SamplerConfig::greedy()
        } else {
            SamplerConfig {
                seed: Some(i),
                temp: 1.5,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..SamplerConfig::default()
            }
        };
        let params = GenParams {
            max_tokens: 200,
            // The end token wins whenever allowed: it is never drawn here,
            // so only the grammar's completion ends these jobs.
            ignore_eos: true,
            constraint: Some(grammar.clone()),
            ..GenParams::new(sampling)
        };
        let sink = Collect::default();
        s.submit(Job::new(
            i as u64,
            vec![b'a' as u32 + i],
            params,
            Box::new(sink.clone()),
        ));
        sinks.push(sink);
    }
    s.run_until_idle();
    for sink in sinks {
        let (text, end) = std::mem::take(&mut *sink.0.lock().unwrap());
        let finish = end.expect("ended").expect("no error");
        assert_eq!(finish.reason, FinishReason::GrammarComplete, "{text}");
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let o = v.as_object().expect("an object");
        assert!(
            o["name"].as_str().is_some_and(|n| n.chars().count() <= 8),
            "{text}"
        );
        assert!(
            o["age"]
                .as_f64()
                .is_some_and(|a| a.fract() == 0.0 && (0.0..=99.0).contains(&a)),
            "{text}"
        );
        assert!(
            o.keys()
                .all(|k| ["name", "age", "tags"].contains(&k.as_str())),
            "{text}"
        );
    }
}

#[test]
fn the_end_token_ends_a_grammar_that_may_go_on() {
    let (mut s, compiler) = scheduler(1);
    // "abc" once or more: after the first, the end token (always the most
    // likely) is allowed and drawn.
    let grammar = compiler
        .compile(&ConstraintSpec::Lark("start: \"abc\"+".into()))
        .unwrap();
    let sink = Collect::default();
    let params = GenParams {
        max_tokens: 50,
        constraint: Some(grammar),
        ..GenParams::new(SamplerConfig::greedy())
    };
    s.submit(Job::new(0, vec![1, 2, 3], params, Box::new(sink.clone())));
    s.run_until_idle();
    let (text, end) = std::mem::take(&mut *sink.0.lock().unwrap());
    let finish = end.unwrap().unwrap();
    assert_eq!(finish.reason, FinishReason::EndOfGeneration);
    assert_eq!(text, "abc");
}

#[test]
fn without_a_constraint_nothing_changes() {
    // The noise model's end token always wins: an unconstrained job ends
    // at once, a constrained one writes its JSON.
    let (mut s, compiler) = scheduler(1);
    let sink = Collect::default();
    s.submit(Job::new(
        0,
        vec![1],
        GenParams::new(SamplerConfig::greedy()),
        Box::new(sink.clone()),
    ));
    s.run_until_idle();
    let (text, end) = std::mem::take(&mut *sink.0.lock().unwrap());
    assert_eq!(end.unwrap().unwrap().reason, FinishReason::EndOfGeneration);
    assert_eq!(text, "");
    let params = GenParams {
        constraint: Some(compiler.compile(&ConstraintSpec::JsonObject).unwrap()),
        ..GenParams::new(SamplerConfig::greedy())
    };
    let sink = Collect::default();
    s.submit(Job::new(1, vec![1], params, Box::new(sink.clone())));
    s.run_until_idle();
    let (text, end) = std::mem::take(&mut *sink.0.lock().unwrap());
    let finish = end.unwrap().unwrap();
    assert!(
        matches!(
            finish.reason,
            FinishReason::EndOfGeneration | FinishReason::GrammarComplete
        ),
        "{finish:?}"
    );
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v) => assert!(v.is_object()),
        // Valid JSON (5.3e437) that serde_json will not hold.
        Err(e) => assert!(e.to_string().contains("out of range"), "{e}: {text:?}"),
    }
}
