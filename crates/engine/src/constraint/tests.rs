//! The constraint on a toy vocabulary: every byte, some multi-byte tokens
//! as a BPE vocabulary has them, and control tokens.

use super::*;
use crate::rng::Mt19937;

/// Ids 0..256: the bytes. Then multi-byte pieces, then two control tokens:
/// an end of text (the trie's end token) and an end of turn.
fn toy() -> (GrammarCompiler, Vec<Vec<u8>>, Vec<u32>) {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for piece in [
        "{\"", "\":", "\": ", "\"name", "name", "true", "false", "null", "12", "3.5", ", \"", "},",
        "\"}", " {", "\n  ", "ab", "abc", "hello", " world", "[1", ",2", "]}", "é",
    ] {
        words.push(piece.as_bytes().to_vec());
    }
    let eos = words.len() as u32;
    words.push(b"\xff<|endoftext|>".to_vec());
    let eot = words.len() as u32;
    words.push(b"\xff<|im_end|>".to_vec());
    // An id the vocabulary does not have (a padded logits row).
    words.push(Vec::new());
    let c = GrammarCompiler::from_token_bytes(words.clone(), eos).expect("a trie");
    (c, words, vec![eos, eot])
}

/// Sample from `c` at random (uniformly among allowed tokens, an end token
/// when the grammar may end with probability 1/4) until it ends; returns
/// the bytes and whether it ended on its own (not by `limit`).
fn random_walk(
    c: &mut Constraint,
    words: &[Vec<u8>],
    eog: &[u32],
    rng: &mut Mt19937,
    limit: usize,
) -> (Vec<u8>, bool) {
    let n = words.len();
    let raw = vec![0.0f32; n];
    let mut row = Vec::new();
    let mut out = Vec::new();
    for _ in 0..limit {
        if c.is_complete() {
            return (out, true);
        }
        c.mask_into(&raw, &mut row, eog, true).expect("a mask");
        let allowed: Vec<u32> = (0..n as u32)
            .filter(|&t| row[t as usize].is_finite())
            .collect();
        assert!(
            !allowed.is_empty(),
            "the mask is empty after {:?}",
            String::from_utf8_lossy(&out)
        );
        let can_end = allowed.iter().any(|t| eog.contains(t));
        if can_end && rng.next_u32().is_multiple_of(4) {
            return (out, true);
        }
        let plain: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|t| !eog.contains(t))
            .collect();
        if plain.is_empty() {
            return (out, true);
        }
        let t = plain[rng.next_u32() as usize % plain.len()];
        out.extend_from_slice(&words[t as usize]);
        c.commit(t).expect("an allowed token commits");
    }
    (out, false)
}

#[test]
fn random_walks_through_a_schema_always_give_valid_json() {
    let (compiler, words, eog) = toy();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": -3, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["ab", "abc", 12]}, "maxItems": 3}
        },
        "required": ["name", "ok", "n"],
        "additionalProperties": false
    });
    let grammar = compiler
        .compile(&ConstraintSpec::JsonSchema(schema))
        .expect("compiles");
    let mut rng = Mt19937::new(7);
    for _ in 0..40 {
        let mut c = grammar.start();
        let (bytes, ended) = random_walk(&mut c, &words, &eog, &mut rng, 400);
        assert!(
            ended,
            "no end in 400 tokens: {:?}",
            String::from_utf8_lossy(&bytes)
        );
        let text = String::from_utf8(bytes).expect("UTF-8");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let o = v.as_object().expect("an object");
        assert!(
            o["name"].as_str().is_some_and(|s| s.chars().count() <= 6),
            "{text}"
        );
        assert!(o["ok"].is_boolean(), "{text}");
        // (`-0` is an integer; serde_json reads it as a float.)
        let n = o["n"].as_f64().expect("a number");
        assert!(n.fract() == 0.0 && (-3.0..=120.0).contains(&n), "{text}");
        assert!(
            o.keys()
                .all(|k| ["name", "ok", "n", "tags"].contains(&k.as_str())),
            "{text}"
        );
    }
}

