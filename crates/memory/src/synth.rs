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
