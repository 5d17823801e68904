//! `cachefit perplexity -m FILE -f TEXT`: perplexity over a text, windowed
//! as llama.cpp's `llama-perplexity` does, so the numbers compare:
//!
//! - the whole text is tokenized once (with BOS if the model adds one);
//! - it is cut into chunks of `n_ctx` tokens (`--chunks` of them at most),
//!   each evaluated from an empty cache, its first token replaced by BOS
//!   when the model adds one;
//! - only the second half of each chunk is scored: the logits at positions
//!   `n_ctx/2 .. n_ctx-2` predict the tokens after them, so every scored
//!   token has at least half a context before it;
//! - PPL = exp(mean NLL) and its ± is `sqrt(var(NLL) / (count - 1)) · PPL`.
//!
//! Also prints bits per byte: the summed NLL in bits over the UTF-8 bytes of
//! the scored tokens, comparable across tokenizers.

use super::common::{self, ContextArgs, ModelArgs};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use model::{Logits, Model};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

/// Context when `-c` is not given: llama-perplexity's usual setting.
const DEFAULT_PPL_CTX: usize = 512;

#[derive(clap::Args)]
#[command(mut_arg("ctx_size", |a| a.help("Context size in tokens: the length of a scored chunk [default: 512]")))]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub ctx: ContextArgs,
    /// UTF-8 text to score.
    #[arg(short = 'f', long)]
    pub file: PathBuf,
    /// Score at most this many chunks (default: all).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Print one JSON line with the results instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Running negative log-likelihood sums over scored tokens.
#[derive(Default, Debug, Clone, Copy)]
struct Nll {
    sum: f64,
    sum_sq: f64,
    count: usize,
    bytes: usize,
}

impl Nll {
    fn add(&mut self, nll: f64, bytes: usize) {
        self.sum += nll;
        self.sum_sq += nll * nll;
        self.count += 1;
        self.bytes += bytes;
    }

    fn ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }

    /// llama.cpp's estimate of the PPL's standard error.
    fn ppl_err(&self) -> f64 {
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum_sq / n - mean * mean;
        if var > 0.0 && self.count > 1 {
            (var / (n - 1.0)).sqrt() * self.ppl()
        } else {
            0.0
        }
    }

    fn bits_per_byte(&self) -> f64 {
        self.sum / std::f64::consts::LN_2 / self.bytes.max(1) as f64
    }
}

/// −log softmax(logits)[target], in f64 like llama.cpp.
fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    -(logits[target as usize] as f64 - max - sum.ln())
}

/// Largest text `perplexity` reads without `--max-prompt-bytes`: 100×
/// wikitext-2's test set.
const PPL_MAX_TEXT_BYTES: usize = 128 << 20;

