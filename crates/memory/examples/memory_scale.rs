//! Scale benchmark for the memory store (issue 18 §4): write a synthetic
//! history of N tokens in SmolLM2's geometry with planted needle blocks,
//! then time searches for them and count how many each tier keeps.
//!
//! ```text
//! cargo run --release -p cachefit-memory --example memory_scale -- \
//!     --tokens 100000000 --path /tmp/scale.mem [--keep] [--reuse] [--cold] [--reopen] [--no-search]
//! ```
//! `--reuse` searches an existing file made with the same options (the
//! needles are regenerated from the seed, not read back); `--cold` drops
//! the file's pages from the page cache before every search, so the fine
//! pass reads from disk; `--reopen` times opening (the index rebuild).
//! scripts/memory-scale.sh runs the 100M-token case.

use memory::search::{Fusion, SearchParams};
use memory::synth::{write_haystack, HaystackSpec, Needle};
use memory::{Geometry, MemoryFile, Mode};
use std::path::PathBuf;
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
        variants: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--tokens" => a.tokens = val().parse().expect("--tokens N"),
            "--path" => a.path = PathBuf::from(val()),
            "--needles" => a.per_strength = val().parse().expect("--needles N"),
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

fn pct(d: &mut [Duration], p: f64) -> f64 {
    d.sort();
    d[((d.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

fn drop_cache(path: &std::path::Path) {
    let f = std::fs::File::open(path).unwrap();
    let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
}

fn main() {
    let a = args();
    let spec = HaystackSpec {
        tokens: a.tokens,
        needles_per_strength: a.per_strength,
        ..HaystackSpec::default()
    };
    let g = Geometry::smollm2();
    println!(
        "geometry: B={} S={} D={} code_bytes={} ids u16; needles: {} per summary cosine {:?}, in {} of {} slots, needle token cosine {}",
        g.block_tokens,
        g.slots,
        g.dims(),
        g.code_bytes,
        spec.needles_per_strength,
        spec.summary_cos,
        spec.needle_slots,
        g.slots,
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
        let mf = MemoryFile::open(&a.path, None, Mode::Read).unwrap();
        let needles = read_needles(&a.path);
        (mf, needles)
    } else {
        let _ = std::fs::remove_file(&a.path);
        let t = Instant::now();
        let mut mf = MemoryFile::create(&a.path, [0; 32], g, b"scale benchmark").unwrap();
        let blocks = a.tokens.div_ceil(64);
        let needles = write_haystack(&mut mf, &spec, |b| {
            if b % (1 << 18) == 0 && b > 0 {
                let s = t.elapsed().as_secs_f64();
                eprintln!(
                    "  {b}/{blocks} blocks, {:.0} s, {:.2} M tokens/s",
                    s,
                    b as f64 * 64.0 / s / 1e6
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
    println!(
        "file: {} blocks, {} tokens, {:.2} GB on disk, {:.1} bytes/token; index in RAM: {:.1} MB ({:.1} bytes/token)",
        mf.len_blocks(),
        mf.len_tokens(),
        disk as f64 / 1e9,
        disk as f64 / mf.len_tokens() as f64,
        mf.index().memory_bytes() as f64 / 1e6,
        mf.index().memory_bytes() as f64 / mf.len_tokens() as f64
    );
    if a.reopen {
        let idx = memory::sidecar::path_for(&a.path);
        for with_index in [true, false] {
            drop_cache(&a.path);
            if idx.exists() {
                drop_cache(&idx);
            }
            let saved = idx.with_extension("idx.away");
            if !with_index {
                std::fs::rename(&idx, &saved).unwrap();
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
                std::fs::rename(&saved, &idx).unwrap();
            }
        }
    }

    let all: Vec<u32> = (0..g.slots).collect();
    if a.no_search {
        return;
    }
    let variants: Vec<(&str, SearchParams)> = vec![
        (
            "default (36 coarse slots, 2 threads, z-sum)",
            SearchParams::default(),
        ),
        (
            "rrf fusion",
            SearchParams {
                fusion: Fusion::Rrf { k: 60.0 },
                ..SearchParams::default()
            },
        ),
        (
            "18 coarse slots (every other one)",
            SearchParams {
                coarse_slots: Some(all.iter().copied().step_by(2).collect()),
                ..SearchParams::default()
            },
        ),
        (ORACLE, SearchParams::default()),
        (
            "12 coarse slots: 0..12 (a prefix; the needles' slots are random, so recall drops)",
            SearchParams {
                coarse_slots: Some((0..12).collect()),
                ..SearchParams::default()
            },
        ),
        (
            "fine pass on 64",
            SearchParams {
                fine_candidates: 64,
                ..SearchParams::default()
            },
        ),
        (
            "1 thread",
            SearchParams {
                threads: 1,
                ..SearchParams::default()
            },
        ),
        (
            "scalar kernels",
            SearchParams {
                isa: Some(memory::kernels::Isa::Scalar),
                ..SearchParams::default()
            },
        ),
    ];
    // Round-robin over the variants for each query, so changes in the
    // machine's load (shared with other work) hit all variants alike.
    #[derive(Default)]
    struct Stats {
        total: Vec<Duration>,
        coarse: Vec<Duration>,
        summary: Vec<Duration>,
        fine: Vec<Duration>,
        by_strength: Vec<(f32, [usize; 4])>,
        worst_summary_rank: usize,
    }
    let variants: Vec<(&str, SearchParams)> = variants
        .into_iter()
        .filter(|(name, _)| {
            a.variants.is_empty() || a.variants.iter().any(|v| name.contains(v.as_str()))
        })
        .collect();
    let mut stats: Vec<Stats> = variants.iter().map(|_| Stats::default()).collect();
    // Untimed: thread start-up and page faults of the index.
    mf.search(&needles[0].query, &variants[0].1).unwrap();
    for n in &needles {
        if !a.cold {
            // Warm: the candidates' records are in the page cache.
            mf.search(&n.query, &variants[0].1).unwrap();
        }
        for ((name, p), st) in variants.iter().zip(stats.iter_mut()) {
            let mut p = p.clone();
            if *name == ORACLE {
                p.coarse_slots = Some(needle_slots(&mf, n));
            }
            if a.cold {
                drop_cache(&a.path);
            }
            let t = Instant::now();
            let r = mf.search(&n.query, &p).unwrap();
            st.total.push(t.elapsed());
            st.coarse.push(r.timings.coarse);
            st.summary.push(r.timings.summary);
            st.fine.push(r.timings.fine);
            let i = match st.by_strength.iter().position(|(c, _)| *c == n.summary_cos) {
                Some(i) => i,
                None => {
                    st.by_strength.push((n.summary_cos, [0; 4]));
                    st.by_strength.len() - 1
                }
            };
            let s = &mut st.by_strength[i].1;
            s[0] += 1;
            s[1] += r.coarse.contains(&n.block) as usize;
            s[2] += r.fine.iter().any(|x| x.block == n.block) as usize;
            s[3] += r.hits.iter().any(|h| h.block == n.block) as usize;
            if let Some(rank) = r.fine.iter().position(|x| x.block == n.block) {
                st.worst_summary_rank = st.worst_summary_rank.max(rank + 1);
            }
        }
    }
    println!(
        "searches ({}): {} queries per variant",
        if a.cold {
            "page cache dropped before each"
        } else {
            "warm page cache"
        },
        needles.len()
    );
    for ((name, p), mut st) in variants.iter().zip(stats) {
        println!(
            "{name}: latency ms median {:.1} p90 {:.1} max {:.1} (coarse {:.1}, summary {:.1}, fine {:.1} median)",
            pct(&mut st.total.clone(), 0.5),
            pct(&mut st.total.clone(), 0.9),
            pct(&mut st.total, 1.0),
            pct(&mut st.coarse, 0.5),
            pct(&mut st.summary, 0.5),
            pct(&mut st.fine, 0.5),
        );
        println!(
            "    worst summary-tier rank of a needle it kept: {}",
            st.worst_summary_rank
        );
        for (c, s) in st.by_strength {
            println!(
                "    summary cos {c:.1}: kept by coarse {}/{}, by summary {}/{}, in top {} {}/{}",
                s[1], s[0], s[2], s[0], p.k, s[3], s[0]
            );
        }
    }
    if !a.keep {
        drop(mf);
        let _ = std::fs::remove_file(&a.path);
        let _ = std::fs::remove_file(needles_path(&a.path));
        let _ = std::fs::remove_file(memory::sidecar::path_for(&a.path));
    }
}

const ORACLE: &str = "12 coarse slots: the needle's own (as if the retrieving slots were known)";

/// The 12 slots in which a needle shows: those whose summary leans most
/// toward the query (the generator does not record them).
fn needle_slots(mf: &MemoryFile, n: &Needle) -> Vec<u32> {
    let q = memory::search::Queries::new(mf.index(), &n.query).unwrap();
    let z = memory::search::summary_scores(
        mf.index(),
        &q,
        n.block as usize,
        memory::kernels::Isa::selected(),
    );
    let mut order: Vec<u32> = (0..z.len() as u32).collect();
    order.sort_by(|&a, &b| z[b as usize].total_cmp(&z[a as usize]));
    order.truncate(12);
    order
}

fn needles_path(p: &std::path::Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".needles");
    PathBuf::from(s)
}

/// The needles next to the file, for `--reuse`: block, cosine, query.
fn write_needles(p: &std::path::Path, needles: &[Needle]) {
    let mut out = Vec::new();
    for n in needles {
        out.extend_from_slice(&n.block.to_le_bytes());
        out.extend_from_slice(&n.summary_cos.to_le_bytes());
        out.extend_from_slice(&(n.query.len() as u32).to_le_bytes());
        for q in &n.query {
            out.extend_from_slice(&q.to_le_bytes());
        }
    }
    std::fs::write(needles_path(p), out).unwrap();
}

fn read_needles(p: &std::path::Path) -> Vec<Needle> {
    let b = std::fs::read(needles_path(p)).expect("--reuse needs the .needles file");
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let block = u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let summary_cos = f32::from_le_bytes(b[i + 8..i + 12].try_into().unwrap());
        let n = u32::from_le_bytes(b[i + 12..i + 16].try_into().unwrap()) as usize;
        i += 16;
        let query = b[i..i + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        i += 4 * n;
        out.push(Needle {
            block,
            summary_cos,
            query,
        });
    }
    out
}
