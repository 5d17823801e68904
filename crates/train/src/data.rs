//! The `data` stage: corpus files in, the texts the later stages read out.
//!
//! The corpus files are cleaned ([`clean`](crate::clean)) and joined with a
//! blank line between files; the last `val_fraction` of that text, from the
//! next paragraph boundary on, is held out for validation. Task passages
//! with training names are generated until their text is `task_ratio` of
//! the training corpus; `eval_passages` more use only held-out names.
//! Names avoid every word of the corpus, so a held-out name appears
//! nowhere in the training text.

use crate::clean::GutenbergCut;
use crate::error::{Error, Result};
use crate::files;
use crate::names::Side;
use crate::paths;
use crate::tasks::{template_words, TaskGen};
use serde_json::json;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The settings of the `data` stage.
#[derive(Clone, Debug)]
pub struct DataConfig {
    /// UTF-8 text files, cleaned and joined in this order.
    pub corpus: Vec<PathBuf>,
    /// Seed of the task passages.
    pub seed: u64,
    /// Task text wanted, as a fraction of the training corpus's bytes.
    pub task_ratio: f64,
    /// Share of the cleaned corpus held out (its end) for validation.
    pub val_fraction: f64,
    /// Number of held-out-name passages for evaluation.
    pub eval_passages: usize,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            corpus: vec![PathBuf::from("data/tinyshakespeare.txt")],
            seed: 1,
            task_ratio: 0.1,
            val_fraction: 0.15,
            eval_passages: 500,
        }
    }
}

/// The texts the stage produces, before they are written.
#[derive(Clone, Debug)]
pub struct DataSet {
    pub corpus_train: String,
    pub corpus_val: String,
    pub tasks_train: Vec<String>,
    pub tasks_eval: Vec<String>,
    pub sources: Vec<Source>,
}

/// A corpus file as read.
#[derive(Clone, Debug)]
pub struct Source {
    pub path: PathBuf,
    pub bytes: usize,
    pub sha256: String,
    pub cleaned_bytes: usize,
    pub gutenberg: GutenbergCut,
}

impl Source {
    fn to_json(&self) -> serde_json::Value {
        json!({
            "path": self.path.display().to_string(),
            "bytes": self.bytes,
            "sha256": self.sha256,
            "cleaned_bytes": self.cleaned_bytes,
            "gutenberg_header_end_line": self.gutenberg.header_end,
            "gutenberg_footer_start_line": self.gutenberg.footer_start,
        })
    }
}

impl DataSet {
    /// Passages as written to their file: separated by one blank line.
    pub fn tasks_train_text(&self) -> String {
        self.tasks_train.join("\n")
    }
    pub fn tasks_eval_text(&self) -> String {
        self.tasks_eval.join("\n")
    }
}

/// What `run` did, for the user.
#[derive(Clone, Debug)]
pub struct DataReport {
    /// Corpus bytes after cleaning, for training and validation.
    pub corpus_train_bytes: usize,
    pub corpus_val_bytes: usize,
    pub train_passages: usize,
    pub tasks_train_bytes: usize,
    pub eval_passages: usize,
    pub tasks_eval_bytes: usize,
    /// Files cut at Gutenberg markers, with what was found.
    pub gutenberg: Vec<String>,
}

fn check(config: &DataConfig) -> Result<()> {
    if config.corpus.is_empty() {
        return Err(Error::Config("no corpus file given".into()));
    }
    if !(0.0..1.0).contains(&config.val_fraction) {
        return Err(Error::Config(format!(
            "validation fraction {} is outside [0, 1)",
            config.val_fraction
        )));
    }
    if !(0.0..=10.0).contains(&config.task_ratio) {
        return Err(Error::Config(format!(
            "task ratio {} is outside [0, 10]",
            config.task_ratio
        )));
    }
    Ok(())
}

