//! How a model's keys become search codes, and its queries search vectors:
//! the [`Layout`] a memory file is made with (its slots, centring means and
//! rotation), kept in the file's params blob so every later session encodes
//! the same way.
//!
//! A **slot** is one (layer, KV head) of the model whose attention finds
//! related text by content (chosen by [`super::calibrate`]). For each token
//! and slot the code is the signs of the slot's **pre-RoPE** key, centred
//! (the mean key over a calibration text subtracted, so the signs split
//! keys evenly: MagicPIG) and rotated by a fixed random orthogonal matrix
//! (spreading outlier channels over all bits: QJL). Pre-RoPE, because a key
//! rotated for its position would score differently at every distance,
//! and retrieval is about content. A query is the mean of the slot's group
//! of query heads, pre-RoPE, rotated the same way; a block's summary is the
//! mean of its rotated, centred keys. Codes have D = head size rounded up
//! to whole bytes; padding dimensions are zero.

use crate::memory::MemoryError;

/// One search slot: a layer and one of its KV heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Slot {
    pub layer: u16,
    pub kv_head: u16,
}

/// The geometry of the model's attention that codes depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl HeadShape {
    /// The shape of a model's heads.
    pub fn of(cfg: &model::ModelConfig) -> HeadShape {
        HeadShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
        }
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads.max(1)
    }

    /// Code dimensions: the head size rounded up to whole bytes.
    pub fn code_dims(&self) -> usize {
        self.head_dim.div_ceil(8) * 8
    }
}

/// Format version of the params blob.
const PARAMS_VERSION: u32 = 1;
const PARAMS_MAGIC: &[u8; 4] = b"CFLY";

/// What a memory file's codes mean.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub shape: HeadShape,
    /// Ordered by retrieval strength, strongest first (a search may scan a
    /// prefix of them first).
    pub slots: Vec<Slot>,
    /// `(slots, head_dim)` mean pre-RoPE key of each slot.
    pub means: Vec<f32>,
    /// `(slots, head_dim)` mean pre-RoPE query of each slot (over its
    /// group's heads). Subtracted from a query before search: what every
    /// query shares says nothing about what this one looks for, and left
    /// in, it ranks the same few blocks first for every question.
    pub query_means: Vec<f32>,
    pub rotation_seed: u64,
    /// `(code_dims, code_dims)` row-major orthogonal matrix, made from the
    /// seed (not stored).
    rotation: Vec<f32>,
}

