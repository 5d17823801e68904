//! The gates of issue 5: the int8 runtime (`crates/model`, the same code
//! `cachefit run` uses) against the float reference (this crate's
//! training forward pass, [`crate::net::forward`], on the model's weights
//! dequantized: with QAT those are the numbers the trainer computed with).
//!
//! - Perplexity over the validation split in windows of the model's
//!   context, every next-token prediction scored.
//! - Greedy agreement: prompts from the validation split, 24 tokens each,
//!   generated independently by both; a token counts when both produced
//!   it at that place. (Computed exactly but cheaply: the reference scores
//!   the runtime's continuation in one pass; only where it disagrees does
//!   it generate its own continuation.)
//! - Determinism: the runtime's logits bit-identical between two runs and
//!   between 1 and 2 threads.

use crate::error::{Error, Result};
use crate::export;
use crate::net::{self, Acts, Layout, NetConfig};
use crate::trainer::read_tokens;
use crate::{files, paths};
use kernels::pool::ThreadPool;
use model::{Logits, Model, ModelConfig, State, StateOptions};
use serde_json::{json, Value};
use std::path::Path;

#[derive(Clone, Debug)]
pub struct GateSettings {
    /// Window length for perplexity (0 = the model's context).
    pub window: usize,
    pub prompts: usize,
    pub prompt_len: usize,
    pub gen_len: usize,
    pub threads: usize,
    /// Perplexity windows, spread evenly over the validation split (0 =
    /// all of them).
    pub windows: usize,
}

