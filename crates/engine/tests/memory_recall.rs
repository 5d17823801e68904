//! `MemorySession::recall` searches a prompt's query tokens in one batch
//! (`MemoryFile::search_many`); it must rank exactly as the loop of one
//! search per token it replaced. The file here is synthetic: a fake key
//! encoder whose keys and queries depend on the token only (a copy head:
//! a token's query finds the earlier places of the same token), a layout
//! of 12 slots, the first 8 searching.

use engine::memory::{
    Encoded, HeadShape, KeyEncoder, Layout, MemoryConfig, MemoryError, MemorySession, Slot,
};
use memory::{Geometry, MemoryFile, Mode};
use std::path::PathBuf;

const SHAPE: HeadShape = HeadShape {
    n_heads: 6,
    n_kv_heads: 3,
    head_dim: 64,
};
const LAYERS: usize = 4;
const FINGERPRINT: [u8; 32] = [3; 32];

/// Pseudo-random, approximately normal value for (token, layer, head,
/// dim): SplitMix64 of the packed key, four 16-bit uniforms summed.
fn value(token: u32, layer: usize, head: usize, dim: usize) -> f32 {
    let mut z = (token as u64) << 32 ^ (layer as u64) << 24 ^ (head as u64) << 16 ^ dim as u64;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let s = (z & 0xffff) + (z >> 16 & 0xffff) + (z >> 32 & 0xffff) + (z >> 48);
    (s as f32 - 131070.0) / 37837.2
}

/// Keys of KV head h and queries of every query head in h's group are the
/// same vector of the token.
struct CopyHead;

impl KeyEncoder for CopyHead {
    fn shape(&self) -> HeadShape {
        SHAPE
    }

    fn attention_layers(&self) -> Vec<usize> {
        (0..LAYERS).collect()
    }

