//! What Hugging Face's `apply_chat_template` adds to a stock jinja2
//! environment, and what Python jinja2 does that minijinja does not by
//! default, installed on a minijinja [`Environment`]:
//!
//! - `trim_blocks` and `lstrip_blocks` (transformers turns both on);
//! - `raise_exception(message)`: templates call it to refuse a conversation;
//! - `tojson` without HTML escaping, with `indent` and friends ([`json`]);
//! - `strftime_now(format)`: Llama 3.x puts today's date in the prompt;
//! - Python string methods (`.strip()`, `.title()`, `.startswith()`, ...)
//!   through minijinja-contrib's pycompat, with `strip`/`title` corrected to
//!   Python's rules ([`python`]);
//! - `{{ x }}`, `|string` and `|trim` as Python prints and strips;
//! - the `{% generation %}` block of transformers' AssistantTracker
//!   extension, which only marks the assistant's text and renders its body.

use std::borrow::Cow;
use std::fmt;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{from_args, Kwargs, Rest, Value};
use minijinja::{Environment, Error, ErrorKind, State};

use crate::json::{self, JsonOptions};
use crate::python;

/// Work budget per render (minijinja "fuel": about one unit per instruction
/// or per 64 bytes allocated). A real template spends tens per message, so
/// this is generous for any conversation that fits a context window, and
/// bounds what a hostile template in a GGUF can make us do (nested `range`
/// loops, doubling strings) to well under a second and about 300 MB.
const FUEL: u64 = 5_000_000;

/// Where `strftime_now` takes the time from.
#[derive(Clone, Copy, Debug)]
pub enum Clock {
    /// The local wall-clock time, as Python's naive `datetime.now()`.
    Local,
    /// A pinned time, for reproducible prompts and tests.
    Fixed(jiff::civil::DateTime),
}

/// Configure `env` the way transformers configures jinja2.
pub fn install(env: &mut Environment<'static>) -> Result<(), Error> {
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()?,
    );
    env.set_fuel(Some(FUEL));
    // Debug mode copies the render state into every error; we keep only
    // kind, detail and line.
    env.set_debug(false);
    env.set_formatter(|out, _state, value| {
        out.write_str(&python::to_str(value)?).map_err(Error::from)
    });
    env.set_unknown_method_callback(python_method);
    env.add_function("raise_exception", raise_exception);
    env.add_filter("tojson", tojson);
    env.add_filter("trim", |value: Value, chars: Option<String>| {
        let text = python::to_str(&value)?;
        Ok::<_, Error>(python::strip(&text, chars.as_deref()).to_string())
    });
    env.add_filter("string", |value: Value| python::to_str(&value));
    set_clock(env, Clock::Local);
    Ok(())
}

/// (Re)define `strftime_now` to read `clock`.
pub fn set_clock(env: &mut Environment<'static>, clock: Clock) {
    env.add_function("strftime_now", move |format: &str| strftime(clock, format));
}

fn strftime(clock: Clock, format: &str) -> Result<String, Error> {
    // Python formats a naive datetime: local civil time, no zone.
    let now = match clock {
        Clock::Local => jiff::ZonedDateTime::now().datetime(),
        Clock::Fixed(now) => now,
    };
    jiff::fmt::strtime::format(format, now).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now({format:?}): {e}"),
        )
    })
}

/// The message of a `raise_exception` call, carried as the source of the
/// minijinja error so [`raised_message`] can tell it from engine errors.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = python::to_str(&message)?;
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// The message if `err` (or an error it wraps) came from `raise_exception`.
pub fn raised_message(err: &Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(Raised(message)) = e.downcast_ref::<Raised>() {
            return Some(message.clone());
        }
        source = e.source();
    }
    None
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, positionally or by keyword as in Python.
fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let (ensure_ascii, indent, separators, sort_keys): (
        Option<bool>,
        Option<Value>,
        Option<Value>,
        Option<bool>,
    ) = from_args(&args)?;
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.or(ensure_ascii);
    let indent = kwargs.get::<Option<Value>>("indent")?.or(indent);
    let separators = kwargs.get::<Option<Value>>("separators")?.or(separators);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.or(sort_keys);
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: indent must be an integer or a string, not {v}"),
                    )
                })?;
                // Python: ' ' * indent, so a negative indent is "". Capped
                // so a template cannot ask for gigabytes of spaces.
                " ".repeat(n.clamp(0, 64) as usize)
            }
        }),
    };
    let mut options = JsonOptions::new(indent);
    options.ensure_ascii = ensure_ascii.unwrap_or(false);
    options.sort_keys = sort_keys.unwrap_or(false);
    if let Some(separators) = separators.filter(|v| !v.is_none()) {
        let pair: Vec<Value> = separators.try_iter()?.collect();
        match pair.as_slice() {
            [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                options.item_separator = item.as_str().unwrap_or_default().to_string();
                options.key_separator = key.as_str().unwrap_or_default().to_string();
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings (item, key)",
                ))
            }
        }
    }
    json::dumps(value, &options)
}

/// Python methods on values: ours where pycompat's differ from Python
/// (whitespace for `strip`, word starts for `title`), pycompat's otherwise.
fn python_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let stripped = |f: for<'a, 'b> fn(&'a str, Option<&'b str>) -> &'a str| {
            let (chars,): (Option<&str>,) = from_args(args)?;
            Ok::<_, Error>(Value::from(f(s, chars)))
        };
        match method {
            "strip" => return stripped(python::strip),
            "lstrip" => return stripped(python::lstrip),
            "rstrip" => return stripped(python::rstrip),
            "title" => {
                let () = from_args(args)?;
                return Ok(Value::from(python::title(s)));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Turn `{% generation %}` / `{% endgeneration %}` (transformers'
/// AssistantTracker extension, which minijinja does not know) into
/// `{% if true %}` / `{% endif %}`: also a block tag, so trim_blocks and
/// lstrip_blocks treat it the same, and the body renders unchanged. Tags
/// keep their `-`/`+` markers and lines keep their numbers.
pub fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        match generation_tag(tag) {
            Some((keyword_at, keyword, replacement)) => {
                out.push_str(&tag[..keyword_at]);
                out.push_str(replacement);
                rest = &tag[keyword_at + keyword.len()..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// If `tag` starts with a generation tag, where its keyword is, the keyword,
/// and what replaces it.
fn generation_tag(tag: &str) -> Option<(usize, &'static str, &'static str)> {
    let mut at = 2;
    if tag[at..].starts_with(['-', '+']) {
        at += 1;
    }
    at += tag[at..].len() - tag[at..].trim_start().len();
    let (keyword, replacement) = [("endgeneration", "endif"), ("generation", "if true")]
        .into_iter()
        .find(|(keyword, _)| tag[at..].starts_with(keyword))?;
    let after = tag[at + keyword.len()..].trim_start();
    let after = after.strip_prefix(['-', '+']).unwrap_or(after);
    after
        .starts_with("%}")
        .then_some((at, keyword, replacement))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_if_blocks() {
        let src = "a{% generation %}b{%- endgeneration -%}c{%+generation%}{% endgeneration%}";
        assert_eq!(
            rewrite_generation_tags(src),
            "a{% if true %}b{%- endif -%}c{%+if true%}{% endif%}"
        );
    }

    #[test]
    fn other_tags_are_untouched() {
        let src = "{% if generation %}{{ generation }}{% generations %}{% endif %}{%";
        assert_eq!(rewrite_generation_tags(src), src);
    }
}
