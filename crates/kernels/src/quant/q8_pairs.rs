//! Q8 pairs: an activation quantized exactly like Q8_0 (same scales, same
//! quants), laid out for the multi-activation dots ([`crate::traits::MultiDot`]).
//!
//! A Q8_0 block keeps its f16 scale next to its 32 quants, so a kernel must
//! convert the scale and realign the quants for every weight row it meets.
//! Here that is done once per activation, and each weight row pays only the
//! integer dot and one multiply-add per block. Blocks go in pairs, one pair
//! per 512-bit register. For `p` pairs (the block count rounded up to even,
//! the padding block all zero) the bytes are:
//!
//! - `qs`: `64·p` quants, the pair's two blocks back to back;
//! - `dy`: `16·p` f32, each block's scale repeated over the 8 lanes its
//!   integer dot lands in (`dpbusd` sums groups of 4 bytes into 8 lanes per
//!   block);
//! - `sy`: `4·p` f32 per pair `[0, dy₀·Σy₀, 0, dy₁·Σy₁]`, lined up with a
//!   weight pair's `[d₀, m₀, d₁, m₁]` for types with a minimum (Q4_1).
//!
//! Every part starts on a multiple of 64 bytes from the start.

use crate::quant::q8_0::{quantize_row_activation, BlockQ8_0, QK8_0};
use bytemuck::Zeroable;

/// Bytes per pair of blocks: 64 quants, 16 + 4 f32.
pub const PAIR_BYTES: usize = 64 + 16 * 4 + 4 * 4;

/// Pairs of blocks in an activation of `cols` elements.
pub fn pairs(cols: usize) -> usize {
    cols.div_ceil(QK8_0).div_ceil(2)
}

pub fn prepared_bytes(cols: usize) -> usize {
    pairs(cols) * PAIR_BYTES
}

/// A prepared activation's three parts.
#[derive(Clone, Copy)]
pub struct Q8Pairs<'a> {
    pub qs: &'a [i8],
    pub dy: &'a [f32],
    pub sy: &'a [f32],
}

impl<'a> Q8Pairs<'a> {
    /// View `bytes` (4-aligned, `pairs · PAIR_BYTES` long) as `pairs` pairs.
    pub fn new(bytes: &'a [u8], pairs: usize) -> Q8Pairs<'a> {
        let (qs, rest) = bytes[..pairs * PAIR_BYTES].split_at(64 * pairs);
        let (dy, sy) = rest.split_at(64 * pairs);
        Q8Pairs {
            qs: bytemuck::cast_slice(qs),
            dy: bytemuck::cast_slice(dy),
            sy: bytemuck::cast_slice(sy),
        }
    }
}

/// Quantize `x` (whole Q8_0 blocks) into `dst` (`prepared_bytes(x.len())`
/// bytes, 4-aligned), with ggml-cpu's run-time Q8_0 quantizer.
pub fn prepare(x: &[f32], dst: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(QK8_0),
        "q8 pairs: {} elements are not whole blocks",
        x.len()
    );
    let p = pairs(x.len());
    assert_eq!(dst.len(), p * PAIR_BYTES, "q8 pairs: wrong buffer size");
    let (qs, rest) = dst.split_at_mut(64 * p);
    let (dy, sy) = rest.split_at_mut(64 * p);
    let qs: &mut [i8] = bytemuck::cast_slice_mut(qs);
    let dy: &mut [f32] = bytemuck::cast_slice_mut(dy);
    let sy: &mut [f32] = bytemuck::cast_slice_mut(sy);
    // The padding block of an odd count stays all zero.
    qs.fill(0);
    dy.fill(0.0);
    sy.fill(0.0);
    let mut block = [BlockQ8_0::zeroed()];
    for (b, xb) in x.chunks_exact(QK8_0).enumerate() {
        quantize_row_activation(xb, &mut block);
        let d = block[0].d.to_f32();
        let sum: i32 = block[0].qs.iter().map(|&q| q as i32).sum();
        qs[32 * b..32 * b + 32].copy_from_slice(&block[0].qs);
        dy[8 * b..8 * b + 8].fill(d);
        sy[2 * b + 1] = d * sum as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::{rng, weights};

    #[test]
    fn same_numbers_as_q8_0() {
        for blocks in [1, 2, 3, 18] {
            let x = weights(&mut rng(blocks as u64), blocks * QK8_0);
            let mut q = vec![BlockQ8_0::zeroed(); blocks];
            quantize_row_activation(&x, &mut q);
            let p = pairs(x.len());
            let mut buf = vec![0u32; p * PAIR_BYTES / 4];
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
            bytes.fill(0xAA); // stale contents must not leak through
            prepare(&x, bytes);
            let v = Q8Pairs::new(bytes, p);
            for (b, qb) in q.iter().enumerate() {
                assert_eq!(&v.qs[32 * b..32 * b + 32], &qb.qs);
                assert!(v.dy[8 * b..8 * b + 8].iter().all(|&d| d == qb.d.to_f32()));
                let sum: i32 = qb.qs.iter().map(|&q| q as i32).sum();
                assert_eq!(v.sy[2 * b], 0.0);
                assert_eq!(v.sy[2 * b + 1], qb.d.to_f32() * sum as f32);
            }
            if blocks % 2 == 1 {
                assert!(v.qs[32 * blocks..].iter().all(|&q| q == 0));
                assert!(v.dy[8 * blocks..].iter().all(|&d| d == 0.0));
                assert!(v.sy[2 * blocks..].iter().all(|&s| s == 0.0));
            }
        }
    }
}
