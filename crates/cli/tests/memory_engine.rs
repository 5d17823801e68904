//! Long memory through the commands (issue #18), on the built-in model (a
//! few thousand tokens ingest in seconds): `memory ingest`, `run --memory`
//! recalling from beyond its context, `chat --memory` appending turns that
//! a later chat sees, the binding to one model, and `serve --memory-dir`
//! keeping each key's memories apart.

mod common;
mod server_support;

use common::cachefit;
use server_support::Server;
use std::io::Write;
use std::process::{Command, Stdio};

/// The command's JSON: the whole output, or its last line.
fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out)
        .or_else(|_| serde_json::from_str(out.trim().lines().last().unwrap_or("")))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// 40 KB of the training text (the built-in model knows its style).
fn text(dir: &std::path::Path) -> std::path::PathBuf {
    let all = std::fs::read_to_string(testkit::workspace_root().join("data/tinyshakespeare.txt"))
        .unwrap();
    let p = dir.join("text.txt");
    std::fs::write(&p, &all[200_000..240_000]).unwrap();
    p
}

#[test]
fn ingest_then_run_sees_the_history_and_recalls_beyond_the_context() {
    let dir = tempfile::tempdir().unwrap();
    let mem = dir.path().join("notes.mem");
    let m = mem.to_str().unwrap();
    let t = text(dir.path());
    let (ok, out, err) = cachefit(&["memory", "ingest", m, "-f", t.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let ing = json(&out);
    let tokens = ing["tokens"].as_u64().unwrap();
    assert!(tokens > 8000, "{ing}");
    assert!(ing["bytes_per_token"].as_f64().unwrap() < 320.0, "{ing}");
    assert!(err.contains("a new memory file"), "{err}");

    // Appending more: the same file grows, its layout kept.
    let (ok, out, err) = cachefit(&["memory", "ingest", m, "-f", t.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    assert_eq!(json(&out)["tokens"].as_u64().unwrap(), 2 * tokens);
    assert!(!err.contains("a new memory file"), "{err}");
    let (ok, out, _) = cachefit(&["memory", "verify", m]);
    assert!(ok, "{out}");

    let run = |extra: &[&str]| {
        let mut a = vec![
            "run", "ROMEO:", "--temp", "0", "-n", "16", "--json", "--memory", m,
        ];
        a.extend_from_slice(extra);
        let (ok, out, err) = cachefit(&a);
        assert!(ok, "{err}");
        (json(&out), err)
    };
    let (v, err) = run(&[]);
    let mem_v = &v["memory"];
    assert_eq!(mem_v["history_tokens"].as_u64().unwrap(), 2 * tokens, "{v}");
    // The built-in model's context is far shorter than the history: the
    // prompt sees its start, its end and recalled blocks.
    assert!(mem_v["sinks"].as_u64().unwrap() > 0, "{v}");
    assert!(mem_v["hot"].as_u64().unwrap() > 0, "{v}");
    assert!(
        !mem_v["recalled_blocks"].as_array().unwrap().is_empty(),
        "{v}"
    );
    assert!(err.contains("tokens of history"), "{err}");
    // Deterministic: the same recall and text again; a different memory
    // setting changes what the prompt sees.
    let (v2, _) = run(&[]);
    assert_eq!(v2["text"], v["text"]);
    assert_eq!(v2["memory"]["recalled_blocks"], mem_v["recalled_blocks"]);
    let (v3, _) = run(&["--memory-recall", "0"]);
    assert_eq!(v3["memory"]["recalled_tokens"], 0);
    // Reading never changes the file.
    let (_, out, _) = cachefit(&["memory", "inspect", m, "--json"]);
    assert_eq!(json(&out)["tokens"].as_u64().unwrap(), 2 * tokens);
}

#[test]
fn a_memory_is_bound_to_its_model_and_missing_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mem = dir.path().join("m.mem");
    let m = mem.to_str().unwrap();
    let t = text(dir.path());
    let (ok, _, err) = cachefit(&["run", "ROMEO:", "--memory", m]);
    assert!(!ok && err.contains("does not exist"), "{err}");
    let (ok, _, err) = cachefit(&["memory", "ingest", m, "-f", t.to_str().unwrap()]);
    assert!(ok, "{err}");
    let Some(smol) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let (ok, _, err) = cachefit(&[
        "run",
        "-m",
        smol.to_str().unwrap(),
        "-p",
        "Hi",
        "--memory",
        m,
    ]);
    assert!(!ok);
    assert!(err.contains("made with another model"), "{err}");
    // The other way: appending with the wrong model is refused too, and the
    // file is untouched.
    let (ok, _, err) = cachefit(&[
        "memory",
        "ingest",
        m,
        "-m",
        smol.to_str().unwrap(),
        "-f",
        t.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("made with another model"), "{err}");
    let (ok, out, _) = cachefit(&["memory", "verify", m]);
    assert!(ok, "{out}");
}

/// `cachefit chat ARGS` with `stdin`: (ok, stdout, stderr).
fn chat(args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn chat_appends_every_turn_and_a_later_chat_sees_them() {
    let dir = tempfile::tempdir().unwrap();
    let mem = dir.path().join("chat.mem");
    let m = mem.to_str().unwrap();
    let args = ["--temp", "0", "-n", "24", "--memory", m];
    let (ok, out, err) = chat(&args, "Who is Romeo?\nWho is Juliet?\n");
    assert!(ok, "{err}");
    // Two answers (a reply may end in a blank line of its own).
    let answers = out.lines().filter(|l| !l.trim().is_empty()).count();
    assert_eq!(answers, 2, "{out}");
    // Two turns appended; the second saw the first.
    let appended: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("tokens appended"))
        .collect();
    assert_eq!(appended.len(), 2, "{err}");
    assert!(appended[0].contains(": 0 tokens of history"), "{err}");
    assert!(!appended[1].contains(": 0 tokens of history"), "{err}");
    let (_, out1, _) = cachefit(&["memory", "inspect", m, "--json"]);
    let after_first = json(&out1)["tokens"].as_u64().unwrap();
    assert!(after_first > 0);

    // A new chat remembers: its prompt sees the earlier turns.
    let (ok, _, err) = chat(&args, "And who is Tybalt?\n");
    assert!(ok, "{err}");
    assert!(
        err.contains(&format!(": {after_first} tokens of history")),
        "{err}"
    );
    let (_, out2, _) = cachefit(&["memory", "inspect", m, "--json"]);
    assert!(json(&out2)["tokens"].as_u64().unwrap() > after_first);
    let (ok, out, _) = cachefit(&["memory", "verify", m]);
    assert!(ok, "{out}");
}

#[test]
fn serve_keeps_a_memory_per_conversation_and_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memories");
    let r = root.to_str().unwrap();
    let ask = |server: &Server, key: &str, body: &str| {
        let auth = format!("Authorization: Bearer {key}");
        server.post("/v1/chat/completions", &[auth.as_str()], body)
    };
    let body = |name: &str, field: &str| {
        format!(
            r#"{{"messages": [{{"role": "user", "content": "Who is Romeo?"}}], "max_tokens": 8, "temperature": 0, "{field}": "{name}"}}"#
        )
    };
    let key_files = |root: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(root)
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    {
        let s = Server::start_builtin(&["--memory-dir", r, "--api-key", "alpha"]);
        let a = ask(&s, "alpha", &body("bob", "memory"));
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(a.json()["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        // The second exchange of the same conversation sees the first.
        let b = ask(&s, "alpha", &body("bob", "memory"));
        let (pa, pb) = (
            a.json()["usage"]["prompt_tokens"].as_u64().unwrap(),
            b.json()["usage"]["prompt_tokens"].as_u64().unwrap(),
        );
        assert!(pb > pa, "{pa} then {pb}");
        // OpenAI's `user` names one as well; another name starts empty.
        let c = ask(&s, "alpha", &body("carol", "user"));
        assert_eq!(c.json()["usage"]["prompt_tokens"].as_u64().unwrap(), pa);
        // Names that could leave the folder are refused.
        for bad in ["../x", ".hidden", "a/b", ""] {
            let e = ask(&s, "alpha", &body(bad, "memory"));
            assert_eq!(e.status, 400, "{bad}: {}", e.body);
            assert_eq!(e.error()["param"], "memory");
        }
    }
    let folders = key_files(&root);
    assert_eq!(folders.len(), 1, "{folders:?}");
    let files = key_files(&folders[0]);
    assert!(files.iter().any(|f| f.ends_with("bob.mem")), "{files:?}");

    // Another key: the same name is another, empty memory.
    let s = Server::start_builtin(&["--memory-dir", r, "--api-key", "beta"]);
    let d = ask(&s, "beta", &body("bob", "memory"));
    assert_eq!(d.status, 200, "{}", d.body);
    let first = {
        let s2 = Server::start_builtin(&[]);
        let e = s2.post(
            "/v1/chat/completions",
            &[],
            &body("x", "user").replace(r#", "user": "x""#, ""),
        );
        e.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    assert_eq!(d.json()["usage"]["prompt_tokens"].as_u64().unwrap(), first);
    assert_eq!(key_files(&root).len(), 2);
    drop(s);

    // Without --memory-dir: `memory` is refused, `user` is only a label.
    let s = Server::start_builtin(&[]);
    assert_eq!(
        s.post("/v1/chat/completions", &[], &body("bob", "memory"))
            .status,
        400
    );
    assert_eq!(
        s.post("/v1/chat/completions", &[], &body("bob", "user"))
            .status,
        200
    );
}
