//! Tokenizers read from GGUF metadata, matching llama.cpp's `llama_tokenize`
//! and `llama_detokenize` token for token.
//!
//! A [`Vocab`] is built from a file's metadata ([`Vocab::from_gguf`]) and
//! holds everything: the tokens, the tokenizer (SentencePiece-style merges
//! by score for `llama`, byte-level BPE with a pre-tokenizer for `gpt2`),
//! the special tokens and the end-of-generation set. [`Vocab::encode`]
//! splits special tokens out of the text first, then tokenizes each stretch
//! of plain text; [`Vocab::decode`] and [`StreamDecoder`] go back.
//!
//! ```no_run
//! let file = gguf::GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let vocab = tokenize::Vocab::from_gguf(file.metadata())?;
//! let prompt = vocab.encode("<|im_start|>user\nHi!<|im_end|>\n", true, true);
//! let mut stream = vocab.stream_decoder();
//! for &id in &prompt {
//!     print!("{}", stream.push(id)); // only whole characters
//! }
//! print!("{}", stream.finish());
//! assert!(vocab.is_eog(vocab.eos().unwrap()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Layout: `vocab` (loading), `special` (special tokens, end of
//! generation), `encode` (special-token splitting and the entry point),
//! `spm` and `bpe` (the two merge algorithms), `pretokenize` (word
//! splitting for BPE), `unicode` (character classes, GPT-2's byte map),
//! `decode`, `error`.
//!
//! llama.cpp is the specification: where it has a quirk (the space
//! clean-up in decoding, Phi-3's strip rules) we reproduce it, and the
//! tests hold us to its own test vectors.

mod bpe;
mod decode;
mod encode;
mod error;
mod pretokenize;
mod special;
mod spm;
mod unicode;
mod vocab;

pub use decode::{DecodeOptions, StreamDecoder, Utf8Buffer};
pub use error::Error;
pub use pretokenize::PreTokenizer;
pub use special::SpecialTokens;
pub use vocab::{supported_pre_tokenizers, TokenAttr, TokenizerModel, Vocab};