impl Default for GateSettings {
    fn default() -> GateSettings {
        GateSettings {
            window: 0,
            prompts: 1000,
            prompt_len: 32,
            gen_len: 24,
            threads: 2,
            windows: 0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct GateReport {
    pub ppl_runtime: f64,
    pub ppl_reference: f64,
    pub predictions: usize,
    pub greedy_token_match: f64,
    pub greedy_prompts_identical: f64,
    /// The reference's next token equals the runtime's, given the
    /// runtime's own prefix (no compounding after a first difference).
    pub greedy_step_agreement: f64,
    pub prompts: usize,
    pub gen_len: usize,
    pub deterministic: bool,
    /// The runtime's bits per byte of the scored text (its negative
    /// log-likelihood over the bytes of the predicted tokens).
    pub bits_per_byte: f64,
    /// Bytes of the model file.
    pub file_bytes: u64,
}

impl GateReport {
    pub fn ppl_rel_diff(&self) -> f64 {
        (self.ppl_runtime - self.ppl_reference).abs() / self.ppl_reference
    }

    pub fn to_json(&self) -> Value {
        json!({
            "ppl_runtime": self.ppl_runtime,
            "ppl_reference": self.ppl_reference,
            "ppl_rel_diff": self.ppl_rel_diff(),
            "ppl_predictions": self.predictions,
            "greedy_token_match": self.greedy_token_match,
            "greedy_prompts_identical": self.greedy_prompts_identical,
            "greedy_step_agreement": self.greedy_step_agreement,
            "greedy_prompts": self.prompts,
            "greedy_tokens_per_prompt": self.gen_len,
            "deterministic": self.deterministic,
            "bits_per_byte": self.bits_per_byte,
            "file_bytes": self.file_bytes,
        })
    }
}

/// The runtime side: the model file opened as `cachefit run` opens it.
struct Runtime<'f> {
    model: Model<'f>,
}

impl<'f> Runtime<'f> {
    fn state(&self, n_ctx: usize, all_logits: bool) -> Result<State<'_>> {
        let o = StateOptions {
            all_logits,
            // Prompts go in one batch; all-logits windows in chunks.
            n_batch: if all_logits { 128 } else { n_ctx },
            // The runtime's default cache type, as `cachefit run` uses it.
            kv_type: model::KvType::F16,
            ..StateOptions::new(n_ctx)
        };
        self.model
            .new_state(&o)
            .map_err(|e| Error::Train(e.to_string()))
    }

    /// Logits for every position of `tokens` (rows of vocab).
    fn all_logits(
        &self,
        st: &mut State<'_>,
        pool: &ThreadPool,
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) {
        out.clear();
        let nb = st.n_batch();
        for (i, chunk) in tokens.chunks(nb).enumerate() {
            let l = st.forward_seq(pool, chunk, i * nb, Logits::All);
            out.extend_from_slice(l);
        }
    }

    /// Greedy continuation of `prompt`, `n` tokens.
    fn greedy(&self, st: &mut State<'_>, pool: &ThreadPool, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(n);
        let mut last = argmax(st.forward_seq(pool, prompt, 0, Logits::Last));
        out.push(last);
        for i in 1..n {
            last = argmax(st.forward_seq(pool, &[last], prompt.len() + i - 1, Logits::Last));
            out.push(last);
        }
        out
    }
}

fn argmax(row: &[f32]) -> u32 {
    net::ops::log_sum_exp(row).1 as u32
}

fn nll(row: &[f32], target: u32) -> f64 {
    net::ops::log_sum_exp(row).0 - row[target as usize] as f64
}

/// Run the gates for the model at `model_path` on the pipeline's
/// validation split in `dir`.
pub fn run(model_path: &Path, dir: &Path, s: &GateSettings, progress: bool) -> Result<GateReport> {
    let (net, params) = export::read_gguf(model_path)?;
    let l = Layout::new(&net);
    let file = gguf::GgufFile::open(model_path)?;
    let cfg = ModelConfig::from_gguf(file.metadata()).map_err(|e| Error::Invalid {
        path: model_path.to_path_buf(),
        problem: e.to_string(),
    })?;
    let model = Model::from_gguf(&file, &cfg).map_err(|e| Error::Invalid {
        path: model_path.to_path_buf(),
        problem: e.to_string(),
    })?;
    let rt = Runtime { model };
    check_vocabulary(&file, dir, model_path)?;
    let val = read_tokens(dir, paths::VAL_BIN, net.vocab)?;
    let window = if s.window == 0 { net.context } else { s.window };
    let pool = ThreadPool::new(s.threads.max(1));

    // Perplexity: windows of `window + 1` tokens, every next token scored.
    let mut windows: Vec<&[u16]> = val.chunks_exact(window + 1).collect();
    if s.windows > 0 && s.windows < windows.len() {
        let all = std::mem::take(&mut windows);
        windows = (0..s.windows)
            .map(|i| all[i * all.len() / s.windows])
            .collect();
    }
    if windows.is_empty() {
        return Err(Error::Config(format!(
            "val.bin has {} tokens, fewer than one window of {}",
            val.len(),
            window + 1
        )));
    }
    let bar = crate::progress_bar(progress, (windows.len() + s.prompts) as u64, "gates");
    let mut acts = Acts::new(&net, window.max(s.prompt_len + s.gen_len));
    // The reference is the trainer's forward pass on the file's weights,
    // with the inputs of ternary matrices quantized as the runtime reads
    // them (a Q8_K pair).
    acts.quantize_inputs = true;
    acts.input_pairs = true;
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).map_err(|err| Error::Vocab {
        path: model_path.to_path_buf(),
        err,
    })?;
    let mut st = rt.state(window, true)?;
    let (mut sum_rt, mut sum_ref, mut n) = (0.0f64, 0.0f64, 0usize);
    let mut bytes = 0usize;
    let mut logits = Vec::new();
    for w in &windows {
        let ids: Vec<u32> = w[..window].iter().map(|&t| t as u32).collect();
        rt.all_logits(&mut st, &pool, &ids, &mut logits);
        for (row, &tgt) in logits.chunks_exact(net.vocab).zip(&w[1..]) {
            sum_rt += nll(row, tgt as u32);
            bytes += vocab.token_to_piece(tgt as u32, false).len();
        }
        let scores = net::score(&net, &l, &params, w, &mut acts);
        sum_ref += scores.iter().map(|(v, _)| v).sum::<f64>();
        n += scores.len();
        bar.inc(1);
    }

