//! `cachefit-train`: the training pipeline's stages as subcommands over
//! the `train` library; each reads and writes files in one working folder
//! (`--dir`, `$CACHEFIT_PIPELINE_DIR`, or `target/pipeline`). Errors print
//! their chain and exit 1.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
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
    /// Train the byte-level BPE; write tokenizer.json and tokenizer.gguf.
    Bpe(BpeArgs),
    /// Tokenize everything into train.bin, val.bin, eval.bin (u16) and
    /// pack.json.
    Pack,
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
    #[arg(long, default_value_t = 0.1)]
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let start = Instant::now();
    let progress = !cli.quiet;
    let dir = cli.dir;
    let result = match cli.command {
        Command::Data(a) => run_data(a, &dir, progress),
        Command::Bpe(a) => run_bpe(a, &dir, progress),
        Command::Pack => run_pack(&dir, progress),
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

fn run_pack(dir: &std::path::Path, progress: bool) -> train::Result<()> {
    let r = pack::run(dir, progress)?;
    println!(
        "vocabulary {} tokens, ids as u16 little-endian",
        r.vocab_size
    );
    for s in &r.splits {
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
