//! A memory file opened for a model: appending history ([`MemorySession::append`])
//! and the context a prompt sees ([`MemorySession::view`]).
//!
//! A prompt's context, at positions 0.. of one KV cache:
//!
//! ```text
//! [ sinks | hot | recalled | prompt ... generation ]
//!   first   last   blocks found
//!   tokens  tokens by the prompt's queries
//! ```
//!
//! - **sinks**: the history's first tokens (attention sinks: a model keeps
//!   some attention on its first positions and misbehaves without them).
//! - **hot**: the history's last tokens, as an ordinary context would hold.
//! - **recalled**: whole blocks from anywhere else in the history, found by
//!   searching with the prompt's queries (a probe: the prompt read by the
//!   encoder after the hot window, its last tokens' pre-RoPE queries),
//!   their K/V recomputed by reading their tokens again (the file keeps
//!   ids, not K/V: 320 bytes per token hold no usable K/V for SmolLM2, and
//!   reading 512 tokens costs ~0.5 s there). Placed right before the
//!   prompt, the best block last: a small model finds a fact best when it
//!   is near the question (docs/MEMORY.md).
//!
//! Positions are consecutive from 0 and the whole span stays inside the
//! context the caller gives, which is at most the model's trained one, so
//! nothing extrapolates.

use std::path::{Path, PathBuf};

use memory::{BlockIn, Geometry, MemoryFile, Mode, SearchParams, FLAG_DOC_START};

use crate::memory::calibrate;
use crate::memory::encoder::{KeyEncoder, OVERLAP};
use crate::memory::layout::Layout;
use crate::memory::{short_hex, MemoryError};

/// Tokens per block of the file.
pub const BLOCK_TOKENS: usize = 64;
/// History tokens the probe reads before the prompt: the content tokens'
/// queries depend on little more than their sentence (measured: 32 to
/// 512 tokens rank needles alike; none ranks one needle in ten lower),
/// and every token read costs time before the first token of an answer.
const PROBE_CONTEXT: usize = 64;

/// Blocks whose every token's code is scored, after the summaries' pass.
/// A block's summary is the mean of its keys, which dilutes one matching
/// token among 64: on 10 needles in 128K tokens (2,000 blocks), 128
/// candidates lost one needle's block, 512 none (8 rows' search 13 → 30
/// ms).
const FINE_CANDIDATES: usize = 512;

/// Histories of at most this many blocks (1M tokens) are searched token
/// by token, every block: a block's summary is the mean of 64 keys, which
/// buries one rare word's key (at 1M tokens, 10 needles: the question's
/// rare words lost their needle's block in the summary tiers for 4 of
/// them, while the sign codes of every token ranked it first for 9).
/// Measured at 1M tokens: 10 of 10 needles recalled (6 with the tiers),
/// ~140 ms per retrieval of 8 queries warm (the tiers: ~25 ms).
pub const EXHAUSTIVE_BLOCKS: usize = 16_384;

/// The store's search settings a recall uses: `k` blocks per query, in a
/// history of `blocks` blocks.
pub fn search_params(k: usize, blocks: usize) -> SearchParams {
    let fine_candidates = if blocks <= EXHAUSTIVE_BLOCKS {
        blocks.max(FINE_CANDIDATES)
    } else {
        FINE_CANDIDATES
    };
    SearchParams {
        k,
        fine_candidates,
        ..SearchParams::default()
    }
}

/// Tokens recalled on each side of a found block.
const MARGIN: usize = 32;

/// Blocks appended between commits while ingesting.
pub const COMMIT_EVERY: usize = 64;

/// How much of the history a prompt sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// The history's last tokens kept in context (the hot window).
    pub hot_tokens: usize,
    /// The history's first tokens kept in context (attention sinks).
    pub sink_tokens: usize,
    /// Blocks recalled per prompt.
    pub recall_blocks: usize,
    /// The prompt's last content tokens that each search.
    pub query_tokens: usize,
    /// Slots that search (the strongest, first in the layout).
    pub search_slots: usize,
    /// Recall random blocks (seeded) instead of searching: the baseline a
    /// search must beat in an evaluation, never a setting for use.
    pub random_recall: Option<u64>,
}