    // Greedy agreement.
    let span = s.prompt_len + s.gen_len;
    if val.len() < span + s.prompts {
        return Err(Error::Config(format!(
            "val.bin has {} tokens, too few for {} prompts",
            val.len(),
            s.prompts
        )));
    }
    let mut gst = rt.state(span, false)?;
    let (mut equal, mut identical, mut step_agree) = (0usize, 0usize, 0usize);
    let mut first_runs = Vec::new();
    for i in 0..s.prompts {
        let at = i * (val.len() - span) / s.prompts;
        let prompt: Vec<u32> = val[at..at + s.prompt_len]
            .iter()
            .map(|&t| t as u32)
            .collect();
        let got = rt.greedy(&mut gst, &pool, &prompt, s.gen_len);
        if i < 8 {
            first_runs.push((prompt.clone(), got.clone()));
        }
        let (want, agree) = reference_greedy(&net, &l, &params, &prompt, &got, &mut acts);
        step_agree += agree;
        let same = got.iter().zip(&want).filter(|(a, b)| a == b).count();
        equal += same;
        identical += usize::from(same == s.gen_len);
        bar.inc(1);
    }
    bar.finish_and_clear();

    // Determinism: the first prompts again, with 1 thread and with 2.
    let mut deterministic = true;
    for threads in [1, 2] {
        let p = ThreadPool::new(threads);
        let mut st2 = rt.state(span, false)?;
        for (prompt, got) in &first_runs {
            deterministic &= rt.greedy(&mut st2, &p, prompt, s.gen_len) == *got;
        }
        let mut again = Vec::new();
        let w = &windows[0];
        let ids: Vec<u32> = w[..window].iter().map(|&t| t as u32).collect();
        let mut st3 = rt.state(window, true)?;
        rt.all_logits(&mut st3, &p, &ids, &mut again);
        let mut first = Vec::new();
        rt.all_logits(&mut st, &pool, &ids, &mut first);
        deterministic &= again
            .iter()
            .map(|v| v.to_bits())
            .eq(first.iter().map(|v| v.to_bits()));
    }

    Ok(GateReport {
        ppl_runtime: (sum_rt / n as f64).exp(),
        ppl_reference: (sum_ref / n as f64).exp(),
        predictions: n,
        greedy_token_match: equal as f64 / (s.prompts * s.gen_len) as f64,
        greedy_prompts_identical: identical as f64 / s.prompts as f64,
        greedy_step_agreement: step_agree as f64 / (s.prompts * s.gen_len) as f64,
        prompts: s.prompts,
        gen_len: s.gen_len,
        deterministic,
        bits_per_byte: sum_rt / std::f64::consts::LN_2 / bytes.max(1) as f64,
        file_bytes: std::fs::metadata(model_path).map_or(0, |m| m.len()),
    })
}

/// The reference's own greedy continuation of `prompt`, given the
/// runtime's (`got`): one scoring pass finds the first place they part;
/// from there the reference generates alone.
fn reference_greedy(
    net: &NetConfig,
    l: &Layout,
    params: &[f32],
    prompt: &[u32],
    got: &[u32],
    acts: &mut Acts,
) -> (Vec<u32>, usize) {
    let mut seq: Vec<u16> = prompt.iter().chain(got).map(|&t| t as u16).collect();
    let p = prompt.len();
    let n = got.len();
    net::forward(net, l, params, &seq[..p + n - 1], acts);
    let v = net.vocab;
    // The reference's choice after each of the runtime's prefixes.
    let forced: Vec<u32> = (0..n)
        .map(|i| argmax(&acts.logits[(p + i - 1) * v..(p + i) * v]))
        .collect();
    let agree = forced.iter().zip(got).filter(|(a, b)| a == b).count();
    let mut out = Vec::with_capacity(n);
    for (&best, &g) in forced.iter().zip(got) {
        out.push(best);
        if best != g {
            break;
        }
    }
    while out.len() < n {
        seq.truncate(p);
        seq.extend(out.iter().map(|&t| t as u16));
        let t = seq.len();
        net::forward(net, l, params, &seq, acts);
        out.push(argmax(&acts.logits[(t - 1) * v..t * v]));
    }
    (out, agree)
}

