//! Issue 22: the chat page at `/` (embedded files, content types, a
//! policy against external loads, ETags), `--no-webui`, and CORS
//! (`--cors-origin`, off by default), on the built-in model. The page in
//! a real browser: scripts/webui-test.sh.

#[path = "server_support/mod.rs"]
mod server_support;

use server_support::{Response, Server};

/// A response header's value (names are case-insensitive).
fn header(r: &Response, name: &str) -> Option<String> {
    r.head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

#[test]
fn the_page_and_its_files_load_with_types_policy_and_etags() {
    let server = Server::start_builtin(&[]);
    let page = server.request("GET", "/", &[], b"");
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(
        header(&page, "content-type").as_deref(),
        Some("text/html; charset=utf-8")
    );
    assert!(page.body.contains("<title>cachefit chat</title>"));
    // Nothing from elsewhere: no absolute URLs in the page or its files.
    let csp = header(&page, "content-security-policy").expect("a CSP");
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"));
    for (path, kind) in [
        ("/webui/app.js", "text/javascript; charset=utf-8"),
        ("/webui/style.css", "text/css; charset=utf-8"),
    ] {
        assert!(page.body.contains(&path[1..]), "the page refers to {path}");
        let r = server.request("GET", path, &[], b"");
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_eq!(header(&r, "content-type").as_deref(), Some(kind));
        assert!(r.body.len() > 1000, "{path} is {} bytes", r.body.len());
        for text in [&page.body, &r.body] {
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
        // Revalidation: the same ETag gets a 304 with no body.
        let etag = header(&r, "etag").expect("an ETag");
        let again = server.request("GET", path, &[&format!("If-None-Match: {etag}")], b"");
        assert_eq!(again.status, 304);
        assert!(again.body.is_empty());
    }
    let r = server.request("GET", "/webui/nothing.js", &[], b"");
    assert_eq!(r.status, 404);
}

#[test]
fn no_webui_makes_the_page_a_404() {
    let server = Server::start_builtin(&["--no-webui"]);
    for path in ["/", "/webui/app.js"] {
        let r = server.request("GET", path, &[], b"");
        assert_eq!(r.status, 404, "{path}: {}", r.body);
        assert_eq!(r.error()["code"], "not_found");
    }
    assert_eq!(server.request("GET", "/v1/models", &[], b"").status, 200);
}

#[test]
fn with_an_api_key_the_page_loads_but_the_api_needs_the_key() {
    let server = Server::start_builtin(&["--api-key", "sesame"]);
    assert_eq!(server.request("GET", "/", &[], b"").status, 200);
    assert_eq!(server.request("GET", "/webui/app.js", &[], b"").status, 200);
    let r = server.request("GET", "/v1/models", &[], b"");
    assert_eq!(r.status, 401, "{}", r.body);
    let r = server.request("GET", "/v1/models", &["Authorization: Bearer sesame"], b"");
    assert_eq!(r.status, 200, "{}", r.body);
}

const PREFLIGHT: &[&str] = &[
    "Access-Control-Request-Method: POST",
    "Access-Control-Request-Headers: authorization, content-type",
];

#[test]
fn cors_is_off_by_default() {
    let server = Server::start_builtin(&[]);
    let r = server.request("GET", "/v1/models", &["Origin: https://chat.example"], b"");
    assert_eq!(r.status, 200);
    assert!(
        !r.head.to_ascii_lowercase().contains("access-control-"),
        "{}",
        r.head
    );
    let mut h = vec!["Origin: https://chat.example"];
    h.extend_from_slice(PREFLIGHT);
    let r = server.request("OPTIONS", "/v1/chat/completions", &h, b"");
    assert!(
        !(200..300).contains(&r.status),
        "preflight got {}",
        r.status
    );
    assert!(!r.head.to_ascii_lowercase().contains("access-control-"));
}

#[test]
fn cors_echoes_allowed_origins_and_answers_preflights_without_the_key() {
    let server = Server::start_builtin(&[
        "--api-key",
        "sesame",
        "--cors-origin",
        "https://chat.example, http://localhost:3000",
        "--cors-origin",
        "https://other.example",
    ]);
    for origin in ["https://chat.example", "https://other.example"] {
        let o = format!("Origin: {origin}");
        let mut h = vec![o.as_str()];
        h.extend_from_slice(PREFLIGHT);
        let r = server.request("OPTIONS", "/v1/chat/completions", &h, b"");
        assert_eq!(r.status, 204, "{}", r.body);
        assert_eq!(
            header(&r, "access-control-allow-origin").as_deref(),
            Some(origin)
        );
        let allowed = header(&r, "access-control-allow-headers").unwrap();
        assert!(allowed.contains("Authorization") && allowed.contains("Content-Type"));
        assert!(header(&r, "access-control-allow-methods")
            .unwrap()
            .contains("POST"));

        // The real request: the key is still needed, and even its 401 is
        // readable by the page (so it can ask for the key).
        let r = server.request("GET", "/v1/models", &[&o], b"");
        assert_eq!(r.status, 401);
        assert_eq!(
            header(&r, "access-control-allow-origin").as_deref(),
            Some(origin)
        );
        let r = server.request(
            "GET",
            "/v1/models",
            &[&o, "Authorization: Bearer sesame"],
            b"",
        );
        assert_eq!(r.status, 200);
        assert_eq!(
            header(&r, "access-control-allow-origin").as_deref(),
            Some(origin)
        );
        assert!(header(&r, "vary")
            .unwrap()
            .to_ascii_lowercase()
            .contains("origin"));
    }
    // Another origin is not echoed, and its preflight is refused.
    let r = server.request(
        "GET",
        "/v1/models",
        &[
            "Origin: https://evil.example",
            "Authorization: Bearer sesame",
        ],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    let mut h = vec!["Origin: https://evil.example"];
    h.extend_from_slice(PREFLIGHT);
    let r = server.request("OPTIONS", "/v1/chat/completions", &h, b"");
    assert_eq!(r.status, 403);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    assert!(r.error()["message"]
        .as_str()
        .unwrap()
        .contains("https://evil.example"));
}

#[test]
fn cors_star_allows_any_origin() {
    let server = Server::start_builtin(&["--cors-origin", "*"]);
    let mut h = vec!["Origin: https://anywhere.example"];
    h.extend_from_slice(PREFLIGHT);
    let r = server.request("OPTIONS", "/v1/models", &h, b"");
    assert_eq!(r.status, 204);
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some("*")
    );
}

#[test]
fn a_bad_cors_origin_is_refused_at_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args(["serve", "--port", "0", "--cors-origin", "chat.example/path"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cors-origin") && err.contains("chat.example/path"),
        "{err}"
    );
}
