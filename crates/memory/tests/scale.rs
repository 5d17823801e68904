//! The scale benchmark's code path at a size CI affords: 2M tokens in the
//! engine's geometry of today (12 slots of 8-byte codes, the first 8
//! search; 220 MB on disk), planted needles, and per needle one retrieval
//! of 8 queries (k = 32 each) through `search_many`. The batch must equal
//! a search per query; recall of the clear needles is checked; latency is
//! printed and checked only loosely (a shared CI machine, an unoptimized
//! test build). The 100M-token numbers come from `examples/memory_scale.rs`.

use memory::search::SearchParams;
use memory::synth::{write_haystack, HaystackSpec};
use memory::{verify, Geometry, MemoryFile, Mode};
use std::time::{Duration, Instant};

#[test]
fn two_million_tokens_batch_search_finds_the_needles() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("scale.mem");
    let spec = HaystackSpec {
        tokens: 1 << 21,
        needles_per_strength: 8,
        summary_cos: vec![0.15, 0.3],
        ..HaystackSpec::default()
    };
    let g = Geometry {
        slots: 12,
        ..Geometry::smollm2()
    };
    let t = Instant::now();
    let mut mf = MemoryFile::create(&p, [0; 32], g, b"").unwrap();
    let needles = write_haystack(&mut mf, &spec, |_| {}).unwrap();
    let write = t.elapsed();
    drop(mf);
    let t = Instant::now();
    let mf = MemoryFile::open(&p, None, Mode::Read).unwrap();
    let open = t.elapsed();
    assert_eq!(mf.len_tokens(), 1 << 21);
    let params = SearchParams {
        k: 32,
        ..SearchParams::default()
    };
    let mut worst = Duration::ZERO;
    let mut found = [0usize; 2];
    for (i, n) in needles.iter().enumerate() {
        assert_eq!(n.queries.len(), 8);
        assert!(n
            .queries
            .iter()
            .all(|q| q[8 * 64..].iter().all(|&x| x == 0.0)));
        let qs: Vec<&[f32]> = n.queries.iter().map(|q| q.as_slice()).collect();
        let t = Instant::now();
        let r = mf.search_many(&qs, &params).unwrap();
        worst = worst.max(t.elapsed());
        assert_eq!(r[0].coarse.len(), 2048, "the coarse tier ran");
        let k = (n.summary_cos > 0.2) as usize;
        found[k] += r[0].hits.iter().any(|h| h.block == n.block) as usize;
        // A few retrievals against one search per query.
        if i % 5 == 0 {
            for (q, many) in qs.iter().zip(&r) {
                let one = mf.search(q, &params).unwrap();
                assert_eq!(one.hits, many.hits);
                assert_eq!(one.coarse, many.coarse);
            }
        }
    }
    eprintln!(
        "2M tokens: wrote in {:.1} s, opened in {:.2} s, index {:.1} MB; retrieval (8 queries) worst {:.1} ms; \
         needles found: {}/8 at summary cos 0.15, {}/8 at 0.3",
        write.as_secs_f64(),
        open.as_secs_f64(),
        mf.index().memory_bytes() as f64 / 1e6,
        worst.as_secs_f64() * 1e3,
        found[0],
        found[1]
    );
    assert_eq!(found[1], 8, "every clear needle is found");
    assert!(found[0] >= 4, "at least half the faint needles are found");
    assert!(worst < Duration::from_secs(4), "a retrieval took {worst:?}");
    assert!(verify(&p).unwrap().is_clean());
}
