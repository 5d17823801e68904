//! llama.cpp's GBNF grammars, rewritten into the Lark syntax llguidance
//! compiles (as llguidance's own `gbnf_to_lark` converter does).
//!
//! GBNF: rules `name ::= alternatives`, one per line unless inside
//! parentheses; `"literals"` and `[character classes]` with `\x`, `\u`,
//! `\U`, `\t`, `\n`, `\r` escapes; `.` for any character; `( )` groups;
//! `| * + ? {m} {m,} {m,n}`; `#` comments; the output is `root`.
//!
//! Lark needs two things GBNF does not say. Rule names must be lowercase
//! (they become `snake_case`, `root` becomes `start`). And rules made only
//! of characters (no recursion) become Lark *terminals* (UPPERCASE), which
//! llguidance matches with its lexer rather than its Earley parser: a JSON
//! string rule then costs one regex step per token instead of one parser
//! item per character. Token references (`<[id]>`, `<|name|>`) and `!` are
//! not supported and are reported as such.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// A GBNF expression.
#[derive(Clone, Debug)]
enum Expr {
    Literal(String),
    /// `[...]`: ranges of characters, negated or not.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    Any,
    Rule(String),
    Seq(Vec<Expr>),
    Alt(Vec<Expr>),
    Repeat {
        inner: Box<Expr>,
        min: u32,
        max: Option<u32>,
    },
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

type Res<T> = Result<T, String>;

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn err<T>(&self, what: &str) -> Res<T> {
        let line = self.src[..self.pos].matches('\n').count() + 1;
        let col = self.src[..self.pos]
            .rsplit('\n')
            .next()
            .map_or(0, |l| l.chars().count())
            + 1;
        let near: String = self.src[self.pos..].chars().take(20).collect();
        Err(format!(
            "{what} at line {line}, column {col} (near {near:?})"
        ))
    }

