//! Memory files a scheduler opens by path for its jobs (a server's
//! per-conversation memories): each file open once however many jobs use
//! it, new files made with the model's layout measured once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use memory::{Geometry, MemoryFile, Mode};

use crate::memory::encoder::KeyEncoder;
use crate::memory::layout::{HeadShape, Layout};
use crate::memory::session::{MemoryConfig, MemorySession, BLOCK_TOKENS};
use crate::memory::{calibrate, MemoryError};

/// Most files kept open when no job uses them.
const KEEP_OPEN: usize = 64;

pub struct Memories {
    fingerprint: [u8; 32],
    shape: HeadShape,
    id_bytes: usize,
    config: MemoryConfig,
    /// The model's layout, measured on the first file made.
    layout: Option<Layout>,
    open: HashMap<PathBuf, (Arc<Mutex<MemorySession>>, u64)>,
    uses: u64,
}

impl Memories {
    /// Files for the model with `fingerprint` and heads of `shape`;
    /// token ids of `id_bytes` bytes.
    pub fn new(
        fingerprint: [u8; 32],
        shape: HeadShape,
        id_bytes: usize,
        config: MemoryConfig,
    ) -> Memories {
        Memories {
            fingerprint,
            shape,
            id_bytes,
            config,
            layout: None,
            open: HashMap::new(),
            uses: 0,
        }
    }

    /// The session of the file at `path` (opened for writing), made when it
    /// does not exist (its folder too), with `enc` measuring the layout the
    /// first time and `tokenize` giving the calibration text's tokens.
    pub fn session(
        &mut self,
        path: &Path,
        enc: &mut dyn KeyEncoder,
        tokenize: &dyn Fn(&str) -> Vec<u32>,
    ) -> Result<Arc<Mutex<MemorySession>>, MemoryError> {
        self.uses += 1;
        if let Some((s, used)) = self.open.get_mut(path) {
            *used = self.uses;
            return Ok(s.clone());
        }
        let session = if path.exists() {
            MemorySession::open(path, self.fingerprint, self.shape, Mode::Write, self.config)?
        } else {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    MemoryError::Model(format!("creating the folder {}: {e}", dir.display()))
                })?;
            }
            let layout = match &self.layout {
                Some(l) => l.clone(),
                None => {
                    let code_bytes = self.shape.code_dims() / 8;
                    let slots = calibrate::slots_in_budget(code_bytes, BLOCK_TOKENS, self.id_bytes);
                    let seed = u64::from_le_bytes(self.fingerprint[..8].try_into().expect("8"));
                    let l = calibrate::calibrate(enc, &tokenize(calibrate::TEXT), slots, seed)?;
                    self.layout = Some(l.clone());
                    l
                }
            };
            let geometry = Geometry {
                block_tokens: BLOCK_TOKENS as u32,
                slots: layout.n_slots() as u32,
                code_bytes: layout.code_bytes() as u32,
                extra_bytes: 0,
                id_bytes: self.id_bytes as u32,
            };
            let file = MemoryFile::create(path, self.fingerprint, geometry, &layout.to_params())?;
            drop(file);
            MemorySession::open(path, self.fingerprint, self.shape, Mode::Write, self.config)?
        };
        if self.open.len() >= KEEP_OPEN {
            // Close the least recently used file no job holds.
            let idle = self
                .open
                .iter()
                .filter(|(_, (s, _))| Arc::strong_count(s) == 1)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(p, _)| p.clone());
            if let Some(p) = idle {
                self.open.remove(&p);
            }
        }
        let s = Arc::new(Mutex::new(session));
        self.open.insert(path.to_path_buf(), (s.clone(), self.uses));
        Ok(s)
    }
}
