//! What `run`, `chat` and `serve` share about generating: the sampling and
//! stop flags (declared once, flattened into each command), and a local
//! session — the engine's scheduler over the model on this thread, with a
//! sink that streams to stdout and stops on Ctrl-C.

use super::common::{ModelArgs, Opened, Pools};
use anyhow::{bail, Context, Result};
use engine::{Finish, GenParams, JobError, ModelBackend, SamplerConfig, Scheduler, Sink};
use model::{Model, StateOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Sampling and stopping, as llama.cpp's tools spell them. The defaults are
/// llama.cpp's: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, a random
/// seed (logged, so a run can be repeated with `-s`).
#[derive(clap::Args, Debug, Clone)]
pub struct GenArgs {
    /// Tokens to generate (-1: until an end-of-generation token or the
    /// context is full).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Sampling seed (default: random, and logged).
    #[arg(short = 's', long)]
    pub seed: Option<u32>,
    /// Temperature; 0 samples greedily.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1: off).
    #[arg(long = "top-p", default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the best one (0: off).
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Penalize repeats of the last --repeat-last-n tokens (1: off).
    #[arg(
        long = "repeat-penalty",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over (0: off, -1: the context).
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i64,
    /// Subtract this times a token's count in the window (0: off).
    #[arg(
        long = "frequency-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
    /// Subtract this once from every token in the window (0: off).
    #[arg(
        long = "presence-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    /// Stop when the output contains this text (not printed); repeatable.
    #[arg(long = "stop", visible_alias = "reverse-prompt", short = 'r')]
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens (they are never
    /// sampled).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Speculative decoding by prompt lookup: guess the next tokens from
    /// the prompt and the output so far, check them in one pass. The same
    /// output, faster where it copies its input (editing code, quoting);
    /// it backs off by itself where guesses fail.
    #[arg(long)]
    pub lookup: bool,
    /// -md FILE: speculative decoding with a draft model, a smaller GGUF
    /// model with the same vocabulary: it guesses the next tokens one by
    /// one, the model checks them in one pass. The same output; faster
    /// when the draft is cheap and usually right. With --lookup, the draft
    /// model guesses where the lookup finds nothing.
    #[arg(long = "model-draft", value_name = "FILE")]
    pub model_draft: Option<PathBuf>,
    /// With --lookup or -md: most tokens guessed per step (llama.cpp's
    /// --draft-max).
    #[arg(long = "draft-max", visible_alias = "draft", value_name = "N", default_value_t = engine::speculate::Lookup::default().draft_max)]
    pub draft_max: usize,
    /// With --lookup or -md: no guess when fewer tokens would be guessed.
    #[arg(long = "draft-min", value_name = "N", default_value_t = engine::speculate::Lookup::default().draft_min)]
    pub draft_min: usize,
    /// With -md: stop a draft at a token the draft model gives less
    /// probability than this (0..1).
    #[arg(long = "draft-p-min", value_name = "P", default_value_t = engine::draft::ModelDraft::default().p_min)]
    pub draft_p_min: f32,
}

impl GenArgs {
    /// The flags checked, before anything is loaded.
    pub fn check(&self) -> Result<()> {
        if self.n_predict < -1 {
            bail!("-n must be -1 (no limit), 0 or positive");
        }
        if self.repeat_last_n < -1 {
            bail!("--repeat-last-n must be -1 (the whole context), 0 (off) or positive");
        }
        if let Some(l) = self.lookup() {
            l.check()
                .map_err(|e| anyhow::anyhow!("--draft-max/--draft-min: {e}"))?;
        }
        if self.model_draft.is_some() {
            self.model_draft_params()
                .check()
                .map_err(|e| anyhow::anyhow!("--draft-max/--draft-min/--draft-p-min: {e}"))?;
        }
        engine::validate(&self.sampling(1)).map_err(|e| anyhow::anyhow!(e.describe(e.param.flag())))
    }

    /// Logits rows the guesses of `n_seq` sequences need (0 without
    /// --lookup).
    pub fn draft_rows(&self, n_seq: usize) -> usize {
        if self.lookup || self.model_draft.is_some() {
            self.draft_max * n_seq
        } else {
            0
        }
    }

    /// The draft model's settings (used with -md).
    fn model_draft_params(&self) -> engine::draft::ModelDraft {
        engine::draft::ModelDraft {
            draft_max: self.draft_max,
            draft_min: self.draft_min,
            p_min: self.draft_p_min,
        }
    }

    /// The prompt-lookup settings, with --lookup.
    pub fn lookup(&self) -> Option<engine::speculate::Lookup> {
        self.lookup.then(|| engine::speculate::Lookup {
            draft_max: self.draft_max,
            draft_min: self.draft_min,
            ..Default::default()
        })
    }

    /// The sampling settings for a context of `n_ctx` tokens.
    pub fn sampling(&self, n_ctx: usize) -> SamplerConfig {
        SamplerConfig {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            penalty_last_n: match self.repeat_last_n {
                -1 => n_ctx,
                n => n.max(0) as usize,
            },
            seed: self.seed,
            ..SamplerConfig::default()
        }
    }

    /// Most tokens to generate (`usize::MAX` for -1).
    pub fn max_tokens(&self) -> usize {
        usize::try_from(self.n_predict).unwrap_or(usize::MAX)
    }

    /// Everything a job needs, for a context of `n_ctx`.
    pub fn params(&self, n_ctx: usize) -> GenParams {
        GenParams {
            max_tokens: self.max_tokens(),
            sampling: self.sampling(n_ctx),
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            lookup: self.lookup(),
            draft_model: self
                .model_draft
                .is_some()
                .then(|| self.model_draft_params()),
            ..GenParams::new(SamplerConfig::default())
        }
    }
}

/// Bind the model's weights (named as `args` says in errors).
pub fn bind<'a>(opened: &'a Opened, args: &ModelArgs) -> Result<Model<'a>> {
    Model::from_gguf(&opened.file, &opened.cfg).with_context(|| args.shown())
}

