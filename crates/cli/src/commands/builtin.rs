//! The model built into the binary (`models/cachefit-ternary.gguf`,
//! made by the training pipeline, docs/MODEL-CARD.md), used when a command
//! gets no `-m`; and [`ModelSource`], which names either it or a file.

use anyhow::{Context, Result};
use gguf::{GgufFile, OpenOptions};
use std::path::PathBuf;

/// `general.name` of the built-in model.
pub const NAME: &str = "cachefit-ternary";

static BYTES: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../models/cachefit-ternary.gguf"
));

/// Where a model comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    File(PathBuf),
    BuiltIn,
}

impl ModelSource {
    /// `-m`: a file as given, else a cached model of that name
    /// (`owner/repo[:QUANT]`, `repo`, a file stem; see `cachefit models`),
    /// else the built-in model when there is no `-m`.
    pub fn from_arg(model: Option<&PathBuf>) -> Result<ModelSource> {
        let Some(p) = model else {
            return Ok(ModelSource::BuiltIn);
        };
        if p.exists() {
            return Ok(ModelSource::File(p.clone()));
        }
        let dir = hub::models_dir();
        let scan = hub::scan(&dir)?;
        let name = p.to_string_lossy();
        match scan.find(&name)? {
            Some(m) if m.missing_parts > 0 => anyhow::bail!(
                "{}: {} of its split parts are missing from {}",
                m.name,
                m.missing_parts,
                m.path.parent().unwrap_or(&dir).display()
            ),
            Some(m) => Ok(ModelSource::File(m.path.clone())),
            None => anyhow::bail!(
                "model file {name} not found: not a file and not a cached model in {} \
                 (`cachefit models` lists them); try `cachefit pull OWNER/REPO[:QUANT]`",
                dir.display()
            ),
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
