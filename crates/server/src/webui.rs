//! The chat page at `/`: three static files (`crates/server/webui/`)
//! compiled into the binary, so the server needs no files beside it and
//! the page no network but its own server (no CDN, no build step).
//!
//! The page is static and holds no secret, so it loads without the API
//! key; it asks for the key when an API call answers 401 and sends it as
//! `Authorization: Bearer`. Every file goes out with a Content-Security-
//! Policy that allows nothing but this origin (a reply that smuggled
//! markup into the page still could not load or send anything elsewhere),
//! and with an ETag of its bytes: the browser revalidates (`no-cache`) and
//! gets a 304 until the binary changes, so an upgrade is never hidden by
//! a stale cache.
//!
//! Off with `--no-webui`: the routes are not added, so `/` is a 404 like
//! any unknown path.

use std::sync::{Arc, OnceLock};

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::http::App;

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

/// The page's files, by the path they are served at. index.html refers to
/// the others by relative URLs, so the page also works behind a reverse
/// proxy that mounts the server under a prefix.
const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        bytes: include_bytes!("../webui/index.html"),
    },
    Asset {
        path: "/webui/app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../webui/app.js"),
    },
    Asset {
        path: "/webui/style.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../webui/style.css"),
    },
];

/// Only this origin, for everything; no inline script or style (the
/// page has none), no frames, no plugins, no form posts elsewhere.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// Whether `path` is one of the page's files: these load without the API
/// key (when the page is on).
pub fn is_asset(path: &str) -> bool {
    ASSETS.iter().any(|a| a.path == path)
}

/// The page's routes, added to the router unless `--no-webui`.
pub fn routes() -> Router<Arc<App>> {
    ASSETS
        .iter()
        .enumerate()
        .fold(Router::new(), |router, (i, asset)| {
            router.route(asset.path, get(move |req: Request| serve(i, req)))
        })
}

/// `"` + the first 16 bytes of the SHA-256 of each file, in hex + `"`,
/// computed once.
fn etags() -> &'static [HeaderValue] {
    static ETAGS: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    ETAGS.get_or_init(|| {
        use sha2::{Digest, Sha256};
        ASSETS
            .iter()
            .map(|a| {
                let hash = Sha256::digest(a.bytes);
                let hex: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
                HeaderValue::from_str(&format!("\"{hex}\"")).expect("hex is a valid header value")
            })
            .collect()
    })
}

async fn serve(index: usize, req: Request) -> Response {
    let asset = &ASSETS[index];
    let etag = &etags()[index];
    // `If-None-Match` may list several tags, or be `*`.
    let cached = req
        .headers()
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|t| t == "*" || t.trim_start_matches("W/").as_bytes() == etag.as_bytes());
    let mut response = if cached {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(header::CONTENT_TYPE, asset.content_type)],
            asset.bytes.to_vec(),
        )
            .into_response()
    };
    let h = response.headers_mut();
    h.insert(header::ETAG, etag.clone());
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for a in ASSETS {
            let text = std::str::from_utf8(a.bytes).unwrap();
            for scheme in ["http://", "https://", "//cdn", "@import"] {
                assert!(!text.contains(scheme), "{} contains {scheme}", a.path);
            }
        }
        let html = std::str::from_utf8(ASSETS[0].bytes).unwrap();
        assert!(html.contains("src=\"webui/app.js\""), "{html}");
        assert!(html.contains("href=\"webui/style.css\""), "{html}");
        // The policy forbids inline script and style, so the page has none.
        assert!(!html.contains("<script>") && !html.contains("style="));
    }

    #[test]
    fn model_text_never_goes_through_html_parsing() {
        let js = std::str::from_utf8(ASSETS[1].bytes).unwrap();
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!js.contains(sink), "app.js uses {sink}");
        }
    }

    #[test]
    fn etags_differ_per_file() {
        let tags = etags();
        assert_eq!(tags.len(), ASSETS.len());
        assert!(tags[0] != tags[1] && tags[1] != tags[2]);
    }
}
