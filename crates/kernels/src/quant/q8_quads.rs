//! Q8 quads: an activation quantized exactly like Q8_0 (same scales, same
//! quants), laid out for the multi-activation dots ([`crate::traits::MultiDot`]).
//!
//! A Q8_0 block keeps its f16 scale next to its 32 quants, so a kernel must
//! convert the scale and realign the quants for every weight row it meets.
//! Here that is done once per activation. Blocks go in quads (four blocks,
//! 128 elements), split so that one 512-bit `dpbusd` takes the first 16
//! elements of all four blocks and a second one, accumulating into the same
//! register, their last 16: the four blocks' sums land in 4 lanes each, and
//! the float work (convert, scale, add) is one 512-bit op per quad instead
//! of one per block. It matches the 4-bit types, whose low nibbles are the
//! first 16 elements of a block and high nibbles the last 16.
//!
//! For `q` quads (the padding blocks of the last one all zero) the bytes are:
//!
//! - `qs`: `128·q` quants; per quad, elements 0..16 of blocks 0..4, then
//!   elements 16..32 of blocks 0..4;
//! - `dy`: `16·q` f32, each block's scale on the 4 lanes its sum lands in;
//! - `sy`: `8·q` f32, per quad `[0, dy₀·Σy₀, 0, dy₁·Σy₁, 0, …, dy₃·Σy₃]`, lined
//!   up with a weight quad's `[d₀, m₀, d₁, m₁, …]` for a stored minimum;
//! - `ls`: `16·q` i32, per quad −c times the sum of the 8 quants each lane
//!   of the two `dpbusd` takes (4 from each half), for the weight type's
//!   zero point `c` (Q4_0's 8, Q5_0's 16, or the 128 that makes Q8_0
//!   unsigned on AVX-512; 0 for the others): the kernels start their
//!   integer sums from it, which removes the zero point exactly at no cost
//!   per weight row. Done in float instead, the two large terms cancel and
//!   the rounding error showed up as greedy divergence from llama.cpp.
//!
//! Every part starts on a multiple of 32 bytes from the start.

use crate::quant::q8_0::{BlockQ8_0, QK8_0};
use bytemuck::Zeroable;

/// Bytes per quad of blocks: 128 quants, 16 + 8 f32, 16 i32.
pub const QUAD_BYTES: usize = 128 + 16 * 4 + 8 * 4 + 16 * 4;

/// Quads of blocks in an activation of `cols` elements.
pub fn quads(cols: usize) -> usize {
    cols.div_ceil(QK8_0).div_ceil(4)
}

pub fn prepared_bytes(cols: usize) -> usize {
    quads(cols) * QUAD_BYTES
}

/// A prepared activation's three parts.
#[derive(Clone, Copy)]
pub struct Q8Quads<'a> {
    pub qs: &'a [i8],
    pub dy: &'a [f32],
    pub sy: &'a [f32],
    pub ls: &'a [i32],
}

