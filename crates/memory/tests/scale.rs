//! The scale benchmark's code path at a size CI affords: 1M tokens in
//! SmolLM2's geometry (310 MB on disk), planted needles, the full tiered
//! search. Recall of the clear needles is checked; latency is printed and
//! checked only loosely (a shared CI machine, an unoptimized test build).
//! The 100M-token numbers come from `examples/memory_scale.rs`.

use memory::search::SearchParams;
use memory::synth::{write_haystack, HaystackSpec};
use memory::{verify, Geometry, MemoryFile, Mode};
use std::time::{Duration, Instant};

#[test]
fn one_million_tokens_search_finds_the_needles() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("scale.mem");
    let spec = HaystackSpec {
        tokens: 1 << 20,
        needles_per_strength: 8,
        summary_cos: vec![0.3, 0.5],
        ..HaystackSpec::default()
    };
    let t = Instant::now();
    let mut mf = MemoryFile::create(&p, [0; 32], Geometry::smollm2(), b"").unwrap();
    let needles = write_haystack(&mut mf, &spec, |_| {}).unwrap();
    let write = t.elapsed();
    drop(mf);
    let t = Instant::now();
    let mf = MemoryFile::open(&p, None, Mode::Read).unwrap();
    let open = t.elapsed();
    assert_eq!(mf.len_tokens(), 1 << 20);
    let params = SearchParams {
        coarse_candidates: 1024,
        ..SearchParams::default()
    };
    let mut worst = Duration::ZERO;
    let mut found = [0usize; 2];
    for n in &needles {
        let t = Instant::now();
        let r = mf.search(&n.query, &params).unwrap();
        worst = worst.max(t.elapsed());
        assert_eq!(r.coarse.len(), 1024, "the coarse tier ran");
        let k = (n.summary_cos > 0.4) as usize;
        found[k] += r.hits.iter().any(|h| h.block == n.block) as usize;
    }
    eprintln!(
        "1M tokens: wrote in {:.1} s, opened in {:.2} s, index {:.1} MB; search worst {:.1} ms; \
         needles found: {}/8 at summary cos 0.3, {}/8 at 0.5",
        write.as_secs_f64(),
        open.as_secs_f64(),
        mf.index().memory_bytes() as f64 / 1e6,
        worst.as_secs_f64() * 1e3,
        found[0],
        found[1]
    );
    assert_eq!(found[1], 8, "every clear needle is found");
    assert!(found[0] >= 6, "most faint needles are found");
    assert!(worst < Duration::from_secs(2), "search took {worst:?}");
    assert!(verify(&p).unwrap().is_clean());
}
