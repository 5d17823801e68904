//! Downloads into the cache: `{file}.part` grown by `Range` requests
//! (resumed after a dropped connection, a Ctrl-C or a killed process),
//! its sha256 checked against the hub's, then renamed to `{file}`.

use crate::client::Client;
use crate::error::HubError;
use crate::progress::{human, Reporter};
use crate::repo::{choose, RepoFile, RepoSpec};
use sha2::{Digest, Sha256};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Failed attempts in a row (no byte gained) before giving up; an attempt
/// that gained bytes starts the count again.
const MAX_FAILED_ATTEMPTS: u32 = 4;
const CHUNK: usize = 256 << 10;

/// What happened to one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Downloaded,
    AlreadyCached,
}

/// The files of a model in the cache, the first the one to open.
#[derive(Debug)]
pub struct Downloaded {
    pub files: Vec<(PathBuf, Outcome)>,
}

impl Downloaded {
    /// The file to open (the first part of a split model).
    pub fn model_path(&self) -> &Path {
        &self.files[0].0
    }
}

/// The cache path of a repo file, refusing names that would leave the
/// repo's folder.
pub fn cache_path(models_dir: &Path, spec: &RepoSpec, file: &str) -> Result<PathBuf, HubError> {
    let unsafe_name = || HubError::UnsafeFileName {
        repo: spec.repo(),
        file: file.to_string(),
    };
    let rel = Path::new(file);
    if file.is_empty()
        || file.contains('\\')
        || !rel.components().all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(unsafe_name());
    }
    Ok(models_dir.join(&spec.owner).join(&spec.name).join(rel))
}

/// `{path}.part`.
pub fn part_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

impl Client {
    /// The files of `spec` (its quant, or `hf_file`) in the cache under
    /// `models_dir`, downloading those not there yet.
    pub fn pull(
        &self,
        spec: &RepoSpec,
        hf_file: Option<&str>,
        models_dir: &Path,
        reporter: &mut Reporter,
        cancel: &AtomicBool,
    ) -> Result<Downloaded, HubError> {
        let listing = self.list(spec)?;
        let files = choose(&spec.repo(), &listing, spec.quant.as_deref(), hf_file)?;
        let mut out = Vec::new();
        for f in &files {
            let dest = cache_path(models_dir, spec, &f.name)?;
            let outcome = self.download(spec, f, &dest, reporter, cancel)?;
            out.push((dest, outcome));
        }
        Ok(Downloaded { files: out })
    }

    /// One repo file to `dest`, unless a complete copy is there.
    pub fn download(
        &self,
        spec: &RepoSpec,
        file: &RepoFile,
        dest: &Path,
        reporter: &mut Reporter,
        cancel: &AtomicBool,
    ) -> Result<Outcome, HubError> {
        let url = self.file_url(spec, &file.name);
        let (mut sha256, mut size) = (file.sha256.clone(), file.size);
        if sha256.is_none() {
            let (s, n) = self.head(&url)?;
            sha256 = s;
            size = size.or(n);
        }
        if let Ok(meta) = fs::metadata(dest) {
            // Only a verified download is ever renamed to `dest`.
            if meta.is_file() && size.is_none_or(|n| n == meta.len()) {
                return Ok(Outcome::AlreadyCached);
            }
        }
        if sha256.is_none() {
            reporter.note(&format!(
                "warning: {url}: the hub reports no sha256; only the size is checked"
            ));
        }
        let parent = dest.parent().expect("a cache path has a folder");
        fs::create_dir_all(parent).map_err(HubError::io(parent))?;
        let part = part_path(dest);
        let (hasher, have) = self.fetch(&url, &part, size, reporter, cancel)?;
        if let Some(n) = size {
            if have != n {
                let _ = fs::remove_file(&part);
                return Err(HubError::SizeMismatch {
                    url,
                    expected: n,
                    actual: have,
                });
            }
        }
        if let Some(expected) = sha256 {
            let actual = hex(&hasher.finalize());
            if actual != expected {
                // A wrong file must not be resumed either.
                let _ = fs::remove_file(&part);
                return Err(HubError::ChecksumMismatch {
                    url,
                    expected,
                    actual,
                });
            }
        }
        File::open(&part)
            .and_then(|f| f.sync_all())
            .map_err(HubError::io(&part))?;
        fs::rename(&part, dest).map_err(HubError::io(dest))?;
        // The rename itself survives a crash once the folder is synced.
        let _ = File::open(parent).and_then(|d| d.sync_all());
        Ok(Outcome::Downloaded)
    }

