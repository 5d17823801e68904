//! Reading and writing the pipeline's files with errors that name them,
//! and the sha256 digests that tie each output to its inputs.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Read a UTF-8 text file. A missing file, a folder or invalid UTF-8 is an
/// error naming the file (and for UTF-8, the line and column).
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = read_bytes(path)?;
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let offset = e.utf8_error().valid_up_to();
        let before = &bytes[..offset];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        // Columns count characters, as an editor shows them.
        let column = String::from_utf8_lossy(&before[line_start..])
            .chars()
            .count()
            + 1;
        Error::NotUtf8 {
            path: path.to_path_buf(),
            byte: bytes[offset],
            offset,
            line,
            column,
        }
    })
}

pub fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    if path.is_dir() {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            problem: "is a folder, not a file".into(),
        });
    }
    std::fs::read(path).map_err(|source| Error::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })
}

/// Read a stage's input from the pipeline folder; a missing file says
/// which stage writes it.
pub fn read_stage_text(dir: &Path, name: &str, stage: &'static str) -> Result<String> {
    read_text(&stage_input(dir, name, stage)?)
}

/// The path of a stage's input, checked to exist.
pub fn stage_input(dir: &Path, name: &str, stage: &'static str) -> Result<PathBuf> {
    let path = dir.join(name);
    if !path.exists() {
        return Err(Error::MissingInput { path, stage });
    }
    Ok(path)
}

/// Write a file whole, creating its folder.
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir(parent)?;
    }
    std::fs::write(path, bytes).map_err(|source| Error::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
    })
}

pub fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        action: "create folder",
        path: dir.to_path_buf(),
        source,
    })
}

/// Lower-case hex sha256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A JSON manifest, pretty-printed with a final newline. Keys come out
/// sorted (`serde_json`'s map), so equal content gives equal bytes.
pub fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value).expect("a JSON value always serializes");
    text.push('\n');
    write(path, text.as_bytes())
}

pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = read_text(path)?;
    serde_json::from_str(&text).map_err(|e| Error::Invalid {
        path: path.to_path_buf(),
        problem: format!("not valid JSON: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_utf8_names_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.txt");
        std::fs::write(&path, b"ok\nd\xc3\xa9j\xff here\n").unwrap();
        let err = read_text(&path).unwrap_err().to_string();
        assert!(err.contains("bad.txt"), "{err}");
        assert!(
            err.contains("invalid byte 0xff at line 2, column 4 (byte offset 7)"),
            "{err}"
        );
    }

    #[test]
    fn missing_and_folder_inputs_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_text(&dir.path().join("nope.txt")).unwrap_err();
        assert!(err.to_string().starts_with("cannot read "), "{err}");
        let err = read_text(dir.path()).unwrap_err();
        assert!(
            err.to_string().ends_with("is a folder, not a file"),
            "{err}"
        );
        let err = read_stage_text(dir.path(), "corpus.train.txt", "data").unwrap_err();
        assert!(
            err.to_string()
                .ends_with("does not exist: run `cachefit-train data` first"),
            "{err}"
        );
    }

    #[test]
    fn sha256_of_abc() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
