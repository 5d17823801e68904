//! Store tests: round trips, truncation at every byte, bit flips, damage
//! vs torn tail, locking, bad headers, write failures, search.

use crate::format::{COMMIT_SLOT_STRIDE, HEADER_FIXED, RECORD_HEADER};
use crate::sidecar;
use crate::synth::{nth_block, OwnedBlock, Rng};
use crate::*;
use std::path::{Path, PathBuf};

const FP: [u8; 32] = [7; 32];

fn tiny() -> Geometry {
    Geometry {
        block_tokens: 4,
        slots: 2,
        code_bytes: 1,
        extra_bytes: 1,
        id_bytes: 2,
    }
}

/// In memory when the machine has a tmpfs: these tests open files
/// thousands of times and sync hundreds; the crash test uses a disk.
fn dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// A file of `n` deterministic blocks, committed every `every`.
fn build(path: &Path, g: Geometry, seed: u64, n: u64, every: u64) -> Vec<OwnedBlock> {
    let mut mf = MemoryFile::create(path, FP, g, b"params").unwrap();
    let mut blocks = Vec::new();
    for i in 0..n {
        let b = nth_block(seed, &g, i);
        assert_eq!(mf.append(&b.as_in()).unwrap(), i);
        blocks.push(b);
        if (i + 1) % every == 0 {
            mf.commit().unwrap();
        }
    }
    mf.commit().unwrap();
    blocks
}

fn assert_prefix(mf: &MemoryFile, blocks: &[OwnedBlock]) {
    assert!(mf.len_blocks() as usize <= blocks.len());
    let mut tokens = 0;
    for i in 0..mf.len_blocks() {
        let b = mf.read_block(i).unwrap();
        assert!(blocks[i as usize].matches(&b), "block {i} differs");
        assert_eq!(b.first_token, tokens);
        tokens += b.n_tokens() as u64;
    }
    assert_eq!(mf.len_tokens(), tokens);
}

fn copy_prefix(src: &Path, dst: &Path, len: usize) {
    let bytes = std::fs::read(src).unwrap();
    std::fs::write(dst, &bytes[..len]).unwrap();
}