#[test]
fn a_closed_object_completes_the_output() {
    let (compiler, words, eog) = toy();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "boolean"}},
        "required": ["name"],
        "additionalProperties": false
    });
    let mut c = compiler
        .compile(&ConstraintSpec::JsonSchema(schema))
        .expect("compiles")
        .start();
    let id = |s: &str| words.iter().position(|w| w == s.as_bytes()).unwrap() as u32;
    for piece in ["{\"", "name", "\":", "true"] {
        assert!(!c.is_complete());
        assert!(c.allows(id(piece)).unwrap(), "{piece}");
        c.commit(id(piece)).unwrap();
    }
    // Not yet: the end token is not allowed before the object closes.
    let mut row = Vec::new();
    c.mask_into(&vec![1.0; words.len()], &mut row, &eog, true)
        .unwrap();
    assert!(eog.iter().all(|&t| row[t as usize] == f32::NEG_INFINITY));
    assert!(row[b'}' as usize].is_finite() && row[b'x' as usize] == f32::NEG_INFINITY);
    c.commit(b'}' as u32).unwrap();
    assert!(c.is_complete());
}

#[test]
fn end_tokens_follow_the_grammar_and_ignore_eos() {
    let (compiler, words, eog) = toy();
    let mut c = compiler
        .compile(&ConstraintSpec::Lark("start: \"ab\"+".into()))
        .unwrap()
        .start();
    let raw: Vec<f32> = (0..words.len()).map(|i| i as f32).collect();
    let mut row = Vec::new();
    c.mask_into(&raw, &mut row, &eog, true).unwrap();
    assert!(eog.iter().all(|&t| row[t as usize] == f32::NEG_INFINITY));
    let ab = words.iter().position(|w| w == b"ab").unwrap();
    assert_eq!(row[ab], raw[ab]);
    assert!(
        row[words.len() - 1] == f32::NEG_INFINITY,
        "padding is never allowed"
    );
    c.commit(ab as u32).unwrap();
    // "ab" may end here or go on: both end tokens come back with their
    // own logits, unless end tokens are suppressed (--ignore-eos).
    c.mask_into(&raw, &mut row, &eog, true).unwrap();
    assert!(eog.iter().all(|&t| row[t as usize] == raw[t as usize]));
    c.mask_into(&raw, &mut row, &eog, false).unwrap();
    assert!(eog.iter().all(|&t| row[t as usize] == f32::NEG_INFINITY));
    assert_eq!(row[ab], raw[ab]);
    assert!(!c.is_complete());
}

#[test]
fn gbnf_and_json_object_constrain_too() {
    let (compiler, words, eog) = toy();
    let g = compiler
        .compile(&ConstraintSpec::grammar(
            "root ::= greeting \" \" who\ngreeting ::= \"hello\" | \"hi\"\nwho ::= [a-z]{1,5}\n",
        ))
        .expect("GBNF compiles");
    assert!(matches!(g.spec(), ConstraintSpec::Gbnf(_)));
    let mut rng = Mt19937::new(3);
    for _ in 0..20 {
        let (bytes, ended) = random_walk(&mut g.start(), &words, &eog, &mut rng, 50);
        let text = String::from_utf8(bytes).unwrap();
        assert!(ended);
        let (a, b) = text.split_once(' ').unwrap_or_else(|| panic!("{text:?}"));
        assert!(["hello", "hi"].contains(&a), "{text:?}");
        assert!(
            (1..=5).contains(&b.len()) && b.bytes().all(|c| c.is_ascii_lowercase()),
            "{text:?}"
        );
    }
    let j = compiler.compile(&ConstraintSpec::JsonObject).unwrap();
    for _ in 0..10 {
        let (bytes, ended) = random_walk(&mut j.start(), &words, &eog, &mut rng, 300);
        if ended {
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => assert!(v.is_object()),
                // Valid JSON (1e999) that serde_json will not hold.
                Err(e) => assert!(e.to_string().contains("out of range"), "{e}"),
            }
        }
    }
    let lark = ConstraintSpec::grammar("%llguidance {}\nstart: \"x\"");
    assert!(matches!(lark, ConstraintSpec::Lark(_)));
    compiler.compile(&lark).unwrap();
}

