//! Log-probabilities and `n` on a real model (SmolLM2-135M Q4_1) through
//! the scheduler and `ModelBackend`: every reported value is checked
//! against a log-softmax, in f64, of logits from a separate forward pass
//! over the same tokens, and three choices read their prompt once and
//! each generate what their seed alone generates.

use std::sync::{Arc, Mutex};

use engine::{
    Finish, GenParams, Job, JobError, ModelBackend, SamplerConfig, Scheduler, Sink, TokenLogprob,
};
use gguf::GgufFile;
use kernels::pool::ThreadPool;
use model::{Logits, Model, ModelConfig, StateOptions};
use tokenize::Vocab;

#[derive(Clone, Default)]
struct Heard {
    text: Arc<Mutex<String>>,
    entries: Arc<Mutex<Vec<TokenLogprob>>>,
    finish: Arc<Mutex<Option<Finish>>>,
}

impl Sink for Heard {
    fn text(&mut self, text: String) {
        self.text.lock().unwrap().push_str(&text);
    }
    fn logprobs(&mut self, entries: Vec<TokenLogprob>) {
        self.entries.lock().unwrap().extend(entries);
    }
    fn finish(&mut self, end: Result<Finish, JobError>) {
        *self.finish.lock().unwrap() = Some(end.expect("the job runs"));
    }
}

fn sampled(temp: f32, seed: u32, max_tokens: usize, logprobs: usize) -> GenParams {
    GenParams {
        max_tokens,
        logprobs: Some(logprobs),
        ..GenParams::new(SamplerConfig {
            temp,
            seed: Some(seed),
            ..SamplerConfig::default()
        })
    }
}

/// log-softmax of `row / temp` in f64.
fn log_softmax(row: &[f32], temp: f64) -> Vec<f64> {
    let z: Vec<f64> = row.iter().map(|&l| l as f64 / temp).collect();
    let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + z.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
    z.iter().map(|x| x - lse).collect()
}

#[test]
fn logprobs_are_a_log_softmax_of_the_logits_and_choices_share_the_prompt() {
    let Some(path) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    let vocab = Vocab::from_gguf(file.metadata()).unwrap();
    let model = Model::from_gguf(&file, &cfg).unwrap();
    let opts = StateOptions {
        n_seq: 3,
        n_batch: 64,
        ..StateOptions::new(128)
    };
    let backend = ModelBackend::new(
        &cfg,
        &model,
        model.new_state(&opts).unwrap(),
        ThreadPool::new(1),
        None,
        &vocab,
    );
    let mut s = Scheduler::new(backend).with_stream_interval(std::time::Duration::ZERO);
    let prompt = engine::prompt::completion_tokens(&vocab, "The capital of France is");
    let run = |s: &mut Scheduler<ModelBackend>, p: GenParams| {
        let h = Heard::default();
        s.submit(Job::new(0, prompt.clone(), p, Box::new(h.clone())));
        s.run_until_idle();
        h
    };

    // The reference: all logits of prompt + generated tokens in one pass.
    let mut reference = model
        .new_state(&StateOptions {
            all_logits: true,
            ..StateOptions::new(128)
        })
        .unwrap();
    let pool = ThreadPool::new(1);
    for (temp, top) in [(1.0f32, 5), (0.7, 3), (0.0, 2)] {
        let h = run(&mut s, sampled(temp, 11, 10, top));
        let entries = h.entries.lock().unwrap().clone();
        let f = h.finish.lock().unwrap().clone().unwrap();
        assert_eq!(entries.len(), f.completion_tokens);
        let mut toks = prompt.clone();
        toks.extend(entries.iter().map(|e| e.token));
        let all = reference
            .forward_seq(&pool, &toks[..toks.len() - 1], 0, Logits::All)
            .to_vec();
        let v = cfg.vocab_size;
        // Greedy reports temperature 1 (llama-server's choice).
        let t = if temp > 0.0 { temp as f64 } else { 1.0 };
        for (k, e) in entries.iter().enumerate() {
            let row = &all[(prompt.len() - 1 + k) * v..][..v];
            let want = log_softmax(row, t);
            let err = (e.logprob as f64 - want[e.token as usize]).abs();
            assert!(
                err < 1e-4,
                "temp {temp} token {k}: {} vs {}",
                e.logprob,
                want[e.token as usize]
            );
            let mut order: Vec<usize> = (0..v).collect();
            order.sort_by(|&a, &b| want[b].partial_cmp(&want[a]).unwrap().then(a.cmp(&b)));
            assert_eq!(e.top.len(), top);
            for (alt, &id) in e.top.iter().zip(&order) {
                assert_eq!(alt.token as usize, id, "temp {temp} token {k}");
                assert!((alt.logprob as f64 - want[id]).abs() < 1e-4);
                assert_eq!(alt.bytes, vocab.token_to_piece(alt.token, false));
            }
            if temp == 0.0 {
                assert_eq!(e.token as usize, order[0], "greedy picks the best");
            }
        }
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.bytes.clone()).collect();
        assert_eq!(String::from_utf8_lossy(&bytes), *h.text.lock().unwrap());
    }

    // Three choices: one prompt reading, each the text of its seed alone.
    let alone: Vec<String> = (0..3)
        .map(|i| {
            run(&mut s, sampled(1.0, 100 + i, 12, 0))
                .text
                .lock()
                .unwrap()
                .clone()
        })
        .collect();
    let fresh = ModelBackend::new(
        &cfg,
        &model,
        model.new_state(&opts).unwrap(),
        ThreadPool::new(1),
        None,
        &vocab,
    );
    let mut s = Scheduler::new(fresh).with_stream_interval(std::time::Duration::ZERO);
    let heard: Vec<Heard> = (0..3).map(|_| Heard::default()).collect();
    let jobs = heard
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let p = sampled(1.0, 100 + i as u32, 12, 0);
            Job::new(i as u64, prompt.clone(), p, Box::new(h.clone()))
        })
        .collect();
    s.submit_choices(jobs);
    s.run_until_idle();
    assert_eq!(
        s.stats().snapshot().prompt_tokens_evaluated,
        prompt.len() as u64
    );
    let got: Vec<String> = heard
        .iter()
        .map(|h| h.text.lock().unwrap().clone())
        .collect();
    assert_eq!(got, alone);
    assert!(
        got[0] != got[1] || got[1] != got[2],
        "seeds gave one text: {got:?}"
    );
}
