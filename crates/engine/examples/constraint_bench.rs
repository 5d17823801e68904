//! What structured output costs, per model:
//!
//! - building the token trie from the vocabulary (once per model),
//! - compiling a JSON schema (once per request),
//! - per token along a real greedy generation: the mask, the greedy pick
//!   over it, masking a copy of the row (for sampling), the commit,
//! - decode tokens/s through the scheduler with and without the schema
//!   (alternating runs; the best run and the median step of each are
//!   reported: the machine may be shared).
//!
//! cargo run --release -p cachefit-engine --example constraint_bench -- MODEL.gguf [-t THREADS] [-n TOKENS] [-r REPS (0: no decode runs)] [--spin MICROSECONDS] [--sampled]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::{
    ConstraintSpec, Finish, GenParams, GrammarCompiler, Job, JobError, ModelBackend, SamplerConfig,
    Scheduler, Sink,
};
use kernels::pool::ThreadPool;
use model::{Model, ModelConfig, StateOptions};

/// An array of at least 64 records: long enough that every run stops at
/// `-n` tokens, not at the end of the JSON.
fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "array",
        "minItems": 64,
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 24},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "city": {"enum": ["Paris", "London", "Tokyo", "Lima"]},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}
            },
            "required": ["name", "age", "city"],
            "additionalProperties": false
        }
    })
}

/// The text so far, the end, and when each piece of text came.
type Output = (String, Option<Result<Finish, JobError>>, Vec<Instant>);

#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Output>>);

impl Sink for Collect {
    fn text(&mut self, text: String) {
        let mut o = self.0.lock().unwrap();
        o.0.push_str(&text);
        o.2.push(Instant::now());
    }
    fn finish(&mut self, end: Result<Finish, JobError>) {
        self.0.lock().unwrap().1 = Some(end);
    }
}

fn stats(mut v: Vec<Duration>) -> String {
    v.sort();
    let mean = v.iter().sum::<Duration>() / v.len().max(1) as u32;
    let p = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    format!(
        "mean {:.1} µs, median {:.1} µs, p99 {:.1} µs, max {:.1} µs over {} tokens",
        mean.as_secs_f64() * 1e6,
        p(0.5).as_secs_f64() * 1e6,
        p(0.99).as_secs_f64() * 1e6,
        p(1.0).as_secs_f64() * 1e6,
        v.len()
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .expect("usage: constraint_bench MODEL.gguf [-t N] [-n N] [-r N]");
    let flag = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default, |v| v.parse().expect("a number"))
    };
    let (threads, n_tokens, reps) = (flag("-t", 2), flag("-n", 128), flag("-r", 5));
    // `--sampled`: llama.cpp's default chain (seeded) instead of greedy.
    let sampling = if args.iter().any(|a| a == "--sampled") {
        SamplerConfig {
            seed: Some(1),
            ..SamplerConfig::default()
        }
    } else {
        SamplerConfig::greedy()
    };
    // How long pool workers spin before parking (µs), as the pool's default.
    let spin = Duration::from_micros(flag(
        "--spin",
        kernels::pool::DEFAULT_SPIN.as_micros() as usize,
    ) as u64);
    let file = gguf::GgufFile::open(path).expect("model");
    let cfg = ModelConfig::from_gguf(file.metadata()).expect("config");
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).expect("vocab");
    println!("{path}: {} tokens ({} logits)", vocab.len(), cfg.vocab_size);

    let t = Instant::now();
    let compiler = GrammarCompiler::new(&vocab, cfg.vocab_size).expect("trie");
    println!("trie: built in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let spec = ConstraintSpec::JsonSchema(schema());
    let t = Instant::now();
    let grammar = compiler.compile(&spec).expect("schema");
    println!(
        "schema: compiled in {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    let model = Model::from_gguf(&file, &cfg).expect("weights");
    let prompt = engine::prompt::completion_tokens(&vocab, "A list of people as JSON:");
    let opts = StateOptions::new(prompt.len() + n_tokens + 8);
    let mut scheduler = Scheduler::new(ModelBackend::new(
        &cfg,
        &model,
        model.new_state(&opts).expect("state"),
        ThreadPool::with_spin(threads, spin),
        None,
        &vocab,
    ))
    .with_stream_interval(Duration::ZERO);

    // The mask and commit along a greedy generation, timed outside the
    // scheduler on the same tokens it chose.
    let params = |constraint: bool| GenParams {
        max_tokens: n_tokens,
        ignore_eos: true,
        constraint: constraint.then(|| grammar.clone()),
        ..GenParams::new(sampling.clone())
    };
    let run = |scheduler: &mut Scheduler<ModelBackend>, constraint: bool| {
        let sink = Collect::default();
        scheduler.submit(Job::new(
            0,
            prompt.clone(),
            params(constraint),
            Box::new(sink.clone()),
        ));
        scheduler.run_until_idle();
        let (text, end, times) = std::mem::take(&mut *sink.0.lock().unwrap());
        let finish = end.expect("an end").expect("no error");
        (text, finish, times)
    };
    let (text, _, _) = run(&mut scheduler, true);
    let ids = vocab.encode(&text, false, false);
    let mut c = grammar.start();
    let (mut masks, mut picks, mut applies, mut commits) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let raw = vec![0.0f32; cfg.vocab_size];
    let mut row = Vec::new();
    let eog = vocab.eog_tokens();
    for &id in &ids {
        let t = Instant::now();
        c.allowed().expect("mask");
        masks.push(t.elapsed());
        let t = Instant::now();
        let _ = c.argmax(&raw, eog, false).expect("mask");
        picks.push(t.elapsed());
        let t = Instant::now();
        c.mask_into(&raw, &mut row, eog, false).expect("mask");
        applies.push(t.elapsed());
        if !row[id as usize].is_finite() {
            // The text re-tokenized differently from how it was generated.
            break;
        }
        let t = Instant::now();
        c.commit(id).expect("commit");
        commits.push(t.elapsed());
    }
    println!("mask (llguidance): {}", stats(masks));
    println!("greedy pick over the mask: {}", stats(picks));
    println!("row copied and masked: {}", stats(applies));
    println!("commit: {}", stats(commits));
    println!(
        "output starts: {:?}",
        text.chars().take(120).collect::<String>()
    );

    if reps == 0 {
        return;
    }
    // Per run: tokens/s over the whole run; per step: the median time
    // between two pieces of text over all runs (a step preempted by a
    // neighbour on a shared machine moves it little).
    let mut best = [f64::MAX; 2];
    let mut steps: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..reps {
        for (k, constraint) in [false, true].into_iter().enumerate() {
            let (_, finish, times) = run(&mut scheduler, constraint);
            assert_eq!(finish.completion_tokens, n_tokens, "the run ended early");
            let per_token = finish.generation_time.as_secs_f64() / (n_tokens - 1) as f64;
            best[k] = best[k].min(per_token);
            steps[k].extend(times.windows(2).map(|w| w[1] - w[0]));
        }
    }
    let (plain, with) = (1.0 / best[0], 1.0 / best[1]);
    println!(
        "decode ({}, {threads} threads, {n_tokens} tokens, best run of {reps}): {plain:.1} tok/s plain, {with:.1} tok/s with the schema, ratio {:.3}",
        if sampling.temp > 0.0 { "sampled" } else { "greedy" },
        with / plain
    );
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64()
    };
    let (plain, with) = (1.0 / median(&mut steps[0]), 1.0 / median(&mut steps[1]));
    println!(
        "decode, median step: {plain:.1} tok/s plain, {with:.1} tok/s with the schema, ratio {:.3}",
        with / plain
    );
}
