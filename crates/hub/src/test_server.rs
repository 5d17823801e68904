//! A stand-in for the hub, for tests (the machines that test cannot reach
//! the real one): serves `{root}/{owner}/{repo}/{file}` with the hub's
//! URL layout over HTTP/1.1 on 127.0.0.1, with knobs for the failures a
//! download must survive or refuse.

use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the server misbehaves; change with [`TestHub::set`].
#[derive(Clone, Debug, Default)]
pub struct Knobs {
    /// Close the connection after this many bytes of a file's body, once
    /// (the knob clears itself).
    pub drop_after: Option<u64>,
    /// Answer every request with this status (401, 404, 500).
    pub status: Option<u16>,
    /// Report a sha256 that is not the file's.
    pub wrong_sha256: bool,
    /// Answer `Range` requests with 200 and the whole file.
    pub ignore_range: bool,
    /// A listing without `lfs` data: the checksum must come from headers.
    pub no_lfs_in_listing: bool,
    /// Require `Authorization: Bearer TOKEN`, else 401.
    pub token: Option<String>,
    /// Send bodies slowly: this many bytes, then a pause.
    pub slow: Option<(usize, Duration)>,
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

pub struct TestHub {
    port: u16,
    knobs: Arc<Mutex<Knobs>>,
    log: Arc<Mutex<Vec<Logged>>>,
    stop: Arc<AtomicBool>,
}

impl TestHub {
    /// Serve `root` until dropped.
    pub fn start(root: &Path) -> TestHub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        let hub = TestHub {
            port,
            knobs: Arc::default(),
            log: Arc::default(),
            stop: Arc::default(),
        };
        let (root, knobs, log, stop) = (
            root.to_path_buf(),
            hub.knobs.clone(),
            hub.log.clone(),
            hub.stop.clone(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (root, knobs, log) = (root.clone(), knobs.clone(), log.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &root, &knobs, &log);
                });
            }
        });
        hub
    }

    /// `http://127.0.0.1:PORT`, for `HF_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn set(&self, f: impl FnOnce(&mut Knobs)) {
        f(&mut self.knobs.lock().unwrap());
    }

    pub fn requests(&self) -> Vec<Logged> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(
    conn: TcpStream,
    root: &Path,
    knobs: &Mutex<Knobs>,
    log: &Mutex<Vec<Logged>>,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut it = line.split_whitespace();
    let (method, target) = (
        it.next().unwrap_or("").to_string(),
        it.next().unwrap_or("").to_string(),
    );
    let (mut range, mut authorization) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(v.trim().to_string()),
                "authorization" => authorization = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    log.lock().unwrap().push(Logged {
        method: method.clone(),
        path: path.clone(),
        range: range.clone(),
        authorization: authorization.clone(),
    });
    let k = knobs.lock().unwrap().clone();
    let mut out = conn;
    if let Some(s) = k.status {
        return respond(&mut out, s, &[], b"{\"error\":\"as the test asked\"}");
    }
    if let Some(t) = &k.token {
        if authorization.as_deref() != Some(&format!("Bearer {t}")) {
            return respond(&mut out, 401, &[], b"{\"error\":\"Invalid credentials\"}");
        }
    }
    if let Some(repo) = path.strip_prefix("/api/models/") {
        let dir = root.join(repo);
        if repo.split('/').count() != 2 || !dir.is_dir() {
            return respond(&mut out, 404, &[], b"{\"error\":\"Repository not found\"}");
        }
        let body = listing(&dir, &k).to_string();
        return respond(&mut out, 200, &[], body.as_bytes());
    }
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    let [owner, name, "resolve", "main", file] = parts.as_slice() else {
        return respond(&mut out, 404, &[], b"not found");
    };
    let file = percent_decode(file);
    let full = root.join(owner).join(name).join(&file);
    if file.split('/').any(|c| c == ".." || c.is_empty()) || !full.is_file() {
        return respond(&mut out, 404, &[], b"{\"error\":\"Entry not found\"}");
    }
    let bytes = std::fs::read(&full)?;
    let len = bytes.len() as u64;
    let etag = format!("\"{}\"", sha_of(&bytes, k.wrong_sha256));
    let start = match (&range, k.ignore_range) {
        (Some(r), false) => r
            .strip_prefix("bytes=")
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|n| n.parse::<u64>().ok()),
        _ => None,
    };
    let mut headers = vec![
        ("ETag".to_string(), etag),
        ("Accept-Ranges".into(), "bytes".into()),
    ];
    let (status, body) = match start {
        Some(s) if s >= len => {
            headers.push(("Content-Range".into(), format!("bytes */{len}")));
            return respond(&mut out, 416, &headers, b"");
        }
        Some(s) => {
            headers.push((
                "Content-Range".into(),
                format!("bytes {s}-{}/{len}", len - 1),
            ));
            (206, &bytes[s as usize..])
        }
        None => (200, &bytes[..]),
    };
    head(&mut out, status, &headers, body.len() as u64)?;
    if method == "HEAD" {
        return Ok(());
    }
    let limit = if k.drop_after.is_some() {
        knobs.lock().unwrap().drop_after = None;
        k.drop_after.map(|n| n as usize)
    } else {
        None
    };
    let body = &body[..limit.map_or(body.len(), |n| n.min(body.len()))];
    match k.slow {
        Some((n, pause)) => {
            for chunk in body.chunks(n.max(1)) {
                out.write_all(chunk)?;
                out.flush()?;
                std::thread::sleep(pause);
            }
        }
        None => out.write_all(body)?,
    }
    out.flush()?;
    if limit.is_some() {
        // The dropped connection: fewer bytes than Content-Length said.
        out.shutdown(Shutdown::Both)?;
    }
    Ok(())
}

