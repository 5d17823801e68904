//! Scale benchmark for the memory store (issue 18 §4) in the engine's
//! geometry of today: a synthetic history of N tokens whose blocks keep 12
//! slots of 8-byte codes, of which the first 8 search; planted needle
//! blocks; per needle one retrieval = 8 queries (the first aimed at the
//! needle, 7 random, all zero in slots 8..12), k = 32 blocks each. Times
//! whole retrievals and counts what each tier keeps.
//!
//! ```text
//! cargo run --release -p cachefit-memory --example memory_scale -- \
//!     --tokens 100000000 --path /tmp/scale.mem [--keep] [--reuse] [--cold] [--reopen] \
//!     [--no-search] [--variant NAME]... [--slots 12] [--search-slots 8] [--queries 8] [--k 32] [--fine 512]
//! ```
//! `--reuse` searches an existing file made with the same options (the
//! needles and their queries are read from `PATH.needles`); `--cold` drops
//! the file's pages from the page cache before every retrieval, so the
//! fine pass reads from disk; `--reopen` times opening (the index
//! rebuild). Variants are taken in turn for each retrieval, so changes in
//! the machine's load hit them alike. scripts/memory-scale.sh runs the
//! 100M-token case.

use memory::search::{SearchParams, SearchResult};
use memory::synth::{write_haystack, HaystackSpec, Needle};
use memory::{Geometry, MemoryFile, Mode};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Args {
    tokens: u64,
    path: PathBuf,
    keep: bool,
    reuse: bool,
    cold: bool,
    reopen: bool,
    no_search: bool,
    per_strength: usize,
    slots: u32,
    search_slots: usize,
    queries: usize,
    k: usize,
    /// Blocks the fine pass scores token by token (the engine's recall
    /// uses 512: engine::memory::session's FINE_CANDIDATES).
    fine: usize,
    /// Only the variants whose names contain one of these.
    variants: Vec<String>,
}

fn args() -> Args {
    let mut a = Args {
        tokens: 1 << 20,
        path: std::env::temp_dir().join("memory-scale.mem"),
        keep: false,
        reuse: false,
        cold: false,
        reopen: false,
        no_search: false,
        per_strength: 16,
        slots: 12,
        search_slots: 8,
        queries: 8,
        k: 32,
        fine: 512,
        variants: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--tokens" => a.tokens = val().parse().expect("--tokens N"),
            "--path" => a.path = PathBuf::from(val()),
            "--needles" => a.per_strength = val().parse().expect("--needles N"),
            "--slots" => a.slots = val().parse().expect("--slots N"),
            "--search-slots" => a.search_slots = val().parse().expect("--search-slots N"),
            "--queries" => a.queries = val().parse().expect("--queries N"),
            "--k" => a.k = val().parse().expect("--k N"),
            "--fine" => a.fine = val().parse().expect("--fine N"),
            "--keep" => a.keep = true,
            "--reuse" => a.reuse = true,
            "--cold" => a.cold = true,
            "--reopen" => a.reopen = true,
            "--no-search" => a.no_search = true,
            "--variant" => a.variants.push(val()),
            _ => panic!("unknown option {k}"),
        }
    }
    a
}

