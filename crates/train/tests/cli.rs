//! The real `cachefit-train` binary in a temporary folder: a small run of
//! every stage, a Project Gutenberg-style book, and the errors a user
//! meets first.

use std::path::Path;
use std::process::{Command, Output};

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachefit-train"))
        .current_dir(dir)
        .env_remove("CACHEFIT_PIPELINE_DIR")
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A made-up book as Project Gutenberg ships it.
fn gutenberg_book() -> String {
    let mut body = String::new();
    for chapter in 1..=12 {
        body.push_str(&format!("CHAPTER {chapter}\r\n\r\n"));
        for para in 0..8 {
            body.push_str(&format!(
                "It was the {para}th hour of chapter {chapter}, and the rain fell\r\n\
                 on the roofs of the old town  while the bells rang.\t\r\n\r\n"
            ));
        }
    }
    format!(
        "\u{feff}The Project Gutenberg eBook of A Made-Up Book\r\n\
         \r\n\
         This ebook is for the use of anyone anywhere in the United States.\r\n\
         \r\n\
         *** START OF THE PROJECT GUTENBERG EBOOK A MADE-UP BOOK ***\r\n\
         \r\n\
         {body}\
         *** END OF THE PROJECT GUTENBERG EBOOK A MADE-UP BOOK ***\r\n\
         \r\n\
         Updated editions will replace the previous one.\r\n\
         START: FULL LICENSE\r\n"
    )
}

#[test]
fn every_stage_through_the_binary_on_a_gutenberg_book() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("book.txt"), gutenberg_book()).unwrap();

    let o = run(
        tmp.path(),
        &[
            "data",
            "--corpus",
            "book.txt",
            "--dir",
            "out",
            "--eval-passages",
            "20",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("book.txt: Gutenberg header ends at line 5, footer starts at line"),
        "{}",
        stdout(&o)
    );
    let out = tmp.path().join("out");
    let train = std::fs::read_to_string(out.join("corpus.train.txt")).unwrap();
    let val = std::fs::read_to_string(out.join("corpus.val.txt")).unwrap();
    let text = format!("{train}\n{val}");
    assert!(text.starts_with("CHAPTER 1\n\nIt was the 0th hour of chapter 1, and the rain fell\n"));
    assert!(text.ends_with("while the bells rang.\n"));
    for stray in [
        "Gutenberg",
        "GUTENBERG",
        "\r",
        "\t",
        "  ",
        "\u{feff}",
        "LICENSE",
    ] {
        assert!(!text.contains(stray), "{stray:?} left in the corpus");
    }

    let o = run(tmp.path(), &["bpe", "--dir", "out", "--vocab-size", "300"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("vocabulary: 300 tokens (41 merges)"),
        "{}",
        stdout(&o)
    );

    // The folder can also come from the environment.
    let o = Command::new(env!("CARGO_BIN_EXE_cachefit-train"))
        .current_dir(tmp.path())
        .env("CACHEFIT_PIPELINE_DIR", "out")
        .arg("pack")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("train "), "{}", stdout(&o));
    for f in ["train.bin", "val.bin", "eval.bin", "pack.json"] {
        assert!(out.join(f).exists(), "{f}");
    }
}

#[test]
fn missing_corpus_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(
        tmp.path(),
        &["data", "--corpus", "nope.txt", "--dir", "out"],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.starts_with("error: cannot read nope.txt\n  caused by: "),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn invalid_utf8_corpus_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("latin1.txt"), b"Caf\xe9 au lait\n").unwrap();
    let o = run(
        tmp.path(),
        &["data", "--corpus", "latin1.txt", "--dir", "out"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: latin1.txt: not UTF-8 text: invalid byte 0xe9 at line 1, column 4 (byte offset 3)\n"
    );
}

#[test]
fn stages_out_of_order_say_what_to_run() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(tmp.path(), &["bpe", "--dir", "out"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: out/corpus.train.txt does not exist: run `cachefit-train data` first\n"
    );
    let o = run(tmp.path(), &["pack", "--dir", "out"]);
    assert_eq!(
        stderr(&o),
        "error: out/tokenizer.gguf does not exist: run `cachefit-train bpe` first\n"
    );
    let o = run(tmp.path(), &["bpe", "--vocab-size", "100"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("error: vocabulary size 100 is outside 260..=65536"),
        "{}",
        stderr(&o)
    );
}
