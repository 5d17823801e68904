//! What the user asks for: a llama.cpp file type ("ftype"). Each is either a
//! single tensor type (`Q8_0`, `F16`, ...) or a mix (`Q4_K_M`, ...), but even
//! the single ones carry llama.cpp's rules for the output tensor and token
//! embeddings, exactly as `llama-quantize MODEL OUT Q8_0` applies them.
//! Names and the `Q3_K`/`Q4_K`/`Q5_K` aliases follow `tools/quantize`.

use crate::error::Error;
use gguf::GgmlType;
use std::fmt;
use std::str::FromStr;

/// A llama.cpp file type we can produce.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    IQ4_NL,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    TQ1_0,
    TQ2_0,
}

/// One row of the target table.
pub struct TargetInfo {
    pub target: Target,
    pub name: &'static str,
    /// `enum llama_ftype` value, written to `general.file_type`.
    pub ftype: u32,
    /// The tensor type most weights get (`llama_ftype_get_default_type`).
    pub base: GgmlType,
    pub about: &'static str,
}

use GgmlType as G;

/// Every target, in the order `llama-quantize --help` lists them.
pub const TARGETS: &[TargetInfo] = &[
    t(Target::Q4_0, "Q4_0", 2, G::Q4_0, "4.5 bpw"),
    t(Target::Q4_1, "Q4_1", 3, G::Q4_1, "5.0 bpw"),
    t(Target::Q5_0, "Q5_0", 8, G::Q5_0, "5.5 bpw"),
    t(Target::Q5_1, "Q5_1", 9, G::Q5_1, "6.0 bpw"),
    t(Target::TQ1_0, "TQ1_0", 36, G::TQ1_0, "1.69 bpw ternary"),
    t(Target::TQ2_0, "TQ2_0", 37, G::TQ2_0, "2.06 bpw ternary"),
    t(
        Target::Q2_K,
        "Q2_K",
        10,
        G::Q2_K,
        "mix: Q2_K, attn_v/ffn_down Q3_K+",
    ),
    t(Target::Q3_K_S, "Q3_K_S", 11, G::Q3_K, "Q3_K everywhere"),
    t(
        Target::Q3_K_M,
        "Q3_K_M",
        12,
        G::Q3_K,
        "mix: Q3_K, attn_v/ffn_down/attn_output Q4_K+",
    ),
    t(
        Target::Q3_K_L,
        "Q3_K_L",
        13,
        G::Q3_K,
        "mix: Q3_K, attn_v/ffn_down/attn_output Q5_K",
    ),
    t(
        Target::IQ4_NL,
        "IQ4_NL",
        25,
        G::IQ4_NL,
        "4.5 bpw non-linear",
    ),
    t(
        Target::Q4_K_S,
        "Q4_K_S",
        14,
        G::Q4_K,
        "mostly Q4_K, first attn_v/ffn_down Q5_K",
    ),
    t(
        Target::Q4_K_M,
        "Q4_K_M",
        15,
        G::Q4_K,
        "mix: Q4_K, half of attn_v/ffn_down Q6_K",
    ),
    t(Target::Q5_K_S, "Q5_K_S", 16, G::Q5_K, "Q5_K everywhere"),
    t(
        Target::Q5_K_M,
        "Q5_K_M",
        17,
        G::Q5_K,
        "mix: Q5_K, half of attn_v/ffn_down Q6_K",
    ),
    t(Target::Q6_K, "Q6_K", 18, G::Q6_K, "6.56 bpw"),
    t(Target::Q8_0, "Q8_0", 7, G::Q8_0, "8.5 bpw"),
    t(Target::F16, "F16", 1, G::F16, "16 bpw"),
    t(Target::BF16, "BF16", 32, G::BF16, "16 bpw"),
    t(Target::F32, "F32", 0, G::F32, "32 bpw"),
];

