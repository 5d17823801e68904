//! The memory's logic against a fake model whose keys and queries are a
//! fixed random vector per token id (a perfect copy head): what a session
//! stores, which blocks a prompt recalls, and the context it assembles.

use super::*;
use crate::memory::encoder::Encoded;
use crate::memory::session::BLOCK_TOKENS;

const SHAPE: HeadShape = HeadShape {
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 16,
};

/// Keys and queries of token t at every layer: one random vector of t
/// (queries: the same, in every head of the group).
struct CopyHead {
    calls: usize,
}

fn vector(t: u32, out: &mut [f32]) {
    let mut s = (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for x in out {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *x = (s % 2001) as f32 / 1000.0 - 1.0;
    }
}

impl KeyEncoder for CopyHead {
    fn shape(&self) -> HeadShape {
        SHAPE
    }
    fn attention_layers(&self) -> Vec<usize> {
        vec![0, 1, 2]
    }
    fn encode(
        &mut self,
        layers: &[usize],
        _context: &[u32],
        tokens: &[u32],
        queries: bool,
    ) -> Result<Encoded, MemoryError> {
        self.calls += 1;
        let hd = SHAPE.head_dim;
        let mut e = Encoded {
            n: tokens.len(),
            keys: vec![Vec::new(); layers.len()],
            queries: vec![Vec::new(); layers.len()],
        };
        let mut v = vec![0.0; hd];
        for (li, &l) in layers.iter().enumerate() {
            for (i, &t) in tokens.iter().enumerate() {
                // Layer 1 is the copy head; the others see position noise.
                let id = if l == 1 {
                    t
                } else {
                    ((i as u32).wrapping_mul(7919) + l as u32 + 1) << 20
                };
                vector(id, &mut v);
                for _ in 0..SHAPE.n_kv_heads {
                    e.keys[li].extend_from_slice(&v);
                }
                if queries {
                    for _ in 0..SHAPE.n_heads {
                        e.queries[li].extend_from_slice(&v);
                    }
                }
            }
        }
        Ok(e)
    }
}

fn session(dir: &std::path::Path, config: MemoryConfig) -> (MemorySession, CopyHead) {
    let mut enc = CopyHead { calls: 0 };
    // Only the copy head's two slots retrieve here.
    let config = MemoryConfig {
        search_slots: 2,
        ..config
    };
    let s = MemorySession::open_or_create(
        &dir.join("m.mem"),
        [7; 32],
        &mut enc,
        // Words as tokens (the calibration text has hundreds of them).
        |t| {
            t.split_whitespace()
                .map(|w| {
                    w.bytes()
                        .fold(17u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()))
                        % 50_000
                        + 2_000
                })
                .collect()
        },
        2,
        memory::Mode::Write,
        config,
    )
    .unwrap();
    (s, enc)
}

/// A history of "filler" tokens 1000.. with rare tokens planted.
fn history(n: usize, plants: &[(usize, u32)]) -> Vec<u32> {
    let mut h: Vec<u32> = (0..n).map(|i| 1000 + (i % 300) as u32).collect();
    for &(at, t) in plants {
        h[at] = t;
    }
    h
}

#[test]
fn calibration_finds_the_copy_head_and_appends_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, mut enc) = session(dir.path(), MemoryConfig::default());
    // The copy head's slots come first.
    assert_eq!(s.layout().slots[0].layer, 1, "{:?}", s.layout().slots);
    let h = history(1000, &[]);
    s.append(&mut enc, &h[..700], true).unwrap();
    s.append(&mut enc, &h[700..], false).unwrap();
    s.commit().unwrap();
    assert_eq!(s.tokens(), 1000);
    // Blocks never span two appends: 700 = 10 full + 60, 300 = 4 + 44.
    assert_eq!(s.file().len_blocks(), 11 + 5);
    let path = s.path().to_path_buf();
    drop(s);
    let s2 = MemorySession::open(
        &path,
        [7; 32],
        SHAPE,
        memory::Mode::Read,
        MemoryConfig::default(),
    )
    .unwrap();
    assert_eq!(s2.tokens(), 1000);
    let back: Vec<u32> = (0..s2.file().len_blocks())
        .flat_map(|b| s2.file().read_block(b).unwrap().ids())
        .collect();
    assert_eq!(back, h);
    // Another model's fingerprint is refused, naming both.
    let e = MemorySession::open(
        &path,
        [8; 32],
        SHAPE,
        memory::Mode::Read,
        MemoryConfig::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("another model"), "{e}");
}

