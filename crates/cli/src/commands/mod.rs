pub mod bench;
pub mod builtin;
pub mod chat;
pub mod common;
pub mod generate;
pub mod info;
pub mod inspect;
pub mod levels;
pub mod memory;
pub mod models;
pub mod perplexity;
pub mod pull;
pub mod quantize;
pub mod run;
pub mod serve;
pub mod stream;
pub mod structured;
pub mod tokenize;

use std::ffi::OsString;

/// llama.cpp spells some flags with two letters after one dash (`-pg` of
/// llama-bench, `-tb` of llama-cli and llama-server), but a clap short flag
/// is one letter. After the subcommands that take them, `-XY V` and
/// `-XY=V` become the long flags; everything else passes through.
const TWO_LETTER_FLAGS: &[(&[&str], &str, &str)] = &[
    (&["bench"], "-pg", "--pg"),
    (
        &["run", "chat", "serve", "perplexity"],
        "-tb",
        "--threads-batch",
    ),
    (
        &["run", "chat", "serve", "perplexity", "bench"],
        "-ub",
        "--ubatch-size",
    ),
    // llama.cpp's `-hf REPO[:QUANT]` and `-hff FILE`.
    (
        &["run", "chat", "serve", "perplexity", "memory"],
        "-hf",
        "--hf-repo",
    ),
    (
        &["run", "chat", "serve", "perplexity", "memory", "pull"],
        "-hff",
        "--hf-file",
    ),
    // llama.cpp's `-md FILE`, the draft model.
    (&["run", "chat", "serve"], "-md", "--model-draft"),
];

/// The arguments with llama.cpp's two-letter flags spelled as ours.
pub fn rewrite_args<I: IntoIterator<Item = OsString>>(args: I) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    let Some(cmd) = args.get(1).and_then(|a| a.to_str()).map(str::to_owned) else {
        return args;
    };
    for &(cmds, short, long) in TWO_LETTER_FLAGS {
        if !cmds.contains(&cmd.as_str()) {
            continue;
        }
        for a in &mut args[2..] {
            if let Some(rest) = a.to_str().and_then(|s| s.strip_prefix(short)) {
                if rest.is_empty() || rest.starts_with('=') {
                    *a = format!("{long}{rest}").into();
                }
            }
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_letter_flags_are_rewritten_after_their_subcommands_only() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            rewrite_args(os(&[
                "c", "bench", "-pg", "1,2", "-pg=3,4", "-pgx", "-tb", "2"
            ])),
            os(&["c", "bench", "--pg", "1,2", "--pg=3,4", "-pgx", "-tb", "2"])
        );
        assert_eq!(
            rewrite_args(os(&["c", "run", "-pg", "-tb", "2", "-tb=3", "-tbx"])),
            os(&[
                "c",
                "run",
                "-pg",
                "--threads-batch",
                "2",
                "--threads-batch=3",
                "-tbx"
            ])
        );
        for cmd in ["chat", "serve", "perplexity"] {
            assert_eq!(
                rewrite_args(os(&["c", cmd, "-tb", "1"])),
                os(&["c", cmd, "--threads-batch", "1"])
            );
        }
        assert_eq!(
            rewrite_args(os(&["c", "bench", "-ub", "8", "-ub=4"])),
            os(&["c", "bench", "--ubatch-size", "8", "--ubatch-size=4"])
        );
        assert_eq!(
            rewrite_args(os(&["c", "info", "-tb"])),
            os(&["c", "info", "-tb"])
        );
        assert_eq!(
            rewrite_args(os(&["c", "run", "-hf", "o/r:Q8_0", "-hff", "x.gguf"])),
            os(&["c", "run", "--hf-repo", "o/r:Q8_0", "--hf-file", "x.gguf"])
        );
        assert_eq!(rewrite_args(os(&["c"])), os(&["c"]));
    }
}
