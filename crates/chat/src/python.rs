//! Python's behaviour at the places where a Hugging Face template can see
//! it and minijinja does something else: what `{{ x }}` prints (Python's
//! `str(x)`: `None`, `True`, `[1, 'a']`, `1e+16`), `repr()` of strings,
//! `str.isspace()` for `strip()`, and `str.title()`.
//!
//! Templates are written against jinja2, so these decide whether our prompt
//! matches the one the model was trained on, byte for byte.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};
use unicode_general_category::{get_general_category, GeneralCategory};

/// `str.isspace()`: Unicode White_Space plus the four ASCII information
/// separators (U+001C..U+001F), which Python counts and Rust does not.
pub fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `str.strip(chars)`: whitespace when `chars` is None.
pub fn strip<'a>(s: &'a str, chars: Option<&str>) -> &'a str {
    rstrip(lstrip(s, chars), chars)
}

pub fn lstrip<'a>(s: &'a str, chars: Option<&str>) -> &'a str {
    match chars {
        Some(chars) => s.trim_start_matches(|c| chars.contains(c)),
        None => s.trim_start_matches(is_space),
    }
}

pub fn rstrip<'a>(s: &'a str, chars: Option<&str>) -> &'a str {
    match chars {
        Some(chars) => s.trim_end_matches(|c| chars.contains(c)),
        None => s.trim_end_matches(is_space),
    }
}

/// `str.title()`: a character is title-cased when the one before it is not
/// cased (so `"they're"` becomes `"They'Re"` and `"x1y"` becomes `"X1Y"`),
/// lower-cased otherwise. minijinja's `title` follows jinja2's *filter*,
/// which only starts words after spaces and brackets.
pub fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut previous_is_cased = false;
    for c in s.chars() {
        if previous_is_cased {
            out.extend(c.to_lowercase());
        } else {
            push_titlecase(&mut out, c);
        }
        previous_is_cased = is_cased(c);
    }
    out
}

/// Unicode's Cased property, which Python's title() tracks.
fn is_cased(c: char) -> bool {
    c.is_lowercase()
        || c.is_uppercase()
        || get_general_category(c) == GeneralCategory::TitlecaseLetter
}

/// Title case of one character. Rust has no titlecase mapping: the
/// Latin digraphs are the letters whose title case differs from their upper
/// case (`ǆ` → `ǅ`, not `Ǆ`), and multi-character upper cases become
/// upper + lower (`ß` → `Ss`, `ﬀ` → `Ff`), as in Unicode's SpecialCasing.
fn push_titlecase(out: &mut String, c: char) {
    match c {
        '\u{1c4}'..='\u{1c6}' => out.push('\u{1c5}'),
        '\u{1c7}'..='\u{1c9}' => out.push('\u{1c8}'),
        '\u{1ca}'..='\u{1cc}' => out.push('\u{1cb}'),
        '\u{1f1}'..='\u{1f3}' => out.push('\u{1f2}'),
        _ => {
            let mut upper = c.to_uppercase();
            if let Some(first) = upper.next() {
                out.push(first);
            }
            for rest in upper {
                out.extend(rest.to_lowercase());
            }
        }
    }
}

/// How deep `repr` (and `tojson`) follow nested lists and dicts before
/// giving up, as Python does with a RecursionError; well past anything a
/// template builds on purpose, well short of exhausting the stack.
pub const MAX_DEPTH: usize = 1000;

pub fn too_deep() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("value nested more than {MAX_DEPTH} levels deep"),
    )
}

/// `str(value)`, which is what jinja2 prints for `{{ value }}`.
pub fn to_str(value: &Value) -> Result<String, Error> {
    let mut out = String::new();
    match value.kind() {
        // jinja2's Undefined prints as nothing.
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => write_repr(&mut out, value, 0)?,
    }
    Ok(out)
}

