//! `tojson` as transformers defines it: Python's `json.dumps(x,
//! ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
//! jinja2's (and minijinja's) own `tojson` HTML-escapes `<`, `>`, `&` and
//! `'`, which would change tool schemas inside prompts; this one does not.
//! Separators, indentation and float formatting follow Python so the bytes
//! match what the model saw in training.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

use crate::python;

/// The keyword arguments of `json.dumps` that templates use.
#[derive(Clone, Debug)]
pub struct JsonOptions {
    /// Escape everything outside printable ASCII as `\uXXXX`.
    pub ensure_ascii: bool,
    /// Newline and this much indentation per level; None: one line.
    pub indent: Option<String>,
    /// Between items and between a key and its value.
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl JsonOptions {
    /// Python's defaults for a given `indent`: `", "` between items on one
    /// line, `","` (then a newline) when indenting.
    pub fn new(indent: Option<String>) -> JsonOptions {
        let item_separator = if indent.is_some() { "," } else { ", " };
        JsonOptions {
            ensure_ascii: false,
            indent,
            item_separator: item_separator.into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }
}

/// `json.dumps(value, **options)`.
pub fn dumps(value: &Value, options: &JsonOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, options, 0)?;
    Ok(out)
}

fn write_value(
    out: &mut String,
    value: &Value,
    options: &JsonOptions,
    level: usize,
) -> Result<(), Error> {
    if level > python::MAX_DEPTH {
        return Err(python::too_deep());
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), options),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(
                out,
                ('[', ']'),
                &items,
                options,
                level,
                |out, item, level| write_value(out, item, options, level),
            )?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if options.sort_keys {
                keys.sort();
            }
            write_container(out, ('{', '}'), &keys, options, level, |out, key, level| {
                write_key(out, key, options)?;
                out.push_str(&options.key_separator);
                write_value(out, &value.get_item(key)?, options, level)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {} is not JSON serializable", value.kind()),
            ))
        }
    }
    Ok(())
}

/// `[a, b]` or, with an indent, one item per line one level deeper. Empty
/// containers stay `[]`/`{}` either way, as in Python.
fn write_container(
    out: &mut String,
    (open, close): (char, char),
    items: &[Value],
    options: &JsonOptions,
    level: usize,
    mut write_item: impl FnMut(&mut String, &Value, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &options.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&options.item_separator);
        }
        newline(out, level + 1);
        write_item(out, item, level + 1)?;
    }
    newline(out, level);
    out.push(close);
    Ok(())
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    match f64::try_from(value.clone()) {
        Ok(f) if f.is_nan() => out.push_str("NaN"),
        Ok(f) if f.is_infinite() => out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" }),
        Ok(f) => out.push_str(&python::float_repr(f)),
        Err(_) => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python turns str, number, bool and None keys into strings; anything
/// else is a TypeError.
fn write_key(out: &mut String, key: &Value, options: &JsonOptions) -> Result<(), Error> {
    match key.kind() {
        ValueKind::String => write_string(out, key.as_str().unwrap_or_default(), options),
        ValueKind::Number | ValueKind::Bool | ValueKind::None => {
            let mut text = String::new();
            write_value(&mut text, key, options, 0)?;
            write_string(out, &text, options);
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("keys must be str, int, float, bool or None, not {kind}"),
            ))
        }
    }
    Ok(())
}

/// A JSON string the way Python's encoder writes it: `\"`, `\\`, the short
/// escapes for `\b \f \n \r \t`, `\u00XX` for other controls; with
/// `ensure_ascii`, `\uXXXX` (as surrogate pairs past U+FFFF) for anything
/// outside printable ASCII.
fn write_string(out: &mut String, s: &str, options: &JsonOptions) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if options.ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Value {
        Value::from_pairs([
            ("b", Value::from(1)),
            (
                "a",
                Value::from(vec![Value::from(2.0), Value::from(()), Value::from(true)]),
            ),
            ("e", Value::from(Vec::<Value>::new())),
            ("s", Value::from("é<&>'\"\n\u{1}😀")),
        ])
    }

    #[test]
    fn one_line_like_python() {
        let got = dumps(&sample(), &JsonOptions::new(None)).unwrap();
        assert_eq!(
            got,
            r#"{"b": 1, "a": [2.0, null, true], "e": [], "s": "é<&>'\"\n\u0001😀"}"#
        );
    }

    #[test]
    fn indented_sorted_ascii_like_python() {
        let options = JsonOptions {
            ensure_ascii: true,
            sort_keys: true,
            ..JsonOptions::new(Some("  ".into()))
        };
        let got = dumps(&sample(), &options).unwrap();
        let want = "{\n  \"a\": [\n    2.0,\n    null,\n    true\n  ],\n  \"b\": 1,\n  \"e\": [],\n  \"s\": \"\\u00e9<&>'\\\"\\n\\u0001\\ud83d\\ude00\"\n}";
        assert_eq!(got, want);
    }

    #[test]
    fn undefined_is_an_error() {
        assert!(dumps(&Value::UNDEFINED, &JsonOptions::new(None)).is_err());
    }
}
