//! Every SIMD twin against the scalar reference on random inputs, odd
//! sizes and tails included.

use super::*;
use crate::synth::Rng;

fn rand_q(r: &mut Rng, d: usize) -> Vec<f32> {
    (0..d).map(|_| r.gauss()).collect()
}

#[test]
fn lut_tables_hold_bit_sums() {
    let mut r = Rng::new(1);
    let q = rand_q(&mut r, 24);
    let mut t = vec![0f32; 3 * 256];
    lut_tables(&q, &mut t);
    for b in 0..3 {
        for v in 0..256usize {
            let want: f32 = (0..8)
                .filter(|j| v >> j & 1 == 1)
                .map(|j| q[8 * b + j])
                .sum();
            assert!((t[b * 256 + v] - want).abs() < 1e-5, "byte {b} value {v}");
        }
    }
}

#[test]
fn lut_scores_match_scalar_bit_for_bit() {
    let mut r = Rng::new(2);
    for cb in [1usize, 2, 3, 8, 9, 16] {
        for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 33, 64, 100] {
            let q = rand_q(&mut r, cb * 8);
            let mut t = vec![0f32; cb * 256];
            lut_tables(&q, &mut t);
            let codes: Vec<u8> = (0..n * cb).map(|_| r.next() as u8).collect();
            let mut want = vec![0f32; n];
            scalar::lut_scores(&t, &codes, &mut want);
            // Against the definition <q, bits>, up to float rounding.
            for (i, w) in want.iter().enumerate() {
                let exact: f32 = (0..cb * 8)
                    .filter(|&d| codes[i * cb + d / 8] >> (d % 8) & 1 == 1)
                    .map(|d| q[d])
                    .sum();
                assert!((w - exact).abs() < 1e-4, "cb {cb} n {n} token {i}");
            }
            for isa in Isa::supported() {
                let mut got = vec![f32::NAN; n];
                lut_scores(isa, &t, &codes, &mut got);
                assert_eq!(
                    got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{} cb {cb} n {n}",
                    isa.name()
                );
            }
        }
    }
}

#[test]
fn int4_dots_match_scalar_within_rounding() {
    let mut r = Rng::new(3);
    for d in [2usize, 6, 14, 16, 18, 30, 64, 66, 128] {
        let sb = d / 2 + 2;
        for count in [1usize, 3, 10] {
            let stride = sb + (r.next() % 5) as usize;
            let q = rand_q(&mut r, d);
            let mut sums = vec![0u8; count * stride];
            for i in 0..count {
                let x = rand_q(&mut r, d);
                crate::format::summary::quantize(&x, &mut sums[i * stride..i * stride + sb]);
            }
            let mut want = vec![0f32; count];
            int4_dots(Isa::Scalar, &q, &sums, stride, &mut want);
            for isa in Isa::supported() {
                let mut got = vec![0f32; count];
                int4_dots(isa, &q, &sums, stride, &mut got);
                for (g, w) in got.iter().zip(&want) {
                    let scale = crate::format::summary::scale(&sums[..2]).max(1e-3);
                    let bound = 1e-5
                        * (d as f32)
                        * 8.0
                        * scale
                        * q.iter().map(|v| v.abs()).fold(0.0, f32::max)
                        + 1e-6;
                    assert!((g - w).abs() <= bound, "{} d {d}: {g} vs {w}", isa.name());
                }
            }
        }
    }
}

#[test]
fn summary_quantize_round_trips_within_half_a_step() {
    let mut r = Rng::new(4);
    for d in [2usize, 8, 64] {
        let x = rand_q(&mut r, d);
        let mut s = vec![0u8; d / 2 + 2];
        crate::format::summary::quantize(&x, &mut s);
        let mut y = vec![0f32; d];
        crate::format::summary::dequantize(&s, &mut y);
        let step = crate::format::summary::scale(&s);
        for (a, b) in x.iter().zip(&y) {
            assert!(
                (a - b).abs() <= 0.5 * step * 1.01 + 1e-6,
                "{a} vs {b} (step {step})"
            );
        }
    }
}