#[test]
fn records_round_trip_in_both_id_widths() {
    let d = dir();
    for (i, g) in [
        Geometry::smollm2(),
        Geometry {
            id_bytes: 4,
            extra_bytes: 24,
            ..tiny()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let p = d.path().join(format!("m{i}.mem"));
        let blocks = build(&p, g, 11, 37, 8);
        let mf = MemoryFile::open(&p, Some(&FP), Mode::Read).unwrap();
        assert_eq!(mf.len_blocks(), 37);
        assert_eq!(mf.header().params, b"params");
        assert_eq!(
            mf.open_report(),
            &OpenReport {
                from_index_file: 37,
                ..OpenReport::default()
            }
        );
        assert_prefix(&mf, &blocks);
        let tokens: u64 = blocks.iter().map(|b| b.ids.len() as u64).sum();
        assert_eq!(mf.len_tokens(), tokens);
        assert_eq!(mf.index().block_of_token(tokens - 1), Some(36));
        assert!(verify(&p).unwrap().is_clean());
    }
}

#[test]
fn smollm2_full_blocks_fit_the_budget() {
    let g = Geometry::smollm2();
    assert_eq!(g.record_len(64), 19_816);
    let b = Budget::of(&g);
    assert!(b.total() <= 320.0, "{}", b.total());
    assert!((b.total() - 19_816.0 / 64.0).abs() < 1e-9);
}

#[test]
fn truncation_at_every_byte_reopens_to_a_prefix() {
    let d = dir();
    let src = d.path().join("src.mem");
    let blocks = build(&src, tiny(), 3, 9, 2);
    let full = std::fs::read(&src).unwrap();
    let data_start = MemoryFile::open(&src, None, Mode::Read)
        .unwrap()
        .header()
        .data_start() as usize;
    let cut = d.path().join("cut.mem");
    for len in 0..=full.len() {
        copy_prefix(&src, &cut, len);
        match MemoryFile::open(&cut, Some(&FP), Mode::Read) {
            Err(e) => {
                assert!(len < data_start, "cut at {len} of {}: {e}", full.len());
                assert!(
                    matches!(
                        e,
                        Error::HeaderTruncated { .. } | Error::NotMemoryFile { .. }
                    ),
                    "cut at {len}: {e}"
                );
            }
            Ok(mf) => {
                assert!(len >= data_start);
                assert_prefix(&mf, &blocks);
                // Whole records up to the cut survive.
                let whole = mf.file_bytes();
                assert!(
                    whole as usize <= len && len - whole as usize <= 4 * 19 + RECORD_HEADER + 8
                );
                drop(mf);
                // A writer cuts the tail; the file then verifies clean and
                // takes more blocks.
                let mut w = MemoryFile::open(&cut, Some(&FP), Mode::Write).unwrap();
                let n = w.len_blocks();
                assert_eq!(std::fs::metadata(&cut).unwrap().len(), w.file_bytes());
                w.append(&nth_block(3, &tiny(), n).as_in()).unwrap();
                w.commit().unwrap();
                drop(w);
                let rep = verify(&cut).unwrap();
                assert!(rep.is_clean(), "cut at {len}: {:?}", rep.problems);
                assert_eq!(rep.valid_blocks, n + 1);
            }
        }
    }
}

#[test]
fn a_bit_flip_anywhere_is_found_by_verify() {
    let d = dir();
    let src = d.path().join("src.mem");
    build(&src, tiny(), 5, 6, 3);
    let full = std::fs::read(&src).unwrap();
    let flipped = d.path().join("flip.mem");
    let mut rng = Rng::new(9);
    for at in 0..full.len() {
        let mut b = full.clone();
        b[at] ^= 1 << rng.below(8);
        std::fs::write(&flipped, &b).unwrap();
        let found = match verify(&flipped) {
            Err(_) => true,
            Ok(r) => !r.is_clean(),
        };
        assert!(found, "flip at byte {at} went unnoticed");
    }
}

#[test]
fn damage_inside_committed_data_is_an_error_not_a_cut() {
    let d = dir();
    let p = d.path().join("m.mem");
    let blocks = build(&p, tiny(), 6, 8, 1);
    let mf = MemoryFile::open(&p, None, Mode::Read).unwrap();
    let off = mf.index().meta(3).offset as usize;
    let last = mf.index().meta(7).offset as usize;
    drop(mf);
    let good = std::fs::read(&p).unwrap();
    // A header flip breaks the chain the open walks; a payload flip below
    // the commit mark passes the open (it checks structure there) but no
    // read returns the block, and verify reports it.
    for (at, block, header) in [
        (off + 1, 3u64, true),
        (off + RECORD_HEADER + 2, 3, false),
        (last + 40, 7, false),
    ] {
        let mut b = good.clone();
        b[at] ^= 0x10;
        std::fs::write(&p, &b).unwrap();
        // With the index file, open trusts it for the committed blocks (it
        // checks only the last one's header): the damage shows on reading.
        let mf = MemoryFile::open(&p, None, Mode::Read).unwrap();
        assert!(
            matches!(mf.read_block(block), Err(Error::RecordChecksum { block: bl, .. }) if bl == block)
        );
        drop(mf);
        for mode in [Mode::Read, Mode::Write] {
            let _ = std::fs::remove_file(sidecar::path_for(&p));
            match MemoryFile::open(&p, None, mode) {
                Err(Error::Damaged { block: bl, .. }) if header && bl == block => {}
                Ok(mf) if !header => {
                    assert!(
                        matches!(mf.read_block(block), Err(Error::RecordChecksum { block: bl, .. }) if bl == block)
                    );
                    assert_prefix_except(&mf, &blocks, block);
                }
                other => panic!("flip at {at}: {other:?}"),
            }
        }
        let rep = verify(&p).unwrap();
        assert_eq!(rep.problems.len(), 1, "{:?}", rep.problems);
        assert_eq!(rep.problems[0].block, Some(block));
        assert_eq!(
            std::fs::metadata(&p).unwrap().len() as usize,
            good.len(),
            "nothing was cut"
        );
    }
    let msg = {
        let mut b = good.clone();
        b[off + 1] ^= 0x10;
        std::fs::write(&p, &b).unwrap();
        let _ = std::fs::remove_file(sidecar::path_for(&p));
        MemoryFile::open(&p, None, Mode::Write)
            .unwrap_err()
            .to_string()
    };
    assert!(msg.contains("block 3") && msg.contains("verify"), "{msg}");
}

fn assert_prefix_except(mf: &MemoryFile, blocks: &[OwnedBlock], bad: u64) {
    for i in (0..mf.len_blocks()).filter(|&i| i != bad) {
        assert!(blocks[i as usize].matches(&mf.read_block(i).unwrap()));
    }
}

#[test]
fn torn_tail_past_the_commit_is_cut_and_earlier_commits_survive() {
    let d = dir();
    let p = d.path().join("m.mem");
    let g = tiny();
    let mut mf = MemoryFile::create(&p, FP, g, b"").unwrap();
    let blocks: Vec<OwnedBlock> = (0..6).map(|i| nth_block(1, &g, i)).collect();
    for b in &blocks[..4] {
        mf.append(&b.as_in()).unwrap();
    }
    mf.commit().unwrap();
    for b in &blocks[4..] {
        mf.append(&b.as_in()).unwrap();
    }
    let end = mf.file_bytes();
    drop(mf);
    // Tear the last (uncommitted) record, and flip a byte of the one before.
    let mut bytes = std::fs::read(&p).unwrap();
    bytes.truncate(end as usize - 3);
    let r4 = MemoryFile::open(&p, None, Mode::Read)
        .unwrap()
        .index()
        .meta(4)
        .offset as usize;
    bytes[r4 + 40] ^= 1;
    std::fs::write(&p, &bytes).unwrap();

    let r = MemoryFile::open(&p, None, Mode::Read).unwrap();
    assert_eq!(r.len_blocks(), 4);
    assert!(r.open_report().tail_bytes > 0);
    assert!(r
        .open_report()
        .tail_reason
        .as_deref()
        .unwrap()
        .contains("checksum"));
    assert_eq!(
        std::fs::metadata(&p).unwrap().len() as usize,
        bytes.len(),
        "a reader cuts nothing"
    );
    drop(r);
    let rep = verify(&p).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
    assert!(rep.notes.iter().any(|n| n.contains("torn tail")));

    let w = MemoryFile::open(&p, None, Mode::Write).unwrap();
    assert_eq!(w.len_blocks(), 4);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), w.file_bytes());
    assert_prefix(&w, &blocks);
}

