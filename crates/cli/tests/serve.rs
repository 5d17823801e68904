//! `cachefit serve` through the real binary, spoken to over plain HTTP/1.1
//! on loopback (the OpenAI-client tests are tests/openai/).

mod server_support;

use server_support::{parse_response, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

fn model() -> Option<String> {
    testkit::model(testkit::SMOLLM2_Q4_1).map(|p| p.to_str().unwrap().to_string())
}

const KEY: &str = "Authorization: Bearer sesame";

#[test]
fn health_errors_auth_and_greedy_parity_with_run() {
    let Some(m) = model() else { return };
    let server = Server::start(
        &m,
        &[
            "--api-key",
            "sesame",
            "--parallel",
            "2",
            "--max-body",
            "4096",
            // Prompts on a second pool of 2 threads, decode on 1: the
            // greedy parity with `run -t 1` below holds across pools.
            "-tb",
            "2",
        ],
    );

    // /health needs no key.
    let r = server.request("GET", "/health", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "ok");

    // Everything else does.
    for key in [
        &[][..],
        &["Authorization: Bearer wrong"][..],
        &["Authorization: sesame"][..],
    ] {
        let r = server.post("/v1/completions", key, r#"{"prompt": "hi"}"#);
        assert_eq!(r.status, 401, "{}", r.body);
        assert_eq!(r.error()["code"], "invalid_api_key");
    }
    assert_eq!(server.request("GET", "/v1/models", &[], b"").status, 401);
    let r = server.request("GET", "/v1/models", &[KEY], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1.gguf");

    // Malformed JSON, wrong types, too-long prompts: 400 in OpenAI's shape.
    let r = server.post(
        "/v1/chat/completions",
        &[KEY],
        r#"{"messages": [{"role": "user""#,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.error()["type"], "invalid_request_error");
    let r = server.post(
        "/v1/chat/completions",
        &[KEY],
        r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}"#,
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["param"], "max_tokens");
    let long = "word ".repeat(400);
    let r = server.post(
        "/v1/completions",
        &[KEY],
        &format!(r#"{{"prompt": "{long}"}}"#),
    );
    assert_eq!(r.status, 400);
    let e = r.error();
    assert_eq!(e["code"], "context_length_exceeded");
    assert!(e["message"].as_str().unwrap().contains("256"), "{e}");
    let r = server.post("/v1/completions", &[KEY], r#"{"prompt": [1, 2, 99999999]}"#);
    assert_eq!(r.status, 400);
    assert!(r.error()["message"]
        .as_str()
        .unwrap()
        .contains("vocabulary"));

    // Over --max-body: 413.
    let big = format!(r#"{{"prompt": "{}"}}"#, "a".repeat(8000));
    let r = server.post("/v1/completions", &[KEY], &big);
    assert_eq!(r.status, 413);
    assert_eq!(r.error()["code"], "request_too_large");

    // Unknown routes and methods.
    let r = server.request("GET", "/v2/nothing", &[KEY], b"");
    assert_eq!(r.status, 404);
    r.error();
    let r = server.request("GET", "/v1/completions", &[KEY], b"");
    assert_eq!(r.status, 405);
    r.error();

    // Greedy completion equals `cachefit run`'s.
    let p = "The capital of France is";
    let r = server.post(
        "/v1/completions",
        &[KEY],
        &format!(r#"{{"prompt": "{p}", "max_tokens": 8, "temperature": 0}}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let run = Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args([
            "run", "--temp", "0", "-m", &m, "-p", p, "-n", "8", "-t", "1", "-c", "256", "--json",
        ])
        .output()
        .unwrap();
    let run: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(v["choices"][0]["text"], run["text"]);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    // The same request in a body over 2 KiB (JSON whitespace), whose
    // prompt is built on the blocking pool rather than the HTTP thread.
    let padded = format!(
        r#"{{"prompt": "{p}",{} "max_tokens": 8, "temperature": 0}}"#,
        " ".repeat(2500)
    );
    let r = server.post("/v1/completions", &[KEY], &padded);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], run["text"]);

    // Metrics count what happened.
    let r = server.request("GET", "/metrics", &[KEY], b"");
    assert_eq!(r.status, 200);
    assert!(r.body.contains("cachefit_queue_depth 0"), "{}", r.body);
    assert!(
        r.body
            .contains(r#"cachefit_http_requests_total{route="/v1/completions",code="401"} 3"#),
        "{}",
        r.body
    );

    server.signal("-TERM");
    let start_log = server.start_log.clone();
    assert!(
        start_log.contains("1 thread (set with -t), 2 for prompts"),
        "{start_log}"
    );
    let (status, log) = server.wait(Duration::from_secs(20));
    assert!(status.success(), "{status:?}\n{log}");
    assert!(log.contains("SIGTERM"), "{log}");
}

#[test]
fn bad_flag_values_are_refused_before_serving() {
    for (flag, value, says) in [
        ("--stream-interval", "-1", "--stream-interval must be"),
        ("--stream-interval", "1e9", "--stream-interval must be"),
        ("--stream-interval", "soon", "invalid value 'soon'"),
        ("--parallel", "0", "--parallel must be at least 1"),
        ("--shutdown-timeout", "-2", "--shutdown-timeout must be"),
    ] {
        // The built-in model: checked before it is opened or a port taken.
        let out = Command::new(env!("CARGO_BIN_EXE_cachefit"))
            .args(["serve", "--port", "0", &format!("{flag}={value}")])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value}: {err}");
        assert!(err.contains(says), "{flag} {value}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let Some(m) = model() else { return };
    let server = Server::start(&m, &["--parallel", "1", "--max-queue", "1"]);
    let addr = server.addr.clone();
    // A long generation holds the only slot...
    let long =
        r#"{"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": true}"#;
    let mut first = TcpStream::connect(&addr).unwrap();
    write!(
        first,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{long}",
        long.len()
    )
    .unwrap();
    let mut buf = [0u8; 256];
    let _ = first.read(&mut buf).unwrap(); // the stream has begun
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.request("GET", "/health", &[], b"").json()["slots_busy"] != 1 {
        assert!(Instant::now() < deadline, "the first request never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    // ...a second waits in the queue...
    let second = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let body = r#"{"prompt": "Hello", "max_tokens": 2}"#;
            let mut s = TcpStream::connect(&addr).unwrap();
            write!(
                s,
                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).unwrap();
            parse_response(&raw).status
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.request("GET", "/health", &[], b"").json()["queue"] != 1 {
        assert!(Instant::now() < deadline, "the second request never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ...and a third is turned away.
    let r = server.post(
        "/v1/completions",
        &[],
        r#"{"prompt": "Hi", "max_tokens": 2}"#,
    );
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        r.head.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        r.head
    );
    assert_eq!(r.error()["type"], "server_error");
    // Closing the first stream cancels it; the queued one then runs.
    drop(first);
    assert_eq!(second.join().unwrap(), 200);
}

#[test]
fn shutdown_lets_running_requests_finish_then_cuts_at_the_deadline() {
    let Some(m) = model() else { return };
    // Generous deadline: the running request completes.
    let server = Server::start(&m, &["--shutdown-timeout", "60"]);
    let addr = server.addr.clone();
    let req = std::thread::spawn(move || {
        let body = r#"{"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}"#;
        let mut s = TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        parse_response(&raw)
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.request("GET", "/health", &[], b"").json()["slots_busy"] != 1 {
        assert!(Instant::now() < deadline, "the request never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    server.signal("-INT");
    let r = req.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 48);
    let (status, log) = server.wait(Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{log}");

    // A short deadline: a long request is ended with a 503 in its stream.
    let server = Server::start(&m, &["--shutdown-timeout", "0.3", "-c", "2048"]);
    let addr = server.addr.clone();
    let req = std::thread::spawn(move || {
        let body = r#"{"prompt": "Once upon a time", "max_tokens": 2000, "stream": true}"#;
        let mut s = TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        parse_response(&raw)
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.request("GET", "/health", &[], b"").json()["slots_busy"] != 1 {
        assert!(Instant::now() < deadline, "the request never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    let t0 = Instant::now();
    server.signal("-TERM");
    let (status, log) = server.wait(Duration::from_secs(20));
    assert!(status.success(), "{status:?}\n{log}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let r = req.join().unwrap();
    assert!(r.body.contains("shutting down"), "{}", r.body);
}
