//! The hub's HTTP side: where it is (`HF_ENDPOINT`), who we are
//! (`HF_TOKEN`), its repo listing and the checksum headers of a file.

use crate::error::HubError;
use crate::repo::{RepoFile, RepoSpec};
use std::time::Duration;
use ureq::http::{Response, StatusCode};
use ureq::Body;

/// Where the hub is when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The hub at one endpoint, with an optional token.
pub struct Client {
    endpoint: String,
    token: Option<String>,
    agent: ureq::Agent,
    /// Follows no redirect: the hub puts the LFS sha256 in
    /// `X-Linked-Etag` of the redirect to its CDN, not in the CDN's answer.
    agent_no_redirect: ureq::Agent,
}

impl Client {
    /// `HF_ENDPOINT` (default [`DEFAULT_ENDPOINT`]) and `HF_TOKEN` (or
    /// `HUGGING_FACE_HUB_TOKEN`), the variables of the Hugging Face tools.
    pub fn from_env() -> Client {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN"));
        Client::new(&endpoint, token)
    }

    pub fn new(endpoint: &str, token: Option<String>) -> Client {
        let config = |redirects: u32| {
            ureq::Agent::config_builder()
                // Statuses are ours to explain (401: a token, 404: a name).
                .http_status_as_error(false)
                .max_redirects(redirects)
                .max_redirects_will_error(false)
                .timeout_connect(Some(Duration::from_secs(30)))
                .timeout_recv_response(Some(Duration::from_secs(60)))
                // A stalled transfer fails (and is resumed) instead of
                // hanging; a slow one goes on.
                .timeout_per_read(Some(Duration::from_secs(60)))
                .user_agent(concat!("cachefit/", env!("CARGO_PKG_VERSION")))
                .build()
                .new_agent()
        };
        Client {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token: token.map(|t| t.trim().to_string()),
            agent: config(10),
            agent_no_redirect: config(0),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// `{endpoint}/{owner}/{repo}/resolve/main/{file}`.
    pub fn file_url(&self, repo: &RepoSpec, file: &str) -> String {
        format!(
            "{}/{}/resolve/main/{}",
            self.endpoint,
            repo.repo(),
            encode_path(file)
        )
    }

    /// A GET, with the token and `extra` headers; HTTP errors explained.
    pub(crate) fn get(
        &self,
        url: &str,
        extra: &[(&str, String)],
    ) -> Result<Response<Body>, HubError> {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        for (k, v) in extra {
            req = req.header(*k, v.as_str());
        }
        let resp = req.call().map_err(|e| HubError::Transport {
            url: url.to_string(),
            detail: e.to_string(),
        })?;
        Ok(resp)
    }

    /// The repo's files with their sizes and LFS sha256.
    pub fn list(&self, repo: &RepoSpec) -> Result<Vec<RepoFile>, HubError> {
        let url = format!("{}/api/models/{}?blobs=true", self.endpoint, repo.repo());
        let resp = self.get(&url, &[])?;
        if !resp.status().is_success() {
            return Err(self.status_error(&url, resp.status()));
        }
        let bad = |detail: String| HubError::BadListing {
            url: url.clone(),
            detail,
        };
        let text = resp
            .into_body()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| bad(e.to_string()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let siblings = v["siblings"]
            .as_array()
            .ok_or_else(|| bad("no `siblings` list of files".to_string()))?;
        siblings
            .iter()
            .map(|s| {
                let name = s["rfilename"]
                    .as_str()
                    .ok_or_else(|| bad("a file without `rfilename`".to_string()))?;
                let sha256 = s["lfs"]["sha256"]
                    .as_str()
                    .filter(|h| is_sha256(h))
                    .map(str::to_ascii_lowercase);
                let size = s["lfs"]["size"].as_u64().or_else(|| s["size"].as_u64());
                Ok(RepoFile {
                    name: name.to_string(),
                    size,
                    sha256,
                })
            })
            .collect()
    }

    /// The sha256 and size the resolve URL's headers report, for a listing
    /// without LFS data: `X-Linked-Etag`/`X-Linked-Size` on the hub's
    /// redirect, else `ETag`/`Content-Length` (a mirror serving directly).
    /// An ETag that is not a sha256 (a git blob id) gives `None`.
    pub fn head(&self, url: &str) -> Result<(Option<String>, Option<u64>), HubError> {
        let mut req = self.agent_no_redirect.head(url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let resp = req.call().map_err(|e| HubError::Transport {
            url: url.to_string(),
            detail: e.to_string(),
        })?;
        let status = resp.status();
        if !(status.is_success() || status.is_redirection()) {
            return Err(self.status_error(url, status));
        }
        let header = |k: &str| {
            resp.headers()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(|v| {
                    v.trim()
                        .trim_start_matches("W/")
                        .trim_matches('"')
                        .to_string()
                })
        };
        let sha = header("x-linked-etag")
            .or_else(|| header("etag"))
            .filter(|h| is_sha256(h))
            .map(|h| h.to_ascii_lowercase());
        let size = header("x-linked-size")
            .or_else(|| {
                status
                    .is_success()
                    .then(|| header("content-length"))
                    .flatten()
            })
            .and_then(|s| s.parse().ok());
        Ok((sha, size))
    }

    /// An HTTP error status, explained.
    pub(crate) fn status_error(&self, url: &str, status: StatusCode) -> HubError {
        let hint = match status.as_u16() {
            401 | 403 if self.token.is_some() => {
                "the token in HF_TOKEN was refused or has no access to this repo (gated: accept its terms on the hub)".to_string()
            }
            401 | 403 => "needs a token (HF_TOKEN): the repo is private or gated, or does not exist".to_string(),
            404 => "no such repo/file".to_string(),
            429 => "rate limited by the hub; try again later".to_string(),
            s if s >= 500 => "the server failed; try again later".to_string(),
            _ => status.canonical_reason().unwrap_or("unexpected status").to_string(),
        };
        HubError::Http {
            url: url.to_string(),
            status: status.as_u16(),
            hint,
        }
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A repo path for a URL: each segment percent-encoded outside the
/// characters that are safe in a path.
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_encoded_and_endpoints_trimmed() {
        assert_eq!(encode_path("a b/c+d.gguf"), "a%20b/c%2Bd.gguf");
        let c = Client::new("http://mirror.example/", None);
        let r = RepoSpec::parse("o/r").unwrap();
        assert_eq!(
            c.file_url(&r, "x.gguf"),
            "http://mirror.example/o/r/resolve/main/x.gguf"
        );
    }
}