impl Default for MemoryConfig {
    fn default() -> MemoryConfig {
        MemoryConfig {
            hot_tokens: 2048,
            sink_tokens: 64,
            recall_blocks: 4,
            query_tokens: 8,
            search_slots: 8,
            random_recall: None,
        }
    }
}

/// The context a prompt sees before itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// `[sinks | hot | recalled]`, to put before the prompt.
    pub tokens: Vec<u32>,
    pub sinks: usize,
    pub hot: usize,
    /// The recalled blocks in the order placed, and their tokens.
    pub recalled: Vec<u64>,
    pub recalled_tokens: usize,
    /// Time spent finding them (probe and search).
    pub recall_time: std::time::Duration,
}

/// What a search found, for measuring it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recall {
    /// Candidate blocks, best first (those in sinks and hot left out).
    pub blocks: Vec<u64>,
    /// Seconds spent probing (encoder) and searching.
    pub probe_seconds: f64,
    pub search_seconds: f64,
}

pub struct MemorySession {
    path: PathBuf,
    file: MemoryFile,
    layout: Layout,
    config: MemoryConfig,
    /// The history's first tokens (up to `sink_tokens`).
    sinks: Vec<u32>,
    /// The history's last tokens: at least what the hot window and the
    /// encoder's overlap need, when the history has them.
    tail: Vec<u32>,
    /// Blocks appended since the last commit.
    uncommitted: usize,
}

impl MemorySession {
    /// Open `path`, or make it (measuring the model's layout with `enc`;
    /// `tokenize` turns the calibration text into tokens) when it does
    /// not exist. `fingerprint` binds it to the model.
    pub fn open_or_create(
        path: &Path,
        fingerprint: [u8; 32],
        enc: &mut dyn KeyEncoder,
        tokenize: impl Fn(&str) -> Vec<u32>,
        id_bytes: usize,
        mode: Mode,
        config: MemoryConfig,
    ) -> Result<MemorySession, MemoryError> {
        if path.exists() {
            return MemorySession::open(path, fingerprint, enc.shape(), mode, config);
        }
        if mode == Mode::Read {
            return Err(MemoryError::Model(format!(
                "memory file {} does not exist",
                path.display()
            )));
        }
        let shape = enc.shape();
        let code_bytes = shape.code_dims() / 8;
        let max_slots = calibrate::slots_in_budget(code_bytes, BLOCK_TOKENS, id_bytes);
        let layout = calibrate::calibrate(
            enc,
            &tokenize(calibrate::TEXT),
            max_slots,
            u64::from_le_bytes(fingerprint[..8].try_into().expect("8 bytes")),
        )?;
        let geometry = Geometry {
            block_tokens: BLOCK_TOKENS as u32,
            slots: layout.n_slots() as u32,
            code_bytes: code_bytes as u32,
            extra_bytes: 0,
            id_bytes: id_bytes as u32,
        };
        let file = MemoryFile::create(path, fingerprint, geometry, &layout.to_params())?;
        Ok(MemorySession {
            path: path.to_path_buf(),
            file,
            layout,
            config,
            sinks: Vec::new(),
            tail: Vec::new(),
            uncommitted: 0,
        })
    }

