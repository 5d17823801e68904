//! `cachefit chat` through the real binary: messages piped in on stdin,
//! replies read from stdout, and a terminal session through `script(1)`'s
//! pseudo-terminal for prompts and Ctrl-C.
//!
//! SmolLM2-135M at Q4_1 is a small model: these tests check what a reply
//! must show (Paris, the rendered history), not how well it talks.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn model() -> Option<String> {
    testkit::model(testkit::SMOLLM2_Q4_1).map(|p| p.to_str().unwrap().to_string())
}

/// Run a chat with `stdin` piped in; (success, stdout, stderr).
fn chat(args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cachefit");
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

/// The stats lines, one per reply.
fn replies(stderr: &str) -> usize {
    stderr.matches("cachefit: reply ").count()
}

/// From each stats line: tokens generated, prompt tokens taken from the
/// cache, prompt tokens evaluated.
fn stats(stderr: &str) -> Vec<[usize; 3]> {
    let number_after = |line: &str, key: &str| -> usize {
        let (_, rest) = line.split_once(key).unwrap();
        rest.split(' ').next().unwrap().parse().unwrap()
    };
    stderr
        .lines()
        .filter(|l| l.starts_with("cachefit: reply "))
        .map(|l| {
            let (before, _) = l.split_once(" from the cache").unwrap();
            [
                number_after(l, "reply "),
                before.rsplit(' ').next().unwrap().parse().unwrap(),
                number_after(l, "from the cache, "),
            ]
        })
        .collect()
}

/// The prompts `--verbose-prompt` printed, in order.
fn prompts(stderr: &str) -> Vec<&str> {
    stderr
        .split("cachefit: prompt, ")
        .skip(1)
        .map(|p| p.split("\ncachefit: ").next().unwrap())
        .collect()
}

#[test]
fn flags_are_checked_before_loading() {
    let (ok, _, err) = chat(&["-m", "/nonexistent.gguf", "-n", "0"], "");
    assert!(!ok);
    assert!(err.contains("-n must be positive"), "{err}");
    let (ok, _, err) = chat(&["-m", "/nonexistent.gguf", "--temp", "-1"], "");
    assert!(!ok);
    assert!(err.contains("--temp"), "{err}");
}

#[test]
fn replies_clear_and_exit() {
    let Some(m) = model() else { return };
    let args = ["-m", &m, "--temp", "0", "-n", "24"];
    let (ok, out, err) = chat(
        &args,
        "Name the capital of France.\n/clear\nWhat is 2+2?\n/exit\nNever read.\n",
    );
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "one line per reply, nothing after /exit: {out:?}"
    );
    assert!(lines[0].contains("Paris"), "{out:?}");
    assert!(
        err.contains("conversation cleared (1 exchange forgotten)"),
        "{err}"
    );
    assert_eq!(replies(&err), 2, "{err}");
    assert!(
        !err.contains("note: the model has no chat template"),
        "{err}"
    );

    // After /clear the reply is the one a fresh session gives, though the
    // system prompt's part of the cache was kept.
    let [_, cached, _] = stats(&err)[1];
    assert!(cached > 0, "{err}");
    let (ok, fresh, err) = chat(&args, "What is 2+2?\n");
    assert!(ok, "{err}");
    assert_eq!(fresh.trim_end(), lines[1]);
    assert_eq!(stats(&err)[0][1], 0, "{err}");
}