/// The validation tokens were made with the pipeline's tokenizer; the
/// model must carry the same vocabulary or the gates compare nonsense.
fn check_vocabulary(file: &gguf::GgufFile, dir: &Path, model_path: &Path) -> Result<()> {
    let tok = files::stage_input(dir, paths::TOKENIZER_GGUF, "bpe")?;
    let vocab = gguf::GgufFile::open(&tok)?;
    let key = "tokenizer.ggml.tokens";
    let a = file.metadata().get_str_array(key).ok();
    let b = vocab.metadata().get_str_array(key).ok();
    if a.is_none() || a != b {
        return Err(Error::Invalid {
            path: model_path.to_path_buf(),
            problem: format!(
                "its vocabulary differs from {} (made by another tokenizer run)",
                tok.display()
            ),
        });
    }
    Ok(())
}

/// Question answering on the held-out-name passages (`tasks.eval.txt`):
/// each question is asked with its passage and the questions before it
/// (as in training), answered greedily up to the end of the line, and
/// counts when the answer is exactly the expected one.
#[derive(Clone, Debug, Default)]
pub struct TaskReport {
    pub questions: usize,
    pub correct: usize,
    /// Of the questions whose answer is "I don't know.".
    pub unknown_questions: usize,
    pub unknown_correct: usize,
}

impl TaskReport {
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.questions.max(1) as f64
    }
    pub fn known_accuracy(&self) -> f64 {
        (self.correct - self.unknown_correct) as f64
            / (self.questions - self.unknown_questions).max(1) as f64
    }
    pub fn unknown_accuracy(&self) -> f64 {
        self.unknown_correct as f64 / self.unknown_questions.max(1) as f64
    }
    pub fn to_json(&self) -> Value {
        json!({
            "task_questions": self.questions,
            "task_accuracy": self.accuracy(),
            "task_accuracy_known": self.known_accuracy(),
            "task_accuracy_unknown": self.unknown_accuracy(),
        })
    }
}

pub fn task_accuracy(
    model_path: &Path,
    dir: &Path,
    max_passages: usize,
    threads: usize,
) -> Result<TaskReport> {
    let text = files::read_stage_text(dir, paths::TASKS_EVAL, "data")?;
    let file = gguf::GgufFile::open(model_path)?;
    let invalid = |e: String| Error::Invalid {
        path: model_path.to_path_buf(),
        problem: e,
    };
    let cfg = ModelConfig::from_gguf(file.metadata()).map_err(|e| invalid(e.to_string()))?;
    let model = Model::from_gguf(&file, &cfg).map_err(|e| invalid(e.to_string()))?;
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).map_err(|e| invalid(e.to_string()))?;
    let rt = Runtime { model };
    let pool = ThreadPool::new(threads.max(1));
    let mut st = rt.state(rt.model.config().context_length, false)?;
    let mut r = TaskReport::default();
    for passage in text
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .take(max_passages)
    {
        let lines: Vec<&str> = passage.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(answer) = line.strip_prefix("A: ") else {
                continue;
            };
            let prefix = format!("{}\nA:", lines[..i].join("\n"));
            let prompt = vocab.encode(&prefix, true, false);
            if prompt.len() + 24 > st.n_ctx() {
                continue;
            }
            let mut out = Vec::new();
            let mut tok = argmax(st.forward_seq(&pool, &prompt, 0, Logits::Last));
            for pos in prompt.len()..prompt.len() + 24 {
                if vocab.is_eog(tok) || vocab.token_to_piece(tok, false).contains(&b'\n') {
                    break;
                }
                out.push(tok);
                tok = argmax(st.forward_seq(&pool, &[tok], pos, Logits::Last));
            }
            let got = vocab.decode(&out);
            let ok = got.trim() == answer.trim();
            let unknown = answer.trim() == "I don't know.";
            r.questions += 1;
            r.correct += usize::from(ok);
            r.unknown_questions += usize::from(unknown);
            r.unknown_correct += usize::from(ok && unknown);
        }
    }
    Ok(r)
}
