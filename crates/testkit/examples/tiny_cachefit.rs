//! Write a random `cachefit` model of the shipped shape (d 144, CCACCA,
//! f 396, 8 heads on one KV head of 18, K 4, context 1024), for benchmarks
//! and manual runs:
//!
//! ```text
//! cargo run --release -p cachefit-testkit --example tiny_cachefit -- OUT.gguf [--vocab 4096] [--f32] [--seed 1]
//! cargo run --release -p cachefit -- bench -m OUT.gguf -p 65 -n 959 -t 1
//! ```

use testkit::cachefit::{Spec, Storage, TinyCachefit};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut out = None;
    let (mut vocab, mut storage, mut seed) = (4096, Storage::I8, 1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--vocab" => vocab = args.next().and_then(|v| v.parse().ok()).expect("--vocab N"),
            "--seed" => seed = args.next().and_then(|v| v.parse().ok()).expect("--seed N"),
            "--f32" => storage = Storage::F32,
            _ if out.is_none() => out = Some(a),
            _ => panic!("unexpected argument {a:?}"),
        }
    }
    let out = out.expect("usage: tiny_cachefit OUT.gguf [--vocab N] [--f32] [--seed N]");
    let spec = Spec {
        vocab,
        ..Spec::reference_shape()
    };
    TinyCachefit::random(spec, seed).write(std::path::Path::new(&out), storage);
    eprintln!("wrote {out} ({vocab} tokens, {storage:?})");
}