    /// Open an existing file made for the model with `fingerprint` and
    /// heads of `shape`.
    pub fn open(
        path: &Path,
        fingerprint: [u8; 32],
        shape: crate::memory::HeadShape,
        mode: Mode,
        config: MemoryConfig,
    ) -> Result<MemorySession, MemoryError> {
        // Read first: a file of another model is never locked or trimmed,
        // and the error can name both fingerprints.
        let theirs = MemoryFile::open(path, None, Mode::Read)?
            .header()
            .fingerprint;
        if theirs != fingerprint {
            return Err(MemoryError::OtherModel {
                path: path.display().to_string(),
                file: short_hex(&theirs),
                model: short_hex(&fingerprint),
            });
        }
        let file = MemoryFile::open(path, Some(&fingerprint), mode)?;
        let layout = Layout::from_params(&file.header().params, shape)?;
        let g = *file.geometry();
        if g.slots as usize != layout.n_slots() || g.code_bytes as usize != layout.code_bytes() {
            return Err(MemoryError::Params(format!(
                "the file keeps {} slots of {} bytes, its layout says {} of {}",
                g.slots,
                g.code_bytes,
                layout.n_slots(),
                layout.code_bytes()
            )));
        }
        let mut s = MemorySession {
            path: path.to_path_buf(),
            file,
            layout,
            config,
            sinks: Vec::new(),
            tail: Vec::new(),
            uncommitted: 0,
        };
        s.sinks = s.read_tokens(0, s.config.sink_tokens)?;
        let total = s.tokens();
        let keep = s.tail_keep() as u64;
        s.tail = s.read_tokens(total.saturating_sub(keep), keep as usize)?;
        Ok(s)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn file(&self) -> &MemoryFile {
        &self.file
    }

    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    /// Tokens of history.
    pub fn tokens(&self) -> u64 {
        self.file.len_tokens()
    }

    fn tail_keep(&self) -> usize {
        self.config.hot_tokens.max(OVERLAP) + BLOCK_TOKENS
    }

    /// Up to `n` tokens of history from `from`, read from the file.
    fn read_tokens(&self, from: u64, n: usize) -> Result<Vec<u32>, MemoryError> {
        let index = self.file.index();
        let mut out = Vec::with_capacity(n);
        let Some(mut b) = index.block_of_token(from) else {
            return Ok(out);
        };
        while out.len() < n && (b as u64) < self.file.len_blocks() {
            let block = self.file.read_block(b as u64)?;
            let ids = block.ids();
            let skip = from.saturating_sub(block.first_token) as usize;
            let take = (n - out.len()).min(ids.len().saturating_sub(skip));
            out.extend_from_slice(&ids[skip..skip + take]);
            b += 1;
        }
        Ok(out)
    }

    /// Append `tokens` to the history (a document, or a chat turn), its
    /// codes from `enc`. Blocks never span two calls, so a turn's text is
    /// found as a unit; the first block of a document is marked. Committed
    /// every [`COMMIT_EVERY`] blocks; call [`MemorySession::commit`] at the
    /// end of a document or turn.
    pub fn append(
        &mut self,
        enc: &mut dyn KeyEncoder,
        tokens: &[u32],
        doc_start: bool,
    ) -> Result<(), MemoryError> {
        let layers = self.layout.layers();
        let (mut codes, mut summaries) = (Vec::new(), Vec::new());
        // Encode in runs of whole blocks so the key rows stay small.
        for (r, run) in tokens.chunks(BLOCK_TOKENS * 16).enumerate() {
            let e = enc.encode(&layers, &self.tail, run, false)?;
            let kv_dim = self.layout.shape.kv_dim();
            for (b, ids) in run.chunks(BLOCK_TOKENS).enumerate() {
                let at = b * BLOCK_TOKENS * kv_dim;
                self.layout.encode_block(
                    ids.len(),
                    |li| &e.keys[li][at..],
                    &mut codes,
                    &mut summaries,
                );
                let flags = if doc_start && r == 0 && b == 0 {
                    FLAG_DOC_START
                } else {
                    0
                };
                self.file.append(&BlockIn {
                    ids,
                    codes: &codes,
                    extra: &[],
                    summaries: &summaries,
                    flags,
                })?;
                self.uncommitted += 1;
                if self.sinks.len() < self.config.sink_tokens {
                    let more = (self.config.sink_tokens - self.sinks.len()).min(ids.len());
                    self.sinks.extend_from_slice(&ids[..more]);
                }
                if self.uncommitted >= COMMIT_EVERY {
                    self.commit()?;
                }
            }
            self.tail.extend_from_slice(run);
            let keep = self.tail_keep();
            if self.tail.len() > 2 * keep {
                self.tail.drain(..self.tail.len() - keep);
            }
        }
        Ok(())
    }

    /// Make everything appended durable.
    pub fn commit(&mut self) -> Result<(), MemoryError> {
        if self.uncommitted > 0 {
            self.file.commit()?;
            self.uncommitted = 0;
        }
        Ok(())
    }

    /// The probe's captured queries of `prompt`, read after the end of the
    /// hot window: per layer of the layout, `(prompt, q_dim)`.
    pub fn probe(
        &self,
        enc: &mut dyn KeyEncoder,
        prompt: &[u32],
        hot: usize,
    ) -> Result<crate::memory::Encoded, MemoryError> {
        let layers = self.layout.layers();
        let take = PROBE_CONTEXT.min(hot).min(self.tail.len());
        let context = &self.tail[self.tail.len() - take..];
        enc.encode(&layers, context, prompt, true)
    }

    /// Blocks for the query vectors `queries` (see
    /// [`Layout::query_vectors`]), best first.
    pub fn search(&self, queries: &[f32], k: usize) -> Result<Vec<memory::Hit>, MemoryError> {
        Ok(self
            .file
            .search(queries, &search_params(k, self.file.len_blocks() as usize))?
            .hits)
    }

    /// Search the history beyond sinks and hot for what `prompt` asks
    /// about. Every one of the prompt's last `query_tokens` content tokens
    /// (`is_content`: not a control token) searches on its own: a copy
    /// head's query at " jade" looks for earlier " jade"s, which a query
    /// at the prompt's end, or a mean of them, does not (measured on
    /// needle questions: the end's query ranked the needle's block nowhere
    /// in the top 32, single content tokens ranked it 0–2). Their rankings
    /// are fused by reciprocal rank, each weighted by how far its best
    /// block stands out from its top 32 (a rare word's search has a clear
    /// winner; "the"'s has none; the gap is squared). `hot` is the hot
    /// window's length.
    pub fn recall(
        &self,
        enc: &mut dyn KeyEncoder,
        prompt: &[u32],
        is_content: &dyn Fn(u32) -> bool,
        hot: usize,
        k: usize,
    ) -> Result<Recall, MemoryError> {
        /// Each row's ranking: this many blocks, fused with this offset.
        const PER_ROW: usize = 32;
        const RRF_K: f32 = 2.0;
        let total = self.tokens();
        let t0 = std::time::Instant::now();
        let e = self.probe(enc, prompt, hot)?;
        let rows: Vec<usize> = (0..e.n)
            .rev()
            .filter(|&r| is_content(prompt[r]))
            .take(self.config.query_tokens)
            .collect();
        let probe_seconds = t0.elapsed().as_secs_f64();
        let t1 = std::time::Instant::now();
        let hot_from = total.saturating_sub(hot as u64);
        let sink_end = self.sinks.len() as u64;
        let index = self.file.index();
        let outside = |b: u64| {
            let m = index.meta(b as usize);
            m.first_token >= sink_end && m.first_token + m.n_tokens as u64 <= hot_from
        };
        // One query per row, all searched in one pass over the index (a
        // search per row read the index once each: 8 passes a retrieval).
        let mut queries: Vec<Vec<f32>> = Vec::with_capacity(rows.len());
        for &row in &rows {
            let mut q = Vec::new();
            self.layout
                .query_vectors(&[row], |li| &e.queries[li], &mut q);
            // Only the strongest slots search (the layout's first).
            let d = self.layout.code_dims();
            q[self.config.search_slots.min(self.layout.n_slots()) * d..].fill(0.0);
            queries.push(q);
        }
        let refs: Vec<&[f32]> = queries.iter().map(|q| q.as_slice()).collect();
        let results = self.file.search_many(
            &refs,
            &search_params(PER_ROW, self.file.len_blocks() as usize),
        )?;
        let mut fused: Vec<(u64, f32)> = Vec::new();
        for hits in results.iter().map(|r| &r.hits) {
            let Some(best) = hits.first() else { continue };
            let mean = hits.iter().map(|h| h.score).sum::<f32>() / hits.len() as f32;
            // Squared: on 10 needles in 128K tokens, the plain gap ranked
            // two needles 3rd (behind other needles' blocks that every
            // "secret code" row puts first), the squared gap one 2nd;
            // gaps to the 2nd–8th best did no better.
            let weight = (best.score - mean).max(0.0).powi(2);
            for (rank, h) in hits.iter().filter(|h| outside(h.block)).enumerate() {
                let add = weight / (RRF_K + rank as f32);
                match fused.iter_mut().find(|(b, _)| *b == h.block) {
                    Some((_, s)) => *s += add,
                    None => fused.push((h.block, add)),
                }
            }
        }
        fused.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(Recall {
            blocks: fused.iter().take(k).map(|(b, _)| *b).collect(),
            probe_seconds,
            search_seconds: t1.elapsed().as_secs_f64(),
        })
    }

    /// `k` distinct blocks drawn at random (seeded by `seed` and the
    /// history's length) from outside sinks and hot.
    fn random_blocks(&self, seed: u64, hot: usize, k: usize) -> Vec<u64> {
        let index = self.file.index();
        let (sink_end, hot_from) = (self.sinks.len() as u64, self.tokens() - hot as u64);
        let pool: Vec<u64> = (0..self.file.len_blocks())
            .filter(|&b| {
                let m = index.meta(b as usize);
                m.first_token >= sink_end && m.first_token + m.n_tokens as u64 <= hot_from
            })
            .collect();
        let mut state = seed ^ self.tokens().wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut out = Vec::new();
        while out.len() < k.min(pool.len()) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let b = pool[(state % pool.len() as u64) as usize];
            if !out.contains(&b) {
                out.push(b);
            }
        }
        out
    }