#[test]
fn history_system_prompt_and_multiline_input() {
    let Some(m) = model() else { return };
    let args = [
        "-m",
        &m,
        "--temp",
        "0",
        "-n",
        "8",
        "--verbose-prompt",
        "--system",
        "You answer briefly.",
    ];
    let input =
        "My name is Ana.\nWhat is\\\nmy name?\n\"\"\"\nA pasted /clear\nends here\\\n\"\"\"\n";
    let (ok, out, err) = chat(&args, input);
    assert!(ok, "{err}");
    assert_eq!(replies(&err), 3, "{err}");
    let p = prompts(&err);
    assert_eq!(p.len(), 3, "{err}");
    // --system replaces the template's default system prompt.
    for prompt in &p {
        assert!(
            prompt.contains("system\nYou answer briefly.<|im_end|>"),
            "{prompt}"
        );
        assert!(!prompt.contains("SmolLM"), "{prompt}");
    }
    // The second prompt holds the first exchange, reply included, and the
    // continued line; the third the fenced block as typed.
    let first_reply = out.lines().next().unwrap();
    assert!(p[1].contains("user\nMy name is Ana.<|im_end|>"), "{}", p[1]);
    assert!(
        p[1].contains(&format!("assistant\n{first_reply}<|im_end|>")),
        "{}",
        p[1]
    );
    assert!(
        p[1].contains("user\nWhat is\nmy name?<|im_end|>"),
        "{}",
        p[1]
    );
    assert!(
        p[2].contains("user\nA pasted /clear\nends here\\<|im_end|>"),
        "{}",
        p[2]
    );
    assert!(!err.contains("conversation cleared"), "{err}");
    // Later turns evaluate only what follows the cached prefix: the
    // previous prompt and reply stay in the cache.
    let s = stats(&err);
    assert_eq!(s[0][1], 0, "{err}");
    for turn in 1..3 {
        assert!(s[turn][1] >= s[turn - 1][1] + s[turn - 1][2], "{err}");
    }
}

#[test]
fn full_context_drops_oldest_exchanges() {
    let Some(m) = model() else { return };
    let long = "Please tell me everything you know. ".repeat(12);
    let input = format!("Hi\nHow are you?\nTell me a joke\n{long}\nName the capital of France.\n");
    let args = [
        "-m",
        &m,
        "--temp",
        "0",
        "-n",
        "24",
        "-c",
        "96",
        "--verbose-prompt",
    ];
    let (ok, out, err) = chat(&args, &input);
    assert!(ok, "{err}");
    assert!(
        err.contains("context full: dropped the oldest exchange"),
        "{err}"
    );
    assert!(err.contains("that message does not fit"), "{err}");
    assert_eq!(replies(&err), 4, "{err}");
    assert!(out.contains("Paris"), "{out}");
    // The system prompt survives every drop.
    for prompt in prompts(&err) {
        assert!(prompt.contains("<|im_start|>system\n"), "{prompt}");
    }
}

/// Output of a child collected by a thread, to wait on.
#[derive(Clone, Default)]
struct Collected(Arc<Mutex<String>>);

impl Collected {
    fn spawn(mut from: impl Read + Send + 'static) -> Collected {
        let c = Collected::default();
        let text = Arc::clone(&c.0);
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 {
                    break;
                }
                text.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        c
    }

    /// What was collected, without the terminal's control sequences (the
    /// line editor redraws its line with them).
    fn text(&self) -> String {
        visible(&self.0.lock().unwrap())
    }

