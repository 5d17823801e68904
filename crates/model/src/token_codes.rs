//! Fixed token codes (docs/CACHEFIT-FORMAT.md, "Token codes"): token `id`
//! maps to a fixed string of `bits` signs, bit `j` taken from word `j / 64`
//! of a seeded hash, `+1` where the bit is set and `−1` where it is clear.
//! A model with codes has no embedding table: its input is a learned
//! projection of the code (`token_proj`, `d × bits`). The trainer and the
//! runtime both call [`code_word`], so they agree on every bit.

/// Word `word` (64 bits) of token `token`'s code under `seed`: SplitMix64's
/// finalizer over `seed ⊕ (token·2³² + word)`, plus its increment.
pub fn code_word(seed: u64, token: u32, word: u32) -> u64 {
    let mut z = (seed ^ ((token as u64) << 32 | word as u64)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The code of `token` as `±1.0`, `out.len()` bits (a multiple of 64).
pub fn code_signs(seed: u64, token: u32, out: &mut [f32]) {
    for (w, chunk) in out.chunks_mut(64).enumerate() {
        let bits = code_word(seed, token, w as u32);
        for (j, v) in chunk.iter_mut().enumerate() {
            *v = if bits >> j & 1 == 1 { 1.0 } else { -1.0 };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_words() {
        // SplitMix64's first output from state 0 is 0xE220A8397B1DCDAF:
        // seed 0, token 0, word 0 starts from the same state.
        assert_eq!(code_word(0, 0, 0), 0xE220_A839_7B1D_CDAF);
        assert_ne!(code_word(0, 0, 1), code_word(0, 1, 0));
        assert_ne!(code_word(1, 0, 0), code_word(0, 0, 0));
    }

    #[test]
    fn codes_are_balanced_and_distinct() {
        let mut a = vec![0.0; 512];
        let mut b = vec![0.0; 512];
        let mut max_agree = 0;
        for t in 0..200u32 {
            code_signs(7, t, &mut a);
            let ones = a.iter().filter(|&&v| v > 0.0).count();
            assert!(
                (200..=312).contains(&ones),
                "token {t}: {ones} of 512 bits set"
            );
            code_signs(7, t + 1000, &mut b);
            let agree = a.iter().zip(&b).filter(|(x, y)| x == y).count();
            max_agree = max_agree.max(agree);
        }
        // Independent random codes agree on 256 ± 11 bits.
        assert!(
            max_agree < 330,
            "two codes agree on {max_agree} of 512 bits"
        );
    }
}
