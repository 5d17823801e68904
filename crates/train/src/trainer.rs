//! The `train` stage: AdamW over random windows of `train.bin`, warm-up
//! then cosine learning rate, global-norm gradient clipping, periodic
//! validation on `val.bin`, resumable checkpoints, and quantization-aware
//! training (every matrix fake-quantized to its export storage, int8 per
//! row or ternary, and the inputs of ternary matrices to Q8_K, all with a
//! straight-through gradient) for the final part of the run.
//!
//! A step's sequences are split across threads, each with its own
//! activations and gradient buffer; the gradients are summed in thread
//! order, so a run is deterministic for a given thread count.

use crate::checkpoint::{self, Checkpoint};
use crate::error::{Error, Result};
use crate::files;
use crate::net::{self, Acts, Layout, NetConfig};
use crate::paths;
use crate::rng::Rng;
use serde_json::json;
use std::path::Path;
use std::time::Instant;

#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence (≤ the network's context).
    pub seq_len: usize,
    pub lr: f32,
    /// The cosine ends at `lr · min_lr_ratio`.
    pub min_lr_ratio: f32,
    pub warmup: usize,
    pub weight_decay: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub grad_clip: f32,
    /// Fraction of the steps, at the end, trained with fake-quantized
    /// weights (0 = none).
    pub qat_fraction: f32,
    pub eval_every: usize,
    /// Validation windows per evaluation (0 = all of `val.bin`).
    pub eval_windows: usize,
    pub checkpoint_every: usize,
    pub seed: u64,
    pub threads: usize,
    /// End this invocation after this many steps (saving a checkpoint),
    /// to train in pieces; not part of the run's identity.
    pub stop_after: Option<usize>,
}

impl Default for TrainConfig {
    fn default() -> TrainConfig {
        TrainConfig {
            // The shipped model's run (docs/MODEL-CARD.md): about six
            // passes over tinyshakespeare, where validation loss bottoms
            // out (longer runs overfit).
            steps: 260,
            batch: 8,
            seq_len: 1024,
            lr: 3e-3,
            min_lr_ratio: 0.1,
            warmup: 20,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            grad_clip: 1.0,
            qat_fraction: 0.25,
            eval_every: 20,
            eval_windows: 0,
            checkpoint_every: 20,
            seed: 1,
            threads: 0,
            stop_after: None,
        }
    }
}

impl TrainConfig {
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "steps": self.steps, "batch": self.batch, "seq_len": self.seq_len,
            "lr": self.lr, "min_lr_ratio": self.min_lr_ratio, "warmup": self.warmup,
            "weight_decay": self.weight_decay, "beta1": self.beta1, "beta2": self.beta2,
            "grad_clip": self.grad_clip, "qat_fraction": self.qat_fraction,
            "eval_every": self.eval_every, "eval_windows": self.eval_windows,
            "seed": self.seed,
        })
    }

    /// The learning rate at `step` (0-based).
    pub fn lr_at(&self, step: usize) -> f32 {
        if step < self.warmup {
            return self.lr * (step + 1) as f32 / self.warmup as f32;
        }
        let span = (self.steps - self.warmup).max(1) as f32;
        let progress = ((step - self.warmup) as f32 / span).min(1.0);
        let cos = 0.5 * (1.0 + (std::f32::consts::PI * progress).cos());
        self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cos)
    }

    /// First step trained with fake-quantized weights.
    pub fn qat_start(&self) -> usize {
        let n = (self.steps as f64 * self.qat_fraction as f64).round() as usize;
        self.steps - n.min(self.steps)
    }

    fn validate(&self, net: &NetConfig) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.steps == 0 || self.batch == 0 || self.seq_len < 2 {
            return bad("steps and batch must be positive and seq-len at least 2".into());
        }
        if self.seq_len > net.context {
            return bad(format!(
                "seq-len {} is longer than the context {}",
                self.seq_len, net.context
            ));
        }
        if !(0.0..=1.0).contains(&self.qat_fraction) {
            return bad(format!(
                "qat fraction {} is outside 0..1",
                self.qat_fraction
            ));
        }
        if !(self.lr.is_finite()
            && self.lr > 0.0
            && self.grad_clip.is_finite()
            && self.grad_clip > 0.0)
        {
            return bad("lr and grad clip must be positive".into());
        }
        Ok(())
    }
}