    /// Skip spaces, tabs and comments; newlines too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => {
                    self.bump();
                }
                '\r' | '\n' if newlines => {
                    self.bump();
                }
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.bump();
                    }
                }
                _ => break,
            }
        }
    }

    fn is_word(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '-' || c == '_'
    }

    fn name(&mut self) -> Res<String> {
        let start = self.pos;
        while self.peek().is_some_and(Self::is_word) {
            self.bump();
        }
        if self.pos == start {
            return self.err("expected a rule name");
        }
        Ok(self.src[start..self.pos].to_string())
    }

    fn hex(&mut self, digits: usize) -> Res<char> {
        let start = self.pos;
        for _ in 0..digits {
            match self.bump() {
                Some(c) if c.is_ascii_hexdigit() => {}
                _ => {
                    self.pos = start;
                    return self.err(&format!("expected {digits} hex digits"));
                }
            }
        }
        let v = u32::from_str_radix(&self.src[start..self.pos], 16).expect("hex digits");
        match char::from_u32(v) {
            Some(c) => Ok(c),
            None => self.err(&format!("U+{v:X} is not a character")),
        }
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Res<char> {
        match self.bump() {
            None => self.err("unexpected end of grammar"),
            Some('\\') => match self.bump() {
                Some('x') => self.hex(2),
                Some('u') => self.hex(4),
                Some('U') => self.hex(8),
                Some('t') => Ok('\t'),
                Some('n') => Ok('\n'),
                Some('r') => Ok('\r'),
                Some(c @ ('"' | '[' | ']' | '\\' | '-' | '^')) => Ok(c),
                Some(c) => self.err(&format!("unknown escape \\{c}")),
                None => self.err("unexpected end of grammar"),
            },
            Some(c) => Ok(c),
        }
    }

    fn literal(&mut self) -> Res<Expr> {
        self.bump(); // "
        let mut s = String::new();
        loop {
            match self.peek() {
                None => return self.err("unterminated string"),
                Some('"') => {
                    self.bump();
                    return Ok(Expr::Literal(s));
                }
                Some(_) => s.push(self.char()?),
            }
        }
    }

    fn class(&mut self) -> Res<Expr> {
        self.bump(); // [
        let negated = self.peek() == Some('^');
        if negated {
            self.bump();
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => return self.err("unterminated character class"),
                Some(']') => {
                    self.bump();
                    return Ok(Expr::Class { negated, ranges });
                }
                Some(_) => {
                    let lo = self.char()?;
                    let mut hi = lo;
                    if self.peek() == Some('-') && !self.src[self.pos + 1..].starts_with(']') {
                        self.bump();
                        hi = self.char()?;
                        if hi < lo {
                            return self.err(&format!("range {lo:?}-{hi:?} is backwards"));
                        }
                    }
                    ranges.push((lo, hi));
                }
            }
        }
    }

    fn int(&mut self) -> Res<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.bump();
        }
        match self.src[start..self.pos].parse() {
            Ok(n) => Ok(n),
            Err(_) => self.err("expected a repetition count"),
        }
    }

    /// `*`, `+`, `?` or `{m,n}` after an item, if there is one.
    fn repetition(&mut self, item: Expr) -> Res<Expr> {
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.bump();
                self.space(true);
                let min = self.int()?;
                self.space(true);
                let max = match self.peek() {
                    Some('}') => Some(min),
                    Some(',') => {
                        self.bump();
                        self.space(true);
                        if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                            Some(self.int()?)
                        } else {
                            None
                        }
                    }
                    _ => return self.err("expected ',' or '}' in a repetition"),
                };
                self.space(true);
                if self.peek() != Some('}') {
                    return self.err("expected '}' to end a repetition");
                }
                if max.is_some_and(|m| m < min) {
                    return self.err("a repetition's maximum is below its minimum");
                }
                (min, max)
            }
            _ => return Ok(item),
        };
        self.bump();
        Ok(Expr::Repeat {
            inner: Box::new(item),
            min,
            max,
        })
    }

    fn sequence(&mut self, nested: bool) -> Res<Expr> {
        let mut items = Vec::new();
        loop {
            self.space(nested);
            let item = match self.peek() {
                None | Some('|' | ')') => break,
                Some('\r' | '\n') if !nested => break,
                Some('"') => self.literal()?,
                Some('[') => self.class()?,
                Some('.') => {
                    self.bump();
                    Expr::Any
                }
                Some('(') => {
                    self.bump();
                    let inner = self.alternatives(true)?;
                    self.space(true);
                    if self.peek() != Some(')') {
                        return self.err("expected ')'");
                    }
                    self.bump();
                    inner
                }
                Some('<') => return self.err("token references (<...>) are not supported"),
                Some('!') => return self.err("token negation (!) is not supported"),
                Some(c) if Self::is_word(c) => {
                    let save = self.pos;
                    let name = self.name()?;
                    // The next rule's head: this sequence ended a line early
                    // (only possible inside parentheses, which is an error).
                    let mut look = Parser {
                        src: self.src,
                        pos: self.pos,
                    };
                    look.space(false);
                    if look.src[look.pos..].starts_with("::=") {
                        self.pos = save;
                        return self.err("a rule starts inside parentheses");
                    }
                    Expr::Rule(name)
                }
                Some(c) => return self.err(&format!("unexpected {c:?}")),
            };
            self.space(nested);
            items.push(self.repetition(item)?);
        }
        Ok(if items.len() == 1 {
            items.pop().expect("one item")
        } else {
            Expr::Seq(items)
        })
    }

    fn alternatives(&mut self, nested: bool) -> Res<Expr> {
        let mut alts = vec![self.sequence(nested)?];
        loop {
            // A `|` opening the next line continues the rule (llama.cpp
            // wants it at the end of the line; both read the same).
            let save = self.pos;
            self.space(true);
            if self.peek() != Some('|') {
                if !nested {
                    self.pos = save;
                }
                break;
            }
            self.bump();
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().expect("one")
        } else {
            Expr::Alt(alts)
        })
    }

    fn rules(&mut self) -> Res<Vec<(String, Expr)>> {
        let mut rules: Vec<(String, Expr)> = Vec::new();
        loop {
            self.space(true);
            if self.peek().is_none() {
                return Ok(rules);
            }
            let name = self.name()?;
            self.space(false);
            if !self.src[self.pos..].starts_with("::=") {
                return self.err("expected '::='");
            }
            self.pos += 3;
            self.space(true);
            let body = self.alternatives(false)?;
            match self.peek() {
                None | Some('\r' | '\n') => {}
                Some(')') => return self.err("unmatched ')'"),
                Some(c) => return self.err(&format!("unexpected {c:?}")),
            }
            if rules.iter().any(|(n, _)| *n == name) {
                return Err(format!("rule {name:?} is defined twice"));
            }
            rules.push((name, body));
        }
    }
}

