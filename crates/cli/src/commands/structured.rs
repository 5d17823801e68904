//! Structured output flags of `run` and `chat`, as llama.cpp spells them:
//! `--grammar`/`--grammar-file` (GBNF, or llguidance's Lark when the text
//! starts with `%llguidance`) and `-j`/`--json-schema`/`--json-schema-file`.
//! The spec is read and checked before the model loads; it is compiled for
//! the model's vocabulary once it has (`engine::constraint`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use engine::{ConstraintSpec, Grammar, GrammarCompiler};
use tokenize::Vocab;

/// Grammars and schemas larger than this are refused (a typo'd path to a
/// model file, not a grammar).
const MAX_SPEC_BYTES: usize = 16 << 20;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct StructuredArgs {
    /// Constrain the output to a grammar: llama.cpp's GBNF (`root ::= ...`),
    /// or llguidance's Lark when it starts with `%llguidance`.
    #[arg(long, value_name = "GRAMMAR", group = "constraint")]
    pub grammar: Option<String>,
    /// A grammar as --grammar takes it, read from FILE.
    #[arg(long = "grammar-file", value_name = "FILE", group = "constraint")]
    pub grammar_file: Option<PathBuf>,
    /// Constrain the output to JSON valid against this JSON Schema
    /// (`{}`: any JSON value).
    #[arg(
        short = 'j',
        long = "json-schema",
        value_name = "SCHEMA",
        group = "constraint"
    )]
    pub json_schema: Option<String>,
    /// A JSON Schema as --json-schema takes it, read from FILE.
    #[arg(long = "json-schema-file", value_name = "FILE", group = "constraint")]
    pub json_schema_file: Option<PathBuf>,
}

impl StructuredArgs {
    /// The spec the flags give (files read, JSON parsed), if any.
    pub fn spec(&self) -> Result<Option<ConstraintSpec>> {
        let read = |path: &PathBuf| super::common::read_bounded(path, MAX_SPEC_BYTES);
        let schema = |text: &str, flag: &str| -> Result<ConstraintSpec> {
            let v: serde_json::Value =
                serde_json::from_str(text).with_context(|| format!("{flag}: not valid JSON"))?;
            if !(v.is_object() || v.is_boolean()) {
                bail!("{flag}: a JSON schema is an object");
            }
            Ok(ConstraintSpec::JsonSchema(v))
        };
        Ok(Some(match self {
            StructuredArgs {
                grammar: Some(g), ..
            } => ConstraintSpec::grammar(g),
            StructuredArgs {
                grammar_file: Some(f),
                ..
            } => ConstraintSpec::grammar(&read(f).context("--grammar-file")?),
            StructuredArgs {
                json_schema: Some(s),
                ..
            } => schema(s, "--json-schema")?,
            StructuredArgs {
                json_schema_file: Some(f),
                ..
            } => schema(
                &read(f).context("--json-schema-file")?,
                &format!("--json-schema-file {}", f.display()),
            )?,
            _ => return Ok(None),
        }))
    }

    /// `spec` compiled for `vocab` (logits rows of `n_vocab`); the error
    /// names the flag and the problem.
    pub fn compile(
        &self,
        spec: Option<ConstraintSpec>,
        vocab: &Vocab,
        n_vocab: usize,
    ) -> Result<Option<Grammar>> {
        let Some(spec) = spec else {
            return Ok(None);
        };
        let flag = match self {
            StructuredArgs {
                grammar: Some(_), ..
            } => "--grammar",
            StructuredArgs {
                grammar_file: Some(_),
                ..
            } => "--grammar-file",
            StructuredArgs {
                json_schema: Some(_),
                ..
            } => "--json-schema",
            _ => "--json-schema-file",
        };
        let compiler = GrammarCompiler::new(vocab, n_vocab)?;
        Ok(Some(
            compiler.compile(&spec).with_context(|| flag.to_string())?,
        ))
    }
}
