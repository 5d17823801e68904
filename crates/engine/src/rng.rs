//! The sampler's random source: 32-bit Mersenne Twister (`std::mt19937`) plus
//! the `std::uniform_real_distribution<double>(0, 1)` draw that llama.cpp's
//! `dist` sampler makes, written out so a seed gives the same stream on every
//! platform and the same stream llama.cpp gets from libstdc++/libc++.
//!
//! The double is libstdc++'s `generate_canonical<double, 53>`: two 32-bit
//! words `a`, `b`, then `(a + b * 2^32) / 2^64` in double arithmetic, clamped
//! below 1.

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// `std::mt19937`.
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N], // (624,)
    index: usize,
}

impl Mt19937 {
    /// Seeds like `std::mt19937(seed)`.
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; N];
        state[0] = seed;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Self { state, index: N }
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & UPPER_MASK) | (self.state[(i + 1) % N] & LOWER_MASK);
            let mut next = self.state[(i + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= MATRIX_A;
            }
            self.state[i] = next;
        }
        self.index = 0;
    }

    /// The next 32-bit output, as `rng()` in C++.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// A double in `[0, 1)`, as `std::uniform_real_distribution<double>(0, 1)(rng)`.
    pub fn next_f64(&mut self) -> f64 {
        const TWO_32: f64 = 4_294_967_296.0;
        let lo = self.next_u32() as f64;
        let hi = self.next_u32() as f64;
        // Same operation order as generate_canonical: sum = lo; sum += hi * 2^32.
        let sum = lo + hi * TWO_32;
        let r = sum / (TWO_32 * TWO_32);
        if r >= 1.0 {
            // nextafter(1.0, 0.0)
            f64::from_bits(1.0f64.to_bits() - 1)
        } else {
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_matches_the_cpp_standard() {
        // [rand.predef]: the 10000th invocation of a default-constructed
        // mt19937 (seed 5489) produces 4123659995.
        let mut rng = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10_000 {
            last = rng.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    #[test]
    fn mt19937_first_outputs() {
        let mut rng = Mt19937::new(5489);
        assert_eq!(rng.next_u32(), 3_499_211_612);
        assert_eq!(rng.next_u32(), 581_869_302);
        assert_eq!(rng.next_u32(), 3_890_346_734);
    }
}
