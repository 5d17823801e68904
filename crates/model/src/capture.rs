//! Keeping the pre-RoPE keys and queries of chosen layers (long-memory
//! work compares them across a text). Each forward call overwrites them
//! with its own tokens', in the call's order; buffers are allocated when
//! the layers are chosen, so a call still allocates nothing.

use crate::Error;

pub(crate) struct Capture {
    n_layers: usize,
    n_batch: usize,
    q_dim: usize,
    kv_dim: usize,
    /// The layers asked for, in the order asked.
    layers: Vec<usize>,
    /// `(n_layers,)` each layer's index in `layers`.
    slot: Vec<Option<usize>>,
    keys: Vec<f32>,    // (layers, n_batch, kv_dim)
    queries: Vec<f32>, // (layers, n_batch, q_dim)
    /// `(layers,)` rows the last call filled: its token count, or 0 for a
    /// layer it did not reach.
    filled: Vec<usize>,
}

impl Capture {
    /// Nothing captured yet.
    pub fn new(n_layers: usize, n_batch: usize, q_dim: usize, kv_dim: usize) -> Capture {
        Capture {
            n_layers,
            n_batch,
            q_dim,
            kv_dim,
            layers: Vec::new(),
            slot: vec![None; n_layers],
            keys: Vec::new(),
            queries: Vec::new(),
            filled: Vec::new(),
        }
    }

    /// Capture `layers` from the next call on (none: stop capturing).
    pub fn set(&mut self, layers: &[usize]) -> Result<(), Error> {
        let mut slot = vec![None; self.n_layers];
        for (i, &l) in layers.iter().enumerate() {
            let problem = if l >= self.n_layers {
                format!("the model has {} layers", self.n_layers)
            } else if slot[l].is_some() {
                "asked for twice".to_string()
            } else {
                slot[l] = Some(i);
                continue;
            };
            return Err(Error::Layer { layer: l, problem });
        }
        let n = layers.len();
        self.slot = slot;
        self.layers = layers.to_vec();
        self.keys = vec![0.0; n * self.n_batch * self.kv_dim];
        self.queries = vec![0.0; n * self.n_batch * self.q_dim];
        self.filled = vec![0; n];
        Ok(())
    }

    pub fn layers(&self) -> &[usize] {
        &self.layers
    }

    /// Where `layer`'s rows go, if it is captured.
    pub fn slot(&self, layer: usize) -> Option<usize> {
        self.slot[layer]
    }

    /// A call of `n` tokens that evaluates layers `0..=last` begins.
    pub fn begin(&mut self, n: usize, last: usize) {
        for (f, &l) in self.filled.iter_mut().zip(&self.layers) {
            *f = if l <= last { n } else { 0 };
        }
    }

    /// Keep token `row`'s query `(q_dim,)` and key `(kv_dim,)` in `slot`.
    pub fn store(&mut self, slot: usize, row: usize, q: &[f32], k: &[f32]) {
        let at = slot * self.n_batch + row;
        self.queries[at * self.q_dim..][..self.q_dim].copy_from_slice(q);
        self.keys[at * self.kv_dim..][..self.kv_dim].copy_from_slice(k);
    }

    /// Copy `from`'s rows `0..` (same layers) into this capture's rows
    /// `rows[0], rows[1], …`: one thread's share of a call into the call's.
    pub fn scatter(&mut self, from: &Capture, rows: &[usize]) {
        let (qd, kd, nb) = (self.q_dim, self.kv_dim, self.n_batch);
        for s in 0..self.layers.len() {
            for (k, &r) in rows.iter().enumerate() {
                let (src, dst) = ((s * nb + k) * qd, (s * nb + r) * qd);
                self.queries[dst..dst + qd].copy_from_slice(&from.queries[src..src + qd]);
                let (src, dst) = ((s * nb + k) * kd, (s * nb + r) * kd);
                self.keys[dst..dst + kd].copy_from_slice(&from.keys[src..src + kd]);
            }
        }
    }

    /// Keys of the `i`-th captured layer, `(n, kv_dim)` for the last
    /// call's `n` tokens (empty if the call stopped before that layer).
    pub fn keys(&self, i: usize) -> &[f32] {
        let at = i * self.n_batch * self.kv_dim;
        &self.keys[at..at + self.filled[i] * self.kv_dim]
    }

    /// Queries of the `i`-th captured layer, `(n, q_dim)`.
    pub fn queries(&self, i: usize) -> &[f32] {
        let at = i * self.n_batch * self.q_dim;
        &self.queries[at..at + self.filled[i] * self.q_dim]
    }
}
