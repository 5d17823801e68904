//! Retrieval quality of a memory file on needle questions: for each needle
//! ("The secret code for the THING is DIGITS."), the chat-rendered
//! question's recall, and where the needle's block ranks.
//!
//! cargo run --release -p cachefit-engine --example memory_recall -- MODEL.gguf FILE.mem NEEDLES.json [HOT] [K] [QUERY_TOKENS] [SEARCH_SLOTS]
use chat::{ChatTemplate, Message};
use engine::memory::{MemoryConfig, MemorySession, ModelEncoder};
use kernels::pool::ThreadPool;
use model::{Model, ModelConfig};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let file = gguf::GgufFile::open(&a[1]).expect("model");
    let cfg = ModelConfig::from_gguf(file.metadata()).expect("config");
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).expect("vocab");
    let fp = engine::memory::fingerprint(&file, &vocab);
    let model = Model::from_gguf(&file, &cfg).expect("model");
    let mut enc = ModelEncoder::new(&model, ThreadPool::new(2)).expect("encoder");
    let hot: usize = a.get(4).map_or(2048, |s| s.parse().unwrap());
    let k: usize = a.get(5).map_or(16, |s| s.parse().unwrap());
    let qt: usize = a.get(6).map_or(8, |s| s.parse().unwrap());
    let config = MemoryConfig {
        hot_tokens: hot,
        query_tokens: qt,
        search_slots: a.get(7).map_or(8, |s| s.parse().unwrap()),
        ..MemoryConfig::default()
    };
    let s = MemorySession::open(
        std::path::Path::new(&a[2]),
        fp,
        engine::memory::HeadShape::of(&cfg),
        memory::Mode::Read,
        config,
    )
    .expect("memory");
    let needles: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&a[3]).unwrap()).unwrap();
    let text = |id: Option<u32>| id.and_then(|i| vocab.token_text(i));
    let template =
        ChatTemplate::from_gguf(file.metadata(), text(vocab.bos()), text(vocab.eos())).unwrap();
    // Each block's text, to find the needles in.
    let n_blocks = s.file().len_blocks();
    let texts: Vec<String> = (0..n_blocks)
        .map(|b| vocab.decode(&s.file().read_block(b).unwrap().ids()))
        .collect();
    let mut found = 0;
    for n in needles.as_array().unwrap() {
        let thing = n["thing"].as_str().unwrap();
        let code = n["code"].as_str().unwrap();
        let q = format!("What is the secret code for the {thing}?");
        let rendered = template.render(&[Message::user(q)], true).unwrap();
        let prompt = engine::prompt::chat_tokens(&vocab, &rendered);
        let r = s
            .recall(&mut enc, &prompt, &|t| !vocab.is_control(t), hot, k)
            .unwrap();
        // Blocks holding the needle's code (or its start, when split).
        let want: Vec<u64> = (0..n_blocks)
            .filter(|&b| {
                let t = &texts[b as usize];
                t.contains(code) || t.contains(&format!("for the {thing}"))
            })
            .collect();
        let rank = r.blocks.iter().position(|b| want.contains(b));
        if let Ok(k0) = std::env::var("FUSE") {
            let k0: f32 = k0.parse().unwrap();
            let e = s.probe(&mut enc, &prompt, hot).unwrap();
            let mut score = std::collections::HashMap::<u64, f32>::new();
            let rows: Vec<usize> = (0..e.n)
                .filter(|&r| !vocab.is_control(prompt[r]))
                .rev()
                .take(qt)
                .collect();
            for &row in &rows {
                let mut qv = Vec::new();
                s.layout()
                    .query_vectors(&[row], |li| &e.queries[li], &mut qv);
                let hits = s.search(&qv, 32).unwrap();
                let mean = hits.iter().map(|h| h.score).sum::<f32>() / hits.len() as f32;
                let w = if std::env::var("PEAK").is_ok() {
                    (hits[0].score - mean).max(0.0)
                } else {
                    1.0
                };
                for (rk, h) in hits.into_iter().enumerate() {
                    *score.entry(h.block).or_default() += w / (k0 + rk as f32);
                }
            }
            let mut v: Vec<(u64, f32)> = score.into_iter().collect();
            v.sort_by(|a, b| b.1.total_cmp(&a.1));
            let rk = v.iter().position(|(b, _)| want.contains(b));
            println!("   fused over {} rows: rank {rk:?}", rows.len());
        }
        if std::env::var("PER_TOKEN").is_ok() {
            let e = s.probe(&mut enc, &prompt, hot).unwrap();
            for row in 0..e.n {
                let mut qv = Vec::new();
                s.layout()
                    .query_vectors(&[row], |li| &e.queries[li], &mut qv);
                // The engine's search of this row alone (searching slots
                // only), with the tiers' candidate counts from COARSE and
                // FINE when set: which tier lost the needle's block.
                let d = s.layout().code_dims();
                qv[config.search_slots.min(s.layout().n_slots()) * d..].fill(0.0);
                let mut p = engine::memory::session::search_params(32, n_blocks as usize);
                let env = |k: &str| std::env::var(k).ok().map(|v| v.parse::<usize>().unwrap());
                p.coarse_candidates = env("COARSE").unwrap_or(p.coarse_candidates);
                p.fine_candidates = env("FINE").unwrap_or(p.fine_candidates);
                let res = s.file().search(&qv, &p).unwrap();
                let coarse = res.coarse.iter().any(|b| want.contains(b));
                let summary = res.fine.iter().any(|f| want.contains(&f.block));
                let rk = res.hits.iter().position(|h| want.contains(&h.block));
                println!(
                    "   token {row:2} {:?} coarse {coarse} summary {summary} rank {rk:?} ({:.1} ms)",
                    vocab.decode(&prompt[row..row + 1]),
                    (res.timings.coarse + res.timings.summary + res.timings.fine).as_secs_f64() * 1e3
                );
            }
        }
        found += rank.is_some() as usize;
        println!(
            "{thing:14} depth {:.1} blocks {want:?} rank {rank:?} probe {:.0} ms search {:.0} ms top {:?}",
            n["depth"].as_f64().unwrap(),
            r.probe_seconds * 1e3,
            r.search_seconds * 1e3,
            &r.blocks[..r.blocks.len().min(8)]
        );
    }
    println!("found {found} of {}", needles.as_array().unwrap().len());
}