/// Rewrite a GBNF grammar as Lark for llguidance. The error names the
/// problem and where it is.
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let rules = Parser { src, pos: 0 }.rules()?;
    if rules.is_empty() {
        return Err("the grammar has no rules".into());
    }
    let index: HashMap<&str, usize> = rules
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.as_str(), i))
        .collect();
    let Some(&root) = index.get("root") else {
        return Err("the grammar has no `root` rule".into());
    };
    let mut missing = None;
    for (_, body) in &rules {
        visit(body, &mut |name| {
            if !index.contains_key(name) && missing.is_none() {
                missing = Some(name.to_string());
            }
        });
    }
    if let Some(name) = missing {
        return Err(format!("rule {name:?} is used but never defined"));
    }
    // Terminal rules: only characters and other terminal rules, found by
    // a fixed point from "none" (so no recursive rule ever is one), never
    // the start.
    let mut terminal = vec![false; rules.len()];
    loop {
        let mut changed = false;
        for (i, (_, body)) in rules.iter().enumerate() {
            if i == root || terminal[i] {
                continue;
            }
            if is_terminal(body, &index, &terminal) {
                terminal[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // Names: snake_case, UPPER for terminals, `start` for root; clashes
    // get a number.
    let mut taken = HashSet::new();
    let mut names = vec![String::new(); rules.len()];
    names[root] = "start".to_string();
    taken.insert("start".to_string());
    for (i, (name, _)) in rules.iter().enumerate() {
        if i == root {
            continue;
        }
        let mut base: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        base = if terminal[i] {
            base.to_ascii_uppercase()
        } else {
            base.to_ascii_lowercase()
        };
        if !base.starts_with(|c: char| c.is_ascii_alphabetic()) {
            base.insert_str(0, if terminal[i] { "R_" } else { "r_" });
        }
        let mut n = base.clone();
        let mut k = 1;
        while !taken.insert(n.clone()) {
            k += 1;
            n = format!("{base}_{k}");
        }
        names[i] = n;
    }
    let mut out = String::from("%llguidance {}\n\n");
    for (i, (_, body)) in rules.iter().enumerate() {
        let _ = write!(out, "{}: ", names[i]);
        write_expr(&mut out, body, &index, &names, true);
        out.push('\n');
    }
    Ok(out)
}

fn visit<'e>(e: &'e Expr, f: &mut impl FnMut(&'e str)) {
    match e {
        Expr::Rule(n) => f(n),
        Expr::Seq(v) | Expr::Alt(v) => v.iter().for_each(|x| visit(x, f)),
        Expr::Repeat { inner, .. } => visit(inner, f),
        Expr::Literal(_) | Expr::Class { .. } | Expr::Any => {}
    }
}

fn is_terminal(e: &Expr, index: &HashMap<&str, usize>, terminal: &[bool]) -> bool {
    match e {
        Expr::Rule(n) => terminal[index[n.as_str()]],
        Expr::Seq(v) | Expr::Alt(v) => v.iter().all(|x| is_terminal(x, index, terminal)),
        Expr::Repeat { inner, .. } => is_terminal(inner, index, terminal),
        Expr::Literal(_) | Expr::Class { .. } | Expr::Any => true,
    }
}

/// A character for a regex class, escaped unless plainly alphanumeric.
fn class_char(out: &mut String, c: char) {
    if c.is_ascii_alphanumeric() {
        out.push(c);
    } else {
        let _ = write!(out, "\\x{{{:X}}}", c as u32);
    }
}

fn write_expr(
    out: &mut String,
    e: &Expr,
    index: &HashMap<&str, usize>,
    names: &[String],
    top: bool,
) {
    match e {
        Expr::Literal(s) => {
            out.push_str(&serde_json::to_string(s).expect("a string serializes"));
        }
        Expr::Class { negated, ranges } => {
            out.push_str("/[");
            if *negated {
                out.push('^');
            }
            for &(lo, hi) in ranges {
                class_char(out, lo);
                if hi != lo {
                    out.push('-');
                    class_char(out, hi);
                }
            }
            out.push_str("]/");
        }
        Expr::Any => out.push_str("/(?s:.)/"),
        Expr::Rule(n) => out.push_str(&names[index[n.as_str()]]),
        Expr::Seq(v) => {
            if v.is_empty() {
                out.push_str("\"\"");
            }
            for (k, x) in v.iter().enumerate() {
                if k > 0 {
                    out.push(' ');
                }
                let group = matches!(x, Expr::Alt(_));
                if group {
                    out.push('(');
                }
                write_expr(out, x, index, names, false);
                if group {
                    out.push(')');
                }
            }
        }
        Expr::Alt(v) => {
            for (k, x) in v.iter().enumerate() {
                if k > 0 {
                    out.push_str(if top { "\n    | " } else { " | " });
                }
                write_expr(out, x, index, names, false);
            }
        }
        Expr::Repeat { inner, min, max } => {
            let group = matches!(**inner, Expr::Seq(_) | Expr::Alt(_) | Expr::Repeat { .. });
            if group {
                out.push('(');
            }
            write_expr(out, inner, index, names, false);
            if group {
                out.push(')');
            }
            match (min, max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => {
                    let _ = write!(out, "{{{m},}}");
                }
                (m, Some(n)) if m == n => {
                    let _ = write!(out, "{{{m}}}");
                }
                (m, Some(n)) => {
                    let _ = write!(out, "{{{m},{n}}}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_terminals_and_escapes() {
        let lark = gbnf_to_lark(
            r#"
# a comment
root ::= greeting ws-opt name   # trailing comment
greeting ::= "hi" | "hello\n"
ws-opt ::= [ \t]*
name ::= [A-Z] [a-z\x2D]{1,8}
"#,
        )
        .unwrap();
        assert!(lark.contains("start: GREETING WS_OPT NAME"), "{lark}");
        assert!(
            lark.contains(
                r#"GREETING: "hi"
    | "hello\n""#
            ),
            "{lark}"
        );
        assert!(lark.contains(r"WS_OPT: /[\x{20}\x{9}]/*"), "{lark}");
        assert!(lark.contains(r"NAME: /[A-Z]/ /[a-z\x{2D}]/{1,8}"), "{lark}");
    }

    #[test]
    fn recursion_and_groups_span_lines() {
        let lark = gbnf_to_lark(
            "root ::= list\nlist ::= \"[\" (\n  item\n  (\",\" item)*\n)? \"]\"\nitem ::= [0-9]+ | list\n",
        )
        .unwrap();
        // `item` refers to `list`, which is recursive: neither is a terminal.
        assert!(
            lark.contains("list: \"[\" (item (\",\" item)*)? \"]\""),
            "{lark}"
        );
        assert!(lark.contains("item: /[0-9]/+\n    | list"), "{lark}");
    }

    #[test]
    fn errors_say_what_and_where() {
        let e = gbnf_to_lark("root ::= foo\n").unwrap_err();
        assert!(e.contains("\"foo\" is used but never defined"), "{e}");
        let e = gbnf_to_lark("start ::= \"a\"\n").unwrap_err();
        assert!(e.contains("no `root` rule"), "{e}");
        let e = gbnf_to_lark("root ::= \"a\n").unwrap_err();
        assert!(e.contains("unterminated string"), "{e}");
        let e = gbnf_to_lark("root ::= \"a\" )\n").unwrap_err();
        assert!(e.contains("unmatched ')'") && e.contains("line 1"), "{e}");
        let e = gbnf_to_lark("root ::= [z-a]\n").unwrap_err();
        assert!(e.contains("backwards"), "{e}");
        let e = gbnf_to_lark("root ::= \"a\"{3,1}\n").unwrap_err();
        assert!(e.contains("below its minimum"), "{e}");
        let e = gbnf_to_lark("root ::= <|im_end|>\n").unwrap_err();
        assert!(e.contains("not supported"), "{e}");
        assert!(gbnf_to_lark("  # only a comment\n").is_err());
    }
}
