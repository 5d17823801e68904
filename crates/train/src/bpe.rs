//! The `bpe` stage: a byte-level BPE trained with the `tokenizers`
//! crate's `BpeTrainer`, as GPT-2's was.
//!
//! The vocabulary is `<|pad|>`, `<|bos|>`, `<|eos|>` (ids 0–2), the 256
//! byte tokens (3–258, in the order of GPT-2's byte-to-character map), then
//! one token per merge until the size asked for (4096 by default: 3,837
//! merges). Words are cut by GPT-2's regex (`tokenizers`' ByteLevel
//! pre-tokenizer, no prefix space); training sees the same documents
//! `pack` encodes ([`documents::training`]).
//!
//! The stage saves `tokenizer.json` and the same vocabulary as a
//! vocab-only GGUF ([`Vocabulary::write_gguf`]), then encodes the held-out
//! texts with both tokenizers and fails unless the ids agree and decoding
//! gives the text back: the runtime must see the tokens the model was
//! trained on.

use crate::documents;
use crate::error::{Error, Result};
use crate::files;
use crate::paths;
use crate::vocab::{self, Vocabulary, BOS_ID, SPECIAL_TOKENS};
use std::path::Path;
use std::str::FromStr;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    TokenizerImpl,
};

type HfTokenizer = TokenizerImpl<
    BPE,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// Special tokens plus the 256 bytes: the smallest vocabulary.
pub const MIN_VOCAB: usize = SPECIAL_TOKENS.len() + 256;
/// Token ids are packed as `u16`.
pub const MAX_VOCAB: usize = 1 << 16;
pub const DEFAULT_VOCAB: usize = 4096;

fn check_vocab_size(vocab_size: usize) -> Result<()> {
    if !(MIN_VOCAB + 1..=MAX_VOCAB).contains(&vocab_size) {
        return Err(Error::Config(format!(
            "vocabulary size {vocab_size} is outside {}..={MAX_VOCAB} \
             (3 special tokens + 256 bytes + at least one merge; ids are stored as u16)",
            MIN_VOCAB + 1
        )));
    }
    Ok(())
}

/// Train on `documents` and return the `tokenizer.json` text.
pub fn train(documents: &[String], vocab_size: usize) -> Result<String> {
    check_vocab_size(vocab_size)?;
    let train_err = |e: tokenizers::Error| Error::Train(e.to_string());
    let mut tokenizer: HfTokenizer = TokenizerImpl::new(BPE::default());
    // GPT-2's settings: no space added before the text, GPT-2's regex.
    let byte_level = ByteLevel::new(false, true, true);
    tokenizer.with_pre_tokenizer(Some(byte_level));
    tokenizer.with_decoder(Some(byte_level));
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(0)
        .special_tokens(
            SPECIAL_TOKENS
                .iter()
                .map(|t| AddedToken::from(*t, true))
                .collect(),
        )
        // All 256 bytes, seen in the corpus or not: any text encodes.
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .show_progress(false)
        .build();
    tokenizer
        .train(&mut trainer, documents.iter())
        .map_err(train_err)?;
    // `encode(text, add_special_tokens = true)` adds BOS, as the GGUF's
    // `add_bos_token` makes our runtime do.
    let bos = SPECIAL_TOKENS[BOS_ID as usize];
    let template = TemplateProcessing::builder()
        .try_single(format!("{bos} $A"))
        .map_err(|e| Error::Train(e.to_string()))?
        .special_tokens(vec![(bos, BOS_ID)])
        .build()
        .map_err(|e| Error::Train(e.to_string()))?;
    tokenizer.with_post_processor(Some(template));
    tokenizer.to_string(true).map_err(train_err)
}

