//! Deterministic pseudo-random data for tests, the crash test's writer and
//! the scale benchmark: no dependency, same stream on every machine.

/// SplitMix64: one multiply-xorshift per number, good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Approximately standard normal: the sum of four uniform 16-bit
    /// numbers, centred and scaled (Irwin–Hall), one draw per call.
    pub fn gauss(&mut self) -> f32 {
        let x = self.next();
        let s = (x & 0xffff) + (x >> 16 & 0xffff) + (x >> 32 & 0xffff) + (x >> 48);
        // Mean 2·65535, variance 4·65536²/12.
        (s as f32 - 131070.0) / 37837.2
    }

    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let x = self.next().to_le_bytes();
        rest.copy_from_slice(&x[..rest.len()]);
    }
}

/// A block with owned buffers, for tests and generators.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnedBlock {
    pub ids: Vec<u32>,
    pub codes: Vec<u8>,
    pub extra: Vec<u8>,
    pub summaries: Vec<u8>,
    pub flags: u16,
}

impl OwnedBlock {
    /// Random ids (below 2^(8·id_bytes)), random codes and extra bytes,
    /// and summaries of random normal vectors.
    pub fn random(rng: &mut Rng, g: &crate::Geometry, n: usize) -> OwnedBlock {
        let id_max = if g.id_bytes == 2 { 1 << 16 } else { 1 << 32 };
        let ids = (0..n).map(|_| rng.below(id_max) as u32).collect();
        let mut codes = vec![0u8; g.slots as usize * n * g.code_bytes as usize];
        rng.fill(&mut codes);
        let mut extra = vec![0u8; n * g.extra_bytes as usize];
        rng.fill(&mut extra);
        let mut summaries = vec![0u8; g.summaries_len()];
        let mut v = vec![0f32; g.dims()];
        for s in summaries.chunks_exact_mut(g.summary_bytes()) {
            v.iter_mut().for_each(|x| *x = rng.gauss());
            crate::summary::quantize(&v, s);
        }
        OwnedBlock {
            ids,
            codes,
            extra,
            summaries,
            flags: rng.next().is_multiple_of(4) as u16,
        }
    }

    pub fn as_in(&self) -> crate::BlockIn<'_> {
        crate::BlockIn {
            ids: &self.ids,
            codes: &self.codes,
            extra: &self.extra,
            summaries: &self.summaries,
            flags: self.flags,
        }
    }

    /// Whether `b` holds exactly this block.
    pub fn matches(&self, b: &crate::Block) -> bool {
        let sb = b.summary(0).len();
        b.ids() == self.ids
            && b.all_codes() == self.codes.as_slice()
            && b.extra() == self.extra.as_slice()
            && b.flags == self.flags
            && (0..self.summaries.len() / sb)
                .all(|i| b.summary(i) == &self.summaries[i * sb..(i + 1) * sb])
    }
}

/// The deterministic stream of blocks number `i` of a test history: block
/// `i` depends on `(seed, i)` only, so a checker can regenerate any prefix.
pub fn nth_block(seed: u64, g: &crate::Geometry, i: u64) -> OwnedBlock {
    let mut rng = Rng::new(seed.wrapping_mul(0x1000_0000_01b3) ^ i);
    let n = if rng.next().is_multiple_of(5) {
        1 + rng.below(g.block_tokens as u64) as usize
    } else {
        g.block_tokens as usize
    };
    OwnedBlock::random(&mut rng, g, n)
}

/// A synthetic history for the scale benchmark: random blocks (random
/// codes, summaries of random normal vectors) with planted "needle" blocks
/// whose summaries and one token's codes lean toward a query, and for each
/// needle one retrieval's queries as the engine makes them: one per
/// content token of a prompt, the first aimed at the needle, the others
/// random (tokens that find nothing in particular), all zero in the slots
/// that do not search.
#[derive(Clone, Debug)]
pub struct HaystackSpec {
    pub tokens: u64,
    /// Needles per strength in `summary_cos`.
    pub needles_per_strength: usize,
    /// Cosine between a needle's summary and its query, in the slots that
    /// carry the needle; one group of needles per value.
    pub summary_cos: Vec<f32>,
    /// Cosine between the needle token's key and the query.
    pub token_cos: f32,
    /// Slots that search: the first ones (a layout orders its slots by
    /// retrieval strength); queries are zero in the others.
    pub search_slots: usize,
    /// Of the searching slots, how many carry a needle (a random subset
    /// per needle).
    pub needle_slots: usize,
    /// Queries per retrieval; the first is aimed at the needle.
    pub queries_per_retrieval: usize,
    pub seed: u64,
    /// Commit every this many blocks (the caller's fsync policy).
    pub commit_every: u64,
}

impl Default for HaystackSpec {
    /// Today's engine: 12 slots kept, the first 8 search, 8 queries per
    /// retrieval.
    fn default() -> HaystackSpec {
        HaystackSpec {
            tokens: 1 << 20,
            needles_per_strength: 16,
            summary_cos: vec![0.1, 0.15, 0.2, 0.3],
            token_cos: 0.6,
            search_slots: 8,
            needle_slots: 8,
            queries_per_retrieval: 8,
            seed: 1,
            commit_every: 64,
        }
    }
}