pub fn run(args: Args) -> Result<()> {
    let t_start = Instant::now();
    // Many windows of the context, so not bounded by one: --max-prompt-bytes
    // or a size no evaluation here would finish.
    let limit = args.ctx.max_prompt_bytes.unwrap_or(PPL_MAX_TEXT_BYTES);
    let text = common::read_bounded(&args.file, limit)
        .context("reading the text (--max-prompt-bytes raises the limit)")?;
    if text.is_empty() {
        bail!("{} is empty", args.file.display());
    }
    if args.chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    // Every pass is a batch: the --threads-batch pool does the work.
    let pools = common::Pools::from_args(&args.model)?;
    let opened = common::open_model(&args.model)?;
    let (cfg, vocab) = (&opened.cfg, &opened.vocab);
    let ctx = ContextArgs {
        ctx_size: Some(args.ctx.ctx_size.unwrap_or(DEFAULT_PPL_CTX)),
        ..args.ctx
    };
    let opts = common::state_options(&opened, &ctx, true)?;
    let n_ctx = opts.n_ctx;
    if n_ctx < 4 {
        bail!("-c {n_ctx} is too small to score anything (at least 4)");
    }
    let path = args.model.shown();
    let model = Model::from_gguf(&opened.file, cfg).with_context(|| path.clone())?;
    let mut state = model.new_state(&opts)?;
    eprintln!(
        "cachefit: {path} ({}), ctx {n_ctx}, {} KV cache, batch {}, {}, kernels {}",
        cfg.arch.name(),
        opts.kv_type,
        opts.n_batch,
        pools.describe(),
        kernels::selected().isa().name()
    );

    let t_tok = Instant::now();
    let mut tokens = vocab.encode(&text, true, false);
    let tok_ms = t_tok.elapsed().as_secs_f64() * 1000.0;
    if tokens.len() < 2 * n_ctx {
        bail!(
            "{} is {} tokens; perplexity with a context of {n_ctx} needs at least {} (2 × -c)",
            args.file.display(),
            tokens.len(),
            2 * n_ctx
        );
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        bail!(
            "token {bad} from the tokenizer is outside the model's vocabulary of {}",
            cfg.vocab_size
        );
    }
    let n_chunks_max = tokens.len() / n_ctx;
    let n_chunks = args.chunks.map_or(n_chunks_max, |c| c.min(n_chunks_max));
    eprintln!(
        "cachefit: tokenized {} bytes into {} tokens in {tok_ms:.0} ms; scoring {n_chunks} chunk{} of {n_ctx}",
        text.len(),
        tokens.len(),
        if n_chunks == 1 { "" } else { "s" }
    );

    let bar = ProgressBar::new(n_chunks as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} chunks  {msg}  [{elapsed} < {eta}]")
            .expect("valid template"),
    );
    let bos = vocab.add_bos().then(|| vocab.bos()).flatten();
    let first = n_ctx / 2;
    let vocab_size = cfg.vocab_size;
    let mut total = Nll::default();
    let mut running = Vec::with_capacity(n_chunks);
    let t_eval = Instant::now();
    for c in 0..n_chunks {
        let chunk = &mut tokens[c * n_ctx..(c + 1) * n_ctx];
        let original_first = chunk[0];
        if let Some(b) = bos {
            chunk[0] = b;
        }
        // A fresh cache: positions restart at 0, later ones overwrite.
        for (b, batch) in chunk.chunks(opts.n_batch).enumerate() {
            let pos0 = b * opts.n_batch;
            let logits = state.forward_seq(pools.batch(), batch, pos0, Logits::All);
            for (i, row) in logits.chunks_exact(vocab_size).enumerate() {
                let pos = pos0 + i;
                if pos >= first && pos + 1 < n_ctx {
                    let target = chunk[pos + 1];
                    total.add(nll(row, target), vocab.token_to_piece(target, false).len());
                }
            }
        }
        chunk[0] = original_first;
        running.push(total.ppl());
        bar.set_message(format!("PPL {:.4}", total.ppl()));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let eval_s = t_eval.elapsed().as_secs_f64();
    let tok_s = (n_chunks * n_ctx) as f64 / eval_s;

    if args.json {
        outln!(
            "{}",
            json!({
                "ppl": total.ppl(),
                "ppl_err": total.ppl_err(),
                "bits_per_byte": total.bits_per_byte(),
                "nll_mean": total.sum / total.count as f64,
                "scored_tokens": total.count,
                "scored_bytes": total.bytes,
                "chunks": n_chunks,
                "n_ctx": n_ctx,
                "tokens": tokens.len(),
                "running_ppl": running,
                "eval_s": eval_s,
                "tok_s": tok_s,
                "total_s": t_start.elapsed().as_secs_f64(),
            })
        );
    } else {
        let per_chunk: Vec<String> = running
            .iter()
            .enumerate()
            .map(|(i, p)| format!("[{}]{p:.4}", i + 1))
            .collect();
        outln!("{}", per_chunk.join(","));
        outln!(
            "Final estimate: PPL = {:.4} +/- {:.5}, bits per byte = {:.4} ({} tokens scored over {} bytes)",
            total.ppl(),
            total.ppl_err(),
            total.bits_per_byte(),
            total.count,
            total.bytes
        );
        eprintln!(
            "cachefit: {:.1} s for {} tokens ({tok_s:.1} tokens per second)",
            eval_s,
            n_chunks * n_ctx
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_is_minus_log_softmax() {
        let l = [1.0f32, 2.0, 3.0];
        let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        for t in 0..3 {
            let want = -((l[t] as f64).exp() / z).ln();
            assert!((nll(&l, t as u32) - want).abs() < 1e-12);
        }
        // Large logits do not overflow.
        assert!(nll(&[1000.0, 0.0], 0).abs() < 1e-12);
    }

    #[test]
    fn ppl_and_error_as_llama_cpp() {
        let mut n = Nll::default();
        for (v, b) in [(1.0, 2), (2.0, 3), (3.0, 1)] {
            n.add(v, b);
        }
        assert!((n.ppl() - 2f64.exp()).abs() < 1e-12);
        // var = (1+4+9)/3 - 4 = 2/3; err = sqrt(var / 2) · ppl
        let want = ((2.0 / 3.0) / 2.0f64).sqrt() * 2f64.exp();
        assert!((n.ppl_err() - want).abs() < 1e-12);
        assert!((n.bits_per_byte() - 6.0 / std::f64::consts::LN_2 / 6.0).abs() < 1e-12);
    }
}
