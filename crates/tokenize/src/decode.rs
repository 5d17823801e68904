//! Tokens to text: pieces per token, whole-sequence decoding as llama.cpp's
//! `llama_detokenize`, and a streaming decoder that only ever emits whole
//! UTF-8 characters.

use crate::vocab::{TokenAttr, Vocab};

/// How [`Vocab::decode_with`] renders tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Drop a leading BOS and trailing EOS where the vocabulary adds them
    /// (llama.cpp's `remove_special`).
    pub remove_special: bool,
    /// Write control tokens as their text, e.g. `<|im_end|>` (llama.cpp's
    /// `unparse_special`); otherwise they print nothing.
    pub unparse_special: bool,
    /// Skip llama.cpp's clean-up of spaces before punctuation and in
    /// contractions (`" ?"` → `"?"`), which some BPE vocabularies ask for.
    /// With it skipped, decoding inverts encoding exactly.
    pub keep_spaces: bool,
}

impl Vocab {
    /// The bytes token `id` stands for: part of a UTF-8 character for byte
    /// tokens. Control and unknown tokens give their text when `special`,
    /// else nothing; ids out of range give nothing.
    pub fn token_to_piece(&self, id: u32, special: bool) -> &[u8] {
        let Some(token) = self.tokens.get(id as usize) else {
            return &[];
        };
        if !special
            && token
                .attr
                .intersects(TokenAttr::UNKNOWN | TokenAttr::CONTROL)
        {
            return &[];
        }
        &self.pieces[id as usize]
    }

    /// Decode as llama.cpp's `common_detokenize(tokens, special = false)`:
    /// control tokens print nothing, SPM drops the space its encoding put
    /// in front, and invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, tokens: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_with(tokens, DecodeOptions::default())).into_owned()
    }

    /// Decode to raw bytes with explicit options.
    pub fn decode_with(&self, tokens: &[u32], opts: DecodeOptions) -> Vec<u8> {
        let mut tokens = tokens;
        // The first piece loses the space SPM encoding added, unless a BOS
        // being removed came first (llama.cpp's rule, kept as is).
        let mut strip_space = self.add_space_prefix;
        if opts.remove_special
            && self.add_bos
            && tokens.first().is_some_and(|&t| Some(t) == self.special.bos)
        {
            strip_space = false;
            tokens = &tokens[1..];
        }
        if opts.remove_special
            && self.add_eos
            && tokens.last().is_some_and(|&t| Some(t) == self.special.eos)
        {
            tokens = &tokens[..tokens.len() - 1];
        }
        let mut out = Vec::new();
        for &id in tokens {
            let mut piece = self.token_to_piece(id, opts.unparse_special);
            if strip_space {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
                strip_space = false;
            }
            out.extend_from_slice(piece);
        }
        if self.clean_spaces && !opts.keep_spaces {
            clean_up_spaces(&mut out);
        }
        out
    }

    /// A decoder for generated tokens, one at a time.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

/// llama.cpp's `clean_up_tokenization_spaces`, three in-place passes ported
/// as written (each reads bytes the previous step may have rewritten).
fn clean_up_spaces(text: &mut Vec<u8>) {
    // " ?", " !", " .", " ,": drop the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);

    // " ' ": drop both spaces.
    let n = text.len();
    let mut total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);

    // " 's", " 'm", " 're", " 've": drop the space (" 't", " 'd", " 'll" keep it).
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            let x2 = text.get(i + 2).copied().filter(|_| i + 2 < n);
            if matches!(x1, b's' | b'm') || matches!((x1, x2), (b'r' | b'v', Some(b'e'))) {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Turns a stream of tokens into text without ever splitting a UTF-8
/// character: bytes of a character that spans tokens are held back until
/// it is complete. Bytes that can never start or continue a character
/// (e.g. a lone continuation byte) come out as U+FFFD where they occur;
/// a character still incomplete at [`finish`](Self::finish) does too.
///
/// Pieces are as [`Vocab::token_to_piece`] gives them: no leading-space
/// stripping and no clean-up, as llama.cpp streams generated text.
pub struct StreamDecoder<'v> {
    vocab: &'v Vocab,
    special: bool,
    utf8: Utf8Buffer,
}

impl<'v> StreamDecoder<'v> {
    pub fn new(vocab: &'v Vocab) -> StreamDecoder<'v> {
        StreamDecoder {
            vocab,
            special: false,
            utf8: Utf8Buffer::default(),
        }
    }

    /// Also print control tokens as their text.
    pub fn with_special(mut self, special: bool) -> Self {
        self.special = special;
        self
    }

    /// Add a token; returns the text that is now complete (often empty
    /// mid-character).
    pub fn push(&mut self, id: u32) -> String {
        self.utf8.push(self.vocab.token_to_piece(id, self.special))
    }

    /// End of stream: whatever is held back, with U+FFFD for an incomplete
    /// character.
    pub fn finish(&mut self) -> String {
        self.utf8.finish()
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.utf8.pending
    }
}

/// Bytes in, whole characters out.
#[derive(Default, Debug)]
pub struct Utf8Buffer {
    pending: Vec<u8>,
}

impl Utf8Buffer {
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: wait for more.
                        None => {
                            rest = after;
                            break;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }

    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