#[test]
fn uncommitted_but_whole_records_survive_a_writer_that_stops() {
    let d = dir();
    let p = d.path().join("m.mem");
    let g = tiny();
    let mut mf = MemoryFile::create(&p, FP, g, b"").unwrap();
    let blocks: Vec<OwnedBlock> = (0..3).map(|i| nth_block(2, &g, i)).collect();
    for b in &blocks {
        mf.append(&b.as_in()).unwrap();
    }
    drop(mf);
    let w = MemoryFile::open(&p, None, Mode::Write).unwrap();
    assert_eq!(w.len_blocks(), 3);
    assert_eq!(w.committed_blocks(), 3);
    drop(w);
    assert_eq!(verify(&p).unwrap().commit.unwrap().blocks, 3);
}

#[test]
fn a_second_writer_is_refused_and_readers_share() {
    let d = dir();
    let p = d.path().join("m.mem");
    let mut w = MemoryFile::create(&p, FP, tiny(), b"").unwrap();
    w.append(&nth_block(1, &tiny(), 0).as_in()).unwrap();
    w.commit().unwrap();
    let e = MemoryFile::open(&p, None, Mode::Write).unwrap_err();
    assert!(matches!(e, Error::Locked { .. }), "{e}");
    assert!(e.to_string().contains("another writer"));
    let r1 = MemoryFile::open(&p, None, Mode::Read).unwrap();
    let r2 = MemoryFile::open(&p, None, Mode::Read).unwrap();
    assert_eq!((r1.len_blocks(), r2.len_blocks()), (1, 1));
    drop(w);
    let w2 = MemoryFile::open(&p, None, Mode::Write).unwrap();
    assert_eq!(w2.len_blocks(), 1);
    let mut r1 = r1;
    assert!(matches!(
        r1.append(&nth_block(1, &tiny(), 1).as_in()),
        Err(Error::ReadOnly { .. })
    ));
    assert!(matches!(
        MemoryFile::create(&p, FP, tiny(), b""),
        Err(Error::Exists { .. })
    ));
}