/// A planted needle and the retrieval that should find it.
#[derive(Clone, Debug)]
pub struct Needle {
    pub block: u64,
    pub summary_cos: f32,
    /// `queries_per_retrieval` queries of `S × D` floats; the first is
    /// aimed at the needle.
    pub queries: Vec<Vec<f32>>,
}

/// `cos · unit(q) · √D + √(1 − cos²) · r`: a vector whose cosine with `q`
/// is about `cos` (r random normal, nearly orthogonal to q in D dims).
fn lean(rng: &mut Rng, q: &[f32], cos: f32) -> Vec<f32> {
    let norm = q.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
    let d = (q.len() as f32).sqrt();
    let rest = (1.0 - cos * cos).max(0.0).sqrt();
    q.iter()
        .map(|&x| cos * x / norm * d + rest * rng.gauss())
        .collect()
}

/// Append the haystack of `spec` to the writer `mf` (any geometry with at
/// least `search_slots` slots), calling `progress(blocks)` now and then.
pub fn write_haystack(
    mf: &mut crate::MemoryFile,
    spec: &HaystackSpec,
    mut progress: impl FnMut(u64),
) -> crate::Result<Vec<Needle>> {
    let g = *mf.geometry();
    let (s_n, d) = (g.slots as usize, g.dims());
    let searching = spec.search_slots.min(s_n);
    let b = g.block_tokens as u64;
    let blocks = spec.tokens.div_ceil(b);
    let mut rng = Rng::new(spec.seed);
    let n_needles = spec.needles_per_strength * spec.summary_cos.len();
    // Distinct needle blocks, spread over the history.
    let mut at: Vec<u64> = Vec::new();
    while at.len() < n_needles.min(blocks as usize) {
        let x = rng.below(blocks);
        if !at.contains(&x) {
            at.push(x);
        }
    }
    let query = |rng: &mut Rng| -> Vec<f32> {
        let mut q: Vec<f32> = (0..s_n * d).map(|_| rng.gauss()).collect();
        q[searching * d..].fill(0.0);
        q
    };
    let mut needles: Vec<Needle> = at
        .iter()
        .enumerate()
        .map(|(i, &block)| Needle {
            block,
            summary_cos: spec.summary_cos[i / spec.needles_per_strength.max(1)],
            queries: (0..spec.queries_per_retrieval.max(1))
                .map(|_| query(&mut rng))
                .collect(),
        })
        .collect();
    needles.sort_by_key(|n| n.block);
    let mut next = 0;
    let mut blk = crate::synth::OwnedBlock::random(&mut rng, &g, b as usize);
    let mut v = vec![0f32; d];
    for i in 0..blocks {
        let n = (spec.tokens - i * b).min(b) as usize;
        blk.ids.resize(n, 0);
        for id in blk.ids.iter_mut() {
            *id = rng.below(if g.id_bytes == 2 { 49_152 } else { 1 << 20 }) as u32;
        }
        blk.codes.resize(s_n * n * g.code_bytes as usize, 0);
        rng.fill(&mut blk.codes);
        blk.extra.resize(n * g.extra_bytes as usize, 0);
        rng.fill(&mut blk.extra);
        for s in blk.summaries.chunks_exact_mut(g.summary_bytes()) {
            v.iter_mut().for_each(|x| *x = rng.gauss());
            crate::summary::quantize(&v, s);
        }
        blk.flags = (i == 0) as u16;
        if next < needles.len() && needles[next].block == i {
            let nd = &needles[next];
            let tok = rng.below(n as u64) as usize;
            // A random `needle_slots` of the searching slots.
            let mut slots: Vec<usize> = (0..searching).collect();
            for k in 0..slots.len() {
                let j = k + rng.below((slots.len() - k) as u64) as usize;
                slots.swap(k, j);
            }
            slots.truncate(spec.needle_slots.min(searching));
            for s in slots {
                let q = &nd.queries[0][s * d..(s + 1) * d];
                let sum = lean(&mut rng, q, nd.summary_cos);
                crate::summary::quantize(
                    &sum,
                    &mut blk.summaries[s * g.summary_bytes()..][..g.summary_bytes()],
                );
                let key = lean(&mut rng, q, spec.token_cos);
                let cb = g.code_bytes as usize;
                let code = &mut blk.codes[(s * n + tok) * cb..][..cb];
                code.fill(0);
                for (j, &x) in key.iter().enumerate() {
                    if x > 0.0 {
                        code[j / 8] |= 1 << (j % 8);
                    }
                }
            }
            next += 1;
        }
        mf.append(&blk.as_in())?;
        if (i + 1) % spec.commit_every == 0 {
            mf.commit()?;
        }
        if i % 4096 == 0 {
            progress(i);
        }
    }
    mf.commit()?;
    progress(blocks);
    Ok(needles)
}
