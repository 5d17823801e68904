//! The three inner loops of search, each a scalar reference ([`scalar`])
//! with AVX2 and AVX-512 twins ([`x86`]) chosen once at run time:
//!
//! - **LUT scoring** (fine pass): a token's score in a slot is
//!   `Σ_{bits set} q_i`, read from one 256-entry f32 table per code byte
//!   ([`lut_tables`]), so a 64-bit code costs 8 loads and 8 adds. The
//!   caller turns it into `<q, sign(code)> = 2·that − Σ q`. The fast
//!   version scores four tokens at a time with plain loads (four
//!   independent sums, so their loads overlap), adding each token's bytes
//!   in the reference's order: it equals the scalar sums bit for bit. On
//!   this project's machine (AMD Zen 4) it took 0.93 ms for a retrieval's
//!   8,192 blocks × slots against 1.9–4.6 ms for the plain loop and 3–7
//!   ms for the AVX2 and AVX-512 gather versions it replaced.
//! - **Int4 dots** (summary pass): `scale · Σ q_i · (nibble_i − 8)`. The
//!   SIMD twins sum in another order; tests bound the difference.
//!   [`int4_sq`] gives `Σ (nibble − 8)²`, the summary's squared norm over
//!   its scale², exactly (integers).
//! - **Fast scan** (coarse pass over every block): the sign bits of block
//!   summaries, transposed so byte `b` of 64 consecutive blocks is one
//!   64-byte row, are scored by 4-bit lookups (`pshufb`) in u8 tables that
//!   hold the query's nibble partial sums, summed over the coarse slots in
//!   u16 lanes. Integer arithmetic: every twin equals the scalar one
//!   exactly. [`FastScanTables`] quantizes the query so no lane overflows.
//! - **Threshold bits** (choosing the coarse candidates): which of a run
//!   of u16 scores reach a floor, as bits, so a scan whose floor is above
//!   almost every score skips them 32 or 64 at a time.
//!
//!   [`fast_scan_many`] scores several queries in one pass: each row of
//!   sign bits is loaded and split into nibbles once, then looked up in
//!   every query's tables ([`FastScanBatch`]), so m queries cost one read
//!   of the index instead of m.
//!
//! Self-contained (no dependency on `crates/kernels`) so it can move there.

pub mod scalar;
#[cfg(target_arch = "x86_64")]
pub mod x86;

#[cfg(test)]
mod tests;

/// Blocks per fast-scan group: one AVX-512 register of bytes.
pub const GROUP: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2 (+ FMA).
    Avx2,
    /// AVX-512 F/BW (implies AVX2).
    Avx512,
}

impl Isa {
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_supported()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every set this CPU runs, scalar first.
    pub fn supported() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
    }

    /// The set this process uses: the one the engine's kernels chose
    /// ([`kernels::selected`], configured once by the CLI), where these
    /// kernels have it; scalar otherwise (NEON has no twin here yet).
    pub fn selected() -> Isa {
        match kernels::selected().isa() {
            kernels::isa::Isa::Avx512 if Isa::Avx512.is_supported() => Isa::Avx512,
            kernels::isa::Isa::Avx512 | kernels::isa::Isa::Avx2 if Isa::Avx2.is_supported() => {
                Isa::Avx2
            }
            _ => Isa::Scalar,
        }
    }
}

