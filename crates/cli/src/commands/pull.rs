//! `cachefit pull OWNER/REPO[:QUANT] [--hf-file FILE]`: download a model
//! from the Hugging Face hub (`HF_ENDPOINT`, `HF_TOKEN`) into the cache
//! (`$CACHEFIT_MODELS/{owner}/{repo}/{file}`, docs/MODELS.md), and the
//! same for `-hf` of the model-running commands.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Exit status after Ctrl-C (128 + SIGINT), as shells report it.
const EXIT_INTERRUPTED: i32 = 130;

#[derive(clap::Args)]
pub struct Args {
    /// OWNER/REPO[:QUANT], e.g. bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M
    /// (the quant picks the .gguf file; default Q4_K_M, as llama.cpp).
    pub repo: String,
    /// This file of the repo instead of a quant's (all parts of a split
    /// model come with its first).
    #[arg(long = "hf-file", value_name = "FILE")]
    pub hf_file: Option<String>,
}

pub fn run(args: Args) -> Result<()> {
    let spec = hub::RepoSpec::parse(&args.repo)?;
    let dir = hub::models_dir();
    let client = hub::Client::from_env();
    // Ctrl-C stops between chunks and keeps the `.part` for the next
    // run; a second Ctrl-C ends at once (the `.part` is a valid prefix
    // either way).
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::Relaxed) {
            std::process::exit(EXIT_INTERRUPTED);
        }
    })
    .context("installing the Ctrl-C handler")?;
    let mut reporter = hub::Reporter::stderr();
    match client.pull(&spec, args.hf_file.as_deref(), &dir, &mut reporter, &cancel) {
        Ok(done) => {
            for (path, outcome) in &done.files {
                let what = match outcome {
                    hub::Outcome::Downloaded => "downloaded",
                    hub::Outcome::AlreadyCached => "already cached",
                };
                eprintln!("cachefit: {what}: {}", path.display());
            }
            outln!("{}", done.model_path().display());
            Ok(())
        }
        Err(e @ hub::HubError::Interrupted { .. }) => {
            eprintln!("cachefit: {e}");
            std::process::exit(EXIT_INTERRUPTED);
        }
        Err(e) => Err(e.into()),
    }
}

/// The path of `-hf REPO[:QUANT]` (with `--hf-file`): the cached copy if
/// there is one, else downloaded now. Ctrl-C here ends the process as
/// usual, leaving the `.part` for the next run to resume (the commands
/// that run models install their own Ctrl-C handling later).
pub fn fetch(repo: &str, hf_file: Option<&str>) -> Result<PathBuf> {
    let spec = hub::RepoSpec::parse(repo)?;
    let dir = hub::models_dir();
    let scan = hub::scan(&dir)?;
    if let Some(m) = scan.find_for(&dir, &spec, hf_file) {
        return Ok(m.path.clone());
    }
    let client = hub::Client::from_env();
    eprintln!(
        "cachefit: {spec} is not in {}; downloading from {}",
        dir.display(),
        client.endpoint()
    );
    let done = client
        .pull(
            &spec,
            hf_file,
            &dir,
            &mut hub::Reporter::stderr(),
            &AtomicBool::new(false),
        )
        .with_context(|| format!("-hf {repo}"))?;
    Ok(done.model_path().to_path_buf())
}
