//! Embeddings: a text's vector, pooled from the model's last hidden
//! states (after the final norm) and L2-normalized, as llama.cpp's
//! `--embedding` mode gives them. One [`Embedder`] owns a state of its
//! own (one sequence), so embedding never touches a generation slot.
//!
//! Pooling follows the file's `{arch}.pooling_type` (llama.cpp's enum:
//! 1 mean, 2 cls = first token, 3 last token) when it has one, else mean
//! over the tokens; a caller may override it.

use kernels::pool::ThreadPool;
use model::{Model, StateOptions, Token};

/// How token states become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    Mean,
    /// The first token's state (BERT's CLS).
    First,
    /// The last token's state (causal decoders' summary).
    Last,
}

impl Pooling {
    /// The pooling a file asks for (`{arch}.pooling_type`), if any it is
    /// one of ours.
    pub fn of_file(md: &gguf::Metadata) -> Option<Pooling> {
        let arch = md.get_str("general.architecture").ok()?;
        match md.get_u32(&format!("{arch}.pooling_type")).ok()? {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::First),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::First => "cls",
            Pooling::Last => "last",
        }
    }
}

impl std::str::FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> Result<Pooling, String> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "cls" | "first" => Ok(Pooling::First),
            "last" => Ok(Pooling::Last),
            _ => Err(format!("`{s}`: pooling is mean, cls or last")),
        }
    }
}

/// Why a text could not be embedded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbedError {
    #[error("the input is empty (no tokens)")]
    Empty,
    #[error("the input is {tokens} tokens; the embedding context holds {n_ctx}")]
    TooLong { tokens: usize, n_ctx: usize },
    #[error("{0}")]
    Model(String),
}

/// Embeds token sequences with its own one-sequence state of `n_ctx`
/// positions, made on first use.
pub struct Embedder<'m> {
    model: &'m Model<'m>,
    opts: StateOptions,
    state: Option<model::State<'m>>,
    pooling: Pooling,
    pool: ThreadPool,
}

impl<'m> Embedder<'m> {
    pub fn new(model: &'m Model<'m>, opts: StateOptions, pooling: Pooling, threads: usize) -> Self {
        Embedder {
            model,
            opts: StateOptions {
                n_seq: 1,
                draft_rows: 0,
                ..opts
            },
            state: None,
            pooling,
            pool: ThreadPool::new(threads.max(1)),
        }
    }

    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Width of the vectors.
    pub fn dim(&self) -> usize {
        self.model.config().dim
    }

    /// The L2-normalized pooled hidden state of `tokens` (read from
    /// position 0, in batches of the state's size).
    pub fn embed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EmbedError> {
        if tokens.is_empty() {
            return Err(EmbedError::Empty);
        }
        let n_ctx = self.opts.n_ctx;
        if tokens.len() > n_ctx {
            return Err(EmbedError::TooLong {
                tokens: tokens.len(),
                n_ctx,
            });
        }
        if self.state.is_none() {
            let mut s = self
                .model
                .new_state(&self.opts)
                .map_err(|e| EmbedError::Model(e.to_string()))?;
            s.set_embeddings(true)
                .map_err(|e| EmbedError::Model(e.to_string()))?;
            self.state = Some(s);
        }
        let state = self.state.as_mut().expect("made above");
        let dim = self.model.config().dim;
        let n_batch = state.n_batch();
        let mut sum = vec![0f64; dim];
        let mut pooled: Option<Vec<f32>> = None;
        for (c, chunk) in tokens.chunks(n_batch).enumerate() {
            let pos0 = c * n_batch;
            let want = |i: usize| match self.pooling {
                Pooling::Mean => true,
                Pooling::First => pos0 + i == 0,
                Pooling::Last => pos0 + i + 1 == tokens.len(),
            };
            let batch: Vec<Token> = chunk
                .iter()
                .enumerate()
                .map(|(i, &id)| Token {
                    id,
                    seq: 0,
                    pos: pos0 + i,
                    logits: want(i),
                })
                .collect();
            state.forward(&self.pool, &batch);
            let rows = state.embeddings();
            match self.pooling {
                Pooling::Mean => {
                    for row in rows.chunks_exact(dim) {
                        for (s, &v) in sum.iter_mut().zip(row) {
                            *s += v as f64;
                        }
                    }
                }
                Pooling::First | Pooling::Last => {
                    if !rows.is_empty() {
                        pooled = Some(rows[..dim].to_vec());
                    }
                }
            }
        }
        let mut v = match pooled {
            Some(v) => v,
            None => {
                let n = tokens.len() as f64;
                sum.iter().map(|s| (s / n) as f32).collect()
            }
        };
        let norm = v
            .iter()
            .map(|&x| (x as f64) * (x as f64))
            .sum::<f64>()
            .sqrt();
        if norm > 0.0 {
            for x in &mut v {
                *x = (*x as f64 / norm) as f32;
            }
        }
        Ok(v)
    }
}