#[test]
fn foreign_newer_damaged_and_other_model_files_are_refused_clearly() {
    let d = dir();
    let p = d.path().join("m.mem");
    build(&p, tiny(), 1, 2, 1);
    let good = std::fs::read(&p).unwrap();
    let try_bytes = |b: &[u8]| -> String {
        let q: PathBuf = d.path().join("x.mem");
        std::fs::write(&q, b).unwrap();
        MemoryFile::open(&q, Some(&FP), Mode::Read)
            .unwrap_err()
            .to_string()
    };
    let gguf = try_bytes(b"GGUF\x03\x00\x00\x00 and more bytes than that");
    assert!(gguf.contains("not a cachefit memory file"), "{gguf}");
    assert!(try_bytes(b"").contains("not a cachefit memory file"));

    let mut newer = good.clone();
    newer[8..12].copy_from_slice(&2u32.to_le_bytes());
    let e = try_bytes(&newer);
    assert!(e.contains("version 2 is newer"), "{e}");

    let mut flipped = good.clone();
    flipped[HEADER_FIXED] ^= 1;
    assert!(try_bytes(&flipped).contains("header checksum"));

    let e = MemoryFile::open(&p, Some(&[9; 32]), Mode::Read).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&"07".repeat(32)) && msg.contains(&"09".repeat(32)),
        "{msg}"
    );

    // A header whose fields are hostile but whose checksum is right.
    let mut h = MemoryFile::open(&p, None, Mode::Read)
        .unwrap()
        .header()
        .clone();
    h.geometry.block_tokens = 60_000;
    h.geometry.slots = 4096;
    h.geometry.code_bytes = 512;
    let mut bytes = h.encode();
    bytes.resize(20_000, 0);
    let e = try_bytes(&bytes);
    assert!(e.contains("64 MiB") || e.contains("67108864"), "{e}");
}

#[test]
fn disk_full_cuts_back_to_the_last_commit_and_the_file_still_opens() {
    let d = dir();
    let p = d.path().join("m.mem");
    let g = tiny();
    let mut mf = MemoryFile::create(&p, FP, g, b"").unwrap();
    let blocks: Vec<OwnedBlock> = (0..8).map(|i| nth_block(4, &g, i)).collect();
    for b in &blocks[..3] {
        mf.append(&b.as_in()).unwrap();
    }
    mf.commit().unwrap();
    mf.append(&blocks[3].as_in()).unwrap();
    // Room for half of the next record.
    mf.fail_writes_after = Some(20);
    let e = mf.append(&blocks[4].as_in()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Write {
                committed_blocks: 3,
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("No space left") && msg.contains("still opens"),
        "{msg}"
    );
    assert_eq!(mf.len_blocks(), 3);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), mf.file_bytes());
    // Space again: the writer goes on from the last commit.
    mf.fail_writes_after = None;
    for b in &blocks[3..] {
        mf.append(&b.as_in()).unwrap();
    }
    mf.commit().unwrap();
    drop(mf);
    let r = MemoryFile::open(&p, None, Mode::Read).unwrap();
    assert_eq!(r.len_blocks(), 8);
    assert_prefix(&r, &blocks);
    assert!(verify(&p).unwrap().is_clean());
}

#[test]
fn bad_blocks_are_refused_with_the_reason() {
    let d = dir();
    let p = d.path().join("m.mem");
    let g = tiny();
    let mut mf = MemoryFile::create(&p, FP, g, b"").unwrap();
    let mut b = nth_block(1, &g, 0);
    b.ids = vec![1, 2, 70_000];
    b.codes.truncate(2 * 3);
    b.extra.truncate(3);
    let e = mf.append(&b.as_in()).unwrap_err().to_string();
    assert!(e.contains("id 70000") && e.contains("2-byte"), "{e}");
    b.ids = vec![1; 5];
    assert!(mf
        .append(&b.as_in())
        .unwrap_err()
        .to_string()
        .contains("5 tokens"));
    b.ids = vec![1; 3];
    b.codes.push(0);
    assert!(mf
        .append(&b.as_in())
        .unwrap_err()
        .to_string()
        .contains("codes"));
    assert_eq!(mf.len_blocks(), 0);
}