/// Ask the CPU to bring `bytes` into its caches without waiting for them:
/// a pass that visits scattered places (the summaries of candidate
/// blocks) names the next ones while it works on the current one, so
/// their memory latencies overlap instead of adding up.
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // Every 64th byte and the last: each cache line `bytes` touches.
        let last = bytes.len().saturating_sub(1);
        for i in (0..bytes.len())
            .step_by(64)
            .chain((!bytes.is_empty()).then_some(last))
        {
            // SAFETY: i < bytes.len(), so the address is inside `bytes`;
            // a prefetch is a hint that never faults and changes no state
            // the program can see.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().add(i) as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Fill `tables` (`q.len() / 8` tables of 256) so that entry `[b][v]` is
/// `Σ_{bit j set in v} q[8b + j]`.
pub fn lut_tables(q: &[f32], tables: &mut [f32]) {
    assert_eq!(q.len() % 8, 0, "query length must be a multiple of 8");
    assert_eq!(tables.len(), q.len() / 8 * 256);
    for (qb, t) in q.chunks_exact(8).zip(tables.chunks_exact_mut(256)) {
        t[0] = 0.0;
        for v in 1..256usize {
            // Adding the lowest set bit to the entry without it keeps each
            // entry one rounding away from an exact sum in bit order.
            let low = v.trailing_zeros() as usize;
            t[v] = t[v & (v - 1)] + qb[low];
        }
    }
}

/// `out[t] = Σ_b tables[b][codes[t·cb + b]]` for the `out.len()` tokens of
/// one slot, `cb = tables.len() / 256`. [`Isa::Scalar`] runs the plain
/// reference; every other set the four-token loop (no SIMD: gathers lost
/// to plain loads, see the module doc).
pub fn lut_scores(isa: Isa, tables: &[f32], codes: &[u8], out: &mut [f32]) {
    let cb = tables.len() / 256;
    assert!(cb > 0 && tables.len() == cb * 256);
    assert_eq!(
        codes.len(),
        out.len() * cb,
        "codes must be tokens × code bytes"
    );
    match isa {
        Isa::Scalar => scalar::lut_scores(tables, codes, out),
        _ => lut_scores_by_four(tables, codes, out),
    }
}

/// [`scalar::lut_scores`] for four tokens at once: the same additions per
/// token in the same order, interleaved so that four chains of loads and
/// adds are in flight instead of one.
fn lut_scores_by_four(tables: &[f32], codes: &[u8], out: &mut [f32]) {
    let cb = tables.len() / 256;
    let mut quads = codes.chunks_exact(4 * cb);
    let mut outs = out.chunks_exact_mut(4);
    for (c, o) in (&mut quads).zip(&mut outs) {
        let mut s = [0f32; 4];
        for (b, t) in tables.chunks_exact(256).enumerate() {
            for (i, si) in s.iter_mut().enumerate() {
                *si += t[c[i * cb + b] as usize];
            }
        }
        o.copy_from_slice(&s);
    }
    scalar::lut_scores(tables, quads.remainder(), outs.into_remainder());
}

/// `out[i] = scale_i · Σ_d q[d] · (nibble_{i,d} − 8)` for `out.len()`
/// summaries laid `stride` bytes apart in `summaries` (each `q.len()/2 + 2`
/// bytes: f16 scale, then nibbles).
pub fn int4_dots(isa: Isa, q: &[f32], summaries: &[u8], stride: usize, out: &mut [f32]) {
    let sb = q.len() / 2 + 2;
    assert_eq!(q.len() % 2, 0);
    assert!(stride >= sb);
    if !out.is_empty() {
        assert!(summaries.len() >= (out.len() - 1) * stride + sb);
    }
    for (i, o) in out.iter_mut().enumerate() {
        let s = &summaries[i * stride..i * stride + sb];
        *o = match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 if Isa::Avx2.is_supported() => {
                // SAFETY: AVX2+FMA support was just checked; `s` holds
                // q.len()/2 + 2 bytes as the kernel requires.
                unsafe { x86::int4_dot_avx2(q, s) }
            }
            _ => scalar::int4_dot(q, s),
        };
    }
}

/// `Σ_d (nibble_d − 8)²` of one summary `s` (f16 scale, then nibbles):
/// its squared norm in units of its scale.
pub fn int4_sq(isa: Isa, s: &[u8]) -> u32 {
    assert!(s.len() >= 2);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.is_supported() => {
            // SAFETY: AVX2 support was just checked; the kernel reads
            // only `s`.
            unsafe { x86::int4_sq_avx2(s) }
        }
        _ => scalar::int4_sq(s),
    }
}

/// A query quantized for the fast scan: per coarse slot and code byte, a
/// 16-entry u8 table for the low nibble and one for the high nibble.
#[derive(Clone, Debug)]
pub struct FastScanTables {
    /// `[coarse slot][code byte][lo 16 | hi 16]`.
    pub tables: Vec<u8>,
    pub code_bytes: usize,
    /// Fused float score ≈ `offset + step · u16 score`.
    pub step: f32,
    pub offset: f32,
}

impl FastScanTables {
    /// Quantize per-slot queries (`weights[i]` scales slot `i`'s score, e.g.
    /// 1/‖q‖ to sum z-scores) so that every table entry is at most 127 (a
    /// lo+hi pair fits a byte) and the largest possible total fits u16.
    pub fn new(queries: &[&[f32]], weights: &[f32]) -> FastScanTables {
        assert_eq!(queries.len(), weights.len());
        let cb = queries.first().map_or(0, |q| q.len() / 8);
        let mut float = Vec::with_capacity(queries.len() * cb * 32);
        for (q, &w) in queries.iter().zip(weights) {
            assert_eq!(q.len(), cb * 8);
            for qb in q.chunks_exact(8) {
                for half in [&qb[..4], &qb[4..]] {
                    for v in 0..16usize {
                        let s: f32 = (0..4).filter(|j| v >> j & 1 == 1).map(|j| half[j]).sum();
                        float.push(s * w);
                    }
                }
            }
        }
        // Shift each 16-entry table to start at 0: the shifts add up to one
        // constant, which ranking ignores and `offset` restores.
        let mut offset = 0f32;
        let mut max_entry = 0f32;
        let mut max_total = 0f32;
        for t in float.chunks_exact_mut(16) {
            let min = t.iter().copied().fold(f32::INFINITY, f32::min);
            offset += min;
            let mut max = 0f32;
            for v in t.iter_mut() {
                *v -= min;
                max = max.max(*v);
            }
            max_entry = max_entry.max(max);
            max_total += max;
        }
        // 127 per entry; the sum of per-table maxima (each rounded up by at
        // most half a step: +0.5 per table) within u16.
        let n_tables = float.len() / 16;
        let step_entry = max_entry / 127.0;
        let step_total = max_total / (65535.0 - 0.5 * n_tables as f32).max(1.0);
        let step = step_entry.max(step_total).max(f32::MIN_POSITIVE);
        let tables = float
            .iter()
            .map(|&v| (v / step).round().min(127.0) as u8)
            .collect();
        FastScanTables {
            tables,
            code_bytes: cb,
            step,
            offset,
        }
    }

