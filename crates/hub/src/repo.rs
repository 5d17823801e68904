//! Repo names (`OWNER/REPO[:QUANT]`) and which of a repo's files a quant
//! names: llama.cpp's `-hf` rule, a case-insensitive match of the quant
//! tag in the `.gguf` file names, with every part of a split model.

use crate::error::HubError;

/// The quant `-hf REPO` downloads when none is named, as llama.cpp.
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// When a repo has no [`DEFAULT_QUANT`]: the first of these it has (good
/// quality per byte first, then larger, then smaller), else its first
/// `.gguf` file.
pub const QUANT_PREFERENCE: &[&str] = &[
    "Q4_K_M", "Q4_K_S", "Q4_0", "Q5_K_M", "Q5_K_S", "Q5_0", "Q6_K", "Q8_0", "IQ4_XS", "IQ4_NL",
    "Q4_1", "Q5_1", "Q3_K_M", "Q3_K_L", "Q3_K_S", "Q2_K", "BF16", "F16", "F32",
];

/// Quant tags as llama.cpp's quantize names them, to name a cached file
/// by its tag (`owner/repo:Q4_K_M`). Longer tags first, so `Q4_K_M` is
/// found before `Q4_K`.
pub const KNOWN_QUANTS: &[&str] = &[
    "IQ2_XXS", "IQ3_XXS", "IQ1_S", "IQ1_M", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XS", "IQ3_S", "IQ3_M",
    "IQ4_XS", "IQ4_NL", "Q2_K_S", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S",
    "Q5_K_M", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K", "Q8_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16", "F16", "F32",
];

/// `OWNER/REPO[:QUANT]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoSpec {
    pub owner: String,
    pub name: String,
    pub quant: Option<String>,
}

impl RepoSpec {
    pub fn parse(s: &str) -> Result<RepoSpec, HubError> {
        let bad = || HubError::BadRepoName(s.to_string());
        let (repo, quant) = match s.split_once(':') {
            Some((r, q)) if !q.is_empty() && !q.contains(['/', ':']) => (r, Some(q.to_string())),
            Some(_) => return Err(bad()),
            None => (s, None),
        };
        let (owner, name) = repo.split_once('/').ok_or_else(bad)?;
        // The hub's own rule for names; it also keeps `..` and `/` out of
        // the cache path built from them.
        let ok = |p: &str| {
            !p.is_empty()
                && !p.starts_with('.')
                && !p.contains("..")
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if !ok(owner) || !ok(name) {
            return Err(bad());
        }
        Ok(RepoSpec {
            owner: owner.to_string(),
            name: name.to_string(),
            quant,
        })
    }

    /// `owner/repo`, without the quant.
    pub fn repo(&self) -> String {
        format!("{}/{}", self.owner, self.name)
    }
}

impl std::fmt::Display for RepoSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.quant {
            Some(q) => write!(f, "{}/{}:{q}", self.owner, self.name),
            None => write!(f, "{}/{}", self.owner, self.name),
        }
    }
}

/// One file of a repo listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    /// Path in the repo (`sub/dir/model-Q4_K_M.gguf`).
    pub name: String,
    pub size: Option<u64>,
    /// The LFS sha256 (lowercase hex), when the listing has it.
    pub sha256: Option<String>,
}

/// Whether `tag` occurs in `name`, case-insensitively, not as part of a
/// longer tag: `Q4_K` is not in `x-Q4_K_M.gguf`, `Q4_K_M` is.
pub fn has_tag(name: &str, tag: &str) -> bool {
    let name = name.to_ascii_lowercase();
    let tag = tag.to_ascii_lowercase();
    if tag.is_empty() {
        return false;
    }
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    let mut from = 0;
    while let Some(i) = name[from..].find(&tag) {
        let start = from + i;
        let end = start + tag.len();
        if !word(name[..start].chars().next_back()) && !word(name[end..].chars().next()) {
            return true;
        }
        from = start + 1;
    }
    false
}

/// The known quant tag in a file name (`Q4_K_M` of `x.Q4_K_M.gguf`).
pub fn find_tag(name: &str) -> Option<&'static str> {
    KNOWN_QUANTS.iter().copied().find(|t| has_tag(name, t))
}

/// `(part, count)` of a split file `PREFIX-0000K-of-0000N.gguf`.
pub fn split_part(name: &str) -> Option<(u32, u32)> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (_, part) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(part) || !digits(count) {
        return None;
    }
    let (part, count): (u32, u32) = (part.parse().ok()?, count.parse().ok()?);
    (part >= 1 && part <= count && count >= 2).then_some((part, count))
}

