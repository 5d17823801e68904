//! The models folder: what is in it, and finding a model by name
//! (`owner/repo[:QUANT]`, `repo[:QUANT]`, or a file stem).

use crate::download::cache_path;
use crate::error::HubError;
use crate::repo::{find_tag, has_tag, split_part, RepoSpec, QUANT_PREFERENCE};
use std::path::{Path, PathBuf};

/// `$CACHEFIT_MODELS`, else `${XDG_CACHE_HOME:-$HOME/.cache}/cachefit/models`
/// (where scripts/fetch-models.sh puts the test models too).
pub fn models_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var("CACHEFIT_MODELS") {
        return PathBuf::from(d);
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("cachefit").join("models")
}

/// A model file in the cache (the first part, for a split model).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedModel {
    /// `owner/repo:QUANT` for a hub download, the file stem otherwise.
    pub name: String,
    /// `owner/repo` for a hub download.
    pub repo: Option<String>,
    /// The file's path relative to its repo folder (or the models folder).
    pub file: String,
    pub path: PathBuf,
    /// Bytes, all parts of a split model together.
    pub size: u64,
    /// Parts of a split model missing from the folder.
    pub missing_parts: u32,
}

/// An unfinished download.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partial {
    pub path: PathBuf,
    pub size: u64,
}

/// What the models folder holds.
#[derive(Debug, Default)]
pub struct Scan {
    pub models: Vec<CachedModel>,
    pub partials: Vec<Partial>,
}

/// Every `.gguf` under `dir` (depth ≥ 3 below it: `owner/repo/file`, a hub
/// download; a shallower one, a file put there by hand), sorted by name,
/// and the `.part` files of unfinished downloads. A missing folder is
/// empty.
pub fn scan(dir: &Path) -> Result<Scan, HubError> {
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    let mut scan = Scan::default();
    for (path, len) in &files {
        let rel = path.strip_prefix(dir).unwrap_or(path);
        let rel_s = rel.to_string_lossy().replace('\\', "/");
        if rel_s.ends_with(".part") {
            scan.partials.push(Partial {
                path: path.clone(),
                size: *len,
            });
            continue;
        }
        if !rel_s.to_ascii_lowercase().ends_with(".gguf") {
            continue;
        }
        let parts: Vec<&str> = rel_s.splitn(3, '/').collect();
        let (repo, file) = match parts.as_slice() {
            [owner, name, file] => (Some(format!("{owner}/{name}")), file.to_string()),
            _ => (None, rel_s.clone()),
        };
        let (mut size, mut missing_parts) = (*len, 0);
        match split_part(&file) {
            Some((k, _)) if k > 1 => continue,
            Some((_, count)) => {
                let first = path.to_string_lossy();
                let prefix = &first[..first.len() - "00001-of-00000.gguf".len()];
                for k in 2..=count {
                    let p = PathBuf::from(format!("{prefix}{k:05}-of-{count:05}.gguf"));
                    match files.iter().find(|(q, _)| *q == p) {
                        Some((_, n)) => size += n,
                        None => missing_parts += 1,
                    }
                }
            }
            None => {}
        }
        let base = file.rsplit('/').next().unwrap_or(&file);
        let stem = stem(base);
        let name = match &repo {
            Some(r) => format!(
                "{r}:{}",
                find_tag(base).map_or(stem.clone(), str::to_string)
            ),
            None => stem,
        };
        scan.models.push(CachedModel {
            name,
            repo,
            file,
            path: path.clone(),
            size,
            missing_parts,
        });
    }
    scan.models
        .sort_by(|a, b| a.name.cmp(&b.name).then(a.file.cmp(&b.file)));
    Ok(scan)
}

fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>) -> Result<(), HubError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(HubError::io(dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(HubError::io(dir))?;
        let path = entry.path();
        // Symlinks are followed: a models folder of links is common.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(&path, out)?;
        } else if meta.is_file() {
            out.push((path, meta.len()));
        }
    }
    Ok(())
}

/// A file name without `.gguf` and the `-00001-of-0000N` of a split model.
fn stem(base: &str) -> String {
    let s = base
        .strip_suffix(".gguf")
        .or_else(|| base.strip_suffix(".GGUF"))
        .unwrap_or(base);
    match split_part(base) {
        Some(_) => s[..s.len() - "-00001-of-00000".len()].to_string(),
        None => s.to_string(),
    }
}