/// Encode each text with `tokenizers` (from `tokenizer_json`) and with our
/// runtime tokenizer; fail on the first difference in ids, or if decoding
/// does not give the text back. Returns the number of tokens compared.
pub fn check_parity(
    tokenizer_json: &str,
    runtime: &tokenize::Vocab,
    texts: &[(&str, &str)],
) -> Result<usize> {
    let hf = tokenizers::Tokenizer::from_str(tokenizer_json)
        .map_err(|e| Error::Train(format!("cannot load the trained tokenizer: {e}")))?;
    let mut total = 0;
    for &(what, text) in texts {
        let theirs = hf
            .encode(text, false)
            .map_err(|e| Error::Train(format!("encoding {what}: {e}")))?;
        let theirs = theirs.get_ids();
        let ours = runtime.encode(text, false, false);
        if let Some(at) = (0..theirs.len().max(ours.len())).find(|&i| theirs.get(i) != ours.get(i))
        {
            let window = |ids: &[u32]| {
                let from = at.saturating_sub(3);
                let to = (at + 4).min(ids.len());
                let pieces: Vec<String> = ids[from..to]
                    .iter()
                    .map(|&id| format!("{id}:{:?}", runtime.token_text(id).unwrap_or("?")))
                    .collect();
                pieces.join(" ")
            };
            return Err(Error::Mismatch {
                what: what.to_string(),
                detail: format!(
                    "token {at} differs; tokenizers: {} — ours: {}",
                    window(theirs),
                    window(&ours)
                ),
            });
        }
        let decoded = runtime.decode_with(
            &ours,
            tokenize::DecodeOptions {
                keep_spaces: true,
                ..Default::default()
            },
        );
        if decoded != text.as_bytes() {
            let at = decoded
                .iter()
                .zip(text.as_bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(decoded.len().min(text.len()));
            return Err(Error::Mismatch {
                what: what.to_string(),
                detail: format!(
                    "decoding does not give the text back (first difference at byte {at})"
                ),
            });
        }
        total += ours.len();
    }
    Ok(total)
}

/// What `run` did, for the user.
#[derive(Clone, Debug)]
pub struct BpeReport {
    pub vocab_size: usize,
    pub merges: usize,
    pub training_documents: usize,
    pub training_bytes: usize,
    /// Tokens of held-out text on which both tokenizers agreed.
    pub checked_tokens: usize,
}

/// Run the stage on the `data` stage's output in `dir`.
pub fn run(vocab_size: usize, dir: &Path, progress: bool) -> Result<BpeReport> {
    check_vocab_size(vocab_size)?;
    let corpus = files::read_stage_text(dir, paths::CORPUS_TRAIN, "data")?;
    let tasks = files::read_stage_text(dir, paths::TASKS_TRAIN, "data")?;
    let docs = documents::training(&corpus, &tasks);
    let training_bytes = docs.iter().map(String::len).sum();

    let spin = crate::spinner(
        progress,
        &format!("training BPE, vocabulary {vocab_size}, on {training_bytes} bytes"),
    );
    let json = train(&docs, vocab_size)?;
    spin.finish_and_clear();

    let json_path = dir.join(paths::TOKENIZER_JSON);
    files::write(&json_path, json.as_bytes())?;
    let vocab = Vocabulary::from_tokenizer_json(&json).map_err(|problem| Error::Invalid {
        path: json_path.clone(),
        problem,
    })?;
    let gguf_path = dir.join(paths::TOKENIZER_GGUF);
    vocab.write_gguf(&gguf_path)?;

    let spin = crate::spinner(progress, "checking tokenizers against cachefit-tokenize");
    let runtime = vocab::load_runtime(&gguf_path)?;
    let val = files::read_stage_text(dir, paths::CORPUS_VAL, "data")?;
    let eval = files::read_stage_text(dir, paths::TASKS_EVAL, "data")?;
    let checked = check_parity(
        &json,
        &runtime,
        &[(paths::CORPUS_VAL, &val), (paths::TASKS_EVAL, &eval)],
    )?;
    spin.finish_and_clear();
    Ok(BpeReport {
        vocab_size: vocab.len(),
        merges: vocab.merges.len(),
        training_documents: docs.len(),
        training_bytes,
        checked_tokens: checked,
    })
}
