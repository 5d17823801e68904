//! The batch search against one search per query, and zero query slots
//! against the bytes of those slots.

use crate::search::{Fusion, SearchParams, SearchResult};
use crate::synth::{OwnedBlock, Rng};
use crate::{kernels::Isa, summary, Geometry, MemoryFile};
use std::path::Path;

/// 12 slots of 8-byte codes as SmolLM2's layout keeps, in short blocks so
/// a test history has thousands.
fn geometry() -> Geometry {
    Geometry {
        block_tokens: 16,
        slots: 12,
        ..Geometry::smollm2()
    }
}

fn dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// `n` random blocks, with the blocks of `needles` leaning toward their
/// query in slots 0..6 (summaries and one token's code). Slots `junk..`
/// of every block get random bytes from a second stream seeded by
/// `junk_seed`, so two files differ only there.
fn write(
    path: &Path,
    n: u64,
    needles: &[(u64, &[f32])],
    junk: usize,
    junk_seed: u64,
) -> MemoryFile {
    let g = geometry();
    let (d, sb, bt) = (g.dims(), g.summary_bytes(), g.block_tokens as usize);
    let mut mf = MemoryFile::create(path, [1; 32], g, b"").unwrap();
    let mut rng = Rng::new(5);
    let mut other = Rng::new(junk_seed);
    for i in 0..n {
        let len = if i % 7 == 3 { 5 } else { bt };
        let mut b = OwnedBlock::random(&mut rng, &g, len);
        if let Some((_, q)) = needles.iter().find(|(at, _)| *at == i) {
            for s in 0..6 {
                let mix: Vec<f32> = q[s * d..(s + 1) * d]
                    .iter()
                    .map(|&x| x + 0.9 * rng.gauss())
                    .collect();
                summary::quantize(&mix, &mut b.summaries[s * sb..(s + 1) * sb]);
                let code = &mut b.codes[(s * len + 2) * 8..][..8];
                code.fill(0);
                for (j, &x) in mix.iter().enumerate() {
                    if x > 0.0 {
                        code[j / 8] |= 1 << (j % 8);
                    }
                }
            }
        }
        other.fill(&mut b.codes[junk * len * 8..]);
        let mut v = vec![0f32; d];
        for s in junk..g.slots as usize {
            v.iter_mut().for_each(|x| *x = other.gauss());
            summary::quantize(&v, &mut b.summaries[s * sb..(s + 1) * sb]);
        }
        mf.append(&b.as_in()).unwrap();
    }
    mf.commit().unwrap();
    mf
}

fn assert_same(a: &SearchResult, b: &SearchResult, what: &str) {
    assert_eq!(a.coarse, b.coarse, "{what}: coarse candidates");
    assert_eq!(a.summary, b.summary, "{what}: summary scores");
    assert_eq!(a.fine, b.fine, "{what}: fine scores");
    let bits = |r: &SearchResult| {
        r.hits
            .iter()
            .map(|h| (h.block, h.score.to_bits()))
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(a), bits(b), "{what}: hits");
}

/// Queries as the engine makes them and worse: random in some slots, zero
/// in others (slots 8..12 for most, random subsets for some, all zero for
/// one), some aimed at planted blocks.
fn queries(rng: &mut Rng, m: usize, aimed: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let g = geometry();
    let d = g.dims();
    (0..m)
        .map(|i| {
            let mut q: Vec<f32> = match aimed.get(i % 5) {
                Some(a) if i % 2 == 0 => a.clone(),
                _ => (0..g.slots as usize * d).map(|_| rng.gauss()).collect(),
            };
            for s in 0..g.slots as usize {
                let zero = match i % 4 {
                    0 | 1 => s >= 8,
                    2 => rng.next().is_multiple_of(3),
                    _ => i == 7 || s >= 10,
                };
                if zero {
                    q[s * d..(s + 1) * d].fill(0.0);
                }
            }
            q
        })
        .collect()
}

#[test]
fn a_batch_equals_one_search_per_query() {
    let g = geometry();
    let d = dir();
    let mut rng = Rng::new(9);
    let aimed: Vec<Vec<f32>> = (0..3)
        .map(|_| {
            (0..g.slots as usize * g.dims())
                .map(|_| rng.gauss())
                .collect()
        })
        .collect();
    let needles: Vec<(u64, &[f32])> = [(41u64, 0usize), (1500, 1), (2990, 2)]
        .iter()
        .map(|&(b, i)| (b, aimed[i].as_slice()))
        .collect();
    // 3000 blocks: three tiles of the sign layout, the last one partial.
    let mf = write(&d.path().join("m.mem"), 3000, &needles, 12, 0);
    let base = SearchParams {
        k: 8,
        coarse_candidates: 256,
        fine_candidates: 32,
        ..SearchParams::default()
    };
    let variants: Vec<SearchParams> = vec![
        base.clone(),
        SearchParams {
            fusion: Fusion::Rrf { k: 60.0 },
            threads: 3,
            ..base.clone()
        },
        SearchParams {
            threads: 1,
            coarse_slots: Some(vec![0, 1, 2, 9]),
            ..base.clone()
        },
        // A repeated slot counts twice, as in a single search.
        SearchParams {
            coarse_slots: Some(vec![3, 0, 0, 5, 11]),
            ..base.clone()
        },
        // The coarse tier skipped (the history is within its candidates).
        SearchParams {
            coarse_candidates: 4000,
            ..base.clone()
        },
        SearchParams {
            coarse_candidates: 0,
            fine_candidates: 0,
            k: 3,
            ..base.clone()
        },
        // Every block to the fine pass: the summary tier skipped too.
        SearchParams {
            fine_candidates: 3000,
            ..base.clone()
        },
    ];
    for (vi, p) in variants.iter().enumerate() {
        for isa in Isa::supported() {
            for m in [1usize, 2, 3, 5, 8, 9, 13] {
                let qs = queries(&mut rng, m, &aimed);
                let p = SearchParams {
                    isa: Some(isa),
                    ..p.clone()
                };
                let refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
                let many = mf.search_many(&refs, &p).unwrap();
                assert_eq!(many.len(), m);
                for (i, q) in qs.iter().enumerate() {
                    let one = mf.search(q, &p).unwrap();
                    assert_same(
                        &many[i],
                        &one,
                        &format!("variant {vi} {} m {m} query {i}", isa.name()),
                    );
                }
            }
        }
    }
    // The aimed queries find their blocks (the comparison is not of empty
    // results).
    let refs: Vec<&[f32]> = aimed.iter().map(|q| q.as_slice()).collect();
    let r = mf.search_many(&refs, &base).unwrap();
    for ((b, _), r) in needles.iter().zip(&r) {
        assert_eq!(r.hits[0].block, *b);
        assert_eq!(r.coarse.len(), 256);
    }
    assert!(mf.search_many(&[], &base).unwrap().is_empty());
}

