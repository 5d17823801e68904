//! `cachefit-train`: the training pipeline's stages as subcommands over
//! the `train` library; each reads and writes files in one working folder
//! (`--dir`, `$CACHEFIT_PIPELINE_DIR`, or `target/pipeline`). Errors print
//! their chain and exit 1.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use train::net::{config::parse_pattern, NetConfig};
use train::trainer::{self, TrainConfig};
use train::{bpe, data, pack};

#[derive(Parser)]
#[command(
    name = "cachefit-train",
    version,
    about = "Training pipeline: corpus → byte-level BPE → packed tokens (docs/PIPELINE.md)"
)]
struct Cli {
    /// Working folder: each stage reads the previous one's files here and
    /// writes its own.
    #[arg(
        long,
        global = true,
        env = "CACHEFIT_PIPELINE_DIR",
        default_value = "target/pipeline"
    )]
    dir: PathBuf,
    /// No progress bars.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Clean the corpus, split off validation text, generate the task
    /// passages (training names and held-out names).
    Data(DataArgs),
    /// Train the byte-level BPE; write tokenizer.json and tokenizer.gguf
    /// (or, with --from-model, take an existing model's tokenizer).
    Bpe(BpeArgs),
    /// Tokenize everything into train.bin, val.bin, eval.bin (u16) and
    /// pack.json.
    Pack(PackArgs),
    /// Train the network on train.bin (resumes from checkpoint.bin when
    /// present); writes checkpoint.bin, train.log.jsonl, train.json.
    Train(TrainArgs),
    /// Write the trained network as a `cachefit` GGUF (int8 matrices).
    Export(ExportArgs),
    /// Measure the int8 runtime against the float reference on val.bin
    /// and write the report (docs/gates.json).
    Gates(GatesArgs),
}

#[derive(clap::Args)]
struct GatesArgs {
    /// The model (default: model.gguf in the working folder).
    #[arg(long, short)]
    model: Option<PathBuf>,
    /// Where to write the JSON report.
    #[arg(long, short, default_value = "docs/gates.json")]
    out: PathBuf,
    /// Greedy prompts from the validation split.
    #[arg(long, default_value_t = 1000)]
    prompts: usize,
    /// Runtime threads.
    #[arg(short = 't', long, default_value_t = 2)]
    threads: usize,
    /// Perplexity windows, spread evenly over the validation split (0 = all).
    #[arg(long, default_value_t = 0)]
    windows: usize,
    /// Held-out-name passages for the question-answering accuracy.
    #[arg(long, default_value_t = 500)]
    task_passages: usize,
}