#[test]
fn fast_scan_matches_scalar_exactly_and_tracks_float_scores() {
    let mut r = Rng::new(5);
    for (n_slots, cb) in [(1usize, 1usize), (3, 2), (5, 8), (36, 8), (2, 9)] {
        for groups in [1usize, 2, 5, 17, 33] {
            let coarse: Vec<u32> = (0..n_slots as u32)
                .filter(|s| s % 2 == 0 || n_slots < 3)
                .collect();
            let data: Vec<Vec<u8>> = (0..n_slots)
                .map(|_| {
                    (0..groups * cb * GROUP + 7)
                        .map(|_| r.next() as u8)
                        .collect()
                })
                .collect();
            let streams: Vec<&[u8]> = coarse
                .iter()
                .map(|&s| data[s as usize].as_slice())
                .collect();
            let qs: Vec<Vec<f32>> = coarse.iter().map(|_| rand_q(&mut r, cb * 8)).collect();
            let qrefs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
            let w: Vec<f32> = qs
                .iter()
                .map(|q| 1.0 / q.iter().map(|v| v * v).sum::<f32>().sqrt())
                .collect();
            let t = FastScanTables::new(&qrefs, &w);
            let mut want = vec![0u16; groups * GROUP];
            scalar::fast_scan(&t, &streams, &mut want);
            for isa in Isa::supported() {
                let mut got = vec![1u16; groups * GROUP];
                fast_scan(isa, &t, &streams, &mut got);
                assert_eq!(
                    got,
                    want,
                    "{} slots {n_slots} cb {cb} groups {groups}",
                    isa.name()
                );
            }
            // The quantized score follows the float one: offset + step·u16
            // is within half a step per table of Σ w·<q, bits>.
            for (blk, &got) in want.iter().enumerate() {
                let (g, j) = (blk / GROUP, blk % GROUP);
                let mut exact = 0f32;
                for (si, &s) in coarse.iter().enumerate() {
                    for d in 0..cb * 8 {
                        let byte = data[s as usize][(g * cb + d / 8) * GROUP + j];
                        if byte >> (d % 8) & 1 == 1 {
                            exact += w[si] * qs[si][d];
                        }
                    }
                }
                let approx = t.offset + t.step * got as f32;
                let tol = t.step * 0.5 * (coarse.len() * cb * 2) as f32 + 1e-4;
                assert!(
                    (approx - exact).abs() <= tol,
                    "block {blk}: {approx} vs {exact}"
                );
            }
        }
    }
}

#[test]
fn fast_scan_tables_never_overflow_u16() {
    // Many slots with one dominant query: the worst case is every lookup at
    // its table maximum.
    let qs: Vec<Vec<f32>> = (0..64)
        .map(|i| vec![if i == 0 { 100.0 } else { 1.0 }; 64])
        .collect();
    let qrefs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
    let t = FastScanTables::new(&qrefs, &vec![1.0; 64]);
    let total: u32 = t
        .tables
        .chunks_exact(16)
        .map(|c| *c.iter().max().unwrap() as u32)
        .sum();
    assert!(total <= 65535, "max total {total}");
    assert!(t.tables.iter().all(|&v| v <= 127));
}

