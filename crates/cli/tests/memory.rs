//! `cachefit memory inspect|verify` through the real binary.

use memory::synth::nth_block;
use memory::{Geometry, MemoryFile};
use std::path::Path;
use std::process::Command;

fn cachefit(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn build(path: &Path) -> MemoryFile {
    let g = Geometry::smollm2();
    let mut mf = MemoryFile::create(path, [0xab; 32], g, b"slots and seeds").unwrap();
    for i in 0..10 {
        mf.append(&nth_block(5, &g, i).as_in()).unwrap();
    }
    mf.commit().unwrap();
    mf
}

#[test]
fn inspect_and_verify_a_sound_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.mem");
    let mf = build(&p);
    let f = p.to_str().unwrap();
    let (code, out, err) = cachefit(&["memory", "inspect", f]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&"ab".repeat(32)), "{out}");
    assert!(
        out.contains(&format!("{} tokens in 10 blocks", mf.len_tokens())),
        "{out}"
    );
    assert!(
        out.contains("codes 288.0") && out.contains("309.6"),
        "{out}"
    );

    let (code, out, _) = cachefit(&["memory", "inspect", f, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["blocks"], 10);
    assert_eq!(v["tokens"], mf.len_tokens());
    assert_eq!(v["geometry"]["slots"], 36);
    assert_eq!(v["index"]["index_file_blocks"], 10);

    let (code, out, err) = cachefit(&["memory", "verify", f]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ok: every record verifies"), "{out}");
}

#[test]
fn verify_reports_damage_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.mem");
    let mf = build(&p);
    let at = mf.index().meta(4).offset as usize + 100;
    drop(mf);
    let mut b = std::fs::read(&p).unwrap();
    b[at] ^= 4;
    std::fs::write(&p, &b).unwrap();
    let (code, out, err) = cachefit(&["memory", "verify", p.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("DAMAGE: block 4") && out.contains("checksum mismatch"),
        "{out}"
    );
    assert!(err.contains("1 problem(s) found"), "{err}");

    let (code, out, _) = cachefit(&["memory", "verify", p.to_str().unwrap(), "--json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["clean"], false);
    assert_eq!(v["problems"][0]["block"], 4);
}

#[test]
fn a_file_that_is_not_memory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.gguf");
    std::fs::write(&p, b"GGUF\x03\x00\x00\x00").unwrap();
    for cmd in ["inspect", "verify"] {
        let (code, _, err) = cachefit(&["memory", cmd, p.to_str().unwrap()]);
        assert_eq!(code, 1);
        assert!(err.contains("not a cachefit memory file"), "{err}");
    }
    let (code, _, err) = cachefit(&["memory", "inspect", "/nonexistent/notes.mem"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("/nonexistent/notes.mem") && err.contains("opening"),
        "{err}"
    );
}
