//! Models split into several GGUF files, as llama.cpp's `gguf-split` writes
//! them: `PREFIX-00001-of-00003.gguf`, `PREFIX-00002-of-00003.gguf`, ...
//! Each file is a complete GGUF with its own tensor entries and data; the
//! first carries the model's metadata, every file carries [`SPLIT_NO`] (its
//! 0-based index), [`SPLIT_COUNT`] and [`SPLIT_TENSORS_COUNT`] (the total
//! tensor count). [`crate::GgufFile::open`] of the first file opens them all
//! as one model; [`write_split`] writes a model that way.

use crate::error::{Error, ErrorKind, Result};
use crate::file::GgufFile;
use crate::value::{Metadata, Value};
use crate::write::{Builder, TensorSpec};
use std::path::{Path, PathBuf};

/// `split.no`: this file's index, from 0 (u16).
pub const SPLIT_NO: &str = "split.no";
/// `split.count`: how many files the model is split into (u16).
pub const SPLIT_COUNT: &str = "split.count";
/// `split.tensors.count`: tensors in all the files together (i32).
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// What a file's `split.*` keys say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitInfo {
    /// 0-based index of this file.
    pub no: u16,
    /// Number of files, at least 2.
    pub count: u16,
    /// Total tensors, if the file says.
    pub tensors: Option<u64>,
}

fn int_key<T: TryFrom<u64>>(md: &Metadata, key: &str, expected: &str) -> Result<T, ErrorKind> {
    let wrong = |found: String| ErrorKind::WrongType {
        key: key.to_string(),
        expected: expected.to_string(),
        found,
    };
    let v = md.get(key).ok_or_else(|| ErrorKind::MissingKey {
        key: key.to_string(),
    })?;
    let n = v
        .as_u64()
        .ok_or_else(|| wrong(format!("{} ({v})", v.type_description())))?;
    T::try_from(n).map_err(|_| wrong(n.to_string()))
}

/// The split keys of a file's metadata: `None` for a file that is the
/// whole model (no `split.count`, or one of 0 or 1, as `gguf-split
/// --merge` and llama.cpp treat it).
pub fn split_info(md: &Metadata) -> Result<Option<SplitInfo>, ErrorKind> {
    if md.get(SPLIT_COUNT).is_none() {
        return Ok(None);
    }
    let count: u16 = int_key(md, SPLIT_COUNT, "integer in u16 range")?;
    if count <= 1 {
        return Ok(None);
    }
    let no: u16 = int_key(md, SPLIT_NO, "integer in u16 range")?;
    if no >= count {
        return Err(ErrorKind::Split(format!(
            "`{SPLIT_NO}` is {no}, but `{SPLIT_COUNT}` is {count} (files are numbered from 0)"
        )));
    }
    let tensors = match md.get(SPLIT_TENSORS_COUNT) {
        None => None,
        Some(_) => Some(int_key(md, SPLIT_TENSORS_COUNT, "non-negative integer")?),
    };
    Ok(Some(SplitInfo { no, count, tensors }))
}

fn postfix(no: u16, count: u16) -> String {
    format!("-{:05}-of-{count:05}.gguf", no as u32 + 1)
}

/// The path of file `no` (0-based) of `count`: `PREFIX-0000{no+1}-of-0000{count}.gguf`
/// (llama.cpp's `llama_split_path`).
pub fn split_path(prefix: &Path, no: u16, count: u16) -> PathBuf {
    let mut s = prefix.as_os_str().to_os_string();
    s.push(postfix(no, count));
    PathBuf::from(s)
}

/// The prefix of `path` if it is named as file `no` of `count`
/// (llama.cpp's `llama_split_prefix`), else `None`. The file name must be
/// UTF-8; the folder may be anything.
pub fn split_prefix(path: &Path, no: u16, count: u16) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(&postfix(no, count))?;
    if stem.is_empty() {
        return None;
    }
    Some(path.with_file_name(stem))
}

