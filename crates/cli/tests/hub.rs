//! Models by name through the real binary, against the in-process hub
//! stand-in (HF_ENDPOINT): pull, resume after a dropped connection and
//! after Ctrl-C, a wrong checksum, 401/404, `models`, `run -m NAME` and
//! `run -hf REPO:QUANT`. The model is the built-in one's file (2 MB).

use hub::test_server::TestHub;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../models/cachefit-shakespeare.gguf"
);
const FILE: &str = "cachefit-shakespeare-Q8_0.gguf";

struct Fixture {
    tmp: tempfile::TempDir,
    hub: TestHub,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("hub/test-owner/shakespeare-GGUF");
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::copy(MODEL, repo.join(FILE)).unwrap();
        let hub = TestHub::start(&tmp.path().join("hub"));
        Fixture { tmp, hub }
    }

    fn cache(&self) -> PathBuf {
        self.tmp.path().join("cache")
    }

    fn dest(&self) -> PathBuf {
        self.cache().join("test-owner/shakespeare-GGUF").join(FILE)
    }

    fn part(&self) -> PathBuf {
        PathBuf::from(format!("{}.part", self.dest().display()))
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cachefit"));
        c.args(args)
            .env("HF_ENDPOINT", self.hub.endpoint())
            .env("CACHEFIT_MODELS", self.cache())
            .env_remove("HF_TOKEN")
            .env_remove("HUGGING_FACE_HUB_TOKEN")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out: Output = self.command(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn same_as_model(p: &Path) -> bool {
    std::fs::read(p).unwrap() == std::fs::read(MODEL).unwrap()
}

#[test]
fn pull_then_models_then_run_by_name() {
    let f = Fixture::new();
    let (ok, out, err) = f.run(&["pull", "test-owner/shakespeare-GGUF:q8_0"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), f.dest().display().to_string());
    assert!(same_as_model(&f.dest()) && !f.part().exists());

    let (ok, out, err) = f.run(&["models"]);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("test-owner/shakespeare-GGUF:Q8_0"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("cachefit") && line.ends_with("yes"), "{line}");

    for name in [
        "test-owner/shakespeare-GGUF:Q8_0",
        "shakespeare-GGUF",
        "cachefit-shakespeare-Q8_0",
    ] {
        let (ok, out, err) = f.run(&["run", "-m", name, "-n", "4", "--temp", "0", "-p", "ROMEO:"]);
        assert!(ok, "-m {name}: {err}");
        assert!(!out.is_empty(), "-m {name}");
    }
    // Cached: -hf needs no server.
    f.hub.set(|k| k.status = Some(500));
    let (ok, _, err) = f.run(&[
        "run",
        "-hf",
        "test-owner/shakespeare-GGUF:Q8_0",
        "-n",
        "2",
        "-p",
        "A",
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = f.run(&["run", "-m", "no-such-model", "-n", "2", "-p", "A"]);
    assert!(
        !ok && err.contains("not a cached model") && err.contains("cachefit pull"),
        "{err}"
    );
}

#[test]
fn run_hf_downloads_what_is_not_cached() {
    let f = Fixture::new();
    let (ok, out, err) = f.run(&[
        "run",
        "-hf",
        "test-owner/shakespeare-GGUF",
        "-n",
        "4",
        "-p",
        "ROMEO:",
    ]);
    assert!(ok, "{err}");
    assert!(!out.is_empty());
    assert!(err.contains("downloading"), "{err}");
    assert!(same_as_model(&f.dest()));
}

#[test]
fn a_dropped_connection_is_resumed() {
    let f = Fixture::new();
    f.hub.set(|k| k.drop_after = Some(700_000));
    let (ok, _, err) = f.run(&["pull", "test-owner/shakespeare-GGUF"]);
    assert!(ok, "{err}");
    assert!(err.contains("resuming"), "{err}");
    assert!(same_as_model(&f.dest()));
    assert!(f
        .hub
        .requests()
        .iter()
        .any(|r| r.range.as_deref() == Some("bytes=700000-")));
}

#[test]
fn a_wrong_checksum_leaves_nothing() {
    let f = Fixture::new();
    f.hub.set(|k| k.wrong_sha256 = true);
    let (ok, _, err) = f.run(&["pull", "test-owner/shakespeare-GGUF"]);
    assert!(!ok && err.contains("checksum mismatch"), "{err}");
    assert!(!f.dest().exists() && !f.part().exists());
    let (_, out, _) = f.run(&["models", "--json"]);
    assert!(out.trim().is_empty(), "{out}");
}

#[test]
fn http_errors_are_explained() {
    let f = Fixture::new();
    f.hub.set(|k| k.status = Some(401));
    let (ok, _, err) = f.run(&["pull", "test-owner/shakespeare-GGUF"]);
    assert!(
        !ok && err.contains("HTTP 401") && err.contains("HF_TOKEN"),
        "{err}"
    );
    f.hub.set(|k| k.status = None);
    let (ok, _, err) = f.run(&["pull", "test-owner/nothing-here"]);
    assert!(
        !ok && err.contains("HTTP 404") && err.contains("no such repo/file"),
        "{err}"
    );
    let (ok, _, err) = f.run(&["pull", "not-a-repo-name"]);
    assert!(!ok && err.contains("OWNER/REPO"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn ctrl_c_keeps_the_part_and_the_next_pull_resumes() {
    let f = Fixture::new();
    // About 3 s for the 2 MB file.
    f.hub
        .set(|k| k.slow = Some((16 << 10, Duration::from_millis(25))));
    let child = f
        .command(&["pull", "test-owner/shakespeare-GGUF"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(f.part()).map_or(0, |m| m.len()) < 100_000 {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted") && err.contains(".part"),
        "{err}"
    );
    let kept = std::fs::metadata(f.part()).unwrap().len();
    assert!(kept > 0 && kept < std::fs::metadata(MODEL).unwrap().len());
    assert!(!f.dest().exists(), "a partial download was put in place");
    // Not a model: `models` mentions it only as a partial download.
    let (_, out, err) = f.run(&["models"]);
    assert!(!out.contains("shakespeare-GGUF:"), "{out}");
    assert!(err.contains("partial download"), "{err}");

    f.hub.set(|k| k.slow = None);
    let (ok, _, err) = f.run(&["pull", "test-owner/shakespeare-GGUF"]);
    assert!(ok, "{err}");
    assert!(err.contains("resuming"), "{err}");
    assert!(same_as_model(&f.dest()) && !f.part().exists());
    let last = f.hub.requests().pop().unwrap();
    assert_eq!(last.range, Some(format!("bytes={kept}-")));
}
