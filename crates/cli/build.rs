//! Records the git commit the binary is built from as
//! `CACHEFIT_BUILD_COMMIT` (bench's `build_commit`, as llama-bench reports
//! its own), unless the environment already sets it. Outside a git
//! checkout, or without git, the binary says "unknown".

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CACHEFIT_BUILD_COMMIT");
    if std::env::var_os("CACHEFIT_BUILD_COMMIT").is_some() {
        return;
    }
    let git_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.git");
    // Rebuild when HEAD moves: HEAD itself, the branch it names, packed refs.
    for f in ["HEAD", "packed-refs"] {
        println!("cargo:rerun-if-changed={}", git_dir.join(f).display());
    }
    if let Ok(head) = std::fs::read_to_string(git_dir.join("HEAD")) {
        if let Some(r) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed={}", git_dir.join(r).display());
        }
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short=7", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()));
    if let Some(c) = commit {
        println!("cargo:rustc-env=CACHEFIT_BUILD_COMMIT={c}");
    }
}