    /// Grow `part` to the whole file: the sha256 of what it holds and its
    /// length.
    fn fetch(
        &self,
        url: &str,
        part: &Path,
        size: Option<u64>,
        reporter: &mut Reporter,
        cancel: &AtomicBool,
    ) -> Result<(Sha256, u64), HubError> {
        let (mut hasher, mut have) = hash_existing(part, size, reporter)?;
        let mut failed = 0;
        let mut last_error = String::new();
        loop {
            if size == Some(have) && have > 0 {
                return Ok((hasher, have));
            }
            if failed >= MAX_FAILED_ATTEMPTS {
                return Err(HubError::GaveUp {
                    url: url.to_string(),
                    detail: last_error,
                    have,
                    part: part.to_path_buf(),
                });
            }
            if failed > 0 {
                std::thread::sleep(Duration::from_millis(500 << failed.min(4)));
            }
            let range = [("Range", format!("bytes={have}-"))];
            let resp = match self.get(url, if have > 0 { &range } else { &[] }) {
                Ok(r) => r,
                Err(e) => {
                    failed += 1;
                    last_error = e.to_string();
                    reporter.note(&format!("{last_error}; retrying"));
                    continue;
                }
            };
            let status = resp.status().as_u16();
            let append = match status {
                206 if have > 0 => {
                    let start = resp
                        .headers()
                        .get("content-range")
                        .and_then(|v| v.to_str().ok())
                        .and_then(range_start);
                    if start != Some(have) {
                        // Not the bytes asked for: take the whole file.
                        reporter.note(&format!(
                            "{url}: the server sent another range than bytes={have}-; starting over"
                        ));
                        (hasher, have) = (Sha256::new(), 0);
                        fs::remove_file(part).map_err(HubError::io(part))?;
                        continue;
                    }
                    true
                }
                200 | 206 => {
                    if have > 0 {
                        reporter.note(&format!(
                            "{url}: the server does not resume downloads; starting over"
                        ));
                    }
                    (hasher, have) = (Sha256::new(), 0);
                    false
                }
                416 if have > 0 => {
                    // More than the file holds (it changed on the hub).
                    reporter.note(&format!(
                        "{url}: the partial download is not a prefix of the file; starting over"
                    ));
                    (hasher, have) = (Sha256::new(), 0);
                    fs::remove_file(part).map_err(HubError::io(part))?;
                    continue;
                }
                // Retrying cannot fix a client error (401, 404).
                s if (400..500).contains(&s) && s != 408 && s != 429 => {
                    return Err(self.status_error(url, resp.status()));
                }
                _ => {
                    failed += 1;
                    last_error = self.status_error(url, resp.status()).to_string();
                    reporter.note(&format!("{last_error}; retrying"));
                    continue;
                }
            };
            let mut out = OpenOptions::new()
                .create(true)
                .write(true)
                .append(append)
                .truncate(!append)
                .open(part)
                .map_err(HubError::io(part))?;
            reporter.start(url, size, have);
            let before = have;
            let mut body = resp.into_body();
            let mut reader = body.as_reader();
            let mut buf = vec![0u8; CHUNK];
            let result = loop {
                if cancel.load(Ordering::Relaxed) {
                    reporter.finish();
                    return Err(HubError::Interrupted {
                        part: part.to_path_buf(),
                        have,
                        total: size,
                    });
                }
                let n = match reader.read(&mut buf) {
                    Ok(0) => break Ok(()),
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => break Err(e.to_string()),
                };
                if size.is_some_and(|s| have + n as u64 > s) {
                    break Err(format!(
                        "the server sent more than the {} bytes listed",
                        size.unwrap_or(0)
                    ));
                }
                out.write_all(&buf[..n]).map_err(HubError::io(part))?;
                hasher.update(&buf[..n]);
                have += n as u64;
                reporter.advance(have);
            };
            reporter.finish();
            match result {
                Ok(()) if size.is_none_or(|s| s == have) => return Ok((hasher, have)),
                Ok(()) => last_error = format!("the connection closed at byte {have}"),
                Err(e) => last_error = format!("{e} at byte {have}"),
            }
            failed = if have > before { 1 } else { failed + 1 };
            reporter.note(&format!(
                "{url}: {last_error} of {}; resuming",
                size.map(human).unwrap_or_else(|| "?".into())
            ));
        }
    }
}

/// The sha256 and length of a partial download, read once so a resumed
/// download is checked whole; a part longer than the file is dropped.
fn hash_existing(
    part: &Path,
    size: Option<u64>,
    reporter: &Reporter,
) -> Result<(Sha256, u64), HubError> {
    let mut hasher = Sha256::new();
    let mut f = match File::open(part) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((hasher, 0)),
        Err(e) => return Err(HubError::io(part)(e)),
    };
    let len = f.metadata().map_err(HubError::io(part))?.len();
    if size.is_some_and(|s| len > s) {
        fs::remove_file(part).map_err(HubError::io(part))?;
        return Ok((hasher, 0));
    }
    if len > 0 {
        reporter.note(&format!(
            "resuming {} ({} already downloaded)",
            part.display(),
            human(len)
        ));
    }
    let mut buf = vec![0u8; CHUNK];
    let mut have = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(HubError::io(part))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        have += n as u64;
    }
    Ok((hasher, have))
}

/// `N` of `Content-Range: bytes N-M/T`.
fn range_start(v: &str) -> Option<u64> {
    v.trim()
        .strip_prefix("bytes ")?
        .split('-')
        .next()?
        .trim()
        .parse()
        .ok()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_paths_stay_in_the_repo_folder() {
        let spec = RepoSpec::parse("o/r").unwrap();
        let dir = Path::new("/m");
        assert_eq!(
            cache_path(dir, &spec, "sub/x.gguf").unwrap(),
            Path::new("/m/o/r/sub/x.gguf")
        );
        for bad in ["../x.gguf", "/etc/x", "a/../../x", "", "a\\b", "./x"] {
            assert!(cache_path(dir, &spec, bad).is_err(), "{bad}");
        }
        assert_eq!(
            part_path(Path::new("/a/b.gguf")),
            Path::new("/a/b.gguf.part")
        );
        assert_eq!(range_start("bytes 100-199/200"), Some(100));
        assert_eq!(range_start("bytes */200"), None);
    }
}