    /// The context `prompt` sees, in at most `room` tokens (what the KV
    /// cache leaves after the prompt and the room kept to generate).
    pub fn view(
        &self,
        enc: &mut dyn KeyEncoder,
        prompt: &[u32],
        is_content: &dyn Fn(u32) -> bool,
        room: usize,
    ) -> Result<View, MemoryError> {
        let total = self.tokens() as usize;
        if total <= room {
            // All of it fits: no search.
            let tokens = self.read_tokens(0, total)?;
            return Ok(View {
                sinks: 0,
                hot: tokens.len(),
                tokens,
                ..View::default()
            });
        }
        let c = &self.config;
        let sinks = self.sinks.len().min(room / 8);
        let recall_room = (c.recall_blocks * BLOCK_TOKENS).min(room / 4);
        let hot = c
            .hot_tokens
            .min(room - sinks - recall_room)
            .min(self.tail.len());
        let k = recall_room / BLOCK_TOKENS;
        let t0 = std::time::Instant::now();
        let found = match (k, self.config.random_recall) {
            (0, _) => Vec::new(),
            (_, Some(seed)) => self.random_blocks(seed, hot, k),
            _ => self.recall(enc, prompt, is_content, hot, k)?.blocks,
        };
        let recall_time = t0.elapsed();
        let mut tokens = Vec::with_capacity(sinks + hot + recall_room);
        tokens.extend_from_slice(&self.sinks[..sinks]);
        tokens.extend_from_slice(&self.tail[self.tail.len() - hot..]);
        let mut recalled = Vec::new();
        let mut recalled_tokens = 0;
        // Each found block with MARGIN tokens either side: a fact cut by a
        // block boundary comes back whole (measured: a needle's sentence
        // split over blocks 352–353, only 353 found, answered wrong). Best
        // last: the weakest first, so the best sits by the prompt.
        let hot_from = (total - hot) as u64;
        let sink_end = self.sinks.len() as u64;
        let index = self.file.index();
        let mut spans: Vec<(u64, u64, u64)> = Vec::new(); // (block, from, to) in history
        for &b in &found {
            let m = index.meta(b as usize);
            let from = m.first_token.saturating_sub(MARGIN as u64).max(sink_end);
            let to = (m.first_token + m.n_tokens as u64 + MARGIN as u64).min(hot_from);
            // Merge with a span it overlaps or touches.
            if let Some(s) = spans.iter_mut().find(|s| from <= s.2 && to >= s.1) {
                let (nf, nt) = (s.1.min(from), s.2.max(to));
                let grow = (nt - nf) - (s.2 - s.1);
                if recalled_tokens + grow as usize > recall_room {
                    continue;
                }
                recalled_tokens += grow as usize;
                (s.1, s.2) = (nf, nt);
                continue;
            }
            if recalled_tokens + (to - from) as usize > recall_room {
                continue;
            }
            recalled_tokens += (to - from) as usize;
            spans.push((b, from, to));
        }
        for &(b, from, to) in spans.iter().rev() {
            recalled.push(b);
            tokens.extend(self.read_tokens(from, (to - from) as usize)?);
        }
        Ok(View {
            tokens,
            sinks,
            hot,
            recalled,
            recalled_tokens,
            recall_time,
        })
    }
}

impl std::fmt::Debug for MemorySession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemorySession")
            .field("path", &self.path)
            .field("tokens", &self.tokens())
            .finish_non_exhaustive()
    }
}