/// A batch of queries, each with tables for some of the batch's slots
/// only (zero elsewhere, as a zero query slot is): every twin equals the
/// scalar batch, and each query's sums equal a single-query scan with its
/// own tables over its own slots.
#[test]
fn fast_scan_many_matches_single_scans_and_scalar() {
    let mut r = Rng::new(6);
    for (n_slots, cb) in [(1usize, 1usize), (3, 2), (8, 8), (12, 8), (5, 9)] {
        for groups in [1usize, 2, 7, 17] {
            let data: Vec<Vec<u8>> = (0..n_slots)
                .map(|_| {
                    (0..groups * cb * GROUP + 5)
                        .map(|_| r.next() as u8)
                        .collect()
                })
                .collect();
            let streams: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            for m in [0usize, 1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17] {
                let mut batch = FastScanBatch::new(m, n_slots, cb);
                let mut single = Vec::new();
                for q in 0..m {
                    // Slots of this query: all, or a random subset (query
                    // 0 has all, some have none).
                    let own: Vec<usize> = (0..n_slots)
                        .filter(|_| q == 0 || !r.next().is_multiple_of(3))
                        .collect();
                    let qs: Vec<Vec<f32>> = own.iter().map(|_| rand_q(&mut r, cb * 8)).collect();
                    let qrefs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
                    let w: Vec<f32> = qs
                        .iter()
                        .map(|q| 1.0 / q.iter().map(|v| v * v).sum::<f32>().sqrt())
                        .collect();
                    let t = FastScanTables::new(&qrefs, &w);
                    for (i, &s) in own.iter().enumerate() {
                        batch.set(q, s, &t, i);
                    }
                    let own_streams: Vec<&[u8]> = own.iter().map(|&s| streams[s]).collect();
                    let mut want = vec![0u16; groups * GROUP];
                    if !own.is_empty() {
                        scalar::fast_scan(&t, &own_streams, &mut want);
                    }
                    single.extend(want);
                }
                let mut want = vec![7u16; m * groups * GROUP];
                scalar::fast_scan_many(&batch, &streams, &mut want);
                assert_eq!(
                    want, single,
                    "scalar batch, {n_slots} slots cb {cb} groups {groups} m {m}"
                );
                for isa in Isa::supported() {
                    let mut got = vec![1u16; m * groups * GROUP];
                    fast_scan_many(isa, &batch, &streams, &mut got);
                    assert_eq!(
                        got,
                        want,
                        "{} slots {n_slots} cb {cb} groups {groups} m {m}",
                        isa.name()
                    );
                }
            }
        }
    }
}

/// Table entries up to 255 (beyond what [`FastScanTables`] makes) wrap
/// the byte sums alike in every twin: the kernels agree on any tables.
#[test]
fn fast_scan_many_twins_agree_on_any_tables() {
    let mut r = Rng::new(7);
    let (n_slots, cb, groups, m) = (4usize, 3usize, 3usize, 11usize);
    let data: Vec<Vec<u8>> = (0..n_slots)
        .map(|_| (0..groups * cb * GROUP).map(|_| r.next() as u8).collect())
        .collect();
    let streams: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let mut batch = FastScanBatch::new(m, n_slots, cb);
    r.fill(&mut batch.tables);
    let mut want = vec![0u16; m * groups * GROUP];
    scalar::fast_scan_many(&batch, &streams, &mut want);
    for isa in Isa::supported() {
        let mut got = vec![0u16; m * groups * GROUP];
        fast_scan_many(isa, &batch, &streams, &mut got);
        assert_eq!(got, want, "{}", isa.name());
    }
}

#[test]
fn at_least_bits_match_scalar_and_the_definition() {
    let mut r = Rng::new(8);
    for n in [
        0usize, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1024, 1031,
    ] {
        for spread in [2u64, 300, 65536] {
            let scores: Vec<u16> = (0..n).map(|_| r.below(spread) as u16).collect();
            for floor in [0u16, 1, r.below(spread) as u16, 65535] {
                let words = n.div_ceil(64);
                let mut want = vec![!0u64; words];
                scalar::at_least(&scores, floor, &mut want);
                for (i, &s) in scores.iter().enumerate() {
                    assert_eq!(want[i / 64] >> (i % 64) & 1 == 1, s >= floor, "score {i}");
                }
                if n % 64 != 0 {
                    assert_eq!(want[words - 1] >> (n % 64), 0, "bits past the end");
                }
                for isa in Isa::supported() {
                    let mut got = vec![!0u64; words];
                    at_least(isa, &scores, floor, &mut got);
                    assert_eq!(got, want, "{} n {n} floor {floor}", isa.name());
                }
            }
        }
    }
}

#[test]
fn int4_sq_matches_scalar_and_the_definition() {
    let mut r = Rng::new(9);
    for d in [0usize, 2, 6, 30, 32, 34, 64, 66, 128, 130] {
        for _ in 0..20 {
            let mut s = vec![0u8; d / 2 + 2];
            r.fill(&mut s);
            let want: u32 = crate::format::summary::values(&s)
                .map(|v| (v as i32 * v as i32) as u32)
                .sum();
            assert_eq!(scalar::int4_sq(&s), want, "d {d}");
            for isa in Isa::supported() {
                assert_eq!(int4_sq(isa, &s), want, "{} d {d}", isa.name());
            }
        }
    }
}
