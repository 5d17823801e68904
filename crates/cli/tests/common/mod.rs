//! What the CLI test files share: running the real binary.

use std::process::Command;

/// Run `cachefit ARGS`: (succeeded, stdout, stderr).
pub fn cachefit(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args(args)
        .output()
        .expect("run cachefit");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
