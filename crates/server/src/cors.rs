//! Cross-origin requests (`--cors-origin`): off unless asked for, so a
//! web page elsewhere cannot read this server's answers through a
//! visitor's browser. When origins are given, a request whose `Origin`
//! is one of them gets `Access-Control-Allow-Origin` (that origin, or `*`
//! when any is allowed), and a preflight (`OPTIONS` with
//! `Access-Control-Request-Method`) is answered here, before the API-key
//! check: browsers never send credentials on a preflight.

use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

/// How long a browser may reuse a preflight's answer.
const MAX_AGE_SECS: &str = "600";

/// The origins allowed to call the API from a browser.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cors {
    /// Any origin (`*`).
    any: bool,
    /// Exact origins, lower-cased, without a trailing `/`.
    origins: Vec<String>,
}

impl Cors {
    /// From `--cors-origin` values, each an origin, `*`, or a comma list
    /// of them. `None` when none are given (CORS off).
    pub fn parse<S: AsRef<str>>(values: &[S]) -> Result<Option<Cors>, String> {
        let mut cors = Cors::default();
        for item in values.iter().flat_map(|v| v.as_ref().split(',')) {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            if item == "*" {
                cors.any = true;
                continue;
            }
            let origin = normalize(item).ok_or_else(|| {
                format!(
                    "`{item}` is not an origin: give scheme://host[:port] (as https://chat.example.com or http://localhost:3000, no path), or * for any"
                )
            })?;
            if !cors.origins.contains(&origin) {
                cors.origins.push(origin);
            }
        }
        Ok((cors.any || !cors.origins.is_empty()).then_some(cors))
    }

    /// What `Access-Control-Allow-Origin` says to a request from `origin`
    /// (`None`: it is not allowed).
    fn allow(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        if self.any {
            return Some(HeaderValue::from_static("*"));
        }
        let text = origin.to_str().ok()?;
        let normalized = normalize(text)?;
        self.origins.contains(&normalized).then(|| origin.clone())
    }

    /// The answer to a preflight, if `method` and `headers` make one.
    /// An allowed origin gets 204 and what it may send; another origin
    /// gets 403 with no CORS headers (the browser then refuses the call).
    pub fn preflight(&self, method: &Method, headers: &HeaderMap) -> Option<Response> {
        if method != Method::OPTIONS || !headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            return None;
        }
        let origin = headers.get(header::ORIGIN)?;
        let Some(allowed) = self.allow(origin) else {
            return Some(crate::http::error_response(crate::ApiError {
                status: 403,
                message: format!(
                    "Cross-origin requests from {} are not allowed: start the server with --cors-origin naming it",
                    String::from_utf8_lossy(origin.as_bytes())
                ),
                kind: "invalid_request_error",
                param: None,
                code: Some("origin_not_allowed"),
                retry_after: None,
                close: false,
            }));
        };
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("Authorization, Content-Type"),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(MAX_AGE_SECS),
        );
        self.vary(h);
        Some(r)
    }

    /// Mark `response` readable by the page at the request's `origin`,
    /// when that origin is allowed.
    pub fn decorate(&self, origin: Option<&HeaderValue>, response: &mut Response) {
        let h = response.headers_mut();
        self.vary(h);
        let Some(allowed) = origin.and_then(|o| self.allow(o)) else {
            return;
        };
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        // Safelisted headers (Content-Type, ...) need no listing; these
        // tell a client why it was turned away and when to retry.
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("Retry-After, WWW-Authenticate"),
        );
    }

    /// The answer depends on `Origin` unless every origin is allowed: a
    /// cache must not give one origin's answer to another.
    fn vary(&self, h: &mut HeaderMap) {
        if !self.any {
            h.append(header::VARY, HeaderValue::from_static("origin"));
        }
    }
}

/// `scheme://host[:port]` lower-cased without a trailing `/`, or `None`
/// when `s` is not an origin (no scheme, a path, a query, spaces).
fn normalize(s: &str) -> Option<String> {
    let s = s.strip_suffix('/').unwrap_or(s);
    let (scheme, rest) = s.split_once("://")?;
    let scheme_ok = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    let host_ok = !rest.is_empty()
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-.:[]_".contains(c));
    (scheme_ok && host_ok).then(|| s.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_refuses_paths() {
        assert_eq!(Cors::parse::<&str>(&[]).unwrap(), None);
        assert_eq!(Cors::parse(&[""]).unwrap(), None);
        let c = Cors::parse(&["https://A.example/, http://localhost:3000", "*"])
            .unwrap()
            .unwrap();
        assert!(c.any);
        assert_eq!(c.origins, ["https://a.example", "http://localhost:3000"]);
        for bad in [
            "example.com",
            "https://a.example/chat",
            "https://a b",
            "://x",
        ] {
            let e = Cors::parse(&[bad]).unwrap_err();
            assert!(e.contains(bad) && e.contains("scheme://host"), "{e}");
        }
    }

    #[test]
    fn echoes_only_allowed_origins() {
        let c = Cors::parse(&["https://a.example"]).unwrap().unwrap();
        let ok = HeaderValue::from_static("https://A.example");
        assert_eq!(c.allow(&ok), Some(ok.clone()));
        assert_eq!(
            c.allow(&HeaderValue::from_static("https://b.example")),
            None
        );
        let any = Cors::parse(&["*"]).unwrap().unwrap();
        assert_eq!(any.allow(&ok).unwrap(), "*");
    }

    #[test]
    fn preflight_needs_the_request_method_header() {
        let c = Cors::parse(&["https://a.example"]).unwrap().unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://a.example"),
        );
        assert!(c.preflight(&Method::OPTIONS, &h).is_none());
        h.insert(
            header::ACCESS_CONTROL_REQUEST_METHOD,
            HeaderValue::from_static("POST"),
        );
        assert!(c.preflight(&Method::GET, &h).is_none());
        let r = c.preflight(&Method::OPTIONS, &h).unwrap();
        assert_eq!(r.status(), 204);
        assert_eq!(
            r.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://a.example"
        );
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert_eq!(c.preflight(&Method::OPTIONS, &h).unwrap().status(), 403);
    }
}
