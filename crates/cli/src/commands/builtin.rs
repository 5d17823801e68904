//! The model built into the binary (`models/cachefit-shakespeare.gguf`,
//! made by the training pipeline, docs/MODEL-CARD.md), used when a command
//! gets no `-m`; and [`ModelSource`], which names either it or a file.

use anyhow::{Context, Result};
use gguf::{GgufFile, OpenOptions};
use std::path::PathBuf;

/// `general.name` of the built-in model.
pub const NAME: &str = "cachefit-shakespeare";

static BYTES: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../models/cachefit-shakespeare.gguf"
));

/// Where a model comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    File(PathBuf),
    BuiltIn,
}

impl ModelSource {
    pub fn from_arg(model: Option<&PathBuf>) -> ModelSource {
        match model {
            Some(p) => ModelSource::File(p.clone()),
            None => ModelSource::BuiltIn,
        }
    }

    /// How messages name it.
    pub fn shown(&self) -> String {
        match self {
            ModelSource::File(p) => p.display().to_string(),
            ModelSource::BuiltIn => format!("built-in {NAME}"),
        }
    }

    /// Open it: a file memory-mapped (or read, per `opts`), the built-in
    /// image copied to page-aligned memory (2 MB).
    pub fn open(&self, opts: OpenOptions) -> Result<GgufFile> {
        match self {
            ModelSource::File(p) => Ok(GgufFile::open_with(p, opts)?),
            ModelSource::BuiltIn => {
                let f = GgufFile::from_bytes(self.shown(), BYTES, opts.limits)
                    .context("the built-in model is damaged; rebuild cachefit")?;
                Ok(f)
            }
        }
    }

    /// Checked before long work: a file must exist.
    pub fn check_exists(&self) -> Result<()> {
        if let ModelSource::File(p) = self {
            if !p.is_file() {
                anyhow::bail!("model file {} not found", p.display());
            }
        }
        Ok(())
    }
}