/// What a run did, for the report and `train.json`.
#[derive(Clone, Debug)]
pub struct TrainReport {
    pub params: usize,
    pub steps_run: usize,
    pub resumed_from: usize,
    pub tokens_per_second: f64,
    pub seconds: f64,
    pub final_val_loss: f64,
    pub final_train_loss: f64,
}

/// Windows of `seq_len + 1` tokens; an evaluation or a step reads these.
fn windows(tokens: &[u16], len: usize) -> Vec<&[u16]> {
    tokens.chunks_exact(len + 1).collect()
}

/// Mean next-token loss over `windows`, split across threads.
pub fn evaluate(
    net: &NetConfig,
    l: &Layout,
    params: &[f32],
    windows: &[&[u16]],
    acts: Vec<&mut Acts>,
) -> f64 {
    let per = windows.len().div_ceil(acts.len()).max(1);
    let sums: Vec<(f64, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = windows
            .chunks(per)
            .zip(acts)
            .map(|(chunk, a)| {
                s.spawn(move || {
                    let mut sum = 0.0;
                    let mut n = 0;
                    for w in chunk {
                        let scores = net::score(net, l, params, w, a);
                        n += scores.len();
                        sum += scores.iter().map(|(nll, _)| nll).sum::<f64>();
                    }
                    (sum, n)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("eval thread"))
            .collect()
    });
    let (sum, n) = sums.iter().fold((0.0, 0), |(a, b), (s, n)| (a + s, b + n));
    sum / n.max(1) as f64
}

/// One optimizer step's gradient: the sequences split across the workers,
/// their gradients summed in worker order into `grad`. Returns the mean
/// loss.
fn gradient(
    net: &NetConfig,
    l: &Layout,
    params: &[f32],
    seqs: &[&[u16]],
    workers: &mut [(Acts, Vec<f32>)],
    grad: &mut [f32],
) -> f64 {
    let n_tokens: usize = seqs.iter().map(|s| s.len() - 1).sum();
    let scale = 1.0 / n_tokens as f32;
    let per = seqs.len().div_ceil(workers.len()).max(1);
    let losses: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = seqs
            .chunks(per)
            .zip(workers.iter_mut())
            .map(|(chunk, (acts, g))| {
                s.spawn(move || {
                    g.fill(0.0);
                    let mut loss = 0.0;
                    for seq in chunk {
                        let n = seq.len() - 1;
                        net::forward(net, l, params, &seq[..n], acts);
                        loss += net::backward(net, l, params, &seq[..n], &seq[1..], scale, acts, g);
                    }
                    loss
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("training thread"))
            .collect()
    });
    let used = seqs.len().div_ceil(per);
    grad.copy_from_slice(&workers[0].1);
    for (_, g) in &workers[1..used] {
        for (a, b) in grad.iter_mut().zip(g) {
            *a += b;
        }
    }
    losses.iter().sum::<f64>() / n_tokens as f64
}

/// AdamW with bias correction; weight decay on matrices only.
fn adamw(tc: &TrainConfig, l: &Layout, ck: &mut Checkpoint, grad: &[f32], lr: f32) {
    let t = (ck.step + 1) as i32;
    let bc1 = 1.0 - tc.beta1.powi(t);
    let bc2 = 1.0 - tc.beta2.powi(t);
    for tensor in &l.tensors {
        let wd = if tensor.matrix { tc.weight_decay } else { 0.0 };
        for i in tensor.range() {
            let g = grad[i];
            let m = tc.beta1 * ck.m[i] + (1.0 - tc.beta1) * g;
            let v = tc.beta2 * ck.v[i] + (1.0 - tc.beta2) * g * g;
            ck.m[i] = m;
            ck.v[i] = v;
            let update = (m / bc1) / ((v / bc2).sqrt() + 1e-8);
            ck.params[i] -= lr * (update + wd * ck.params[i]);
        }
    }
}

/// Default worker count: the cores this process may use.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Train from `train.bin`/`val.bin` in `dir`; resume from the checkpoint
/// there when it was made with the same settings (`fresh` starts over).
pub fn run(
    net: &NetConfig,
    tc: &TrainConfig,
    dir: &Path,
    fresh: bool,
    progress: bool,
) -> Result<TrainReport> {
    net.validate()?;
    tc.validate(net)?;
    let train_tokens = read_tokens(dir, paths::TRAIN_BIN, net.vocab)?;
    let val_tokens = read_tokens(dir, paths::VAL_BIN, net.vocab)?;
    if train_tokens.len() <= tc.seq_len + 1 {
        return Err(Error::Config(format!(
            "train.bin has {} tokens, fewer than one sequence of {}",
            train_tokens.len(),
            tc.seq_len + 1
        )));
    }
    let mut val = windows(&val_tokens, tc.seq_len);
    if tc.eval_windows > 0 {
        val.truncate(tc.eval_windows);
    }
    if val.is_empty() {
        return Err(Error::Config(format!(
            "val.bin has {} tokens, fewer than one window of {}",
            val_tokens.len(),
            tc.seq_len + 1
        )));
    }
    let l = Layout::new(net);
    let ck_path = dir.join(paths::CHECKPOINT);
    let mut ck = match (fresh, ck_path.exists()) {
        (false, true) => {
            let ck = checkpoint::load(&ck_path)?;
            if ck.net != *net || ck.train != tc.to_json() {
                return Err(Error::Invalid {
                    path: ck_path,
                    problem: "was made with other settings; pass --fresh to start over \
                              (the checkpoint is replaced only when the new run saves one)"
                        .into(),
                });
            }
            ck
        }
        _ => Checkpoint::new(
            net.clone(),
            tc.to_json(),
            net::init_params(net, &l, tc.seed),
        ),
    };
    let resumed_from = ck.step;
    let threads = if tc.threads == 0 {
        default_threads()
    } else {
        tc.threads
    };
    let threads = threads.min(tc.batch).max(1);
    let mut workers: Vec<(Acts, Vec<f32>)> = (0..threads)
        .map(|_| (Acts::new(net, tc.seq_len), vec![0.0; l.len]))
        .collect();
    let mut grad = vec![0.0f32; l.len];
    let mut effective = vec![0.0f32; l.len];
    let log_path = dir.join(paths::TRAIN_LOG);
    let mut log = if resumed_from > 0 {
        std::fs::read_to_string(&log_path).unwrap_or_default()
    } else {
        String::new()
    };
    let bar = crate::progress_bar(progress, tc.steps as u64, "training");
    bar.set_position(ck.step as u64);
    let start = Instant::now();
    let mut trained_tokens = 0usize;
    let mut last_loss = f64::NAN;
    let mut last_val = ck.last_val;
    let qat_start = tc.qat_start();
    let end = tc
        .stop_after
        .map_or(tc.steps, |n| (resumed_from + n).min(tc.steps));
    while ck.step < end {
        let step = ck.step;
        // The windows of a step depend on the seed and step alone, so a
        // resumed run sees what an uninterrupted one would.
        let mut rng = Rng::stream(tc.seed, 1_000_000 + step as u64);
        let span = train_tokens.len() - tc.seq_len - 1;
        let seqs: Vec<&[u16]> = (0..tc.batch)
            .map(|_| {
                let at = rng.below(span + 1);
                &train_tokens[at..at + tc.seq_len + 1]
            })
            .collect();
        let qat = step >= qat_start;
        for (a, _) in workers.iter_mut() {
            a.quantize_inputs = qat;
        }
        let params: &[f32] = if qat {
            net::fake_quantize(net, &l, &ck.params, &mut effective);
            &effective
        } else {
            &ck.params
        };
        let loss = gradient(net, &l, params, &seqs, &mut workers, &mut grad);
        if !loss.is_finite() {
            return Err(Error::Train(format!(
                "loss is {loss} at step {step}: lower --lr or raise --warmup"
            )));
        }
        let norm = grad
            .iter()
            .map(|g| (*g as f64) * (*g as f64))
            .sum::<f64>()
            .sqrt();
        if norm > tc.grad_clip as f64 {
            let s = (tc.grad_clip as f64 / norm) as f32;
            grad.iter_mut().for_each(|g| *g *= s);
        }
        let lr = tc.lr_at(step);
        adamw(tc, &l, &mut ck, &grad, lr);
        ck.step += 1;
        trained_tokens += tc.batch * tc.seq_len;
        last_loss = loss;
        let tok_s = trained_tokens as f64 / start.elapsed().as_secs_f64();
        let done = ck.step == end;
        if ck.step % tc.eval_every == 0 || done {
            let eval_params: &[f32] = if qat {
                net::fake_quantize(net, &l, &ck.params, &mut effective);
                &effective
            } else {
                &ck.params
            };
            let acts = workers.iter_mut().map(|(a, _)| a).collect();
            let v = evaluate(net, &l, eval_params, &val, acts);
            last_val = v;
            ck.last_val = v;
            let line = json!({
                "step": ck.step, "train_loss": loss, "val_loss": v,
                "val_ppl": v.exp(), "lr": lr, "grad_norm": norm, "qat": qat,
                "tokens_per_second": tok_s,
                "elapsed_s": start.elapsed().as_secs_f64(),
            });
            log.push_str(&line.to_string());
            log.push('\n');
            files::write(&log_path, log.as_bytes())?;
            let text = format!(
                "step {:5}  train {:.4}  val {:.4} (ppl {:.2})  lr {:.2e}  {}{:.0} tok/s",
                ck.step,
                loss,
                v,
                v.exp(),
                lr,
                if qat { "qat  " } else { "" },
                tok_s
            );
            // A hidden bar (quiet, or not a terminal) prints nothing.
            if bar.is_hidden() {
                eprintln!("{text}");
            } else {
                bar.println(text);
            }
        }
        if ck.step % tc.checkpoint_every == 0 || done {
            checkpoint::save(&ck_path, &ck)?;
        }
        bar.set_message(format!("loss {loss:.3}  {tok_s:.0} tok/s"));
        bar.set_position(ck.step as u64);
    }
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    let report = TrainReport {
        params: l.len,
        steps_run: ck.step - resumed_from,
        resumed_from,
        tokens_per_second: trained_tokens as f64 / seconds.max(1e-9),
        seconds,
        final_val_loss: last_val,
        final_train_loss: last_loss,
    };
    files::write_json(
        &dir.join(paths::TRAIN_MANIFEST),
        &json!({
            "net": net.to_json(), "train": tc.to_json(), "threads": threads,
            "params": l.len, "steps_run": report.steps_run, "resumed_from": resumed_from,
            "tokens_per_second": report.tokens_per_second, "seconds": seconds,
            "final_val_loss": last_val, "final_val_ppl": last_val.exp(),
            "final_train_loss": last_loss,
        }),
    )?;
    Ok(report)
}

/// A `u16` token file, every id checked against the vocabulary.
pub fn read_tokens(dir: &Path, name: &str, vocab: usize) -> Result<Vec<u16>> {
    let path = files::stage_input(dir, name, "pack")?;
    let bytes = files::read_bytes(&path)?;
    if bytes.len() % 2 != 0 {
        return Err(Error::Invalid {
            path,
            problem: format!("{} bytes is not a whole number of u16 ids", bytes.len()),
        });
    }
    let tokens: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    if let Some((i, t)) = tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        return Err(Error::Invalid {
            path,
            problem: format!("token {i} is id {t}, outside the vocabulary of {vocab}"),
        });
    }
    Ok(tokens)
}