#[test]
fn a_prompt_recalls_the_block_holding_its_rare_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let config = MemoryConfig {
        hot_tokens: 256,
        ..MemoryConfig::default()
    };
    let (mut s, mut enc) = session(dir.path(), config);
    let plants = [(3000, 77u32), (3001, 78), (6100, 91), (6101, 92)];
    s.append(&mut enc, &history(8000, &plants), true).unwrap();
    let content = |_: u32| true;
    for (at, prompt) in [(3000usize, vec![5, 77, 78, 6]), (6100, vec![91, 92])] {
        let r = s.recall(&mut enc, &prompt, &content, 256, 4).unwrap();
        let want = (at / BLOCK_TOKENS) as u64;
        assert_eq!(r.blocks.first(), Some(&want), "{prompt:?}: {:?}", r.blocks);
    }
    // Blocks in the sinks or the hot window are never recalled.
    let r = s
        .recall(&mut enc, &[1000, 1001], &content, 256, 16)
        .unwrap();
    for b in r.blocks {
        let m = s.file().index().meta(b as usize);
        assert!(m.first_token >= 64 && m.first_token + m.n_tokens as u64 <= 8000 - 256);
    }
}

#[test]
fn the_view_is_sinks_hot_and_spans_within_the_room() {
    let dir = tempfile::tempdir().unwrap();
    let config = MemoryConfig {
        hot_tokens: 300,
        sink_tokens: 64,
        recall_blocks: 4,
        ..MemoryConfig::default()
    };
    let (mut s, mut enc) = session(dir.path(), config);
    let h = history(5000, &[(2000, 55), (2001, 56)]);
    s.append(&mut enc, &h, true).unwrap();
    let v = s.view(&mut enc, &[55, 56], &|_| true, 2000).unwrap();
    assert_eq!(v.sinks, 64);
    assert_eq!(v.hot, 300);
    assert_eq!(&v.tokens[..64], &h[..64]);
    assert_eq!(&v.tokens[64..364], &h[5000 - 300..]);
    assert!(v.recalled_tokens <= 4 * BLOCK_TOKENS);
    assert_eq!(v.tokens.len(), 364 + v.recalled_tokens);
    // The best span comes last, right before the prompt: the planted
    // tokens with their margins around them.
    let last = &v.tokens[v.tokens.len() - 2 * BLOCK_TOKENS..];
    assert!(last.windows(2).any(|w| w == [55, 56]), "{last:?}");
    // Each recalled stretch is a run of the history.
    let recalled = &v.tokens[364..];
    let pos = h.windows(2).position(|w| w == [55, 56]).unwrap();
    let at = recalled.windows(2).position(|w| w == [55, 56]).unwrap();
    assert_eq!(recalled[at - 10..at + 10], h[pos - 10..pos + 10]);

    // A small room: less hot, and everything still fits.
    let v = s.view(&mut enc, &[55, 56], &|_| true, 200).unwrap();
    assert!(v.tokens.len() <= 200, "{}", v.tokens.len());
    // Room for all of it: the whole history, no search.
    let calls = enc.calls;
    let v = s.view(&mut enc, &[55, 56], &|_| true, 6000).unwrap();
    assert_eq!(v.tokens, h);
    assert_eq!(enc.calls, calls);
}

#[test]
fn random_recall_draws_from_outside_sinks_and_hot() {
    let dir = tempfile::tempdir().unwrap();
    let config = MemoryConfig {
        hot_tokens: 256,
        random_recall: Some(3),
        ..MemoryConfig::default()
    };
    let (mut s, mut enc) = session(dir.path(), config);
    s.append(&mut enc, &history(4000, &[]), true).unwrap();
    let a = s.view(&mut enc, &[1], &|_| true, 1500).unwrap();
    let b = s.view(&mut enc, &[2], &|_| true, 1500).unwrap();
    assert_eq!(a.recalled, b.recalled, "seeded: the same draw");
    assert!(!a.recalled.is_empty());
}