    pub fn n_slots(&self) -> usize {
        self.tables.len() / (self.code_bytes * 32).max(1)
    }
}

/// Score groups of [`GROUP`] blocks. `slots[i]` is coarse slot `i`'s
/// transposed sign summaries (the slot of `t`'s tables `i`) from the first
/// group to score on: each group `code_bytes · GROUP` bytes, byte `b` of the
/// group's block `j` at `b·GROUP + j`. `out` gets `GROUP` u16 sums per
/// group.
pub fn fast_scan(isa: Isa, t: &FastScanTables, slots: &[&[u8]], out: &mut [u16]) {
    assert_eq!(slots.len(), t.n_slots());
    assert_eq!(out.len() % GROUP, 0);
    let need = out.len() / GROUP * t.code_bytes * GROUP;
    assert!(slots.iter().all(|s| s.len() >= need));
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if isa.is_supported() => {
            // SAFETY: AVX-512 BW support was just checked; every slot holds
            // one whole group per GROUP outputs (asserted above).
            unsafe { x86::fast_scan_avx512(t, slots, out) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.is_supported() => {
            // SAFETY: AVX2 support was just checked; sizes as above.
            unsafe { x86::fast_scan_avx2(t, slots, out) }
        }
        _ => scalar::fast_scan(t, slots, out),
    }
}

/// Several queries' fast-scan tables over the same coarse slots, laid
/// `[slot][code byte][query][lo 16 | hi 16]`: the lookups of one row of
/// sign bits for every query read one contiguous run of tables. A query
/// without a slot has zero tables there (adds nothing).
#[derive(Clone, Debug)]
pub struct FastScanBatch {
    pub tables: Vec<u8>,
    pub queries: usize,
    pub slots: usize,
    pub code_bytes: usize,
}

impl FastScanBatch {
    /// All tables zero.
    pub fn new(queries: usize, slots: usize, code_bytes: usize) -> FastScanBatch {
        FastScanBatch {
            tables: vec![0; slots * code_bytes * queries * 32],
            queries,
            slots,
            code_bytes,
        }
    }

    /// Query `query`'s tables for batch slot `slot`: slot `from` of `t`.
    pub fn set(&mut self, query: usize, slot: usize, t: &FastScanTables, from: usize) {
        let cb = self.code_bytes;
        assert_eq!(t.code_bytes, cb, "tables for another code size");
        assert!(query < self.queries && slot < self.slots && from < t.n_slots());
        for b in 0..cb {
            let src = &t.tables[(from * cb + b) * 32..][..32];
            let at = ((slot * cb + b) * self.queries + query) * 32;
            self.tables[at..at + 32].copy_from_slice(src);
        }
    }
}

/// [`fast_scan`] for every query of `t` at once. `slots` as there (one
/// per batch slot); `out` is `[query][groups · GROUP]`, query `q`'s sums
/// equal to what [`fast_scan`] gives with its own tables.
pub fn fast_scan_many(isa: Isa, t: &FastScanBatch, slots: &[&[u8]], out: &mut [u16]) {
    assert_eq!(slots.len(), t.slots);
    assert_eq!(t.tables.len(), t.slots * t.code_bytes * t.queries * 32);
    if t.queries == 0 {
        assert!(out.is_empty());
        return;
    }
    assert_eq!(out.len() % (t.queries * GROUP), 0);
    let per_query = out.len() / t.queries;
    let need = per_query / GROUP * t.code_bytes * GROUP;
    assert!(slots.iter().all(|s| s.len() >= need));
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if isa.is_supported() => {
            // SAFETY: AVX-512 BW support was just checked; every slot holds
            // one whole group per GROUP outputs of a query, the tables
            // match the batch's shape (asserted above).
            unsafe { x86::fast_scan_many_avx512(t, slots, out) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.is_supported() => {
            // SAFETY: AVX2 support was just checked; sizes as above.
            unsafe { x86::fast_scan_many_avx2(t, slots, out) }
        }
        _ => scalar::fast_scan_many(t, slots, out),
    }
}

/// Bit `i % 64` of `bits[i / 64]` set when `scores[i] >= floor`; bits
/// past the end of `scores` clear. `bits.len()` is `scores.len()` / 64
/// rounded up.
pub fn at_least(isa: Isa, scores: &[u16], floor: u16, bits: &mut [u64]) {
    assert_eq!(bits.len(), scores.len().div_ceil(64));
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if isa.is_supported() => {
            // SAFETY: AVX-512 BW support was just checked; bits holds a
            // word per 64 scores (asserted above).
            unsafe { x86::at_least_avx512(scores, floor, bits) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.is_supported() => {
            // SAFETY: AVX2 support was just checked; sizes as above.
            unsafe { x86::at_least_avx2(scores, floor, bits) }
        }
        _ => scalar::at_least(scores, floor, bits),
    }
}
