//! Test-only helpers shared by the crates' integration tests.

pub mod cachefit;

use std::path::PathBuf;

/// Folder `scripts/fetch-models.sh` fills: `$CACHEFIT_MODELS`, or
/// `$XDG_CACHE_HOME/cachefit/models`, or `~/.cache/cachefit/models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CACHEFIT_MODELS") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    cache.join("cachefit").join("models")
}

/// SmolLM2-135M-Instruct Q4_1, the real model the tests run on.
pub const SMOLLM2_Q4_1: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Gemma 3 270M, Q4_K_M (`scripts/fetch-models.sh`).
pub const GEMMA3_270M: &str = "gemma-3-270m-Q4_K_M.gguf";

/// Qwen2.5-Coder-0.5B-Instruct, Q4_K_M: the tool-calling model of the
/// server's tests (`scripts/fetch-models.sh`).
pub const QWEN25_CODER_05B: &str = "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf";

/// The path of a fetched test model, or `None` after a loud note on stderr
/// when it is missing. With `CACHEFIT_REQUIRE_MODELS=1` (set by CI) a missing
/// model is a test failure instead: CI never skips.
pub fn model(name: &str) -> Option<PathBuf> {
    let p = models_dir().join(name);
    if p.is_file() {
        return Some(p);
    }
    let msg = format!(
        "test model {} not found; run scripts/fetch-models.sh",
        p.display()
    );
    if std::env::var("CACHEFIT_REQUIRE_MODELS").is_ok_and(|v| v == "1") {
        panic!("{msg} (CACHEFIT_REQUIRE_MODELS=1)");
    }
    eprintln!("\n*** SKIPPING: {msg} ***\n");
    None
}

/// The workspace root (for fixtures under `tests/` or `testdata/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(|p| p.parent())
        .expect("testkit lives in crates/testkit")
        .to_path_buf()
}