fn pct(d: &[Duration], p: f64) -> f64 {
    let mut d = d.to_vec();
    d.sort();
    d[((d.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

/// CPU time of the whole process (all threads) so far.
fn cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn drop_cache(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
}

/// How a retrieval's queries are searched.
#[derive(Clone, Copy, PartialEq)]
enum Call {
    /// One `search_many` for all of them.
    Batch,
    /// One `search` each, as the engine did before `search_many`.
    Loop,
}

struct Variant {
    name: &'static str,
    call: Call,
    params: SearchParams,
    /// Run without `--variant` naming it (the others change results or
    /// take seconds per retrieval at 100M).
    default: bool,
}

/// The engine's fusion of a retrieval's rankings (MemorySession::recall):
/// reciprocal rank with offset 2, each query weighted by how far its best
/// block stands out from the mean of its top k. Best first.
fn fuse_like_the_engine(results: &[SearchResult]) -> Vec<u64> {
    let mut fused: Vec<(u64, f32)> = Vec::new();
    for r in results {
        let Some(best) = r.hits.first() else { continue };
        let mean = r.hits.iter().map(|h| h.score).sum::<f32>() / r.hits.len() as f32;
        let weight = (best.score - mean).max(0.0);
        for (rank, h) in r.hits.iter().enumerate() {
            let add = weight / (2.0 + rank as f32);
            match fused.iter_mut().find(|(b, _)| *b == h.block) {
                Some((_, s)) => *s += add,
                None => fused.push((h.block, add)),
            }
        }
    }
    fused.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    fused.into_iter().map(|(b, _)| b).collect()
}

fn main() {
    let a = args();
    let spec = HaystackSpec {
        tokens: a.tokens,
        needles_per_strength: a.per_strength,
        search_slots: a.search_slots,
        needle_slots: a.search_slots,
        queries_per_retrieval: a.queries,
        ..HaystackSpec::default()
    };
    let g = Geometry {
        slots: a.slots,
        ..Geometry::smollm2()
    };
    println!(
        "geometry: B={} S={} D={} code_bytes={} ids u16; {} slots search, {} queries per retrieval, k={}; \
         needles: {} per summary cosine {:?}, in all searching slots, needle token cosine {}",
        g.block_tokens,
        g.slots,
        g.dims(),
        g.code_bytes,
        spec.search_slots,
        spec.queries_per_retrieval,
        a.k,
        spec.needles_per_strength,
        spec.summary_cos,
        spec.token_cos
    );
    let (mf, needles): (MemoryFile, Vec<Needle>) = if a.reuse && a.path.exists() {
        // A writer's open writes the index file if it is missing.
        let t = Instant::now();
        let w = MemoryFile::open(&a.path, None, Mode::Write).unwrap();
        println!(
            "writer open: {:.1} s ({} of {} blocks from the index file)",
            t.elapsed().as_secs_f64(),
            w.open_report().from_index_file,
            w.len_blocks()
        );
        drop(w);
        let t = Instant::now();
        let mf = MemoryFile::open(&a.path, None, Mode::Read).unwrap();
        println!(
            "reader open (warm page cache, index file): {:.2} s",
            t.elapsed().as_secs_f64()
        );
        let needles = read_needles(&a.path);
        (mf, needles)
    } else {
        let _ = std::fs::remove_file(&a.path);
        let t = Instant::now();
        let mut mf = MemoryFile::create(&a.path, [0; 32], g, b"scale benchmark").unwrap();
        let blocks = a.tokens.div_ceil(g.block_tokens as u64);
        let needles = write_haystack(&mut mf, &spec, |b| {
            if b % (1 << 18) == 0 && b > 0 {
                let s = t.elapsed().as_secs_f64();
                eprintln!(
                    "  {b}/{blocks} blocks, {:.0} s, {:.2} M tokens/s",
                    s,
                    b as f64 * g.block_tokens as f64 / s / 1e6
                );
            }
        })
        .unwrap();
        let s = t.elapsed().as_secs_f64();
        println!(
            "wrote {} tokens in {:.1} s: {:.2} M tokens/s ({:.0} MB/s), committing every {} blocks",
            mf.len_tokens(),
            s,
            mf.len_tokens() as f64 / s / 1e6,
            mf.file_bytes() as f64 / s / 1e6,
            spec.commit_every
        );
        write_needles(&a.path, &needles);
        (mf, needles)
    };
    let disk = std::fs::metadata(&a.path).unwrap().len();
    let idx_path = memory::sidecar::path_for(&a.path);
    let idx_disk = std::fs::metadata(&idx_path).map_or(0, |m| m.len());
    let tokens = mf.len_tokens() as f64;
    let ix = mf.index();
    let summaries = ix.all_summaries().len();
    let signs = ix.sign_tiles().len();
    println!(
        "file: {} blocks, {} tokens, {:.2} GB on disk ({:.1} bytes/token); index file {:.2} GB ({:.1} bytes/token); \
         index in RAM {:.1} MB ({:.1} bytes/token: summaries {:.1}, sign bits {:.1}, block places {:.1})",
        mf.len_blocks(),
        mf.len_tokens(),
        disk as f64 / 1e9,
        disk as f64 / tokens,
        idx_disk as f64 / 1e9,
        idx_disk as f64 / tokens,
        ix.memory_bytes() as f64 / 1e6,
        ix.memory_bytes() as f64 / tokens,
        summaries as f64 / tokens,
        signs as f64 / tokens,
        (ix.memory_bytes() - summaries - signs) as f64 / tokens,
    );
    if a.reopen {
        for with_index in [true, false] {
            drop_cache(&a.path);
            if idx_path.exists() {
                drop_cache(&idx_path);
            }
            let saved = idx_path.with_extension("idx.away");
            if !with_index {
                std::fs::rename(&idx_path, &saved).unwrap();
            }
            let t = Instant::now();
            let r = MemoryFile::open(&a.path, None, Mode::Read).unwrap();
            println!(
                "reopen, page cache dropped first: {:.2} s for {} blocks, {} from the index file",
                t.elapsed().as_secs_f64(),
                r.len_blocks(),
                r.open_report().from_index_file
            );
            if !with_index {
                std::fs::rename(&saved, &idx_path).unwrap();
            }
        }
    }
    if a.no_search {
        return;
    }
    search(&a, &mf, &needles);
    if !a.keep {
        drop(mf);
        let _ = std::fs::remove_file(&a.path);
        let _ = std::fs::remove_file(needles_path(&a.path));
        let _ = std::fs::remove_file(&idx_path);
    }
}

fn search(a: &Args, mf: &MemoryFile, needles: &[Needle]) {
    let base = SearchParams {
        k: a.k,
        fine_candidates: a.fine,
        ..SearchParams::default()
    };
    let variants: Vec<Variant> = vec![
        Variant {
            name: "batch: one search_many, 2 threads",
            call: Call::Batch,
            params: base.clone(),
            default: true,
        },
        Variant {
            name: "loop: one search per query, 2 threads",
            call: Call::Loop,
            params: base.clone(),
            default: true,
        },
        Variant {
            name: "batch, 1 thread",
            call: Call::Batch,
            params: SearchParams {
                threads: 1,
                ..base.clone()
            },
            default: true,
        },
        Variant {
            name: "batch, avx2 kernels",
            call: Call::Batch,
            params: SearchParams {
                isa: Some(memory::kernels::Isa::Avx2),
                ..base.clone()
            },
            default: true,
        },
        Variant {
            name: "batch, scalar kernels",
            call: Call::Batch,
            params: SearchParams {
                isa: Some(memory::kernels::Isa::Scalar),
                ..base.clone()
            },
            default: false,
        },
        Variant {
            name: "batch, coarse pass over slots 0..4",
            call: Call::Batch,
            params: SearchParams {
                coarse_slots: Some((0..4).collect()),
                ..base.clone()
            },
            default: false,
        },
        Variant {
            name: "batch, fine pass on 64",
            call: Call::Batch,
            params: SearchParams {
                fine_candidates: 64,
                ..base.clone()
            },
            default: false,
        },
    ];
    let variants: Vec<Variant> = variants
        .into_iter()
        .filter(|v| v.params.isa.is_none_or(|i| i.is_supported()))
        .filter(|v| {
            if a.variants.is_empty() {
                v.default
            } else {
                a.variants.iter().any(|n| v.name.contains(n.as_str()))
            }
        })
        .collect();
    #[derive(Default)]
    struct Stats {
        total: Vec<Duration>,
        /// CPU time of the retrieval, all threads.
        cpu: Vec<Duration>,
        coarse: Vec<Duration>,
        summary: Vec<Duration>,
        fine: Vec<Duration>,
        /// Per strength: retrievals, aimed query's needle kept by coarse,
        /// by summary, in its top k, in the fused top 4.
        by_strength: Vec<(f32, [usize; 5])>,
        worst_fused_rank: usize,
    }
    let run = |v: &Variant, queries: &[&[f32]]| -> Vec<SearchResult> {
        match v.call {
            Call::Batch => mf.search_many(queries, &v.params).unwrap(),
            Call::Loop => queries
                .iter()
                .map(|q| mf.search(q, &v.params).unwrap())
                .collect(),
        }
    };
    let mut stats: Vec<Stats> = variants.iter().map(|_| Stats::default()).collect();
    // Untimed: thread start-up and page faults of the index.
    run(&variants[0], &refs(&needles[0]));
    for n in needles {
        let qs = refs(n);
        let mut first: Option<Vec<SearchResult>> = None;
        for (v, st) in variants.iter().zip(stats.iter_mut()) {
            if a.cold {
                drop_cache(&a.path);
            } else {
                // Warm: this variant's candidate records are in the page
                // cache.
                run(v, &qs);
            }
            let (t, c) = (Instant::now(), cpu());
            let r = run(v, &qs);
            st.total.push(t.elapsed());
            st.cpu.push(cpu() - c);
            let sum = |f: fn(&SearchResult) -> Duration| match v.call {
                Call::Batch => f(&r[0]),
                Call::Loop => r.iter().map(f).sum(),
            };
            st.coarse.push(sum(|r| r.timings.coarse));
            st.summary.push(sum(|r| r.timings.summary));
            st.fine.push(sum(|r| r.timings.fine));
            // Variants that only change how the search runs find the same
            // blocks.
            let same_search =
                v.params.coarse_slots.is_none() && v.params.fine_candidates == base.fine_candidates;
            match &first {
                None if same_search => first = Some(r.clone()),
                Some(f) if same_search => {
                    for (x, y) in f.iter().zip(&r) {
                        assert_eq!(x.hits, y.hits, "{} differs from the first variant", v.name);
                    }
                }
                _ => {}
            }
            let i = match st.by_strength.iter().position(|(c, _)| *c == n.summary_cos) {
                Some(i) => i,
                None => {
                    st.by_strength.push((n.summary_cos, [0; 5]));
                    st.by_strength.len() - 1
                }
            };
            let aimed = &r[0];
            let fused = fuse_like_the_engine(&r);
            let s = &mut st.by_strength[i].1;
            s[0] += 1;
            s[1] += aimed.coarse.contains(&n.block) as usize;
            s[2] += aimed.fine.iter().any(|x| x.block == n.block) as usize;
            s[3] += aimed.hits.iter().any(|h| h.block == n.block) as usize;
            if let Some(rank) = fused.iter().position(|&b| b == n.block) {
                s[4] += (rank < 4) as usize;
                if aimed.hits.iter().any(|h| h.block == n.block) {
                    st.worst_fused_rank = st.worst_fused_rank.max(rank + 1);
                }
            }
        }
    }
    println!(
        "retrievals ({}): {} per variant, {} queries each, k = {}",
        if a.cold {
            "page cache dropped before each"
        } else {
            "warm page cache"
        },
        needles.len(),
        needles[0].queries.len(),
        a.k
    );
    for (v, st) in variants.iter().zip(stats) {
        println!(
            "{}: latency per retrieval ms median {:.1} p90 {:.1} max {:.1}, CPU median {:.1} (coarse {:.1}, summary {:.1}, fine {:.1} median)",
            v.name,
            pct(&st.total, 0.5),
            pct(&st.total, 0.9),
            pct(&st.total, 1.0),
            pct(&st.cpu, 0.5),
            pct(&st.coarse, 0.5),
            pct(&st.summary, 0.5),
            pct(&st.fine, 0.5),
        );
        println!(
            "    worst fused rank of a needle its aimed query found: {}",
            st.worst_fused_rank
        );
        for (c, s) in st.by_strength {
            println!(
                "    summary cos {c:.2}: aimed query kept it in coarse {}/{}, summary {}/{}, top {} {}/{}; fused top 4 {}/{}",
                s[1], s[0], s[2], s[0], a.k, s[3], s[0], s[4], s[0]
            );
        }
    }
}

fn needles_path(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".needles");
    PathBuf::from(s)
}

/// The needles next to the file, for `--reuse`: block, cosine, queries.
fn write_needles(p: &Path, needles: &[Needle]) {
    let mut out = Vec::new();
    for n in needles {
        out.extend_from_slice(&n.block.to_le_bytes());
        out.extend_from_slice(&n.summary_cos.to_le_bytes());
        out.extend_from_slice(&(n.queries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(n.queries[0].len() as u32).to_le_bytes());
        for q in n.queries.iter().flatten() {
            out.extend_from_slice(&q.to_le_bytes());
        }
    }
    std::fs::write(needles_path(p), out).unwrap();
}

fn read_needles(p: &Path) -> Vec<Needle> {
    let b = std::fs::read(needles_path(p)).expect("--reuse needs the .needles file");
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as usize;
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let block = u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let summary_cos = f32::from_le_bytes(b[i + 8..i + 12].try_into().unwrap());
        let (m, n) = (u32_at(i + 12), u32_at(i + 16));
        i += 20;
        let queries = (0..m)
            .map(|_| {
                let q = b[i..i + 4 * n]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                i += 4 * n;
                q
            })
            .collect();
        out.push(Needle {
            block,
            summary_cos,
            queries,
        });
    }
    out
}

fn refs(n: &Needle) -> Vec<&[f32]> {
    n.queries.iter().map(|q| q.as_slice()).collect()
}