/// The draft model -md names (a file or a cached model's name), opened the
/// way `args` opens the model, its vocabulary checked against `target`'s.
pub fn open_draft(gen: &GenArgs, args: &ModelArgs, target: &Opened) -> Result<Option<Opened>> {
    let Some(path) = &gen.model_draft else {
        return Ok(None);
    };
    let shown = format!("-md {}", path.display());
    let source = super::builtin::ModelSource::from_arg(Some(path)).context(shown.clone())?;
    let opts = gguf::OpenOptions {
        mmap: !args.no_mmap,
        mlock: args.mlock,
        ..Default::default()
    };
    let file = source.open(opts).with_context(|| shown.clone())?;
    let cfg = model::ModelConfig::from_gguf(file.metadata())
        .with_context(|| format!("{shown}: reading the model config"))?;
    let vocab = tokenize::Vocab::from_gguf(file.metadata())
        .with_context(|| format!("{shown}: the model has no usable tokenizer"))?;
    engine::draft::check_vocab(&target.vocab, &vocab)
        .map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
    Ok(Some(Opened { file, cfg, vocab }))
}

/// Bind the draft model's weights (named as -md in errors).
pub fn bind_draft<'a>(opened: Option<&'a Opened>, gen: &GenArgs) -> Result<Option<Model<'a>>> {
    opened
        .map(|o| {
            Model::from_gguf(&o.file, &o.cfg).with_context(|| {
                format!(
                    "-md {}",
                    gen.model_draft
                        .as_ref()
                        .map_or_else(String::new, |p| p.display().to_string())
                )
            })
        })
        .transpose()
}

/// The model's scheduler on this thread: one slot, kept between jobs (so
/// `chat` reuses the cached prefix of each next prompt).
pub struct Local<'a> {
    pub scheduler: Scheduler<ModelBackend<'a>>,
    next_id: u64,
}

impl<'a> Local<'a> {
    /// Allocate one slot's state of `opts` for `model`, on `pools`.
    /// With `draft`, its guesses speed up the jobs that ask
    /// ([`GenParams::draft_model`]).
    pub fn new(
        opened: &'a Opened,
        model: &'a Model<'a>,
        draft: Option<&'a Model<'a>>,
        opts: &StateOptions,
        pools: Pools,
    ) -> Result<Local<'a>> {
        let state = model.new_state(opts)?;
        let (decode, batch) = pools.into_parts();
        let mut backend =
            ModelBackend::new(&opened.cfg, model, state, decode, batch, &opened.vocab);
        if let Some(d) = draft {
            backend = backend.with_draft(
                engine::draft::DraftModel::new(d, opts).context("the draft model's state")?,
            );
        }
        Ok(Local {
            scheduler: Scheduler::new(backend).with_stream_interval(Duration::ZERO),
            next_id: 0,
        })
    }

    /// Generate from `prompt` to the end, into `sink`, seeing `memory`.
    pub fn generate(
        &mut self,
        prompt: Vec<u32>,
        params: GenParams,
        sink: Box<dyn Sink>,
        memory: Option<engine::JobMemory>,
    ) {
        self.next_id += 1;
        let mut job = engine::Job::new(self.next_id, prompt, params, sink);
        job.memory = memory;
        self.scheduler.submit(job);
        self.scheduler.run_until_idle();
    }
}

/// What a [`Printer`] saw of its job.
#[derive(Default)]
pub struct Printed {
    /// Everything written (or, when not writing, collected).
    pub text: String,
    pub end: Option<std::result::Result<Finish, JobError>>,
    /// Writing to stdout failed (a closed pipe): the job was cancelled.
    pub write_error: Option<std::io::Error>,
    /// Each token's log-probabilities, when the job asked for them.
    pub logprobs: Vec<engine::TokenLogprob>,
}

/// A sink that writes text to stdout as it comes (or only collects it),
/// and reports cancelled when Ctrl-C was pressed or stdout went away.
#[derive(Clone)]
pub struct Printer {
    pub printed: Arc<Mutex<Printed>>,
    interrupted: Arc<AtomicBool>,
    write: bool,
}

impl Printer {
    /// `write`: stream to stdout; otherwise collect only (`--json`).
    pub fn new(interrupted: Arc<AtomicBool>, write: bool) -> Printer {
        Printer {
            printed: Arc::default(),
            interrupted,
            write,
        }
    }

    /// Take what was printed, leaving the printer fresh for another job.
    pub fn take(&self) -> Printed {
        std::mem::take(&mut *self.printed.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Sink for Printer {
    fn text(&mut self, text: String) {
        let mut p = self.printed.lock().unwrap_or_else(PoisonError::into_inner);
        if self.write && p.write_error.is_none() {
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                p.write_error = Some(e);
            }
        }
        p.text.push_str(&text);
    }

    fn logprobs(&mut self, entries: Vec<engine::TokenLogprob>) {
        self.printed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .logprobs
            .extend(entries);
    }

    fn finish(&mut self, end: std::result::Result<Finish, JobError>) {
        self.printed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .end = Some(end);
    }

    fn cancelled(&self) -> bool {
        self.interrupted.load(Ordering::SeqCst)
            || self
                .printed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .write_error
                .is_some()
    }
}