#[test]
fn commit_slots_alternate_and_a_torn_slot_falls_back() {
    let d = dir();
    let p = d.path().join("m.mem");
    build(&p, tiny(), 1, 5, 1);
    let mf = MemoryFile::open(&p, None, Mode::Read).unwrap();
    let page = mf.header().commit_offset() as usize;
    let end = mf.file_bytes();
    drop(mf);
    let m = verify(&p).unwrap().commit.unwrap();
    assert_eq!((m.end, m.blocks), (end, 5));
    // Tear the newer slot: the older one (one commit back) rules.
    let mut b = std::fs::read(&p).unwrap();
    let newer = page + (m.generation % 2 * COMMIT_SLOT_STRIDE) as usize;
    b[newer + 20] ^= 0xff;
    std::fs::write(&p, &b).unwrap();
    let rep = verify(&p).unwrap();
    assert_eq!(rep.commit.unwrap().generation, m.generation - 1);
    let w = MemoryFile::open(&p, None, Mode::Write).unwrap();
    assert_eq!(w.len_blocks(), 5);
}

/// Plant blocks whose codes and summaries lean toward per-slot query
/// vectors among random ones; every tier must rank them first.
#[test]
fn search_finds_planted_blocks_through_every_tier() {
    let d = dir();
    let p = d.path().join("m.mem");
    let g = Geometry {
        slots: 6,
        ..Geometry::smollm2()
    };
    let mut mf = MemoryFile::create(&p, FP, g, b"").unwrap();
    let mut rng = Rng::new(77);
    let dims = g.dims();
    let queries: Vec<Vec<f32>> = (0..3)
        .map(|_| (0..g.slots as usize * dims).map(|_| rng.gauss()).collect())
        .collect();
    let needles = [37u64, 512, 1999];
    for i in 0..2100u64 {
        let mut b = OwnedBlock::random(&mut rng, &g, 64);
        if let Some(k) = needles.iter().position(|&n| n == i) {
            let q = &queries[k];
            let n = b.ids.len();
            for s in 0..g.slots as usize {
                let qs = &q[s * dims..(s + 1) * dims];
                let mix: Vec<f32> = qs.iter().map(|&x| x + 0.8 * rng.gauss()).collect();
                summary::quantize(
                    &mix,
                    &mut b.summaries[s * g.summary_bytes()..][..g.summary_bytes()],
                );
                // Token 10's code is the query's signs with a little noise.
                let code = &mut b.codes[(s * n + 10) * 8..][..8];
                code.fill(0);
                for (dd, &x) in mix.iter().enumerate() {
                    if x > 0.0 {
                        code[dd / 8] |= 1 << (dd % 8);
                    }
                }
            }
        }
        mf.append(&b.as_in()).unwrap();
    }
    mf.commit().unwrap();
    for (k, q) in queries.iter().enumerate() {
        for fusion in [Fusion::ZSum, Fusion::Rrf { k: 60.0 }] {
            for isa in kernels::Isa::supported() {
                let params = SearchParams {
                    k: 4,
                    coarse_candidates: 256,
                    fine_candidates: 16,
                    fusion,
                    isa: Some(isa),
                    ..SearchParams::default()
                };
                let r = mf.search(q, &params).unwrap();
                assert_eq!(r.coarse.len(), 256, "the coarse pass ran");
                assert!(r.coarse.contains(&needles[k]));
                assert_eq!(r.hits[0].block, needles[k], "{fusion:?} {isa:?}");
                assert_eq!(r.fine.len(), 16);
                assert!(r.fine.iter().all(|s| s.scores.len() == 6));
            }
        }
        // The coarse tier alone ranks the needle first too.
        let qs = search::Queries::new(mf.index(), q).unwrap();
        let all: Vec<u32> = (0..6).collect();
        let c = search::coarse_scores(mf.index(), &qs, &all, 2, kernels::Isa::Scalar);
        let top = (0..c.len()).max_by(|&a, &b| c[a].total_cmp(&c[b])).unwrap();
        assert_eq!(top as u64, needles[k]);
    }
    // Bad queries are refused with the reason.
    let e = mf
        .search(&[0.0; 3], &SearchParams::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("6 slots × 64 dims"), "{e}");
    let mut q = queries[0].clone();
    q[70] = f32::NAN;
    let e = mf
        .search(&q, &SearchParams::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("slot 1 dim 6"), "{e}");
}