impl<'a> Q8Quads<'a> {
    /// View `bytes` (4-aligned, at least `quads · QUAD_BYTES` long) as
    /// `quads` quads.
    pub fn new(bytes: &'a [u8], quads: usize) -> Q8Quads<'a> {
        let (qs, rest) = bytes[..quads * QUAD_BYTES].split_at(128 * quads);
        let (dy, rest) = rest.split_at(64 * quads);
        let (sy, ls) = rest.split_at(32 * quads);
        Q8Quads {
            qs: bytemuck::cast_slice(qs),
            dy: bytemuck::cast_slice(dy),
            sy: bytemuck::cast_slice(sy),
            ls: bytemuck::cast_slice(ls),
        }
    }

    /// Element `j` (< 32) of block `b`.
    pub fn quant(&self, b: usize, j: usize) -> i8 {
        let (q, k) = (b / 4, b % 4);
        self.qs[128 * q + 64 * (j / 16) + 16 * k + j % 16]
    }

    /// Scale of block `b`.
    pub fn scale(&self, b: usize) -> f32 {
        self.dy[4 * b]
    }

    /// dy·Σy of block `b`.
    pub fn scaled_sum(&self, b: usize) -> f32 {
        self.sy[2 * b + 1]
    }
}

/// Quantize `x` (whole Q8_0 blocks) into `dst` (`prepared_bytes(x.len())`
/// bytes, 4-aligned), with ggml-cpu's run-time Q8_0 quantizer.
pub fn prepare(x: &[f32], dst: &mut [u8]) {
    prepare_with_zero_point(x, dst, 0)
}

/// [`prepare`] with `ls` holding −`zero_point`·(lane sums).
pub fn prepare_with_zero_point(x: &[f32], dst: &mut [u8], zero_point: i32) {
    assert!(
        x.len().is_multiple_of(QK8_0),
        "q8 quads: {} elements are not whole blocks",
        x.len()
    );
    let nq = quads(x.len());
    assert_eq!(dst.len(), nq * QUAD_BYTES, "q8 quads: wrong buffer size");
    let (qs, rest) = dst.split_at_mut(128 * nq);
    let (dy, rest) = rest.split_at_mut(64 * nq);
    let (sy, ls) = rest.split_at_mut(32 * nq);
    let qs: &mut [i8] = bytemuck::cast_slice_mut(qs);
    let dy: &mut [f32] = bytemuck::cast_slice_mut(dy);
    let sy: &mut [f32] = bytemuck::cast_slice_mut(sy);
    let ls: &mut [i32] = bytemuck::cast_slice_mut(ls);
    // The padding blocks of the last quad stay all zero.
    qs.fill(0);
    dy.fill(0.0);
    sy.fill(0.0);
    // The selected quantizer, looked up once for the row.
    let quantize = crate::selected().q8_0_activation;
    let mut block = [BlockQ8_0::zeroed()];
    for (b, xb) in x.chunks_exact(QK8_0).enumerate() {
        quantize(xb, &mut block);
        let d = block[0].d.to_f32();
        let sum: i32 = block[0].qs.iter().map(|&q| q as i32).sum();
        let at = 128 * (b / 4) + 16 * (b % 4);
        qs[at..at + 16].copy_from_slice(&block[0].qs[..16]);
        qs[at + 64..at + 80].copy_from_slice(&block[0].qs[16..]);
        dy[4 * b..4 * b + 4].fill(d);
        sy[2 * b + 1] = d * sum as f32;
    }
    // Lane l of a quad's sums takes bytes 4l..4l+4 of both 64-byte halves.
    for (l, out) in ls.iter_mut().enumerate() {
        let (q, lane) = (l / 16, l % 16);
        let half = |h: usize| -> i32 {
            let at = 128 * q + 64 * h + 4 * lane;
            qs[at..at + 4].iter().map(|&v| v as i32).sum()
        };
        *out = -zero_point * (half(0) + half(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8_0::quantize_row_activation;
    use crate::quant::testing::{rng, weights};

    #[test]
    fn same_numbers_as_q8_0() {
        for blocks in [1, 2, 3, 4, 5, 18] {
            let x = weights(&mut rng(blocks as u64), blocks * QK8_0);
            let mut q = vec![BlockQ8_0::zeroed(); blocks];
            quantize_row_activation(&x, &mut q);
            let nq = quads(x.len());
            let mut buf = vec![0u32; nq * QUAD_BYTES / 4];
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
            bytes.fill(0xAA); // stale contents must not leak through
            prepare_with_zero_point(&x, bytes, 8);
            let v = Q8Quads::new(bytes, nq);
            for b in 0..4 * nq {
                let sum: i32 = q
                    .get(b)
                    .map_or(0, |qb| qb.qs.iter().map(|&q| q as i32).sum());
                let d = q.get(b).map_or(0.0, |qb| qb.d.to_f32());
                for j in 0..32 {
                    assert_eq!(v.quant(b, j), q.get(b).map_or(0, |qb| qb.qs[j]), "{b} {j}");
                }
                assert!(v.dy[4 * b..4 * b + 4].iter().all(|&s| s == d));
                assert_eq!((v.sy[2 * b], v.scaled_sum(b)), (0.0, d * sum as f32));
                assert_eq!(v.scale(b), d);
                // A block's four lanes sum to −8 times the block's Σy.
                assert_eq!(v.ls[4 * b..4 * b + 4].iter().sum::<i32>(), -8 * sum);
            }
        }
    }
}
