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
