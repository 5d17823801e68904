//! `cachefit`: the command-line tool. Thin: each subcommand is a file in
//! `commands/` over the library crates; errors print their chain and exit 1.

#[macro_use]
mod out;
mod commands;
mod kernel_env;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cachefit",
    version,
    about = "CPU-first LLM inference built around the memory hierarchy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmark prompt processing and generation speed, llama-bench style.
    Bench(commands::bench::Args),
    /// Talk with a model through its chat template: streaming replies,
    /// history, /clear, Ctrl-C to stop a reply.
    Chat(commands::chat::Args),
    /// Show the CPU, caches, cores and memory bandwidth, and how a model
    /// fits them.
    Info(commands::info::Args),
    /// Show a GGUF file's metadata, tensor table and totals by type.
    Inspect(commands::inspect::Args),
    /// Long-memory files: inspect one, verify every record.
    Memory(commands::memory::Args),
    /// Models in the cache: name, quant, size, architecture, whether this
    /// build runs them.
    Models(commands::models::Args),
    /// Perplexity of a model over a text, windowed like llama-perplexity.
    Perplexity(commands::perplexity::Args),
    /// Download a model from the Hugging Face hub (or HF_ENDPOINT) into
    /// the cache: `cachefit pull OWNER/REPO[:QUANT]`.
    Pull(commands::pull::Args),
    /// Convert a GGUF model to another tensor type or a llama.cpp-style mix.
    Quantize(commands::quantize::Args),
    /// Generate text from a prompt, streaming it to stdout.
    Run(commands::run::Args),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(commands::serve::Args),
    /// Measure read and copy bandwidth of a buffer (STREAM-style).
    Stream(commands::stream::Args),
    /// Show how the model's tokenizer splits a text.
    Tokenize(commands::tokenize::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(commands::rewrite_args(std::env::args_os()));
    kernel_env::configure();
    // A model file truncated or replaced while mapped: report it and stop
    // (what was computed after the fault read zeros). `serve` and
    // `quantize` replace this with their own clean-up.
    if let Err(e) = mapguard::set_fault_handler(|fault| {
        eprintln!("error: {fault}");
        std::process::exit(1);
    }) {
        eprintln!("cachefit: warning: cannot watch mapped files for changes: {e}");
    }
    let result = match cli.command {
        Command::Bench(a) => commands::bench::run(a),
        Command::Chat(a) => commands::chat::run(a),
        Command::Info(a) => commands::info::run(a),
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Memory(a) => commands::memory::run(a),
        Command::Models(a) => commands::models::run(a),
        Command::Perplexity(a) => commands::perplexity::run(a),
        Command::Pull(a) => commands::pull::run(a),
        Command::Quantize(a) => commands::quantize::run(a),
        Command::Run(a) => commands::run::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Stream(a) => commands::stream::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A closed stdout (`cachefit bench | head -1`): the reader took what
        // it wanted.
        Err(e) if closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

fn closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