/// Write `file` as `gguf-split --split --split-max-tensors max_tensors`
/// does: at most `max_tensors` tensors per file, in order; the first file
/// gets the model's metadata plus the split keys, the others only the
/// split keys. Files are `PREFIX-0000i-of-0000n.gguf`, created new (an
/// existing file is an error, never overwritten). Returns their paths.
pub fn write_split(file: &GgufFile, prefix: &Path, max_tensors: usize) -> Result<Vec<PathBuf>> {
    let err = |kind: ErrorKind| Error::new(prefix, kind);
    if max_tensors == 0 {
        return Err(err(ErrorKind::Write(
            "at least one tensor per file is needed".into(),
        )));
    }
    let tensors = file.tensors();
    let groups: Vec<_> = if tensors.is_empty() {
        vec![&tensors[..0]]
    } else {
        tensors.chunks(max_tensors).collect()
    };
    let count = u16::try_from(groups.len()).map_err(|_| {
        err(ErrorKind::Write(format!(
            "{} files would be needed; a split model has at most {}",
            groups.len(),
            u16::MAX
        )))
    })?;
    let total = i32::try_from(tensors.len()).map_err(|_| {
        err(ErrorKind::Write(format!(
            "{} tensors do not fit `{SPLIT_TENSORS_COUNT}` (i32)",
            tensors.len()
        )))
    })?;
    let mut paths = Vec::with_capacity(groups.len());
    for (no, group) in groups.into_iter().enumerate() {
        let no = no as u16;
        let path = split_path(prefix, no, count);
        let perr = |kind: ErrorKind| Error::new(&path, kind);
        let mut md = if no == 0 {
            file.metadata().clone()
        } else {
            Metadata::new()
        };
        // As gguf_set_val does (an old value goes, the new one is
        // appended), in gguf-split's order: it sets `split.count` last,
        // once the number of files is known. The files come out byte for
        // byte as `llama-gguf-split` writes them.
        for (key, value) in [
            (SPLIT_NO, Value::U16(no)),
            (SPLIT_TENSORS_COUNT, Value::I32(total)),
            (SPLIT_COUNT, Value::U16(count)),
        ] {
            md.remove(key);
            md.set(key, value);
        }
        let mut b = Builder::new(md);
        for t in group {
            b.add_tensor(TensorSpec {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: t.ty,
            })
            .map_err(perr)?;
        }
        let out = std::fs::File::create_new(&path).map_err(|e| perr(e.into()))?;
        let mut w = b.write_header(std::io::BufWriter::new(out)).map_err(perr)?;
        for t in group {
            w.write_tensor(file.tensor_data(t)).map_err(perr)?;
        }
        let out = w.finish().map_err(perr)?;
        out.into_inner()
            .map_err(|e| perr(e.into_error().into()))?
            .sync_all()
            .map_err(|e| perr(e.into()))?;
        paths.push(path);
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_llama_cpp_makes_them() {
        let p = split_path(Path::new("/m/model"), 1, 3);
        assert_eq!(p, Path::new("/m/model-00002-of-00003.gguf"));
        assert_eq!(split_prefix(&p, 1, 3).unwrap(), Path::new("/m/model"));
        assert_eq!(split_prefix(&p, 0, 3), None);
        assert_eq!(split_prefix(&p, 1, 4), None);
        assert_eq!(split_prefix(Path::new("-00001-of-00002.gguf"), 0, 2), None);
        assert_eq!(split_prefix(Path::new("model.gguf"), 0, 2), None);
        assert_eq!(
            split_path(Path::new("a"), 65534, 65535),
            Path::new("a-65535-of-65535.gguf")
        );
    }

    #[test]
    fn split_keys() {
        let mut md = Metadata::new();
        assert_eq!(split_info(&md).unwrap(), None);
        md.set(SPLIT_COUNT, Value::U16(1));
        assert_eq!(split_info(&md).unwrap(), None);
        md.set(SPLIT_COUNT, Value::U16(3));
        let e = split_info(&md).unwrap_err().to_string();
        assert!(e.contains("`split.no` is missing"), "{e}");
        md.set(SPLIT_NO, Value::U16(3));
        let e = split_info(&md).unwrap_err().to_string();
        assert!(e.contains("`split.no` is 3"), "{e}");
        md.set(SPLIT_NO, Value::U16(2));
        md.set(SPLIT_TENSORS_COUNT, Value::I32(7));
        let want = SplitInfo {
            no: 2,
            count: 3,
            tensors: Some(7),
        };
        assert_eq!(split_info(&md).unwrap(), Some(want));
        md.set(SPLIT_TENSORS_COUNT, Value::I32(-1));
        assert!(split_info(&md).is_err());
        md.set(SPLIT_COUNT, Value::String("3".into()));
        let e = split_info(&md).unwrap_err().to_string();
        assert!(e.contains("`split.count`: expected integer"), "{e}");
        md.set(SPLIT_COUNT, Value::U32(70000));
        let e = split_info(&md).unwrap_err().to_string();
        assert!(e.contains("70000"), "{e}");
    }
}