#[test]
fn index_after_a_roll_back_equals_a_fresh_one() {
    let d = dir();
    let p = d.path().join("m.mem");
    let g = tiny();
    let mut mf = MemoryFile::create(&p, FP, g, b"").unwrap();
    for i in 0..70 {
        mf.append(&nth_block(8, &g, i).as_in()).unwrap();
    }
    mf.commit().unwrap();
    for i in 70..140 {
        mf.append(&nth_block(8, &g, i).as_in()).unwrap();
    }
    mf.fail_writes_after = Some(0);
    assert!(mf.append(&nth_block(8, &g, 140).as_in()).is_err());
    mf.fail_writes_after = None;
    for i in 70..100 {
        mf.append(&nth_block(8, &g, i).as_in()).unwrap();
    }
    mf.commit().unwrap();
    let fresh = MemoryFile::open(&p, None, Mode::Read).unwrap();
    assert_eq!(fresh.index().sign_tiles(), mf.index().sign_tiles());
    assert_eq!(fresh.index().all_summaries(), mf.index().all_summaries());
    assert_eq!(fresh.index().metas(), mf.index().metas());
}

#[test]
fn the_index_file_gives_the_same_index_as_the_records() {
    let d = dir();
    let p = d.path().join("m.mem");
    let idx = sidecar::path_for(&p);
    let g = tiny();
    build(&p, g, 12, 150, 7);
    let with = MemoryFile::open(&p, None, Mode::Read).unwrap();
    assert_eq!(with.open_report().from_index_file, 150);
    let saved = std::fs::read(&idx).unwrap();
    std::fs::remove_file(&idx).unwrap();
    let without = MemoryFile::open(&p, None, Mode::Read).unwrap();
    assert_eq!(without.open_report().from_index_file, 0);
    let same = |a: &MemoryFile, b: &MemoryFile| {
        assert_eq!(a.index().metas(), b.index().metas());
        assert_eq!(a.index().all_summaries(), b.index().all_summaries());
        assert_eq!(a.index().sign_tiles(), b.index().sign_tiles());
    };
    same(&with, &without);
    assert!(verify(&p)
        .unwrap()
        .notes
        .iter()
        .any(|n| n.contains("no index file")));

    // A damaged entry: the prefix before it is used, the rest read from
    // the records; the next writer rewrites the file whole.
    let el = saved.len().div_ceil(150) - 1;
    let mut bad = saved.clone();
    let at = 64 + 60 * (saved.len() - 64) / 150 + 5;
    bad[at] ^= 1;
    std::fs::write(&idx, &bad).unwrap();
    let part = MemoryFile::open(&p, None, Mode::Read).unwrap();
    assert_eq!(part.open_report().from_index_file, 60, "entry length {el}");
    same(&part, &without);
    drop(MemoryFile::open(&p, None, Mode::Write).unwrap());
    assert_eq!(std::fs::read(&idx).unwrap(), saved);

    // The data file cut short: entries past its end are not used.
    let m100 = with.index().meta(100).offset;
    drop((with, without, part));
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..m100 as usize + 3]).unwrap();
    let cut = MemoryFile::open(&p, None, Mode::Read).unwrap();
    assert_eq!(cut.len_blocks(), 100);
    assert_eq!(cut.open_report().from_index_file, 100);
    drop(cut);
    std::fs::write(&p, &bytes).unwrap();

    // Another file's index file is ignored.
    let q = d.path().join("other.mem");
    build(&q, g, 12, 150, 7);
    std::fs::copy(sidecar::path_for(&q), &idx).unwrap();
    let other = MemoryFile::open(&p, None, Mode::Read).unwrap();
    assert_eq!(other.open_report().from_index_file, 0);
    assert!(verify(&p)
        .unwrap()
        .notes
        .iter()
        .any(|n| n.contains("does not match")));
}