fn listing(dir: &Path, k: &Knobs) -> serde_json::Value {
    let mut files = Vec::new();
    collect(dir, dir, &mut files);
    files.sort();
    let siblings: Vec<serde_json::Value> = files
        .iter()
        .map(|rel| {
            let bytes = std::fs::read(dir.join(rel)).unwrap_or_default();
            let mut s = serde_json::json!({"rfilename": rel, "size": bytes.len()});
            if !k.no_lfs_in_listing {
                s["lfs"] = serde_json::json!({
                    "sha256": sha_of(&bytes, k.wrong_sha256),
                    "size": bytes.len(),
                    "pointerSize": 134,
                });
            }
            s
        })
        .collect();
    serde_json::json!({"id": dir.display().to_string(), "siblings": siblings})
}

fn collect(base: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p: PathBuf = e.path();
        if p.is_dir() {
            collect(base, &p, out);
        } else if let Ok(rel) = p.strip_prefix(base) {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

fn sha_of(bytes: &[u8], wrong: bool) -> String {
    let mut h = Sha256::new();
    h.update(bytes);
    if wrong {
        h.update(b"not this file");
    }
    crate::download::hex(&h.finalize())
}

fn head(
    out: &mut TcpStream,
    status: u16,
    headers: &[(String, String)],
    len: u64,
) -> std::io::Result<()> {
    let mut s = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (k, v) in headers {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    s.push_str(&format!(
        "Content-Length: {len}\r\nConnection: close\r\n\r\n"
    ));
    out.write_all(s.as_bytes())
}

fn respond(
    out: &mut TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
) -> std::io::Result<()> {
    head(out, status, headers, body.len() as u64)?;
    out.write_all(body)?;
    out.flush()?;
    // Let the client read the answer before the socket closes.
    let _ = out.shutdown(Shutdown::Write);
    let mut sink = [0u8; 1024];
    let _ = out.set_read_timeout(Some(Duration::from_millis(200)));
    while matches!(out.read(&mut sink), Ok(n) if n > 0) {}
    Ok(())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        500 => "Internal Server Error",
        _ => "Status",
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
