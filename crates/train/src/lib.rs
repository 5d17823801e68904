//! The training pipeline's first stages: text corpus → byte-level BPE →
//! packed token files, each a function here and a subcommand of the
//! `cachefit-train` binary (`docs/PIPELINE.md` has the commands).
//!
//! - [`data`]: clean the corpus ([`clean`]: line endings, stray whitespace,
//!   Project Gutenberg header and footer), split off its last tenth for
//!   validation, and generate the task streams ([`tasks`]: fact passages
//!   about invented entities, questions and answers, names from a syllable
//!   generator in [`names`], a disjoint set of names held out for
//!   evaluation).
//! - [`bpe`]: train a byte-level BPE with the `tokenizers` crate's
//!   `BpeTrainer` and a GPT-2 pre-tokenizer, save its `tokenizer.json`,
//!   and write the vocabulary as GGUF metadata ([`vocab`]) that our
//!   `tokenize` crate loads as it loads GPT-2's. The stage checks that both
//!   tokenizers give the same ids on the held-out text.
//! - [`pack`]: tokenize the training, validation and evaluation documents
//!   ([`documents`]) into `u16` token files with a JSON sidecar.
//!
//! Every stage is deterministic: the same inputs and seed give the same
//! bytes. Random choices come from [`rng`], whose stream is fixed by this
//! crate's code alone, not by a dependency's version.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bpe;
pub mod checkpoint;
pub mod clean;
pub mod data;
pub mod distill;
pub mod documents;
mod error;
pub mod export;
pub mod files;
pub mod gates;
pub mod import;
pub mod names;
pub mod net;
pub mod pack;
pub mod rng;
pub mod tasks;
pub mod trainer;
pub mod vocab;

pub use error::{Error, Result};
pub use vocab::{vocab_metadata, Vocabulary};

/// The pipeline's file names inside its working folder, shared by the
/// stages (each reads what the one before wrote).
pub mod paths {
    /// `data`: the cleaned corpus minus its validation tail.
    pub const CORPUS_TRAIN: &str = "corpus.train.txt";
    /// `data`: the cleaned corpus's last paragraphs, held out.
    pub const CORPUS_VAL: &str = "corpus.val.txt";
    /// `data`: task passages with training names, blank-line separated.
    pub const TASKS_TRAIN: &str = "tasks.train.txt";
    /// `data`: task passages with held-out names only.
    pub const TASKS_EVAL: &str = "tasks.eval.txt";
    /// `data`: what went in (sha256 of each corpus file) and came out.
    pub const DATA_MANIFEST: &str = "data.json";
    /// `bpe`: the `tokenizers` library's own file.
    pub const TOKENIZER_JSON: &str = "tokenizer.json";
    /// `bpe`: the same vocabulary as a vocab-only GGUF.
    pub const TOKENIZER_GGUF: &str = "tokenizer.gguf";
    /// `bpe --from-model`: where the imported tokenizer came from.
    pub const VOCAB_IMPORT: &str = "vocab.json";
    /// `pack`: token files, `u16` little-endian ids.
    pub const TRAIN_BIN: &str = "train.bin";
    pub const VAL_BIN: &str = "val.bin";
    pub const EVAL_BIN: &str = "eval.bin";
    /// `pack`: the sidecar describing the token files.
    pub const PACK_MANIFEST: &str = "pack.json";
    /// `train`: parameters and optimizer state, resumable.
    pub const CHECKPOINT: &str = "checkpoint.bin";
    /// `train`: one JSON line per validation.
    pub const TRAIN_LOG: &str = "train.log.jsonl";
    /// `train`: the run's settings and results.
    pub const TRAIN_MANIFEST: &str = "train.json";
    /// `export`: the int8 model.
    pub const MODEL_GGUF: &str = "model.gguf";
}

/// A progress bar that draws only when asked to (stages run quietly in
/// tests) and only on a terminal (indicatif's own rule).
pub(crate) fn progress_bar(show: bool, len: u64, message: &str) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let style = indicatif::ProgressStyle::with_template(
        "{msg:24} [{elapsed_precise}] {wide_bar} {percent:>3}% ({eta})",
    )
    .expect("static template");
    indicatif::ProgressBar::new(len)
        .with_style(style)
        .with_message(message.to_string())
}

/// A spinner for work whose progress cannot be counted (the BPE trainer
/// reports none without its own indicatif version).
pub(crate) fn spinner(show: bool, message: &str) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let style = indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed_precise}]")
        .expect("static template");
    let bar = indicatif::ProgressBar::new_spinner()
        .with_style(style)
        .with_message(message.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}