/// Names `llama-quantize` accepts for a mix (`tools/quantize/quantize.cpp`).
pub const ALIASES: &[(&str, Target)] = &[
    ("Q3_K", Target::Q3_K_M),
    ("Q4_K", Target::Q4_K_M),
    ("Q5_K", Target::Q5_K_M),
];

const fn t(
    target: Target,
    name: &'static str,
    ftype: u32,
    base: GgmlType,
    about: &'static str,
) -> TargetInfo {
    TargetInfo {
        target,
        name,
        ftype,
        base,
        about,
    }
}

impl Target {
    pub fn info(self) -> &'static TargetInfo {
        TARGETS
            .iter()
            .find(|i| i.target == self)
            .expect("every target has a row in TARGETS")
    }
    pub fn name(self) -> &'static str {
        self.info().name
    }
    /// llama.cpp's `enum llama_ftype` number.
    pub fn ftype(self) -> u32 {
        self.info().ftype
    }
    /// The type most tensors get.
    pub fn base_type(self) -> GgmlType {
        self.info().base
    }

    /// Case-insensitive lookup of a name or alias.
    pub fn parse(name: &str) -> Result<Target, Error> {
        let hit = TARGETS
            .iter()
            .map(|i| (i.name, i.target))
            .chain(ALIASES.iter().copied())
            .find(|(n, _)| n.eq_ignore_ascii_case(name.trim()));
        match hit {
            Some((_, t)) => Ok(t),
            None => Err(Error::UnknownTarget {
                name: name.to_string(),
                supported: supported_names(),
            }),
        }
    }
}

/// All accepted names, comma-separated, aliases marked.
pub fn supported_names() -> String {
    let mut names: Vec<String> = TARGETS.iter().map(|i| i.name.to_string()).collect();
    names.extend(ALIASES.iter().map(|(a, t)| format!("{a} (= {})", t.name())));
    names.join(", ")
}

impl FromStr for Target {
    type Err = Error;
    fn from_str(s: &str) -> Result<Target, Error> {
        Target::parse(s)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_case_insensitively() {
        for i in TARGETS {
            assert_eq!(Target::parse(i.name).unwrap(), i.target);
            assert_eq!(Target::parse(&i.name.to_lowercase()).unwrap(), i.target);
        }
        assert_eq!(Target::parse("q4_k").unwrap(), Target::Q4_K_M);
        assert_eq!(Target::parse("Q5_k").unwrap(), Target::Q5_K_M);
        assert_eq!(Target::parse("Q3_K").unwrap(), Target::Q3_K_M);
    }

    #[test]
    fn unknown_name_lists_supported() {
        let e = Target::parse("Q7_X").unwrap_err().to_string();
        assert!(e.contains("`Q7_X`"), "{e}");
        for n in [
            "Q4_K_M",
            "Q8_0",
            "TQ2_0",
            "BF16",
            "IQ4_NL",
            "Q4_K (= Q4_K_M)",
        ] {
            assert!(e.contains(n), "{n} missing from: {e}");
        }
    }

    #[test]
    fn ftype_numbers_match_llama_h() {
        // `enum llama_ftype` in include/llama.h.
        let want = [
            (Target::F32, 0),
            (Target::F16, 1),
            (Target::Q4_0, 2),
            (Target::Q4_1, 3),
            (Target::Q8_0, 7),
            (Target::Q5_0, 8),
            (Target::Q5_1, 9),
            (Target::Q2_K, 10),
            (Target::Q3_K_S, 11),
            (Target::Q3_K_M, 12),
            (Target::Q3_K_L, 13),
            (Target::Q4_K_S, 14),
            (Target::Q4_K_M, 15),
            (Target::Q5_K_S, 16),
            (Target::Q5_K_M, 17),
            (Target::Q6_K, 18),
            (Target::IQ4_NL, 25),
            (Target::BF16, 32),
            (Target::TQ1_0, 36),
            (Target::TQ2_0, 37),
        ];
        for (t, n) in want {
            assert_eq!(t.ftype(), n, "{t}");
        }
        assert_eq!(TARGETS.len(), want.len());
    }
}
