//! What a newcomer sees first (issue #17, part 4): `run` samples by
//! default with a logged seed, a closed pipe is not a crash, a busy port
//! says why once, `info` describes the built-in model, help shows
//! llama.cpp's spellings and the true defaults.

mod common;

use common::cachefit;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// Lines of `text` that repeat an earlier line, and all non-empty lines.
fn repeats(text: &str) -> (usize, usize) {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut seen = std::collections::HashSet::new();
    let repeated = lines.iter().filter(|l| !seen.insert(**l)).count();
    (repeated, lines.len())
}

#[test]
fn run_samples_by_default_with_a_logged_seed() {
    let (ok, a, err_a) = cachefit(&["run", "ROMEO:", "-n", "200"]);
    assert!(ok, "{err_a}");
    let (ok, b, _) = cachefit(&["run", "ROMEO:", "-n", "200"]);
    assert!(ok);
    assert_ne!(a, b, "two runs without a seed gave the same text");
    for text in [&a, &b] {
        let (repeated, lines) = repeats(text);
        assert!(lines > 0, "{text}");
        assert!(
            2 * repeated < lines,
            "{repeated} of {lines} lines repeat:\n{text}"
        );
    }
    // The seed is logged and repeats the run.
    let seed = err_a
        .split("sampling with seed ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no seed logged: {err_a}"))
        .to_string();
    let (ok, again, _) = cachefit(&["run", "ROMEO:", "-n", "200", "-s", &seed]);
    assert!(ok);
    assert_eq!(again, a);
    // --temp 0 is greedy: the same text every time, and no seed to log.
    let (_, g1, err) = cachefit(&["run", "ROMEO:", "-n", "40", "--temp", "0"]);
    let (_, g2, _) = cachefit(&["run", "ROMEO:", "-n", "40", "--temp", "0"]);
    assert_eq!(g1, g2);
    assert!(!err.contains("sampling with seed"), "{err}");
}

/// Run `cachefit ARGS`, read one line of its stdout, close the pipe; the
/// exit status and stderr.
fn closed_after_one_line(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // The reader is dropped: later writes get EPIPE.
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_pipe_is_not_a_crash() {
    let model = testkit::workspace_root().join("models/cachefit-ternary.gguf");
    let m = model.to_str().unwrap();
    for args in [
        vec!["inspect", m, "--full"],
        vec!["tokenize", "--ids", "hello world, and more words to print"],
        vec!["run", "ROMEO:", "-n", "400", "--ignore-eos"],
        vec!["bench", "-p", "8", "-n", "8", "-r", "1", "--no-probe"],
    ] {
        let (status, err) = closed_after_one_line(&args);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(status.success(), "{args:?}: {status}: {err}");
    }
}

#[test]
fn a_busy_port_says_why_once() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let (ok, _, err) = cachefit(&["serve", "--port", &port, "-t", "1"]);
    assert!(!ok);
    assert_eq!(err.matches("in use").count(), 1, "{err}");
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{err}"
    );
    // One slot is one slot.
    assert!(!err.contains("1 slots"), "{err}");
}

#[test]
fn info_describes_the_built_in_model() {
    let (ok, out, err) = cachefit(&["info", "--quick"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("model:     built-in cachefit-ternary"),
        "{out}"
    );
    assert!(out.contains("decode ceiling"), "{out}");
}

#[test]
fn help_shows_llama_cpp_spellings_and_true_defaults() {
    for cmd in ["run", "chat", "serve", "perplexity"] {
        let (ok, out, _) = cachefit(&[cmd, "--help"]);
        assert!(ok);
        assert!(
            out.contains("-tb N") && out.contains("-ub N"),
            "{cmd}: {out}"
        );
    }
    let (_, out, _) = cachefit(&["bench", "--help"]);
    assert!(out.contains("-pg PP,TG") && out.contains("-ub N"), "{out}");
    let (_, out, _) = cachefit(&["perplexity", "-h"]);
    let c = out.lines().find(|l| l.contains("--ctx-size")).unwrap();
    assert!(c.contains("[default: 512]"), "{c}");
    let (_, out, _) = cachefit(&["run", "-h"]);
    let at = out.find("--temp").unwrap();
    assert!(out[at..].contains("[default: 0.8]"), "{out}");
}