impl Layout {
    pub fn new(
        shape: HeadShape,
        slots: Vec<Slot>,
        means: Vec<f32>,
        query_means: Vec<f32>,
        rotation_seed: u64,
    ) -> Layout {
        assert_eq!(means.len(), slots.len() * shape.head_dim);
        assert_eq!(query_means.len(), slots.len() * shape.head_dim);
        let rotation = orthogonal(shape.code_dims(), rotation_seed);
        Layout {
            shape,
            slots,
            means,
            query_means,
            rotation_seed,
            rotation,
        }
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    pub fn code_dims(&self) -> usize {
        self.shape.code_dims()
    }

    pub fn code_bytes(&self) -> usize {
        self.code_dims() / 8
    }

    /// The distinct layers of the slots, ascending (what a state captures).
    pub fn layers(&self) -> Vec<usize> {
        let mut l: Vec<usize> = self.slots.iter().map(|s| s.layer as usize).collect();
        l.sort_unstable();
        l.dedup();
        l
    }

    /// `rotated = R · pad(x)`, `x` of head_dim values, into `out` (code_dims).
    fn rotate(&self, x: &[f32], out: &mut [f32]) {
        let d = self.code_dims();
        for (r, o) in out.iter_mut().enumerate() {
            let row = &self.rotation[r * d..r * d + x.len()];
            *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
        }
    }

    /// The rotated, centred key of slot `s` from its pre-RoPE key head.
    pub fn key_vector(&self, s: usize, key_head: &[f32], out: &mut [f32]) {
        let hd = self.shape.head_dim;
        let mean = &self.means[s * hd..(s + 1) * hd];
        let centred: Vec<f32> = key_head.iter().zip(mean).map(|(k, m)| k - m).collect();
        self.rotate(&centred, out);
    }

    /// Codes and block summaries for `n` tokens from their captured
    /// pre-RoPE keys, `keys(layer_index)` giving `(n, kv_dim)` rows for the
    /// layer at that index of [`Layout::layers`]. Codes come out
    /// `[slot][token][code_bytes]`, summaries `[slot][D/2 + 2]`, the
    /// layouts the memory file stores.
    pub fn encode_block<'k>(
        &self,
        n: usize,
        keys: impl Fn(usize) -> &'k [f32],
        codes: &mut Vec<u8>,
        summaries: &mut Vec<u8>,
    ) {
        let (hd, d, cb) = (self.shape.head_dim, self.code_dims(), self.code_bytes());
        let kv_dim = self.shape.kv_dim();
        let layers = self.layers();
        codes.clear();
        codes.resize(self.n_slots() * n * cb, 0);
        summaries.clear();
        summaries.resize(self.n_slots() * (d / 2 + 2), 0);
        let mut v = vec![0.0f32; d];
        let mut mean = vec![0.0f32; d];
        for (s, slot) in self.slots.iter().enumerate() {
            let li = layers
                .binary_search(&(slot.layer as usize))
                .expect("a slot's layer is in layers()");
            let rows = keys(li);
            assert!(rows.len() >= n * kv_dim, "keys for {n} tokens");
            mean.fill(0.0);
            for t in 0..n {
                let head = &rows[t * kv_dim + slot.kv_head as usize * hd..][..hd];
                self.key_vector(s, head, &mut v);
                sign_bits(&v, &mut codes[(s * n + t) * cb..(s * n + t + 1) * cb]);
                for (m, x) in mean.iter_mut().zip(&v) {
                    *m += x / n as f32;
                }
            }
            memory::summary::quantize(
                &mean,
                &mut summaries[s * (d / 2 + 2)..(s + 1) * (d / 2 + 2)],
            );
        }
    }

