//! Downloads against the in-process hub stand-in: resume after a dropped
//! connection, a server that ignores Range, wrong checksums, 401/404,
//! the token, an interrupted download kept for the next run.

use cachefit_hub::test_server::TestHub;
use cachefit_hub::{Client, HubError, Outcome, RepoSpec, Reporter};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// A repo `o/r` with a 3 MB model file of known bytes, and an empty cache.
struct Fixture {
    _tmp: tempfile::TempDir,
    cache: PathBuf,
    bytes: Vec<u8>,
    hub: TestHub,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("hub/o/r");
    std::fs::create_dir_all(&repo).unwrap();
    let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(repo.join("m-Q4_K_M.gguf"), &bytes).unwrap();
    std::fs::write(repo.join("m-Q8_0.gguf"), b"other").unwrap();
    std::fs::write(repo.join("README.md"), b"readme").unwrap();
    let hub = TestHub::start(&tmp.path().join("hub"));
    let cache = tmp.path().join("cache");
    Fixture {
        _tmp: tmp,
        cache,
        bytes,
        hub,
    }
}

fn pull(f: &Fixture, spec: &str, token: Option<&str>) -> Result<Vec<(PathBuf, Outcome)>, HubError> {
    let client = Client::new(&f.hub.endpoint(), token.map(str::to_string));
    let spec = RepoSpec::parse(spec).unwrap();
    client
        .pull(
            &spec,
            None,
            &f.cache,
            &mut Reporter::silent(),
            &AtomicBool::new(false),
        )
        .map(|d| d.files)
}

fn dest(f: &Fixture) -> PathBuf {
    f.cache.join("o/r/m-Q4_K_M.gguf")
}

fn part(p: &Path) -> PathBuf {
    PathBuf::from(format!("{}.part", p.display()))
}

#[test]
fn the_default_quant_is_downloaded_and_then_found_cached() {
    let f = fixture();
    let files = pull(&f, "o/r", None).unwrap();
    assert_eq!(files, [(dest(&f), Outcome::Downloaded)]);
    assert_eq!(std::fs::read(dest(&f)).unwrap(), f.bytes);
    assert!(!part(&dest(&f)).exists());
    assert_eq!(
        pull(&f, "o/r:q4_k_m", None).unwrap()[0].1,
        Outcome::AlreadyCached
    );
    let got = pull(&f, "o/r:Q8_0", None).unwrap();
    assert_eq!(std::fs::read(&got[0].0).unwrap(), b"other");
}

#[test]
fn a_dropped_connection_is_resumed_with_range() {
    let f = fixture();
    f.hub.set(|k| k.drop_after = Some(1_000_000));
    pull(&f, "o/r", None).unwrap();
    assert_eq!(std::fs::read(dest(&f)).unwrap(), f.bytes);
    let ranges: Vec<Option<String>> = f
        .hub
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with(".gguf") && r.method == "GET")
        .map(|r| r.range)
        .collect();
    assert_eq!(ranges, [None, Some("bytes=1000000-".to_string())]);
}

#[test]
fn a_part_left_by_an_earlier_run_is_resumed_and_checked_whole() {
    let f = fixture();
    std::fs::create_dir_all(dest(&f).parent().unwrap()).unwrap();
    std::fs::write(part(&dest(&f)), &f.bytes[..1234]).unwrap();
    pull(&f, "o/r", None).unwrap();
    assert_eq!(std::fs::read(dest(&f)).unwrap(), f.bytes);
    let last = f.hub.requests().pop().unwrap();
    assert_eq!(last.range.as_deref(), Some("bytes=1234-"));

    // A part that is not a prefix of the file fails the checksum and is
    // deleted, never renamed into place.
    let f = fixture();
    std::fs::create_dir_all(dest(&f).parent().unwrap()).unwrap();
    std::fs::write(part(&dest(&f)), vec![9u8; 1234]).unwrap();
    let e = pull(&f, "o/r", None).unwrap_err();
    assert!(matches!(e, HubError::ChecksumMismatch { .. }), "{e}");
    assert!(!dest(&f).exists() && !part(&dest(&f)).exists());
}

