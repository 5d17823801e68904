//! How the text files become documents, the unit the BPE trains on and
//! `pack` wraps in BOS … EOS. Both stages take their documents from here,
//! so the tokenizer is trained on exactly the text it will encode.
//!
//! - Training: the corpus's paragraphs in order, cut into chunks where the
//!   task passages are slotted in, evenly spread (passage `i` of `T` after
//!   the first `⌊(i+1)·P/(T+1)⌋` of `P` paragraphs). Each chunk and each passage is a
//!   document. Spreading them means any window of the token stream holds
//!   both kinds of text in about the mix asked for.
//! - Validation: the held-out tail of each corpus file, one document each.
//! - Evaluation: the held-out-name passages, one document each.
//!
//! A paragraph keeps its final `\n`; a chunk joins its paragraphs with the
//! blank line that separated them, so the text of a chunk is exactly the
//! corpus text it covers.

/// Split text whose paragraphs are separated by one blank line (as
/// [`clean`](crate::clean::clean) leaves it, and as `data` writes passage
/// files) into paragraphs, each ending in `\n`.
pub fn paragraphs(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("\n\n") {
        out.push(&rest[..i + 1]);
        rest = rest[i + 2..].trim_start_matches('\n');
    }
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

/// The training documents: corpus chunks with the task passages spread
/// between them.
pub fn training(corpus: &str, tasks: &str) -> Vec<String> {
    let paras = paragraphs(corpus);
    let passages = paragraphs(tasks);
    let (p, t) = (paras.len(), passages.len());
    let mut docs = Vec::with_capacity(t * 2 + 1);
    let mut chunk = String::new();
    let mut next = 0; // next passage to place
    for (i, para) in paras.iter().enumerate() {
        // Passages due after the first `i` paragraphs.
        while next < t && (next + 1) * p / (t + 1) <= i {
            if !chunk.is_empty() {
                docs.push(std::mem::take(&mut chunk));
            }
            docs.push(passages[next].to_string());
            next += 1;
        }
        if !chunk.is_empty() {
            chunk.push('\n');
        }
        chunk.push_str(para);
    }
    if !chunk.is_empty() {
        docs.push(chunk);
    }
    docs.extend(passages[next..].iter().map(|s| s.to_string()));
    docs
}

/// The validation documents: each corpus file's held-out tail, whole
/// (files that held nothing back give none).
pub fn validation(tails: &[&str]) -> Vec<String> {
    tails
        .iter()
        .filter(|t| !t.is_empty())
        .map(|t| t.to_string())
        .collect()
}

/// The evaluation documents: one per held-out-name passage.
pub fn evaluation(tasks_eval: &str) -> Vec<String> {
    paragraphs(tasks_eval)
        .into_iter()
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paragraphs_keep_their_newline() {
        assert_eq!(paragraphs("a\nb\n\nc\n\n\nd"), ["a\nb\n", "c\n", "d"]);
        assert!(paragraphs("").is_empty());
    }

    #[test]
    fn passages_spread_evenly_and_chunks_keep_the_text() {
        let corpus: String = (0..10).map(|i| format!("p{i}\n\n")).collect();
        let corpus = corpus.trim_end_matches('\n').to_string() + "\n";
        let docs = training(&corpus, "T0\n\nT1\n");
        assert_eq!(
            docs,
            [
                "p0\n\np1\n\np2\n",
                "T0\n",
                "p3\n\np4\n\np5\n",
                "T1\n",
                "p6\n\np7\n\np8\n\np9\n"
            ]
        );
        let chunks: Vec<&str> = docs
            .iter()
            .filter(|d| d.starts_with('p'))
            .map(String::as_str)
            .collect();
        assert_eq!(chunks.join("\n"), corpus);
    }

    #[test]
    fn more_passages_than_paragraphs_and_empty_sides() {
        assert_eq!(
            training("p\n", "a\n\nb\n\nc\n"),
            ["a\n", "b\n", "c\n", "p\n"]
        );
        assert_eq!(training("", "a\n\nb\n"), ["a\n", "b\n"]);
        assert_eq!(training("p\n\nq\n", ""), ["p\n\nq\n"]);
    }

    #[test]
    fn one_validation_document_per_file_tail() {
        assert_eq!(validation(&["a\n\nb\n", "", "c\n"]), ["a\n\nb\n", "c\n"]);
        assert!(validation(&[""]).is_empty());
    }
}
