//! `cachefit tokenize [-m FILE] [--ids] [--no-special] [--no-parse-special] TEXT`:
//! the model's tokenization of a text, like llama.cpp's `llama-tokenize`.

use super::builtin::ModelSource;
use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model whose tokenizer to use (default: the built-in model).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Print only the token ids, as a list.
    #[arg(long)]
    pub ids: bool,
    /// Don't add the BOS/EOS tokens the model asks for.
    #[arg(long)]
    pub no_special: bool,
    /// Treat special-token text like `<|im_end|>` as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Text to tokenize.
    pub text: String,
}

pub fn run(args: Args) -> Result<()> {
    let source = ModelSource::from_arg(args.model.as_ref())?;
    let file = source.open(Default::default())?;
    let vocab = tokenize::Vocab::from_gguf(file.metadata())
        .with_context(|| format!("{}: cannot load the tokenizer", source.shown()))?;
    let ids = vocab.encode(&args.text, !args.no_special, !args.no_parse_special);
    if args.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        outln!("[{}]", list.join(", "));
        return Ok(());
    }
    for id in &ids {
        let piece = vocab.token_to_piece(*id, true);
        outln!("{id:>7} -> '{}'", String::from_utf8_lossy(piece));
    }
    eprintln!("{} tokens", ids.len());
    Ok(())
}