/// Build the texts in memory.
pub fn build(config: &DataConfig, progress: bool) -> Result<DataSet> {
    check(config)?;
    let bar = crate::progress_bar(progress, config.corpus.len() as u64, "cleaning corpus");
    let mut cleaned_files = Vec::new();
    let mut sources = Vec::new();
    for path in &config.corpus {
        let raw = files::read_text(path)?;
        let cleaned = crate::clean::clean(&raw);
        sources.push(Source {
            path: path.clone(),
            bytes: raw.len(),
            sha256: files::sha256_hex(raw.as_bytes()),
            cleaned_bytes: cleaned.text.len(),
            gutenberg: cleaned.gutenberg.clone(),
        });
        if !cleaned.text.is_empty() {
            cleaned_files.push(cleaned.text);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let corpus = cleaned_files.join("\n");
    if corpus.is_empty() {
        return Err(Error::Config(
            "the corpus files hold no text once cleaned".into(),
        ));
    }
    let (train, val) = split_tail(&corpus, config.val_fraction)?;

    // Names must not be corpus words: a held-out name in Shakespeare would
    // be a held-out name seen in training.
    let mut forbidden: HashSet<String> = crate::names::words(&corpus).collect();
    forbidden.extend(template_words());
    let want = (train.len() as f64 * config.task_ratio).round() as usize;
    let tasks_train = TaskGen::new(config.seed, Side::Train, &forbidden).passages_until(want);
    let tasks_eval =
        TaskGen::new(config.seed, Side::HeldOut, &forbidden).passages(config.eval_passages);
    Ok(DataSet {
        corpus_train: train.to_string(),
        corpus_val: val.to_string(),
        tasks_train,
        tasks_eval,
        sources,
    })
}

/// Cut `text` (paragraphs separated by one blank line, ending in `\n`)
/// before its last `fraction`, at the paragraph boundary nearest that
/// point after it (else before it).
fn split_tail(text: &str, fraction: f64) -> Result<(&str, &str)> {
    if fraction == 0.0 {
        return Ok((text, ""));
    }
    let mut target = ((text.len() as f64) * (1.0 - fraction)) as usize;
    while !text.is_char_boundary(target) {
        target += 1;
    }
    let cut = text[target..]
        .find("\n\n")
        .map(|i| target + i)
        .or_else(|| text[..target].rfind("\n\n"))
        .ok_or_else(|| {
            Error::Config(
                "the corpus is a single paragraph: no place to split off validation text \
                 (use a validation fraction of 0)"
                    .into(),
            )
        })?;
    Ok((&text[..cut + 1], &text[cut + 2..]))
}

/// Run the stage: build the texts and write them, with `data.json`, into
/// `dir`.
pub fn run(config: &DataConfig, dir: &Path, progress: bool) -> Result<DataReport> {
    let set = build(config, progress)?;
    let tasks_train = set.tasks_train_text();
    let tasks_eval = set.tasks_eval_text();
    let outputs: [(&str, &str); 4] = [
        (paths::CORPUS_TRAIN, &set.corpus_train),
        (paths::CORPUS_VAL, &set.corpus_val),
        (paths::TASKS_TRAIN, &tasks_train),
        (paths::TASKS_EVAL, &tasks_eval),
    ];
    let mut described = serde_json::Map::new();
    for (name, text) in outputs {
        files::write(&dir.join(name), text.as_bytes())?;
        described.insert(
            name.to_string(),
            json!({ "bytes": text.len(), "sha256": files::sha256_hex(text.as_bytes()) }),
        );
    }
    let manifest = json!({
        "stage": "data",
        "seed": config.seed,
        "task_ratio": config.task_ratio,
        "val_fraction": config.val_fraction,
        "sources": set.sources.iter().map(Source::to_json).collect::<Vec<_>>(),
        "outputs": described,
        "train_passages": set.tasks_train.len(),
        "eval_passages": set.tasks_eval.len(),
    });
    files::write_json(&dir.join(paths::DATA_MANIFEST), &manifest)?;

    let gutenberg = set
        .sources
        .iter()
        .filter(|s| s.gutenberg.found())
        .map(|s| {
            let line = |l: Option<usize>| l.map_or("none".to_string(), |l| l.to_string());
            format!(
                "{}: Gutenberg header ends at line {}, footer starts at line {}",
                s.path.display(),
                line(s.gutenberg.header_end),
                line(s.gutenberg.footer_start)
            )
        })
        .collect();
    Ok(DataReport {
        corpus_train_bytes: set.corpus_train.len(),
        corpus_val_bytes: set.corpus_val.len(),
        train_passages: set.tasks_train.len(),
        tasks_train_bytes: tasks_train.len(),
        eval_passages: set.tasks_eval.len(),
        tasks_eval_bytes: tasks_eval.len(),
        gutenberg,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_tail_cuts_at_a_paragraph() {
        let text = "aaaa\n\nbbbb\n\ncccc\n\ndddd\n";
        assert_eq!(
            split_tail(text, 0.3).unwrap(),
            ("aaaa\n\nbbbb\n\ncccc\n", "dddd\n")
        );
        assert_eq!(
            split_tail(text, 0.05).unwrap(),
            ("aaaa\n\nbbbb\n\ncccc\n", "dddd\n")
        );
        assert_eq!(split_tail(text, 0.0).unwrap(), (text, ""));
        assert!(split_tail("one paragraph\n", 0.5).is_err());
    }

    #[test]
    fn bad_settings_are_errors() {
        let bad = DataConfig {
            val_fraction: 1.0,
            ..DataConfig::default()
        };
        assert!(build(&bad, false)
            .unwrap_err()
            .to_string()
            .contains("outside [0, 1)"));
        let none = DataConfig {
            corpus: vec![],
            ..DataConfig::default()
        };
        assert!(build(&none, false).is_err());
    }
}