#[derive(clap::Args)]
struct ExportArgs {
    /// Output file (default: model.gguf in the working folder).
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Matrix storage: i8 (the network's own: int8 rows + f32 scales, and
    /// TQ2_0 block matrices for a ternary network) or f32.
    #[arg(long = "type", default_value = "i8")]
    ty: String,
    /// general.name in the file.
    #[arg(long, default_value = "cachefit-shakespeare")]
    name: String,
}

#[derive(clap::Args)]
struct TrainArgs {
    /// Block pattern: C = gated short convolution, A = attention.
    #[arg(long, default_value = "CCACCA")]
    pattern: String,
    /// Residual width.
    #[arg(long, default_value_t = 144)]
    d: usize,
    /// MLP hidden width.
    #[arg(long, default_value_t = 396)]
    ffn: usize,
    #[arg(long, default_value_t = 8)]
    heads: usize,
    #[arg(long, default_value_t = 1)]
    kv_heads: usize,
    #[arg(long, default_value_t = 18)]
    head_dim: usize,
    /// Context the model is made for (RoPE positions, the runtime's default).
    #[arg(long, default_value_t = 1024)]
    context: usize,
    #[arg(long, default_value_t = 4)]
    conv_kernel: usize,
    /// Logit soft cap (0 = none).
    #[arg(long, default_value_t = 30.0)]
    softcap: f32,
    /// Storage of the block matrices: int8 (one scale per row), ternary
    /// (TQ2_0, a scale per 256 weights) or ternary-row (one scale per row).
    #[arg(long, default_value = "int8")]
    weights: String,
    /// Fixed token codes of N bits instead of an embedding table (0 = a
    /// learned table tied to the output head).
    #[arg(long, default_value_t = 0)]
    token_codes: usize,
    /// Seed of the token codes.
    #[arg(long, default_value_t = 1)]
    code_seed: u64,
    /// Optimizer steps.
    #[arg(long, default_value_t = TrainConfig::default().steps)]
    steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = TrainConfig::default().batch)]
    batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = TrainConfig::default().seq_len)]
    seq_len: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    lr: f32,
    #[arg(long, default_value_t = TrainConfig::default().warmup)]
    warmup: usize,
    #[arg(long, default_value_t = TrainConfig::default().weight_decay)]
    weight_decay: f32,
    #[arg(long, default_value_t = TrainConfig::default().grad_clip)]
    grad_clip: f32,
    /// Final fraction of the steps trained with fake-quantized weights.
    #[arg(long, default_value_t = TrainConfig::default().qat_fraction)]
    qat_fraction: f32,
    /// Validate every N steps.
    #[arg(long, default_value_t = TrainConfig::default().eval_every)]
    eval_every: usize,
    /// Validation windows (0 = all of val.bin).
    #[arg(long, default_value_t = 0)]
    eval_windows: usize,
    #[arg(long, default_value_t = TrainConfig::default().checkpoint_every)]
    checkpoint_every: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker threads (default: the cores available).
    #[arg(short = 't', long, default_value_t = 0)]
    threads: usize,
    /// Ignore an existing checkpoint and start over.
    #[arg(long)]
    fresh: bool,
    /// Stop this invocation after N steps (a checkpoint is saved; run the
    /// same command again to continue).
    #[arg(long)]
    stop_after: Option<usize>,
}

#[derive(clap::Args)]
struct DataArgs {
    /// UTF-8 text files (Project Gutenberg files as downloaded are fine);
    /// repeat for several.
    #[arg(long = "corpus", default_value = "data/tinyshakespeare.txt")]
    corpus: Vec<PathBuf>,
    /// Seed of the task passages.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Task text to generate, as a fraction of the training corpus bytes.
    #[arg(long, default_value_t = 0.1)]
    task_ratio: f64,
    /// Share of the corpus (its end) held out for validation.
    #[arg(long, default_value_t = 0.15)]
    val_fraction: f64,
    /// Number of held-out-name passages for evaluation.
    #[arg(long, default_value_t = 500)]
    eval_passages: usize,
}

#[derive(clap::Args)]
struct BpeArgs {
    /// Vocabulary size, including the 3 special tokens and 256 bytes.
    #[arg(long, default_value_t = bpe::DEFAULT_VOCAB)]
    vocab_size: usize,
    /// Train nothing: copy this GGUF model's tokenizer (every tokenizer.*
    /// key, chat template included) into tokenizer.gguf, so the network
    /// trains on its token ids (a draft model for it, say).
    #[arg(long, value_name = "GGUF", conflicts_with = "vocab_size")]
    from_model: Option<PathBuf>,
}

