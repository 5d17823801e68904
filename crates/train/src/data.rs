//! The `data` stage: corpus files in, the texts the later stages read out.
//!
//! Each corpus file is cleaned ([`clean`](crate::clean)) and split on its
//! own: its last `val_fraction`, from the next paragraph boundary on, is
//! held out for validation, so every source has a part in the validation
//! text. The training parts are joined, in order and with a blank line
//! between files, into `corpus.train.txt`, the held-out parts likewise into
//! `corpus.val.txt`; `data.json` records where each file's part lies in
//! the latter (`val_start`, `val_bytes`), so `pack` can score each source
//! on its own. Task passages
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
    /// The file's stem, naming its validation token file (`val.STEM.bin`).
    pub stem: String,
    /// Where the file's held-out part lies in `corpus.val.txt`: byte
    /// offset and length (0 if the file held nothing once cleaned).
    pub val_start: usize,
    pub val_bytes: usize,
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
            "stem": self.stem,
            "val_start": self.val_start,
            "val_bytes": self.val_bytes,
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
    let stems = stems(&config.corpus)?;
    let bar = crate::progress_bar(progress, config.corpus.len() as u64, "cleaning corpus");
    let (mut train_parts, mut val_parts) = (Vec::new(), Vec::new());
    let mut sources = Vec::new();
    let mut forbidden = HashSet::new();
    for (path, stem) in config.corpus.iter().zip(stems) {
        let raw = files::read_text(path)?;
        let cleaned = crate::clean::clean(&raw);
        // Names must not be corpus words: a held-out name in Shakespeare
        // would be a held-out name seen in training.
        forbidden.extend(crate::names::words(&cleaned.text));
        let (train, val) =
            split_tail(&cleaned.text, config.val_fraction).map_err(|e| Error::Invalid {
                path: path.clone(),
                problem: e.to_string(),
            })?;
        // Parts are joined with one `\n`: each ends in one already.
        let val_start = val_parts.iter().map(|p: &String| p.len() + 1).sum();
        if !train.is_empty() {
            train_parts.push(train.to_string());
        }
        if !val.is_empty() {
            val_parts.push(val.to_string());
        }
        sources.push(Source {
            path: path.clone(),
            bytes: raw.len(),
            sha256: files::sha256_hex(raw.as_bytes()),
            cleaned_bytes: cleaned.text.len(),
            gutenberg: cleaned.gutenberg.clone(),
            stem,
            val_start: if val.is_empty() { 0 } else { val_start },
            val_bytes: val.len(),
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    if train_parts.is_empty() && val_parts.is_empty() {
        return Err(Error::Config(
            "the corpus files hold no text once cleaned".into(),
        ));
    }
    let (train, val) = (train_parts.join("\n"), val_parts.join("\n"));

    forbidden.extend(template_words());
    let want = (train.len() as f64 * config.task_ratio).round() as usize;
    let tasks_train = TaskGen::new(config.seed, Side::Train, &forbidden).passages_until(want);
    let tasks_eval =
        TaskGen::new(config.seed, Side::HeldOut, &forbidden).passages(config.eval_passages);
    Ok(DataSet {
        corpus_train: train,
        corpus_val: val,
        tasks_train,
        tasks_eval,
        sources,
    })
}

/// Each corpus file's stem (`data/english.txt` → `english`), with
/// characters other than ASCII letters, digits, `-` and `_` as `_`: it
/// names a file. Two files with one stem are an error, their validation
/// files would collide.
fn stems(corpus: &[PathBuf]) -> Result<Vec<String>> {
    let mut seen: Vec<(String, &PathBuf)> = Vec::new();
    for path in corpus {
        let stem: String = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if stem.is_empty() {
            return Err(Error::Config(format!(
                "corpus path {} has no file name",
                path.display()
            )));
        }
        if let Some((_, other)) = seen.iter().find(|(s, _)| *s == stem) {
            return Err(Error::Config(format!(
                "corpus files {} and {} both have the name `{stem}`, which names their \
                 validation token file (val.{stem}.bin): rename or copy one",
                other.display(),
                path.display()
            )));
        }
        seen.push((stem, path));
    }
    Ok(seen.into_iter().map(|(s, _)| s).collect())
}

/// Cut `text` (paragraphs separated by one blank line, ending in `\n`)
/// before its last `fraction`, at the paragraph boundary nearest that
/// point after it (else before it).
fn split_tail(text: &str, fraction: f64) -> Result<(&str, &str)> {
    if fraction == 0.0 || text.is_empty() {
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
                "a single paragraph: no place to split off validation text \
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

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn paragraphs(prefix: &str, n: usize) -> String {
        (0..n)
            .map(|i| format!("{prefix} paragraph {i}.\n\n"))
            .collect::<String>()
    }

    #[test]
    fn each_file_keeps_its_own_tail_for_validation() {
        let tmp = tempfile::tempdir().unwrap();
        let a = write(tmp.path(), "alpha.txt", &paragraphs("Alpha", 20));
        let b = write(tmp.path(), "beta.v2.txt", &paragraphs("Beta", 40));
        let config = DataConfig {
            corpus: vec![a.clone(), b.clone()],
            val_fraction: 0.2,
            eval_passages: 3,
            ..DataConfig::default()
        };
        let set = build(&config, false).unwrap();
        let stems: Vec<&str> = set.sources.iter().map(|s| s.stem.as_str()).collect();
        assert_eq!(stems, ["alpha", "beta_v2"]);
        // Each source's range in the validation text is that file's tail.
        let val = |s: &Source| &set.corpus_val[s.val_start..s.val_start + s.val_bytes];
        // (20% of Alpha's 400 bytes is 80: from the next paragraph on.)
        assert_eq!(
            val(&set.sources[0]),
            "Alpha paragraph 17.\n\nAlpha paragraph 18.\n\nAlpha paragraph 19.\n"
        );
        for (source, text) in set
            .sources
            .iter()
            .zip([paragraphs("Alpha", 20), paragraphs("Beta", 40)])
        {
            let cleaned = crate::clean::clean(&text).text;
            let (train, tail) = split_tail(&cleaned, 0.2).unwrap();
            assert_eq!(val(source), tail);
            assert!(set.corpus_train.contains(train));
        }
        assert_eq!(
            set.corpus_val,
            format!("{}\n{}", val(&set.sources[0]), val(&set.sources[1]))
        );
        // Training keeps the rest of both, in order.
        assert!(set.corpus_train.starts_with("Alpha paragraph 0.\n"));
        assert!(set
            .corpus_train
            .contains("Alpha paragraph 16.\n\nBeta paragraph 0.\n"));
        assert!(!set.corpus_train.contains("Alpha paragraph 17."));
        assert!(!set.corpus_train.contains("Beta paragraph 39."));

        // One file alone splits as before: its tail is the whole
        // validation text.
        let one = build(
            &DataConfig {
                corpus: vec![b],
                ..config.clone()
            },
            false,
        )
        .unwrap();
        assert_eq!(
            (one.sources[0].val_start, one.sources[0].val_bytes),
            (0, one.corpus_val.len())
        );
        assert_eq!(one.corpus_val, val(&set.sources[1]));

        // No validation: empty ranges.
        let none = build(
            &DataConfig {
                val_fraction: 0.0,
                ..config
            },
            false,
        )
        .unwrap();
        assert!(none.corpus_val.is_empty());
        assert!(none.sources.iter().all(|s| s.val_bytes == 0));
    }

    #[test]
    fn clashing_names_and_single_paragraph_files_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("x")).unwrap();
        let a = write(tmp.path(), "book.txt", &paragraphs("A", 10));
        let b = write(&tmp.path().join("x"), "book.md", &paragraphs("B", 10));
        let config = DataConfig {
            corpus: vec![a.clone(), b],
            eval_passages: 1,
            ..DataConfig::default()
        };
        let err = build(&config, false).unwrap_err().to_string();
        assert!(err.contains("both have the name `book`"), "{err}");

        let single = write(tmp.path(), "single.txt", "one paragraph only\n");
        let err = build(
            &DataConfig {
                corpus: vec![a, single],
                ..config
            },
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("single.txt: a single paragraph"), "{err}");
    }
}
