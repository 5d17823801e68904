//! A `cachefit serve` child process and plain HTTP/1.1 requests to it, for
//! the test files that talk to the server.
#![allow(dead_code)] // each test file uses its own part

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running server; killed if a test fails before stopping it.
pub struct Server {
    pub child: Child,
    pub addr: String,
    pub stderr: mpsc::Receiver<String>,
    /// What it logged before it listened.
    pub start_log: String,
}

impl Server {
    pub fn start(m: &str, extra: &[&str]) -> Server {
        Server::spawn(&["-m", m], extra)
    }

    /// The built-in model (no -m).
    pub fn start_builtin(extra: &[&str]) -> Server {
        Server::spawn(&[], extra)
    }

    fn spawn(model: &[&str], extra: &[&str]) -> Server {
        let ctx: &[&str] = if extra.contains(&"-c") {
            &[]
        } else {
            &["-c", "256"]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_cachefit"))
            .args(["serve", "--port", "0", "-t", "1"])
            .args(model)
            .args(ctx)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cachefit serve");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut log = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(addr) = line.split("listening on http://").nth(1) {
                        return Server {
                            child,
                            addr: addr.trim().to_string(),
                            stderr: rx,
                            start_log: log,
                        };
                    }
                    log.push_str(&line);
                    log.push('\n');
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the server did not start:\n{log}");
                }
            }
        }
    }

    /// One request on its own connection: (status, headers, body).
    pub fn request(&self, method: &str, path: &str, headers: &[&str], body: &[u8]) -> Response {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for h in headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        parse_response(&raw)
    }

    pub fn post(&self, path: &str, headers: &[&str], body: &str) -> Response {
        let mut h = vec!["Content-Type: application/json"];
        h.extend_from_slice(headers);
        self.request("POST", path, &h, body.as_bytes())
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }

    /// Wait for the process to exit; its status and the rest of stderr.
    pub fn wait(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let rest: Vec<String> = self.stderr.try_iter().collect();
                return (status, rest.join("\n"));
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the server did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}}.
    pub fn error(&self) -> Value {
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        e.clone()
    }
}

pub fn parse_response(raw: &[u8]) -> Response {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Response {
        status,
        head: head.to_string(),
        body,
    }
}

pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}