#[test]
fn a_server_that_ignores_range_restarts_the_file() {
    let f = fixture();
    f.hub.set(|k| {
        k.drop_after = Some(500_000);
        k.ignore_range = true;
    });
    pull(&f, "o/r", None).unwrap();
    assert_eq!(std::fs::read(dest(&f)).unwrap(), f.bytes);
}

#[test]
fn a_wrong_checksum_is_refused_and_leaves_nothing() {
    let f = fixture();
    f.hub.set(|k| k.wrong_sha256 = true);
    let e = pull(&f, "o/r", None).unwrap_err().to_string();
    assert!(
        e.contains("checksum mismatch") && e.contains("m-Q4_K_M.gguf"),
        "{e}"
    );
    assert!(!dest(&f).exists() && !part(&dest(&f)).exists());
    // The same through the ETag, when the listing has no LFS data.
    f.hub.set(|k| k.no_lfs_in_listing = true);
    let e = pull(&f, "o/r", None).unwrap_err().to_string();
    assert!(e.contains("checksum mismatch"), "{e}");
    assert!(!dest(&f).exists() && !part(&dest(&f)).exists());
    f.hub.set(|k| k.wrong_sha256 = false);
    pull(&f, "o/r", None).unwrap();
    assert_eq!(std::fs::read(dest(&f)).unwrap(), f.bytes);
}

#[test]
fn http_errors_say_what_to_do() {
    let f = fixture();
    f.hub.set(|k| k.status = Some(401));
    let e = pull(&f, "o/r", None).unwrap_err().to_string();
    assert!(
        e.contains("HTTP 401") && e.contains("HF_TOKEN") && e.contains("/api/models/o/r"),
        "{e}"
    );
    f.hub.set(|k| k.status = None);
    let e = pull(&f, "o/nope", None).unwrap_err().to_string();
    assert!(
        e.contains("HTTP 404") && e.contains("no such repo/file"),
        "{e}"
    );
    let e = pull(&f, "o/r:Q2_K", None).unwrap_err().to_string();
    assert!(
        e.contains("quant Q2_K") && e.contains("m-Q4_K_M.gguf"),
        "{e}"
    );
}

#[test]
fn the_token_is_sent() {
    let f = fixture();
    f.hub.set(|k| k.token = Some("sekrit".into()));
    let e = pull(&f, "o/r", None).unwrap_err().to_string();
    assert!(e.contains("HTTP 401"), "{e}");
    pull(&f, "o/r", Some("sekrit")).unwrap();
    assert!(f
        .hub
        .requests()
        .iter()
        .any(|r| r.authorization.as_deref() == Some("Bearer sekrit")));
}

#[test]
fn an_interrupted_download_keeps_its_part() {
    let f = fixture();
    f.hub
        .set(|k| k.slow = Some((64 << 10, std::time::Duration::from_millis(5))));
    let client = Client::new(&f.hub.endpoint(), None);
    let spec = RepoSpec::parse("o/r").unwrap();
    let cancel = AtomicBool::new(false);
    let e = std::thread::scope(|s| {
        s.spawn(|| {
            while std::fs::metadata(part(&dest(&f))).map_or(0, |m| m.len()) == 0 {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        client
            .pull(&spec, None, &f.cache, &mut Reporter::silent(), &cancel)
            .unwrap_err()
    });
    assert!(matches!(e, HubError::Interrupted { .. }), "{e}");
    let kept = std::fs::metadata(part(&dest(&f))).unwrap().len();
    assert!(kept > 0 && kept < f.bytes.len() as u64, "{kept}");
    assert!(!dest(&f).exists());
    f.hub.set(|k| k.slow = None);
    pull(&f, "o/r", None).unwrap();
    assert_eq!(std::fs::read(dest(&f)).unwrap(), f.bytes);
}