impl Scan {
    /// The model `-m NAME` means: `owner/repo[:QUANT]`, `repo[:QUANT]`, its
    /// full name, or a file stem. `Ok(None)` when nothing matches; an error
    /// listing the candidates when several do.
    pub fn find(&self, query: &str) -> Result<Option<&CachedModel>, HubError> {
        let q = query.to_ascii_lowercase();
        let exact: Vec<&CachedModel> = self
            .models
            .iter()
            .filter(|m| m.name.to_ascii_lowercase() == q)
            .collect();
        if exact.len() == 1 {
            return Ok(Some(exact[0]));
        }
        let (base, tag) = match q.split_once(':') {
            Some((b, t)) => (b, Some(t)),
            None => (q.as_str(), None),
        };
        let found: Vec<&CachedModel> = self
            .models
            .iter()
            .filter(|m| {
                let file_base = m.file.rsplit('/').next().unwrap_or(&m.file);
                let stem = stem(file_base).to_ascii_lowercase();
                let repo_match = m.repo.as_ref().is_some_and(|r| {
                    let r = r.to_ascii_lowercase();
                    r == base || r.split_once('/').is_some_and(|(_, n)| n == base)
                });
                match tag {
                    Some(t) => repo_match && (has_tag(&m.file, t) || stem == t),
                    None => repo_match || stem == base,
                }
            })
            .collect();
        match found.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one)),
            many => Err(HubError::AmbiguousName {
                query: query.to_string(),
                candidates: many
                    .iter()
                    .map(|m| format!("{} ({})", m.name, m.path.display()))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The cached model `-hf spec` would download: the exact file with
    /// `hf_file`, else its quant, else the first of the preferred quants
    /// the cache has for the repo. Complete models only.
    pub fn find_for(
        &self,
        models_dir: &Path,
        spec: &RepoSpec,
        hf_file: Option<&str>,
    ) -> Option<&CachedModel> {
        let repo = spec.repo().to_ascii_lowercase();
        let of_repo: Vec<&CachedModel> = self
            .models
            .iter()
            .filter(|m| {
                m.missing_parts == 0
                    && m.repo
                        .as_ref()
                        .is_some_and(|r| r.to_ascii_lowercase() == repo)
            })
            .collect();
        if let Some(f) = hf_file {
            let want = cache_path(models_dir, spec, f).ok()?;
            return of_repo.into_iter().find(|m| m.path == want);
        }
        let with = |tag: &str| -> Option<&CachedModel> {
            let found: Vec<&CachedModel> = of_repo
                .iter()
                .copied()
                .filter(|m| has_tag(&m.file, tag))
                .collect();
            // Two files with the tag: let the listing decide.
            (found.len() == 1).then(|| found[0])
        };
        match &spec.quant {
            Some(q) => with(q),
            None => QUANT_PREFERENCE.iter().find_map(|q| with(q)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(dir: &Path, rel: &str, len: usize) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, vec![0u8; len]).unwrap();
    }

    #[test]
    fn the_folder_is_listed_and_searched_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        touch(d, "SmolLM2-135M-Instruct.Q4_1.gguf", 10);
        touch(d, "bartowski/SmolLM2-GGUF/SmolLM2-Q4_K_M.gguf", 20);
        touch(d, "bartowski/SmolLM2-GGUF/SmolLM2-Q8_0.gguf", 30);
        touch(d, "o/big/Q8_0/big-Q8_0-00001-of-00003.gguf", 1);
        touch(d, "o/big/Q8_0/big-Q8_0-00002-of-00003.gguf", 2);
        touch(d, "o/big/x.gguf.part", 5);
        touch(d, "notes.txt", 1);
        let s = scan(d).unwrap();
        let names: Vec<&str> = s.models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "SmolLM2-135M-Instruct.Q4_1",
                "bartowski/SmolLM2-GGUF:Q4_K_M",
                "bartowski/SmolLM2-GGUF:Q8_0",
                "o/big:Q8_0"
            ]
        );
        let big = &s.models[3];
        assert_eq!((big.size, big.missing_parts), (3, 1));
        assert_eq!(s.partials.len(), 1);
        assert_eq!(s.partials[0].size, 5);

        let find = |q: &str| s.find(q).map(|m| m.map(|m| m.name.clone()));
        assert_eq!(
            find("bartowski/smollm2-gguf:q8_0").unwrap().as_deref(),
            Some("bartowski/SmolLM2-GGUF:Q8_0")
        );
        assert_eq!(
            find("SmolLM2-GGUF:Q4_K_M").unwrap().as_deref(),
            Some("bartowski/SmolLM2-GGUF:Q4_K_M")
        );
        assert_eq!(
            find("SmolLM2-135M-Instruct.Q4_1").unwrap().as_deref(),
            Some("SmolLM2-135M-Instruct.Q4_1")
        );
        assert_eq!(find("big-Q8_0").unwrap().as_deref(), Some("o/big:Q8_0"));
        assert_eq!(find("nothing").unwrap(), None);
        let e = find("bartowski/SmolLM2-GGUF").unwrap_err().to_string();
        assert!(e.contains(":Q4_K_M") && e.contains(":Q8_0"), "{e}");

        let spec = RepoSpec::parse("bartowski/SmolLM2-GGUF").unwrap();
        let m = s.find_for(d, &spec, None).unwrap();
        assert_eq!(m.name, "bartowski/SmolLM2-GGUF:Q4_K_M");
        let spec = RepoSpec::parse("bartowski/SmolLM2-GGUF:q8_0").unwrap();
        assert_eq!(
            s.find_for(d, &spec, None).unwrap().file,
            "SmolLM2-Q8_0.gguf"
        );
        assert!(s.find_for(d, &spec, Some("SmolLM2-Q4_K_M.gguf")).is_some());
        // An incomplete split model is not a usable cache entry.
        let spec = RepoSpec::parse("o/big:Q8_0").unwrap();
        assert!(s.find_for(d, &spec, None).is_none());
    }

    #[test]
    fn a_missing_folder_is_empty() {
        let s = scan(Path::new("/no/such/folder/anywhere")).unwrap();
        assert!(s.models.is_empty() && s.partials.is_empty());
    }
}
