//! The client half of `scripts/load.py --client rust`: one concurrency
//! level of streaming `/v1/completions` requests against a server on
//! loopback, in Rust, so that at tens of thousands of tokens per second the
//! client does not take the CPU the server needs (the Python client, one
//! process under one GIL, did on a two-core machine).
//!
//! `load_client HOST:PORT CLIENTS TOTAL MAX_TOKENS TIME_LIMIT_S [API_KEY]`
//! prints one JSON line with the fields `load.py` reports for a level.
//! Same requests as load.py: client c sends requests c, c + CLIENTS, … <
//! TOTAL back to back, each "Here is a short story about {topic}. Once upon
//! a time", temperature 0, usage included.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TOPICS: [&str; 16] = [
    "the sea",
    "a mountain",
    "bread",
    "a violin",
    "winter",
    "a train",
    "bees",
    "the moon",
    "a library",
    "rain",
    "a garden",
    "coffee",
    "a lighthouse",
    "snow",
    "a river",
    "chess",
];

/// One finished request: time to first token, latency (s), tokens.
type Outcome = (f64, f64, u64);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 {
        eprintln!("usage: load_client HOST:PORT CLIENTS TOTAL MAX_TOKENS TIME_LIMIT_S [API_KEY]");
        std::process::exit(2);
    }
    let addr = args[0].clone();
    let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
    if !["127.0.0.1", "localhost", "[::1]"].contains(&host) {
        eprintln!("{addr}: this load test only targets loopback addresses");
        std::process::exit(2);
    }
    let num = |i: usize| -> u64 {
        args[i].parse().unwrap_or_else(|_| {
            eprintln!("argument {}: not a number: {}", i + 1, args[i]);
            std::process::exit(2)
        })
    };
    let (clients, total, max_tokens) = (num(1) as usize, num(2) as usize, num(3));
    let limit = Duration::from_secs_f64(args[4].parse().unwrap_or(120.0));
    let key = args.get(5).cloned();
    let deadline = Instant::now() + limit;

    let results: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    let failed = Mutex::new(0usize);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for c in 0..clients {
            let (addr, key, results, failed) = (&addr, &key, &results, &failed);
            s.spawn(move || {
                for (i, _) in (c..total).step_by(clients.max(1)).enumerate() {
                    if Instant::now() > deadline {
                        return;
                    }
                    let topic = TOPICS[(c + i * clients) % TOPICS.len()];
                    let prompt = format!("Here is a short story about {topic}. Once upon a time");
                    match one_request(addr, key.as_deref(), &prompt, max_tokens, deadline) {
                        Some(r) => results.lock().unwrap().push(r),
                        None => *failed.lock().unwrap() += 1,
                    }
                }
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    let results = results.into_inner().unwrap();
    let ttfts: Vec<f64> = results.iter().map(|r| r.0).collect();
    let lats: Vec<f64> = results.iter().map(|r| r.1).collect();
    let tokens: u64 = results.iter().map(|r| r.2).sum();
    println!(
        "{}",
        json!({
            "clients": clients,
            "requests": results.len(),
            "failed": failed.into_inner().unwrap(),
            "seconds": wall,
            "req_s": results.len() as f64 / wall,
            "tok_s": tokens as f64 / wall,
            "tokens": tokens,
            "ttft_p50_ms": 1000.0 * percentile(&ttfts, 50.0),
            "ttft_p99_ms": 1000.0 * percentile(&ttfts, 99.0),
            "latency_p99_ms": 1000.0 * percentile(&lats, 99.0),
        })
    );
}

/// As load.py's: linear interpolation between closest ranks (NaN if none).
fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    let k = (xs.len() - 1) as f64 * p / 100.0;
    let (lo, hi) = (k as usize, (k as usize + 1).min(xs.len() - 1));
    xs[lo] + (xs[hi] - xs[lo]) * (k - lo as f64)
}

/// Stream one completion; `None` on any failure or past the deadline.
fn one_request(
    addr: &str,
    key: Option<&str>,
    prompt: &str,
    max_tokens: u64,
    deadline: Instant,
) -> Option<Outcome> {
    let body = json!({
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    let t0 = Instant::now();
    let mut sock = TcpStream::connect(addr).ok()?;
    sock.set_nodelay(true).ok()?;
    sock.set_read_timeout(Some(
        deadline
            .saturating_duration_since(t0)
            .max(Duration::from_secs(1)),
    ))
    .ok()?;
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).ok()?;
    sock.write_all(body.as_bytes()).ok()?;
    let mut r = BufReader::new(sock);

    // Status line and headers.
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    if line.split_whitespace().nth(1) != Some("200") {
        return None;
    }
    let mut chunked = false;
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((name, value)) = l.split_once(':') {
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
            {
                chunked = true;
            }
        }
    }

    // The body (de-chunked) into `buf`; whole events ("…\n\n") handled as
    // they complete.
    let (mut ttft, mut tokens) = (None, 0u64);
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = Vec::new();
    loop {
        let more = if chunked {
            line.clear();
            if r.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let size = usize::from_str_radix(line.trim_end().split(';').next()?, 16).ok()?;
            if size == 0 {
                false
            } else {
                chunk.resize(size + 2, 0); // data and its CRLF
                r.read_exact(&mut chunk).ok()?;
                buf.extend_from_slice(&chunk[..size]);
                true
            }
        } else {
            chunk.resize(16 << 10, 0);
            let n = r.read(&mut chunk).ok()?;
            buf.extend_from_slice(&chunk[..n]);
            n > 0
        };
        // Events in `buf`.
        let mut start = 0;
        while let Some(end) = find(&buf[start..], b"\n\n") {
            let event = &buf[start..start + end];
            start += end + 2;
            let Some(data) = event.strip_prefix(b"data: ") else {
                continue;
            };
            if data == b"[DONE]" {
                return Some((
                    ttft.unwrap_or_else(|| t0.elapsed().as_secs_f64()),
                    t0.elapsed().as_secs_f64(),
                    tokens,
                ));
            }
            // After the first token only usage and errors matter.
            let wanted = ttft.is_none()
                || find(data, b"\"usage\"").is_some()
                || find(data, b"\"error\"").is_some();
            if wanted {
                let v: Value = serde_json::from_slice(data).ok()?;
                if v.get("error").is_some() {
                    return None;
                }
                if let Some(n) = v
                    .pointer("/usage/completion_tokens")
                    .and_then(Value::as_u64)
                {
                    tokens = n;
                }
                let text = v.pointer("/choices/0/text").and_then(Value::as_str);
                if ttft.is_none() && text.is_some_and(|t| !t.is_empty()) {
                    ttft = Some(t0.elapsed().as_secs_f64());
                }
            }
            if Instant::now() > deadline {
                return None;
            }
        }
        buf.drain(..start);
        if !more {
            return None; // ended without [DONE]
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
