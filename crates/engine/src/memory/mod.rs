//! Long memory (issue #18): a conversation's or a corpus's whole history on
//! disk, the recent part in the KV cache and the rest brought back when it
//! matters.
//!
//! ```text
//! history ──encoder──▶ pre-RoPE keys ──layout──▶ sign codes + block summaries ──▶ memory file
//! prompt  ──probe pass──▶ pre-RoPE queries ──layout──▶ search ──▶ top blocks' token ids
//! context = [sinks | hot window | retrieved blocks | prompt]  (positions 0.., all in the KV cache)
//! ```
//!
//! - [`layout`]: what a code is (slots, centring, rotation), stored in the
//!   file so every session encodes alike.
//! - [`calibrate`]: which (layer, KV head) pairs retrieve, measured once per
//!   model when a file is made.
//! - [`encoder`]: keys of a token stream in a sliding window.
//! - [`session`]: a memory file opened for a model: appending, and the
//!   context a prompt sees.
//!
//! The store itself (records, crash safety, the tiered search) is the
//! `memory` crate.

pub mod calibrate;
pub mod encoder;
pub mod layout;
pub mod registry;
pub mod session;

use sha2::{Digest, Sha256};

pub use encoder::{Encoded, KeyEncoder, ModelEncoder};
pub use layout::{HeadShape, Layout, Slot};
pub use registry::Memories;
pub use session::{MemoryConfig, MemorySession, Recall, View};

/// Why a memory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error(transparent)]
    File(#[from] memory::Error),
    #[error("the memory file's layout is unusable: {0}")]
    Params(String),
    #[error("{0}")]
    Model(String),
    #[error(
        "{path} was made with another model (fingerprint {file}); this model's is {model}. \
         Open it with the model it was built with, or start a new memory file"
    )]
    OtherModel {
        path: String,
        file: String,
        model: String,
    },
}

/// A model's identity for memory files: SHA-256 over every tensor's name,
/// type, shape and bytes, and the tokenizer's tokens, so a memory file is
/// never read with codes from another model or ids from another
/// vocabulary. Hash it before binding the weights (binding may release
/// the mapped pages that row tiles were made from).
pub fn fingerprint(file: &gguf::GgufFile, vocab: &tokenize::Vocab) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"cachefit memory fingerprint v1\0");
    for t in file.tensors() {
        h.update(t.name.as_bytes());
        h.update([0]);
        h.update(format!("{:?}{:?}", t.ty, t.dims).as_bytes());
        h.update(file.tensor_data(t));
    }
    h.update(b"\0tokenizer\0");
    for id in 0..vocab.len() as u32 {
        h.update(vocab.token_text(id).unwrap_or("").as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

/// The tokens a job reads for `prompt` with a memory: `[BOS] | view |
/// prompt` (a BOS the vocabulary put at the prompt's start moves to the
/// front, so the history does not sit before it), the view taking what the context
/// leaves after the prompt and `reserve` tokens to generate. Errors if
/// the prompt alone does not fit.
pub fn assemble(
    session: &MemorySession,
    enc: &mut dyn KeyEncoder,
    vocab: &tokenize::Vocab,
    prompt: &[u32],
    n_ctx: usize,
    reserve: usize,
) -> Result<(Vec<u32>, View), MemoryError> {
    // Only a BOS the vocabulary adds: some models' BOS is also a chat
    // template's turn start (SmolLM2's <|im_start|>), which stays put.
    let bos = vocab
        .bos()
        .filter(|&b| vocab.add_bos() && prompt.first() == Some(&b));
    let body = &prompt[bos.is_some() as usize..];
    let used = body.len() + bos.is_some() as usize + reserve.min(n_ctx / 2);
    let room = n_ctx.saturating_sub(used + 1);
    let view = session.view(enc, body, &|t| !vocab.is_control(t), room)?;
    let mut tokens = Vec::with_capacity(view.tokens.len() + prompt.len() + 1);
    tokens.extend(bos);
    tokens.extend_from_slice(&view.tokens);
    tokens.extend_from_slice(body);
    Ok((tokens, view))
}

/// A fingerprint as messages show it (its first 8 bytes in hex).
pub fn short_hex(fp: &[u8; 32]) -> String {
    fp[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