/// `repr(value)`: how Python shows a value inside a list or dict.
fn write_repr(out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(f) => out.push_str(&float_repr(f)),
            Err(_) => {
                let _ = write!(out, "{value}");
            }
        },
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let (open, close) = if value.is_tuple() {
                ("(", ")")
            } else {
                ("[", "]")
            };
            out.push_str(open);
            let mut n = 0;
            if let Ok(items) = value.try_iter() {
                for item in items {
                    if n > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &item, depth + 1)?;
                    n += 1;
                }
            }
            if value.is_tuple() && n == 1 {
                out.push(',');
            }
            out.push_str(close);
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &key, depth + 1)?;
                    out.push_str(": ");
                    let item = value.get_item(&key).unwrap_or_default();
                    write_repr(out, &item, depth + 1)?;
                }
            }
            out.push('}');
        }
        // Integers, bytes and opaque objects: minijinja's own rendering.
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// `repr(str)`: single quotes unless the text has a `'` and no `"`;
/// escapes for the quote, backslash and unprintable characters.
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let code = c as u32;
                let _ = match code {
                    0..=0xff => write!(out, "\\x{code:02x}"),
                    0x100..=0xffff => write!(out, "\\u{code:04x}"),
                    _ => write!(out, "\\U{code:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `str.isprintable()` for one character: everything but the "Other" and
/// "Separator" categories, except the ASCII space.
fn is_printable(c: char) -> bool {
    use GeneralCategory::*;
    c == ' '
        || !matches!(
            get_general_category(c),
            Control
                | Format
                | Surrogate
                | PrivateUse
                | Unassigned
                | LineSeparator
                | ParagraphSeparator
                | SpaceSeparator
        )
}

/// `repr(float)`: the shortest digits that round-trip, positional for
/// exponents -4..16 (always with a fractional part), scientific outside
/// (`1e+16`, `1e-05`).
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits, e.g. "-1.25e-7".
    let sci = format!("{:e}", f.abs());
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return format!("{f}");
    };
    let Ok(exp) = exp.parse::<i32>() else {
        return format!("{f}");
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        // Where the decimal point goes, counted in digits from the left.
        let point = exp + 1;
        if point <= 0 {
            format!(
                "{sign}0.{}{digits}",
                "0".repeat(point.unsigned_abs() as usize)
            )
        } else {
            let point = point as usize;
            if point >= digits.len() {
                format!("{sign}{digits}{}.0", "0".repeat(point - digits.len()))
            } else {
                format!("{sign}{}.{}", &digits[..point], &digits[point..])
            }
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let mantissa = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (1.5, "1.5"),
            (-2.25, "-2.25"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e20, "1e+20"),
            (123456.789, "123456.789"),
            (1.2345e-7, "1.2345e-07"),
            (1e100, "1e+100"),
            (-0.0, "-0.0"),
            (f64::INFINITY, "inf"),
            (f64::NAN, "nan"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn title_matches_python() {
        assert_eq!(title("they're bill's friends"), "They'Re Bill'S Friends");
        assert_eq!(title("hello1world x-y"), "Hello1World X-Y");
        assert_eq!(title("ǆemal straße"), "ǅemal Straße");
        assert_eq!(title("ßa"), "Ssa");
        assert_eq!(title("ABC def"), "Abc Def");
    }

    #[test]
    fn strip_uses_python_whitespace() {
        assert_eq!(strip("\u{1f} a \u{1c}\n", None), "a");
        assert_eq!(strip("xxhixx", Some("x")), "hi");
        assert_eq!(lstrip("\n\nhi\n", Some("\n")), "hi\n");
        assert_eq!(strip("abc", Some("")), "abc");
    }

    #[test]
    fn repr_of_containers() {
        let v = Value::from(vec![
            Value::from(1),
            Value::from("it's"),
            Value::from(()),
            Value::from(true),
            Value::from(2.5),
            Value::from("a\u{a0}\u{1}\\"),
        ]);
        assert_eq!(
            to_str(&v).unwrap(),
            r#"[1, "it's", None, True, 2.5, 'a\xa0\x01\\']"#
        );
        let m = Value::from_pairs([("b", Value::from(1)), ("a", Value::from("x"))]);
        assert_eq!(to_str(&m).unwrap(), "{'b': 1, 'a': 'x'}");

        let mut deep = Value::from(1);
        for _ in 0..=MAX_DEPTH {
            deep = Value::from(vec![deep]);
        }
        assert!(to_str(&deep).is_err());
    }
}