    fn encode(
        &mut self,
        layers: &[usize],
        _context: &[u32],
        tokens: &[u32],
        queries: bool,
    ) -> Result<Encoded, MemoryError> {
        let (hd, group) = (SHAPE.head_dim, SHAPE.group());
        let keys = layers
            .iter()
            .map(|&l| {
                tokens
                    .iter()
                    .flat_map(|&t| {
                        (0..SHAPE.n_kv_heads)
                            .flat_map(move |h| (0..hd).map(move |i| value(t, l, h, i)))
                    })
                    .collect()
            })
            .collect();
        let qs = if queries {
            layers
                .iter()
                .map(|&l| {
                    tokens
                        .iter()
                        .flat_map(|&t| {
                            (0..SHAPE.n_heads)
                                .flat_map(move |h| (0..hd).map(move |i| value(t, l, h / group, i)))
                        })
                        .collect()
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Encoded {
            n: tokens.len(),
            keys,
            queries: qs,
        })
    }
}

/// A directory removed on drop (no tempfile dependency here).
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir() -> Dir {
    let p = std::env::temp_dir().join(format!("cachefit-recall-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    Dir(p)
}

/// The loop `recall` ran before `search_many`: one `search` per content
/// token, fused by weighted reciprocal rank. Best first.
fn recall_by_loop(
    s: &MemorySession,
    enc: &mut dyn KeyEncoder,
    prompt: &[u32],
    is_content: &dyn Fn(u32) -> bool,
    hot: usize,
    k: usize,
) -> Vec<u64> {
    let total = s.tokens();
    let e = s.probe(enc, prompt, hot).unwrap();
    let rows: Vec<usize> = (0..e.n)
        .rev()
        .filter(|&r| is_content(prompt[r]))
        .take(s.config().query_tokens)
        .collect();
    let hot_from = total.saturating_sub(hot as u64);
    let sink_end = (s.config().sink_tokens as u64).min(total);
    let index = s.file().index();
    let outside = |b: u64| {
        let m = index.meta(b as usize);
        m.first_token >= sink_end && m.first_token + m.n_tokens as u64 <= hot_from
    };
    let layout = s.layout();
    let mut fused: Vec<(u64, f32)> = Vec::new();
    let mut queries = Vec::new();
    for &row in &rows {
        layout.query_vectors(&[row], |li| &e.queries[li], &mut queries);
        let d = layout.code_dims();
        queries[s.config().search_slots.min(layout.n_slots()) * d..].fill(0.0);
        let hits = s.search(&queries, 32).unwrap();
        let Some(best) = hits.first() else { continue };
        let mean = hits.iter().map(|h| h.score).sum::<f32>() / hits.len() as f32;
        let weight = (best.score - mean).max(0.0).powi(2);
        for (rank, h) in hits.iter().filter(|h| outside(h.block)).enumerate() {
            let add = weight / (2.0 + rank as f32);
            match fused.iter_mut().find(|(b, _)| *b == h.block) {
                Some((_, x)) => *x += add,
                None => fused.push((h.block, add)),
            }
        }
    }
    fused.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    fused.iter().take(k).map(|(b, _)| *b).collect()
}

#[test]
fn batched_recall_ranks_as_the_loop_of_searches() {
    let d = dir();
    let path = d.0.join("m.mem");
    let slots: Vec<Slot> = (0..12)
        .map(|i| Slot {
            layer: (i % LAYERS) as u16,
            kv_head: (i / LAYERS) as u16,
        })
        .collect();
    let means = (0..12 * 64).map(|i| (i % 7) as f32 * 0.01).collect();
    let query_means = (0..12 * 64).map(|i| (i % 5) as f32 * -0.01).collect();
    let layout = Layout::new(SHAPE, slots, means, query_means, 11);
    let geometry = Geometry {
        block_tokens: 64,
        slots: 12,
        code_bytes: 8,
        extra_bytes: 0,
        id_bytes: 2,
    };
    drop(MemoryFile::create(&path, FINGERPRINT, geometry, &layout.to_params()).unwrap());
    let config = MemoryConfig {
        hot_tokens: 256,
        ..MemoryConfig::default()
    };
    let mut enc = CopyHead;
    let mut s = MemorySession::open(&path, FINGERPRINT, SHAPE, Mode::Write, config).unwrap();
    // 300 blocks of common tokens (ids 10..400); rare tokens 1000.. at
    // a few places, some twice.
    let mut x = 7u64;
    let mut history: Vec<u32> = (0..300 * 64)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            10 + (x >> 33) as u32 % 390
        })
        .collect();
    for (i, at) in [700usize, 3001, 3050, 9000, 12345, 15000, 15001, 17777]
        .iter()
        .enumerate()
    {
        history[*at] = 1000 + (i as u32 % 5);
    }
    s.append(&mut enc, &history, true).unwrap();
    s.commit().unwrap();
    let is_content = |t: u32| t >= 10;
    let prompts: Vec<Vec<u32>> = vec![
        vec![1, 1000, 55, 1001, 2],
        vec![1, 1002, 1003, 1004, 60, 61, 62, 63, 64, 1000, 2],
        vec![1, 20, 30, 40, 2],
        (0..40)
            .map(|i| if i % 9 == 4 { 1001 } else { 10 + i * 7 })
            .collect(),
        vec![1, 2],
    ];
    let mut found_rare = 0;
    for (pi, p) in prompts.iter().enumerate() {
        for k in [1usize, 4, 16] {
            let got = s.recall(&mut enc, p, &is_content, 256, k).unwrap().blocks;
            let want = recall_by_loop(&s, &mut enc, p, &is_content, 256, k);
            assert_eq!(got, want, "prompt {pi} k {k}");
            if pi == 0 && k == 4 {
                // The rare tokens' blocks (700 → block 10, 3001/3050 → 46/47).
                found_rare = got.iter().filter(|&&b| [10, 46, 47].contains(&b)).count();
            }
        }
    }
    assert!(
        found_rare >= 2,
        "the copy head finds the rare tokens' blocks"
    );
}