/// Whether a file is a split part other than the first (opened through
/// the first, so neither a model of its own nor a choice).
pub fn is_split_part(name: &str) -> bool {
    split_part(name).is_some_and(|(k, _)| k > 1)
}

/// The name of part `k` of the split model whose first part is `first`.
fn part_name(first: &str, k: u32, count: u32) -> String {
    let prefix = &first[..first.len() - "-00001-of-00000.gguf".len()];
    format!("{prefix}-{k:05}-of-{count:05}.gguf")
}

/// Model files: `.gguf`, not a projector (`mmproj`, for images), not a
/// later split part.
fn is_model_file(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let base = lower.rsplit('/').next().unwrap_or(&lower);
    lower.ends_with(".gguf") && !base.contains("mmproj") && !is_split_part(name)
}

/// The files to download for `quant` (or the default choice): one file,
/// or every part of a split model, in order. `hf_file` names the file
/// exactly instead.
pub fn choose(
    repo: &str,
    files: &[RepoFile],
    quant: Option<&str>,
    hf_file: Option<&str>,
) -> Result<Vec<RepoFile>, HubError> {
    let models: Vec<&RepoFile> = files.iter().filter(|f| is_model_file(&f.name)).collect();
    let no_match = |quant: Option<&str>| HubError::NoMatch {
        repo: repo.to_string(),
        quant: quant.map(str::to_string),
        files: list_names(files),
    };
    let first = if let Some(want) = hf_file {
        // A later part names its model too.
        let want = match split_part(want) {
            Some((k, n)) if k > 1 => {
                let len = want.len() - "-00001-of-00000.gguf".len();
                format!("{}-00001-of-{n:05}.gguf", &want[..len])
            }
            _ => want.to_string(),
        };
        files
            .iter()
            .find(|f| f.name == want)
            .ok_or_else(|| HubError::NoMatch {
                repo: repo.to_string(),
                quant: Some(format!("file {want}")),
                files: list_names(files),
            })?
    } else if let Some(q) = quant {
        let found: Vec<&RepoFile> = models
            .iter()
            .copied()
            .filter(|f| has_tag(&f.name, q))
            .collect();
        match found.as_slice() {
            [] => return Err(no_match(Some(q))),
            [one] => *one,
            many => {
                return Err(HubError::Ambiguous {
                    repo: repo.to_string(),
                    what: format!("quant {q}"),
                    candidates: many
                        .iter()
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
        }
    } else {
        let preferred = QUANT_PREFERENCE.iter().find_map(|q| {
            let found: Vec<&RepoFile> = models
                .iter()
                .copied()
                .filter(|f| has_tag(&f.name, q))
                .collect();
            (!found.is_empty()).then_some((q, found))
        });
        match preferred {
            Some((_, found)) if found.len() == 1 => found[0],
            Some((q, found)) => {
                return Err(HubError::Ambiguous {
                    repo: repo.to_string(),
                    what: format!("the default quant {q}"),
                    candidates: found
                        .iter()
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
            None => *models.first().ok_or_else(|| no_match(None))?,
        }
    };
    let mut out = vec![first.clone()];
    if let Some((_, count)) = split_part(&first.name) {
        for k in 2..=count {
            let name = part_name(&first.name, k, count);
            let part = files
                .iter()
                .find(|f| f.name == name)
                .ok_or(HubError::MissingPart {
                    repo: repo.to_string(),
                    first: first.name.clone(),
                    count,
                    missing: k,
                })?;
            out.push(part.clone());
        }
    }
    Ok(out)
}

fn list_names(files: &[RepoFile]) -> String {
    const SHOWN: usize = 30;
    let ggufs: Vec<&str> = files
        .iter()
        .map(|f| f.name.as_str())
        .filter(|n| n.ends_with(".gguf"))
        .collect();
    let all: Vec<&str> = if ggufs.is_empty() {
        files.iter().map(|f| f.name.as_str()).collect()
    } else {
        ggufs
    };
    if all.is_empty() {
        return "none".to_string();
    }
    let mut s = all
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if all.len() > SHOWN {
        s.push_str(&format!(" and {} more", all.len() - SHOWN));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<RepoFile> {
        names
            .iter()
            .map(|n| RepoFile {
                name: n.to_string(),
                size: Some(1),
                sha256: None,
            })
            .collect()
    }

    fn chosen(names: &[&str], quant: Option<&str>) -> Result<Vec<String>, HubError> {
        choose("o/r", &files(names), quant, None).map(|v| v.into_iter().map(|f| f.name).collect())
    }

    #[test]
    fn repo_names_parse_and_refuse_paths() {
        let s = RepoSpec::parse("bartowski/SmolLM2-GGUF:q4_k_m").unwrap();
        assert_eq!(
            (s.owner.as_str(), s.name.as_str()),
            ("bartowski", "SmolLM2-GGUF")
        );
        assert_eq!(s.quant.as_deref(), Some("q4_k_m"));
        assert_eq!(s.to_string(), "bartowski/SmolLM2-GGUF:q4_k_m");
        assert_eq!(RepoSpec::parse("a/b").unwrap().quant, None);
        for bad in [
            "a", "a/b/c", "../b", "a/..", "a/b:", "/b", "a/", "a/b:c:d", "a b/c",
        ] {
            assert!(RepoSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tags_match_whole_tags_case_insensitively() {
        assert!(has_tag("x-Q4_K_M.gguf", "q4_k_m"));
        assert!(has_tag("x.q4_k_m.gguf", "Q4_K_M"));
        assert!(!has_tag("x-Q4_K_M.gguf", "Q4_K"));
        assert!(!has_tag("x-Q4_0_4_4.gguf", "Q4_0"));
        assert!(!has_tag("xQ4_0.gguf", "Q4_0"));
        assert!(has_tag("Q8_0/x-00001-of-00002.gguf", "Q8_0"));
        assert_eq!(find_tag("SmolLM2-135M-Instruct.Q4_1.gguf"), Some("Q4_1"));
        assert_eq!(find_tag("gemma-3-270m-Q4_K_M.gguf"), Some("Q4_K_M"));
        assert_eq!(find_tag("model.gguf"), None);
    }

    #[test]
    fn quant_choice_follows_llama_cpp() {
        let repo = [
            "README.md",
            "m-Q8_0.gguf",
            "m-Q4_K_M.gguf",
            "m-Q4_K_S.gguf",
            "mmproj-m-Q4_K_M.gguf",
        ];
        assert_eq!(chosen(&repo, None).unwrap(), ["m-Q4_K_M.gguf"]);
        assert_eq!(chosen(&repo, Some("q8_0")).unwrap(), ["m-Q8_0.gguf"]);
        assert_eq!(chosen(&repo, Some("Q4_K_S")).unwrap(), ["m-Q4_K_S.gguf"]);
        // No Q4_K_M: the next preferred quant.
        assert_eq!(
            chosen(&["m-Q8_0.gguf", "m-Q6_K.gguf"], None).unwrap(),
            ["m-Q6_K.gguf"]
        );
        // No known tag: the first model file.
        assert_eq!(chosen(&["b.gguf", "a.txt"], None).unwrap(), ["b.gguf"]);
        let e = chosen(&repo, Some("Q3_K_L")).unwrap_err().to_string();
        assert!(
            e.contains("quant Q3_K_L") && e.contains("m-Q8_0.gguf"),
            "{e}"
        );
        let e = chosen(&["README.md"], None).unwrap_err().to_string();
        assert!(
            e.contains("no .gguf file") && e.contains("README.md"),
            "{e}"
        );
        let e = chosen(&["a-Q8_0.gguf", "b-Q8_0.gguf"], Some("Q8_0"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a-Q8_0.gguf, b-Q8_0.gguf") && e.contains("--hf-file"),
            "{e}"
        );
    }

    #[test]
    fn split_models_bring_every_part() {
        let repo = [
            "Q8_0/m-Q8_0-00002-of-00003.gguf",
            "Q8_0/m-Q8_0-00001-of-00003.gguf",
            "Q8_0/m-Q8_0-00003-of-00003.gguf",
            "m-Q4_K_M.gguf",
        ];
        assert_eq!(
            chosen(&repo, Some("Q8_0")).unwrap(),
            [
                "Q8_0/m-Q8_0-00001-of-00003.gguf",
                "Q8_0/m-Q8_0-00002-of-00003.gguf",
                "Q8_0/m-Q8_0-00003-of-00003.gguf"
            ]
        );
        let by_file = choose(
            "o/r",
            &files(&repo),
            None,
            Some("Q8_0/m-Q8_0-00003-of-00003.gguf"),
        )
        .unwrap();
        assert_eq!(by_file.len(), 3);
        let e = chosen(&repo[1..], Some("Q8_0")).unwrap_err().to_string();
        assert!(e.contains("no part 2"), "{e}");
        assert_eq!(split_part("a-00002-of-00010.gguf"), Some((2, 10)));
        assert_eq!(split_part("a-2-of-10.gguf"), None);
        assert!(is_split_part("a-00002-of-00010.gguf"));
        assert!(!is_split_part("a-00001-of-00010.gguf"));
    }

    #[test]
    fn a_named_file_must_exist() {
        let e = choose("o/r", &files(&["a.gguf"]), None, Some("b.gguf"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("file b.gguf") && e.contains("a.gguf"), "{e}");
    }
}
