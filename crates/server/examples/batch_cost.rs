//! Time of one decode pass over `n` slots, each at position `pos`: how
//! much batching saves per token. `cargo run --release -p cachefit-server
//! --example batch_cost -- MODEL.gguf [THREADS [SLOTS,...
//! [no-mmap]]]`
use kernels::pool::ThreadPool;
use model::{Model, ModelConfig, StateOptions, Token};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: batch_cost MODEL.gguf [THREADS]");
    let threads: usize = args.next().map_or(2, |t| t.parse().expect("threads"));
    let slots: Vec<usize> = args.next().map_or(vec![1, 2, 4, 8, 16], |s| {
        s.split(',').map(|n| n.parse().expect("slots")).collect()
    });
    // A fourth argument `no-mmap` reads the file into (huge-page) memory.
    let mmap = args.next().as_deref() != Some("no-mmap");
    let opts = gguf::OpenOptions {
        mmap,
        ..Default::default()
    };
    let file = gguf::GgufFile::open_with(&path, opts).expect("open");
    let cfg = ModelConfig::from_gguf(file.metadata()).expect("config");
    let model = Model::from_gguf(&file, &cfg).expect("weights");
    let pool = ThreadPool::new(threads);
    let pos = 100;
    for n in slots {
        let opts = StateOptions {
            n_seq: n,
            n_batch: 128,
            ..StateOptions::new(256)
        };
        let mut s = model.new_state(&opts).expect("state");
        // Fill each slot's cache up to `pos`.
        for seq in 0..n {
            let toks: Vec<Token> = (0..pos)
                .map(|p| Token {
                    id: (p % 100) as u32 + 10,
                    seq,
                    pos: p,
                    logits: p + 1 == pos,
                })
                .collect();
            for chunk in toks.chunks(100) {
                s.forward(&pool, chunk);
            }
        }
        let batch: Vec<Token> = (0..n)
            .map(|seq| Token {
                id: 42,
                seq,
                pos,
                logits: true,
            })
            .collect();
        // Five timings of at least 0.2 s each; the median (the machine is
        // shared: single short timings move by tens of percent).
        let mut times: Vec<f64> = (0..5)
            .map(|_| {
                let (t0, mut reps) = (Instant::now(), 0u32);
                while reps < 20 || t0.elapsed().as_secs_f64() < 0.2 {
                    s.forward(&pool, &batch);
                    reps += 1;
                }
                t0.elapsed().as_secs_f64() * 1000.0 / f64::from(reps)
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let ms = times[2];
        println!(
            "{n:2} slots: {ms:7.2} ms/pass, {:7.1} tok/s",
            n as f64 * 1000.0 / ms
        );
    }
}