    /// Wait until `done` holds for the text; panics with it after 60 s.
    fn wait(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let text = self.text();
            if done(&text) {
                return text;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what}; got:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `text` without CSI escape sequences (`ESC [ params final`).
fn visible(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("\x1b[") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let end = after
            .find(|c: char| ('@'..='~').contains(&c))
            .map_or(after.len(), |i| i + 1);
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The screen ends with `prompt` (the editor may leave a `\r` after it).
fn at_prompt(screen: &str, prompt: &str) -> bool {
    screen.trim_end_matches('\r').ends_with(prompt)
}

/// Kills the child if a test fails while it runs.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    fn stdin(&mut self) -> &mut ChildStdin {
        self.0.stdin.as_mut().unwrap()
    }

    fn send(&mut self, text: &str) {
        self.stdin().write_all(text.as_bytes()).unwrap();
        self.stdin().flush().unwrap();
    }

    fn exit_code(&mut self) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status.code();
            }
            assert!(start.elapsed() < Duration::from_secs(60), "did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// At --temp 0 the model writes hundreds of tokens for this: time enough
/// to interrupt it within the -n 64 the tests give.
const LONG_REPLY: &str = "Write a long story about a dragon.\n";

#[cfg(unix)]
#[test]
fn sigint_stops_the_reply_then_exits_at_the_prompt() {
    let Some(m) = model() else { return };
    let mut child = Running(
        Command::new(env!("CARGO_BIN_EXE_cachefit"))
            .args(["chat", "-m", &m, "--temp", "0", "-n", "64"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cachefit"),
    );
    let out = Collected::spawn(child.0.stdout.take().unwrap());
    let err = Collected::spawn(child.0.stderr.take().unwrap());
    let sigint = |pid: u32| {
        let ok = Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    };

    child.send(LONG_REPLY);
    out.wait("the reply to start", |t| t.len() > 10);
    sigint(child.0.id());
    err.wait("[interrupted]", |t| t.contains("[interrupted]"));
    let stopped = out.text().len();

    // Back at the prompt: the next message is answered.
    child.send("Name the capital of France.\n");
    err.wait("the second reply", |t| replies(t) == 2);
    assert!(out.text().len() > stopped + 1, "{}", out.text());
    let s = stats(&err.text());
    assert!(
        s[0][0] < 64,
        "the first reply was cut short: {}",
        err.text()
    );

    // Ctrl-C at the prompt leaves, with 130.
    sigint(child.0.id());
    assert_eq!(child.exit_code(), Some(130), "{}", err.text());
}

/// The interactive session in a real terminal: `script` gives the chat a
/// pseudo-terminal, and Ctrl-C typed into it reaches the process as SIGINT.
#[cfg(target_os = "linux")]
#[test]
fn terminal_session_with_ctrl_c() {
    let Some(m) = model() else { return };
    let script = Command::new("script").arg("--version").output();
    if !script.is_ok_and(|o| o.status.success()) {
        eprintln!("\n*** SKIPPING: script(1) from util-linux is not available ***\n");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_cachefit");
    // No history file of the user's touched; no colour around the prompts
    // the test waits for (chat_repl.rs tests both).
    let command = format!("'{bin}' chat -m '{m}' --temp 0 -n 64 --no-history");
    let mut child = Running(
        Command::new("script")
            .args(["-qfec", &command, "/dev/null"])
            .env("SHELL", "/bin/sh")
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start script"),
    );
    // Everything the terminal shows: prompts, echo, replies, notices.
    let screen = Collected::spawn(child.0.stdout.take().unwrap());

    screen.wait("the prompt", |t| {
        t.contains("/help for commands") && at_prompt(t, "> ")
    });
    child.send(LONG_REPLY);
    screen.wait("the reply to start", |t| {
        t.split_once("dragon.\r\n")
            .is_some_and(|(_, reply)| reply.len() > 10)
    });
    child.send("\x03");
    screen.wait("the prompt again", |t| {
        t.split_once("[interrupted]")
            .is_some_and(|(_, rest)| at_prompt(rest, "> "))
    });

    // A continued line, answered; then Ctrl-C twice leaves, in whichever
    // state the second one finds the chat. (Sent apart: two signals that
    // arrive before the first is handled are one.)
    child.send("What is\\\n");
    screen.wait("the continuation prompt", |t| at_prompt(t, "... "));
    child.send("2+2?\n");
    screen.wait("the answer", |t| replies(t) == 2 && at_prompt(t, "> "));
    child.send("Name the capital of France.\n");
    screen.wait("the third reply to start", |t| {
        t.split_once("France.\r\n")
            .is_some_and(|(_, reply)| !reply.is_empty())
    });
    child.send("\x03");
    std::thread::sleep(Duration::from_millis(100));
    child.send("\x03");
    assert_eq!(child.exit_code(), Some(130), "{}", screen.text());
}

/// The built-in model has no end-of-turn token and, left alone, writes the
/// next `Q:` line itself; chat stops where its template would start one.
#[test]
fn builtin_model_stops_before_writing_the_next_question() {
    let (ok, out, err) = chat(
        &["--temp", "0", "-n", "200"],
        "Who is Romeo?\nWho is Juliet?\n",
    );
    assert!(ok, "{err}");
    assert_eq!(replies(&err), 2, "{err}");
    assert!(
        !out.contains("Q:"),
        "a reply ran into the next question: {out:?}"
    );
    // Both replies stopped on the turn marker, well short of -n 200.
    for [generated, _, _] in stats(&err) {
        assert!(generated < 200, "{err}");
    }
}
