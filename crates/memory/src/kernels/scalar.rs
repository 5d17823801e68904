//! Scalar references: plain loops every SIMD twin is tested against.

use super::{FastScanBatch, FastScanTables, GROUP};

/// Per token, the table entries of its code bytes added in byte order.
pub fn lut_scores(tables: &[f32], codes: &[u8], out: &mut [f32]) {
    let cb = tables.len() / 256;
    for (code, o) in codes.chunks_exact(cb).zip(out.iter_mut()) {
        let mut s = 0f32;
        for (b, &c) in code.iter().enumerate() {
            s += tables[b * 256 + c as usize];
        }
        *o = s;
    }
}

/// `scale · Σ_d q[d] · (nibble_d − 8)` over one summary `s` (f16 scale,
/// then `q.len() / 2` bytes of nibbles, even dims low).
pub fn int4_dot(q: &[f32], s: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (pair, &b) in q.chunks_exact(2).zip(&s[2..]) {
        acc += pair[0] * ((b & 15) as i32 - 8) as f32;
        acc += pair[1] * ((b >> 4) as i32 - 8) as f32;
    }
    acc * crate::format::summary::scale(s)
}

/// Σ of the squared int4 values (nibble − 8) of summary `s`.
pub fn int4_sq(s: &[u8]) -> u32 {
    s[2..]
        .iter()
        .map(|&b| {
            let (lo, hi) = ((b & 15) as i32 - 8, (b >> 4) as i32 - 8);
            (lo * lo + hi * hi) as u32
        })
        .sum()
}

/// u16 sums of table lookups over every coarse slot and code byte, for
/// each block of each group (see [`super::fast_scan`]).
pub fn fast_scan(t: &FastScanTables, slots: &[&[u8]], out: &mut [u16]) {
    let cb = t.code_bytes;
    for (g, o) in out.chunks_exact_mut(GROUP).enumerate() {
        o.fill(0);
        for (si, slot) in slots.iter().enumerate() {
            for b in 0..cb {
                let row = &slot[(g * cb + b) * GROUP..][..GROUP];
                let tab = &t.tables[(si * cb + b) * 32..][..32];
                for (acc, &c) in o.iter_mut().zip(row) {
                    let pair = tab[(c & 15) as usize] + tab[16 + (c >> 4) as usize];
                    *acc = acc.wrapping_add(pair as u16);
                }
            }
        }
    }
}

/// [`fast_scan`] per query of a batch: `out` is `[query][groups · GROUP]`.
pub fn fast_scan_many(t: &FastScanBatch, slots: &[&[u8]], out: &mut [u16]) {
    let (cb, m) = (t.code_bytes, t.queries);
    if m == 0 {
        return;
    }
    let per_query = out.len() / m;
    for (q, o) in out.chunks_exact_mut(per_query).enumerate() {
        for (g, o) in o.chunks_exact_mut(GROUP).enumerate() {
            o.fill(0);
            for (si, slot) in slots.iter().enumerate() {
                for b in 0..cb {
                    let row = &slot[(g * cb + b) * GROUP..][..GROUP];
                    let tab = &t.tables[((si * cb + b) * m + q) * 32..][..32];
                    for (acc, &c) in o.iter_mut().zip(row) {
                        let pair = tab[(c & 15) as usize].wrapping_add(tab[16 + (c >> 4) as usize]);
                        *acc = acc.wrapping_add(pair as u16);
                    }
                }
            }
        }
    }
}

/// Bit per score: set when it is at least `floor` (see
/// [`super::at_least`]).
pub fn at_least(scores: &[u16], floor: u16, bits: &mut [u64]) {
    for (w, chunk) in bits.iter_mut().zip(scores.chunks(64)) {
        *w = 0;
        for (j, &s) in chunk.iter().enumerate() {
            *w |= ((s >= floor) as u64) << j;
        }
    }
}