#[test]
fn bad_specs_are_errors_that_name_the_problem() {
    let (compiler, _, _) = toy();
    let bad = [
        (
            ConstraintSpec::JsonSchema(serde_json::json!({"type": "frobnicate"})),
            "JSON schema",
        ),
        (
            ConstraintSpec::JsonSchema(serde_json::json!(42)),
            "JSON schema",
        ),
        (
            ConstraintSpec::JsonSchema(
                serde_json::json!({"type": "integer", "minimum": 5, "maximum": 1}),
            ),
            "JSON schema",
        ),
        (ConstraintSpec::Lark("start: foo".into()), "Lark grammar"),
        (ConstraintSpec::Lark("start: \"a".into()), "Lark grammar"),
        (
            ConstraintSpec::Gbnf("root ::= undefined-rule".into()),
            "GBNF grammar",
        ),
        (ConstraintSpec::Gbnf("root = \"a\"".into()), "GBNF grammar"),
    ];
    for (spec, kind) in bad {
        let e = compiler
            .compile(&spec)
            .expect_err(&format!("{spec:?} is bad"));
        let ConstraintError::Invalid { kind: k, message } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*k, kind);
        assert!(!message.is_empty() && message.len() < 700, "{message}");
        assert!(
            e.to_string().starts_with(&format!("invalid {kind}: ")),
            "{e}"
        );
    }
}

#[test]
fn grammars_compare_by_spec_and_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<GrammarCompiler>();
    send_sync::<Grammar>();
    fn send<T: Send>() {}
    send::<Constraint>();
    let (compiler, _, _) = toy();
    let a = compiler.compile(&ConstraintSpec::JsonObject).unwrap();
    let b = compiler.compile(&ConstraintSpec::JsonObject).unwrap();
    assert_eq!(a, b.clone());
    assert_ne!(
        a,
        compiler
            .compile(&ConstraintSpec::Lark("start: \"x\"".into()))
            .unwrap()
    );
}

/// llama.cpp's `grammars/json.gbnf`, as it is written there.
const JSON_GBNF: &str = r#"root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"#;

#[test]
fn llama_cpp_json_gbnf_gives_json() {
    let (compiler, words, eog) = toy();
    let g = compiler
        .compile(&ConstraintSpec::Gbnf(JSON_GBNF.into()))
        .expect("json.gbnf compiles");
    let mut rng = Mt19937::new(11);
    let mut complete = 0;
    for _ in 0..30 {
        let (bytes, ended) = random_walk(&mut g.start(), &words, &eog, &mut rng, 200);
        if !ended {
            continue;
        }
        complete += 1;
        let text = String::from_utf8(bytes).expect("UTF-8");
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => assert!(v.is_object(), "{text}"),
            Err(e) => assert!(e.to_string().contains("out of range"), "{e}: {text}"),
        }
    }
    assert!(complete >= 10, "only {complete} of 30 walks ended");
}

#[test]
fn argmax_is_the_greedy_pick_of_the_masked_row() {
    use crate::sample::{Sampler, SamplerConfig};
    let (compiler, words, eog) = toy();
    let n = words.len();
    let specs = [
        ConstraintSpec::JsonObject,
        ConstraintSpec::Lark("start: (\"ab\" | \"abc\")+ <|im_end|>?".into()),
        ConstraintSpec::Gbnf(JSON_GBNF.into()),
    ];
    let mut rng = Mt19937::new(5);
    for spec in specs {
        let g = compiler.compile(&spec).unwrap();
        for allow_eog in [true, false] {
            let mut c = g.start();
            let mut row = Vec::new();
            for _ in 0..60 {
                if !c.can_continue(&eog, allow_eog) {
                    break;
                }
                // Coarse values (ties), some NaN, the end tokens often high.
                let logits: Vec<f32> = (0..n)
                    .map(|i| match rng.next_u32() % 50 {
                        0 => f32::NAN,
                        _ if eog.contains(&(i as u32)) => 3.0,
                        r => (r % 4) as f32,
                    })
                    .collect();
                c.mask_into(&logits, &mut row, &eog, allow_eog).unwrap();
                let want = Sampler::new(SamplerConfig::greedy()).sample(&mut row);
                let got = c.argmax(&logits, &eog, allow_eog).unwrap();
                assert_eq!(got, Some(want), "{spec:?}");
                if eog.contains(&want) {
                    break;
                }
                c.advance(want, &eog);
            }
        }
    }
}