    /// The search vectors `(slots, code_dims)` from captured pre-RoPE
    /// queries: for each slot, the mean over `rows` (token rows of the
    /// capture) and over the query heads sharing its KV head, less the
    /// slot's mean query, rotated.
    /// `queries(layer_index)` gives `(rows, q_dim)`.
    pub fn query_vectors<'q>(
        &self,
        rows: &[usize],
        queries: impl Fn(usize) -> &'q [f32],
        out: &mut Vec<f32>,
    ) {
        let (hd, d, group) = (self.shape.head_dim, self.code_dims(), self.shape.group());
        let q_dim = self.shape.q_dim();
        let layers = self.layers();
        out.clear();
        out.resize(self.n_slots() * d, 0.0);
        let mut acc = vec![0.0f32; hd];
        let scale = 1.0 / (rows.len().max(1) * group) as f32;
        for (s, slot) in self.slots.iter().enumerate() {
            let li = layers
                .binary_search(&(slot.layer as usize))
                .expect("a slot's layer is in layers()");
            let q = queries(li);
            acc.fill(0.0);
            for &r in rows {
                for g in 0..group {
                    let h = slot.kv_head as usize * group + g;
                    let head = &q[r * q_dim + h * hd..][..hd];
                    for (a, x) in acc.iter_mut().zip(head) {
                        *a += x * scale;
                    }
                }
            }
            for (a, m) in acc.iter_mut().zip(&self.query_means[s * hd..(s + 1) * hd]) {
                *a -= m;
            }
            self.rotate(&acc, &mut out[s * d..(s + 1) * d]);
        }
    }

    /// The params blob a memory file keeps.
    pub fn to_params(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(PARAMS_MAGIC);
        for v in [
            PARAMS_VERSION,
            self.shape.n_heads as u32,
            self.shape.n_kv_heads as u32,
            self.shape.head_dim as u32,
            self.slots.len() as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.rotation_seed.to_le_bytes());
        for s in &self.slots {
            b.extend_from_slice(&s.layer.to_le_bytes());
            b.extend_from_slice(&s.kv_head.to_le_bytes());
        }
        for m in self.means.iter().chain(&self.query_means) {
            b.extend_from_slice(&m.to_le_bytes());
        }
        b
    }

    /// A layout back from a params blob; `shape` is the model's, which the
    /// blob must match.
    pub fn from_params(b: &[u8], shape: HeadShape) -> Result<Layout, MemoryError> {
        let bad = |why: &str| MemoryError::Params(why.to_string());
        let mut r = Reader(b);
        if r.take(4)? != PARAMS_MAGIC {
            return Err(bad("not a cachefit layout"));
        }
        let version = r.u32()?;
        if version != PARAMS_VERSION {
            return Err(bad(&format!(
                "layout version {version}; this cachefit reads {PARAMS_VERSION}"
            )));
        }
        let stored = HeadShape {
            n_heads: r.u32()? as usize,
            n_kv_heads: r.u32()? as usize,
            head_dim: r.u32()? as usize,
        };
        if stored != shape {
            return Err(bad(&format!(
                "made for {} heads ({} KV) of {}, the model has {} ({}) of {}",
                stored.n_heads,
                stored.n_kv_heads,
                stored.head_dim,
                shape.n_heads,
                shape.n_kv_heads,
                shape.head_dim
            )));
        }
        let n = r.u32()? as usize;
        let seed = u64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes"));
        if n == 0 || n > 4096 {
            return Err(bad(&format!("{n} slots")));
        }
        let mut slots = Vec::with_capacity(n);
        for _ in 0..n {
            let layer = r.u16()?;
            let kv_head = r.u16()?;
            if kv_head as usize >= shape.n_kv_heads {
                return Err(bad(&format!("KV head {kv_head} of {}", shape.n_kv_heads)));
            }
            slots.push(Slot { layer, kv_head });
        }
        let mut means = Vec::with_capacity(2 * n * shape.head_dim);
        for _ in 0..2 * n * shape.head_dim {
            let m = f32::from_le_bytes(r.take(4)?.try_into().expect("4 bytes"));
            if !m.is_finite() {
                return Err(bad("a centring mean is not a number"));
            }
            means.push(m);
        }
        let query_means = means.split_off(n * shape.head_dim);
        if !r.0.is_empty() {
            return Err(bad("trailing bytes"));
        }
        Ok(Layout::new(shape, slots, means, query_means, seed))
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MemoryError> {
        if self.0.len() < n {
            return Err(MemoryError::Params("the layout is cut short".into()));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, MemoryError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u16(&mut self) -> Result<u16, MemoryError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
}

/// Bit i of `out` (little-endian within bytes) is set when `v[i] > 0`.
pub fn sign_bits(v: &[f32], out: &mut [u8]) {
    out.fill(0);
    for (i, &x) in v.iter().enumerate() {
        if x > 0.0 {
            out[i / 8] |= 1 << (i % 8);
        }
    }
}

/// A `d × d` orthogonal matrix (row-major) from `seed`: Gram–Schmidt over
/// seeded Gaussian rows, in f64 so every machine builds the same one.
pub fn orthogonal(d: usize, seed: u64) -> Vec<f32> {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        // splitmix64, then two uniforms to one Gaussian (Box–Muller).
        let mut u = || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let (a, b) = (u(), u());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    };
    let mut rows: Vec<Vec<f64>> = Vec::with_capacity(d);
    while rows.len() < d {
        let mut v: Vec<f64> = (0..d).map(|_| next()).collect();
        for r in &rows {
            let dot: f64 = v.iter().zip(r).map(|(a, b)| a * b).sum();
            for (x, y) in v.iter_mut().zip(r) {
                *x -= dot * y;
            }
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm > 1e-6 {
            v.iter_mut().for_each(|x| *x /= norm);
            rows.push(v);
        }
    }
    rows.into_iter().flatten().map(|x| x as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> HeadShape {
        HeadShape {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 18,
        }
    }

    fn layout() -> Layout {
        let slots = vec![
            Slot {
                layer: 3,
                kv_head: 1,
            },
            Slot {
                layer: 0,
                kv_head: 0,
            },
        ];
        let means = (0..36).map(|i| i as f32 * 0.01).collect();
        let query_means = (0..36).map(|i| i as f32 * -0.02).collect();
        Layout::new(shape(), slots, means, query_means, 7)
    }

    #[test]
    fn the_rotation_is_orthogonal_and_reproducible() {
        for d in [8, 24, 64] {
            let r = orthogonal(d, 42);
            assert_eq!(r, orthogonal(d, 42));
            assert_ne!(r, orthogonal(d, 43));
            for i in 0..d {
                for j in 0..d {
                    let dot: f32 = (0..d).map(|k| r[i * d + k] * r[j * d + k]).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((dot - want).abs() < 1e-5, "{d}: ({i},{j}) {dot}");
                }
            }
        }
    }

    #[test]
    fn params_round_trip_and_bad_blobs_are_errors() {
        let l = layout();
        let b = l.to_params();
        assert_eq!(Layout::from_params(&b, shape()).unwrap(), l);
        let other = HeadShape {
            head_dim: 16,
            ..shape()
        };
        assert!(Layout::from_params(&b, other).is_err());
        for cut in 0..b.len() {
            assert!(Layout::from_params(&b[..cut], shape()).is_err(), "{cut}");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(Layout::from_params(&extra, shape()).is_err());
        let mut nan = b.clone();
        let at = nan.len() - 4;
        nan[at..].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(Layout::from_params(&nan, shape()).is_err());
    }

    #[test]
    fn codes_are_the_signs_of_rotated_centred_keys() {
        let l = layout();
        let s = l.shape;
        let n = 5;
        // Keys for layers [0, 3] (layers() order), (n, kv_dim) each.
        let keys: Vec<Vec<f32>> = (0..2)
            .map(|li| {
                (0..n * s.kv_dim())
                    .map(|i| ((i * 7 + li * 3) % 11) as f32 - 5.0)
                    .collect()
            })
            .collect();
        let (mut codes, mut sums) = (Vec::new(), Vec::new());
        l.encode_block(n, |li| &keys[li], &mut codes, &mut sums);
        assert_eq!(codes.len(), 2 * n * 3);
        assert_eq!(sums.len(), 2 * (24 / 2 + 2));
        // Slot 0 is layer 3 (index 1 of layers()), KV head 1.
        let mut v = vec![0.0; 24];
        for t in 0..n {
            let head = &keys[1][t * s.kv_dim() + 18..][..18];
            l.key_vector(0, head, &mut v);
            for (i, x) in v.iter().enumerate() {
                let bit = codes[t * 3 + i / 8] >> (i % 8) & 1;
                assert_eq!(bit == 1, *x > 0.0, "token {t} dim {i}");
            }
        }
    }

    #[test]
    fn query_vectors_average_the_group_and_rows() {
        let l = layout();
        let s = l.shape;
        let q: Vec<Vec<f32>> = (0..2)
            .map(|li| {
                (0..3 * s.q_dim())
                    .map(|i| (i % 5) as f32 + li as f32)
                    .collect()
            })
            .collect();
        let mut out = Vec::new();
        l.query_vectors(&[0, 2], |li| &q[li], &mut out);
        assert_eq!(out.len(), 2 * 24);
        // Slot 1: layer 0, KV head 0 → query heads 0..3, rows 0 and 2.
        let mut acc = vec![0.0f32; 18];
        for r in [0, 2] {
            for h in 0..3 {
                for (a, x) in acc.iter_mut().zip(&q[0][r * s.q_dim() + h * 18..][..18]) {
                    *a += x / 6.0;
                }
            }
        }
        for (a, m) in acc.iter_mut().zip(&l.query_means[18..36]) {
            *a -= m;
        }
        let mut want = vec![0.0; 24];
        l.rotate(&acc, &mut want);
        for (a, b) in out[24..].iter().zip(&want) {
            assert!((a - b).abs() < 1e-4);
        }
    }
}