#[derive(clap::Args)]
struct PackArgs {
    /// A teacher model's generations, JSON lines of {"prompt", "ids",
    /// "stop"} (scripts/train-draft.sh makes them with `cachefit run --json
    /// --logprobs 0`): added to train.bin, every 10th held out as
    /// val.distilled.bin.
    #[arg(long, value_name = "JSONL")]
    distilled: Option<PathBuf>,
    /// Times the distilled training documents go into train.bin.
    #[arg(long, default_value_t = 1, requires = "distilled")]
    distilled_repeat: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let start = Instant::now();
    let progress = !cli.quiet;
    let dir = cli.dir;
    let result = match cli.command {
        Command::Data(a) => run_data(a, &dir, progress),
        Command::Bpe(a) => run_bpe(a, &dir, progress),
        Command::Pack(a) => run_pack(a, &dir, progress),
        Command::Train(a) => run_train(a, &dir, progress),
        Command::Export(a) => run_export(a, &dir),
        Command::Gates(a) => run_gates(a, &dir, progress),
    };
    match result {
        Ok(()) => {
            eprintln!(
                "done in {:.1} s; files in {}",
                start.elapsed().as_secs_f64(),
                dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}

fn run_data(a: DataArgs, dir: &std::path::Path, progress: bool) -> train::Result<()> {
    let config = data::DataConfig {
        corpus: a.corpus,
        seed: a.seed,
        task_ratio: a.task_ratio,
        val_fraction: a.val_fraction,
        eval_passages: a.eval_passages,
    };
    let r = data::run(&config, dir, progress)?;
    for note in &r.gutenberg {
        println!("{note}");
    }
    println!(
        "corpus: {} bytes for training, {} held out for validation",
        r.corpus_train_bytes, r.corpus_val_bytes
    );
    println!(
        "tasks: {} training passages ({} bytes, {:.1}% of the training corpus), \
         {} held-out-name passages ({} bytes)",
        r.train_passages,
        r.tasks_train_bytes,
        100.0 * r.tasks_train_bytes as f64 / r.corpus_train_bytes.max(1) as f64,
        r.eval_passages,
        r.tasks_eval_bytes
    );
    Ok(())
}

fn run_bpe(a: BpeArgs, dir: &std::path::Path, progress: bool) -> train::Result<()> {
    if let Some(model) = &a.from_model {
        let r = train::import::run(model, dir)?;
        println!(
            "vocabulary: {} tokens from {} ({} tokenizer keys{}; BOS {}, EOS {})",
            r.vocab_size,
            r.source.display(),
            r.keys,
            if r.has_chat_template {
                ", chat template"
            } else {
                ""
            },
            r.bos.map_or("none".into(), |id| id.to_string()),
            r.eos.map_or("none".into(), |id| id.to_string()),
        );
        if r.checked_tokens > 0 {
            println!(
                "held-out text: {} tokens, decoded back to the text exactly",
                r.checked_tokens
            );
        }
        return Ok(());
    }
    let r = bpe::run(a.vocab_size, dir, progress)?;
    println!(
        "vocabulary: {} tokens ({} merges), trained on {} documents ({} bytes)",
        r.vocab_size, r.merges, r.training_documents, r.training_bytes
    );
    println!(
        "held-out text: {} tokens, identical ids from tokenizers and cachefit-tokenize",
        r.checked_tokens
    );
    Ok(())
}

fn run_pack(a: PackArgs, dir: &std::path::Path, progress: bool) -> train::Result<()> {
    let options = pack::PackOptions {
        distilled: a.distilled,
        distilled_repeat: a.distilled_repeat,
    };
    let r = pack::run_with(dir, &options, progress)?;
    println!(
        "vocabulary {} tokens, ids as u16 little-endian",
        r.vocab_size
    );
    for s in r.splits.iter().chain(&r.sources) {
        println!(
            "{:5} {:>9} tokens  {:>5} documents  {:>9} bytes of text ({:.2} bytes/token)  {}",
            s.name,
            s.tokens,
            s.documents,
            s.text_bytes,
            s.text_bytes as f64 / s.tokens.max(1) as f64,
            s.file
        );
    }
    Ok(())
}

fn run_train(a: TrainArgs, dir: &std::path::Path, progress: bool) -> train::Result<()> {
    let vocab = pack::vocab_size(dir)?;
    let net = NetConfig {
        vocab,
        d: a.d,
        ffn: a.ffn,
        pattern: parse_pattern(&a.pattern)?,
        n_heads: a.heads,
        n_kv_heads: a.kv_heads,
        head_dim: a.head_dim,
        context: a.context,
        conv_kernel: a.conv_kernel,
        softcap: a.softcap,
        eps: 1e-6,
        rope_base: 10000.0,
        weights: train::net::WeightFormat::parse(&a.weights)?,
        token_code_bits: a.token_codes,
        token_code_seed: if a.token_codes > 0 { a.code_seed } else { 0 },
    };
    let tc = TrainConfig {
        steps: a.steps,
        batch: a.batch,
        seq_len: a.seq_len,
        lr: a.lr,
        warmup: a.warmup,
        weight_decay: a.weight_decay,
        grad_clip: a.grad_clip,
        qat_fraction: a.qat_fraction,
        eval_every: a.eval_every.max(1),
        eval_windows: a.eval_windows,
        checkpoint_every: a.checkpoint_every.max(1),
        seed: a.seed,
        threads: a.threads,
        stop_after: a.stop_after,
        ..TrainConfig::default()
    };
    let r = trainer::run(&net, &tc, dir, a.fresh, progress)?;
    if r.resumed_from > 0 {
        println!("resumed at step {}", r.resumed_from);
    }
    println!(
        "{} parameters; {} steps in {:.1} s, {:.0} training tokens/s",
        r.params, r.steps_run, r.seconds, r.tokens_per_second
    );
    println!(
        "final train loss {:.4}; validation loss {:.4} (perplexity {:.2})",
        r.final_train_loss,
        r.final_val_loss,
        r.final_val_loss.exp()
    );
    Ok(())
}

fn run_export(a: ExportArgs, dir: &std::path::Path) -> train::Result<()> {
    use train::export::{self, MatrixType};
    let ty = match a.ty.as_str() {
        "i8" | "int8" => MatrixType::Int8,
        "f32" => MatrixType::F32,
        other => {
            return Err(train::Error::Config(format!(
                "--type {other:?}: expected i8 or f32"
            )))
        }
    };
    let r = export::run(dir, a.out.as_deref(), ty, &a.name)?;
    println!(
        "{} parameters (step {}) written: {} bytes ({:.2} MB)",
        r.params,
        r.step,
        r.bytes,
        r.bytes as f64 / 1e6
    );
    Ok(())
}

fn run_gates(a: GatesArgs, dir: &std::path::Path, progress: bool) -> train::Result<()> {
    use train::gates::{self, GateSettings};
    let model = a
        .model
        .unwrap_or_else(|| dir.join(train::paths::MODEL_GGUF));
    let settings = GateSettings {
        prompts: a.prompts,
        threads: a.threads,
        windows: a.windows,
        ..GateSettings::default()
    };
    let r = gates::run(&model, dir, &settings, progress)?;
    let tasks = gates::task_accuracy(&model, dir, a.task_passages, a.threads)?;
    let mut v = r.to_json();
    for (k, x) in tasks.to_json().as_object().expect("an object") {
        v[k] = x.clone();
    }
    v["ppl_windows_asked"] = a.windows.into();
    v["model"] = model.display().to_string().into();
    v["model_sha256"] = train::files::sha256_hex(&train::files::read_bytes(&model)?).into();
    v["commit"] = git_commit().into();
    v["date"] = utc_now().into();
    train::files::write_json(&a.out, &v)?;
    println!(
        "perplexity: runtime {:.4}, reference {:.4} ({:.3}% apart, {} predictions)",
        r.ppl_runtime,
        r.ppl_reference,
        100.0 * r.ppl_rel_diff(),
        r.predictions
    );
    println!(
        "bits per byte (runtime): {:.4}; file {} bytes",
        r.bits_per_byte, r.file_bytes
    );
    println!(
        "greedy: {:.2}% of {}×{} tokens equal, {:.1}% of prompts identical, \
         {:.2}% of steps agree given the same prefix",
        100.0 * r.greedy_token_match,
        r.prompts,
        r.gen_len,
        100.0 * r.greedy_prompts_identical,
        100.0 * r.greedy_step_agreement
    );
    println!(
        "deterministic across runs and 1/2 threads: {}",
        r.deterministic
    );
    println!(
        "held-out-name questions: {:.1}% of {} answered exactly ({:.1}% of facts asked, {:.1}% of \"I don't know\")",
        100.0 * tasks.accuracy(),
        tasks.questions,
        100.0 * tasks.known_accuracy(),
        100.0 * tasks.unknown_accuracy()
    );
    println!("report: {}", a.out.display());
    Ok(())
}

/// `git rev-parse HEAD`, or "unknown" outside a checkout.
fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The current UTC time, ISO 8601 (from `date`, to keep a clock crate out).
fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