#[test]
fn bad_queries_in_a_batch_are_named() {
    let d = dir();
    let mf = write(&d.path().join("m.mem"), 40, &[], 12, 0);
    let n = 12 * 64;
    let good = vec![0.5f32; n];
    let mut nan = good.clone();
    nan[64 * 3 + 5] = f32::NAN;
    let e = mf
        .search_many(&[&good, &good, &nan], &SearchParams::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("query 2: slot 3 dim 5 is NaN"), "{e}");
    let e = mf
        .search_many(&[&good, &good[..10]], &SearchParams::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("query 1: 10 floats"), "{e}");
    let p = SearchParams {
        coarse_candidates: 8,
        fine_candidates: 4,
        coarse_slots: Some(vec![12]),
        ..SearchParams::default()
    };
    let e = mf.search_many(&[&good], &p).unwrap_err().to_string();
    assert!(e.contains("coarse slot 12 does not exist"), "{e}");
}

/// A zero query slot is skipped in every tier: two files that differ only
/// in slots 8..12 (codes and summaries) give bit-identical results to
/// queries that are zero there, per tier, with one search or a batch.
#[test]
fn zero_query_slots_read_nothing_of_their_slots() {
    let g = geometry();
    let d = dir();
    let mut rng = Rng::new(21);
    let aimed: Vec<f32> = (0..g.slots as usize * g.dims())
        .map(|_| rng.gauss())
        .collect();
    let needles = [(777u64, aimed.as_slice())];
    let a = write(&d.path().join("a.mem"), 2500, &needles, 8, 1);
    let b = write(&d.path().join("b.mem"), 2500, &needles, 8, 2);
    assert_ne!(
        a.read_block(5).unwrap().codes(9),
        b.read_block(5).unwrap().codes(9),
        "the files differ in the zero slots"
    );
    let mut qs = vec![aimed.clone()];
    qs.extend((0..4).map(|_| (0..aimed.len()).map(|_| rng.gauss()).collect::<Vec<f32>>()));
    for q in qs.iter_mut() {
        q[8 * 64..].fill(0.0);
    }
    let refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
    for fusion in [Fusion::ZSum, Fusion::Rrf { k: 2.0 }] {
        let p = SearchParams {
            k: 8,
            coarse_candidates: 200,
            fine_candidates: 24,
            fusion,
            ..SearchParams::default()
        };
        let (ra, rb) = (
            a.search_many(&refs, &p).unwrap(),
            b.search_many(&refs, &p).unwrap(),
        );
        for (i, (x, y)) in ra.iter().zip(&rb).enumerate() {
            assert_same(x, y, &format!("{fusion:?} query {i}"));
            assert!(x
                .fine
                .iter()
                .all(|r| r.scores[8..].iter().all(|&s| s == 0.0)));
            assert_same(&a.search(&qs[i], &p).unwrap(), y, "single search");
        }
        assert_eq!(ra[0].hits[0].block, 777);
    }
}

#[test]
fn a_fine_pass_over_every_block_ranks_every_token() {
    // fine_candidates covering the history: the hits are the best blocks
    // by every token's code (brute force here), with no summary read.
    use crate::search::{best, fine_scores, fuse, FineTables, Queries, SlotScores};
    let d = dir();
    let mut rng = Rng::new(21);
    let mf = write(&d.path().join("m.mem"), 700, &[], 12, 0);
    let p = SearchParams {
        k: 10,
        fine_candidates: 700,
        ..SearchParams::default()
    };
    for isa in Isa::supported() {
        for q in queries(&mut rng, 4, &[]) {
            let p = SearchParams {
                isa: Some(isa),
                ..p.clone()
            };
            let r = mf.search(&q, &p).unwrap();
            assert!(r.summary.is_empty(), "no summary scored");
            assert_eq!(r.fine.len(), 700);
            let qs = Queries::new(mf.index(), &q).unwrap();
            let tables = FineTables::new(&qs, geometry().slots as usize);
            let mut buf = Vec::new();
            let rows: Vec<SlotScores> = (0..700u64)
                .map(|b| SlotScores {
                    block: b,
                    scores: fine_scores(&mf, &qs, &tables, b, isa, &mut buf).unwrap(),
                })
                .collect();
            let want = best(&rows, &fuse(&rows, p.fusion), p.k);
            let blocks = |h: &[crate::search::Hit]| h.iter().map(|h| h.block).collect::<Vec<_>>();
            assert_eq!(blocks(&r.hits), blocks(&want), "{}", isa.name());
        }
    }
}
