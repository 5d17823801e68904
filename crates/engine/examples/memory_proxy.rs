//! The retrieval quality proxy of issue #18: for each query (a content
//! token of a needle question) and each searched slot, the block holding
//! the history token with the exact best score — the full-precision
//! pre-RoPE dot product of the centred query and centred key, the quantity
//! the codes approximate — and whether each tier of the search kept that
//! block: the coarse pass (sign bits of block summaries), the summary pass
//! (int4 summaries: the blocks handed to the fine pass), and the final top
//! k (sign codes of every token, fused over slots).
//!
//! cargo run --release -p cachefit-engine --example memory_proxy -- MODEL.gguf FILE.mem NEEDLES.json [K]
use chat::{ChatTemplate, Message};
use engine::memory::{HeadShape, KeyEncoder, MemoryConfig, MemorySession, ModelEncoder};
use kernels::pool::ThreadPool;
use model::{Model, ModelConfig};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 4 {
        eprintln!("usage: memory_proxy MODEL.gguf FILE.mem NEEDLES.json [K]");
        std::process::exit(2);
    }
    let k: usize = a.get(4).map_or(32, |s| s.parse().unwrap());
    let file = gguf::GgufFile::open(&a[1]).expect("model");
    let cfg = ModelConfig::from_gguf(file.metadata()).expect("config");
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).expect("vocab");
    let fp = engine::memory::fingerprint(&file, &vocab);
    let model = Model::from_gguf(&file, &cfg).expect("model");
    let mut enc = ModelEncoder::new(&model, ThreadPool::new(2)).expect("encoder");
    let config = MemoryConfig::default();
    let shape = HeadShape::of(&cfg);
    let s = MemorySession::open(
        std::path::Path::new(&a[2]),
        fp,
        shape,
        memory::Mode::Read,
        config,
    )
    .expect("memory");
    let layout = s.layout().clone();
    let slots = config.search_slots.min(layout.n_slots());
    let layers = layout.layers();
    let (hd, kv_dim, q_dim, group) = (shape.head_dim, shape.kv_dim(), shape.q_dim(), shape.group());

    // Every history token's centred key in the searched slots, re-encoded
    // exactly as ingest encoded them.
    let n_blocks = s.file().len_blocks();
    let mut ids = Vec::new();
    let mut block_of = Vec::new();
    for b in 0..n_blocks {
        let t = s.file().read_block(b).unwrap().ids();
        block_of.extend(std::iter::repeat_n(b, t.len()));
        ids.extend(t);
    }
    let mut keys: Vec<Vec<f32>> = vec![Vec::with_capacity(ids.len() * hd); slots];
    let t0 = std::time::Instant::now();
    let mut done = 0;
    while done < ids.len() {
        let run = (ids.len() - done).min(1024);
        let e = enc
            .encode(&layers, &ids[..done], &ids[done..done + run], false)
            .unwrap();
        for (sl, slot) in layout.slots.iter().take(slots).enumerate() {
            let li = layers.binary_search(&(slot.layer as usize)).unwrap();
            let mean = &layout.means[sl * hd..(sl + 1) * hd];
            for t in 0..run {
                let kh = &e.keys[li][t * kv_dim + slot.kv_head as usize * hd..][..hd];
                keys[sl].extend(kh.iter().zip(mean).map(|(x, m)| x - m));
            }
        }
        done += run;
    }
    eprintln!(
        "encoded {} tokens in {:.0} s",
        ids.len(),
        t0.elapsed().as_secs_f64()
    );
    let hot_from = ids.len().saturating_sub(config.hot_tokens);
    let sink_end = config.sink_tokens.min(ids.len());

    let needles: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&a[3]).unwrap()).unwrap();
    let text = |id: Option<u32>| id.and_then(|i| vocab.token_text(i));
    let template =
        ChatTemplate::from_gguf(file.metadata(), text(vocab.bos()), text(vocab.eos())).unwrap();
    // The engine's own search settings, and the tiers it uses beyond
    // EXHAUSTIVE_BLOCKS (coarse 2,048 → summary 512 → fine) on this file.
    use engine::memory::session::{search_params, EXHAUSTIVE_BLOCKS};
    let settings = [
        ("engine", search_params(k, n_blocks as usize)),
        ("tiers", search_params(k, EXHAUSTIVE_BLOCKS + 1)),
    ];
    // [setting][row kind: the needle's own words, other content][pairs,
    // coarse kept, summary kept, top k]
    let mut count = [[[0usize; 4]; 2]; 2];
    for n in needles.as_array().unwrap() {
        let thing = n["thing"].as_str().unwrap();
        let q = format!("What is the secret code for the {thing}?");
        let rendered = template.render(&[Message::user(q)], true).unwrap();
        let prompt = engine::prompt::chat_tokens(&vocab, &rendered);
        let e = s.probe(&mut enc, &prompt, config.hot_tokens).unwrap();
        let rows: Vec<usize> = (0..e.n)
            .rev()
            .filter(|&r| !vocab.is_control(prompt[r]))
            .take(config.query_tokens)
            .collect();
        for &row in &rows {
            let mut qv = Vec::new();
            layout.query_vectors(&[row], |li| &e.queries[li], &mut qv);
            let d = layout.code_dims();
            qv[slots * d..].fill(0.0);
            let word = vocab.decode(&prompt[row..row + 1]);
            let kind = !thing.split(' ').any(|w| w == word.trim()) as usize;
            let found: Vec<(Vec<u64>, Vec<u64>, Vec<u64>)> = settings
                .iter()
                .map(|(_, p)| {
                    let res = s.file().search(&qv, p).unwrap();
                    let summary_kept = res.fine.iter().map(|f| f.block).collect();
                    let top = res.hits.iter().map(|h| h.block).collect();
                    (res.coarse, summary_kept, top)
                })
                .collect();
            for (sl, slot) in layout.slots.iter().take(slots).enumerate() {
                let li = layers.binary_search(&(slot.layer as usize)).unwrap();
                let mut qc = vec![0.0f32; hd];
                for h in slot.kv_head as usize * group..(slot.kv_head as usize + 1) * group {
                    for (c, x) in qc
                        .iter_mut()
                        .zip(&e.queries[li][row * q_dim + h * hd..][..hd])
                    {
                        *c += x / group as f32;
                    }
                }
                for (c, m) in qc
                    .iter_mut()
                    .zip(&layout.query_means[sl * hd..(sl + 1) * hd])
                {
                    *c -= m;
                }
                let best = (sink_end..hot_from)
                    .max_by(|&x, &y| {
                        let dot = |t: usize| -> f32 {
                            keys[sl][t * hd..(t + 1) * hd]
                                .iter()
                                .zip(&qc)
                                .map(|(a, b)| a * b)
                                .sum()
                        };
                        dot(x).total_cmp(&dot(y))
                    })
                    .unwrap();
                let b = block_of[best];
                for (c, (coarse, summary, top)) in count.iter_mut().zip(&found) {
                    let c = &mut c[kind];
                    c[0] += 1;
                    c[1] += coarse.contains(&b) as usize;
                    c[2] += summary.contains(&b) as usize;
                    c[3] += top.contains(&b) as usize;
                }
            }
        }
    }
    println!(
        "{} tokens, {} blocks; per (query token, slot): the block of the exact best key kept by each tier",
        ids.len(),
        n_blocks
    );
    println!("| search | query tokens | pairs | coarse | summary (passed on) | top {k} |");
    println!("|---|---|---:|---:|---:|---:|");
    for ((name, p), c) in settings.iter().zip(&count) {
        for (kind, c) in ["the needle's own words", "other content tokens"]
            .iter()
            .zip(c)
        {
            let pct = |x: usize| 100.0 * x as f64 / c[0].max(1) as f64;
            println!(
                "| {name} | {kind} | {} | {:.1}% | {:.1}% ({}) | {:.1}% |",
                c[0],
                pct(c[1]),
                pct(c[2]),
                p.fine_candidates.min(n_blocks as usize),
                pct(c[3])
            );
        }
    }
}
