//! Structured output requests: which spec a request asks for, and its
//! compilation against the model's token trie (`engine::constraint`).
//!
//! - `response_format`: OpenAI's `{"type": "text"}`,
//!   `{"type": "json_object"}` and `{"type": "json_schema", "json_schema":
//!   {"name", "description", "schema", "strict"}}`; llama-server's
//!   `{"type": "json_object", "schema": {...}}` too.
//! - `json_schema`: llama-server's top-level schema.
//! - `grammar`: llama-server's GBNF string (Lark when it starts with
//!   `%llguidance`, as llama.cpp reads it).
//!
//! At most one of them constrains a request. A bad shape or a schema or
//! grammar that does not compile is a 400 naming the field and the
//! problem. The trie is built on the first request that needs it and kept
//! for the server's life; building and compiling run on tokio's blocking
//! pool (the trie takes ~0.1–0.5 s, a large schema milliseconds).

use std::sync::Arc;

use engine::{ConstraintError, ConstraintSpec, Grammar, GrammarCompiler};
use serde_json::{Map, Value};

use crate::api::wrong_type;
use crate::error::ApiError;
use crate::http::App;

/// Keys `response_format` takes.
const RESPONSE_FORMAT_FIELDS: &[&str] = &["type", "json_schema", "schema"];
/// Keys of `response_format.json_schema`.
const JSON_SCHEMA_FIELDS: &[&str] = &["name", "description", "schema", "strict"];

/// What a request asks for: the spec and the field that said it (for
/// errors), or `None` for free text.
pub fn spec(obj: &Map<String, Value>) -> Result<Option<(String, ConstraintSpec)>, ApiError> {
    let mut found: Vec<(String, ConstraintSpec)> = Vec::new();
    if let Some(rf) = obj.get("response_format").filter(|v| !v.is_null()) {
        if let Some(s) = response_format(rf)? {
            found.push(s);
        }
    }
    if let Some(s) = obj.get("json_schema").filter(|v| !v.is_null()) {
        found.push(("json_schema".into(), schema("json_schema", s)?));
    }
    match obj.get("grammar") {
        None | Some(Value::Null) => {}
        Some(Value::String(g)) if g.trim().is_empty() => {}
        Some(Value::String(g)) => found.push(("grammar".into(), ConstraintSpec::grammar(g))),
        Some(other) => return Err(wrong_type("grammar", "a string", other)),
    }
    if found.len() > 1 {
        let names: Vec<String> = found.iter().map(|(f, _)| format!("`{f}`")).collect();
        return Err(ApiError::param(
            &found[1].0,
            format!(
                "Only one output constraint per request: {} were given",
                names.join(" and ")
            ),
        ));
    }
    Ok(found.pop())
}

fn response_format(rf: &Value) -> Result<Option<(String, ConstraintSpec)>, ApiError> {
    let Value::Object(o) = rf else {
        return Err(wrong_type("response_format", "an object", rf));
    };
    unknown_key(o, RESPONSE_FORMAT_FIELDS, "response_format")?;
    let kind = match o.get("type") {
        Some(Value::String(t)) => t.as_str(),
        None | Some(Value::Null) => {
            return Err(ApiError::param(
                "response_format.type",
                "Missing required parameter: `response_format.type`",
            ))
        }
        Some(other) => return Err(wrong_type("response_format.type", "a string", other)),
    };
    let only_for = |key: &str, kind: &str| {
        ApiError::param(
            &format!("response_format.{key}"),
            format!("`response_format.{key}` does not go with type `{kind}`"),
        )
    };
    match kind {
        "text" => {
            if let Some(k) = ["json_schema", "schema"].into_iter().find(|k| o.contains_key(*k)) {
                return Err(only_for(k, kind));
            }
            Ok(None)
        }
        "json_object" => {
            if o.contains_key("json_schema") {
                return Err(only_for("json_schema", kind));
            }
            // llama-server's extension: a schema on json_object.
            match o.get("schema").filter(|v| !v.is_null()) {
                Some(s) => Ok(Some((
                    "response_format.schema".into(),
                    schema("response_format.schema", s)?,
                ))),
                None => Ok(Some(("response_format".into(), ConstraintSpec::JsonObject))),
            }
        }
        "json_schema" => {
            if o.contains_key("schema") {
                return Err(only_for("schema", kind));
            }
            let js = match o.get("json_schema") {
                Some(Value::Object(js)) => js,
                None | Some(Value::Null) => {
                    return Err(ApiError::param(
                        "response_format.json_schema",
                        "Missing required parameter: `response_format.json_schema`",
                    ))
                }
                Some(other) => {
                    return Err(wrong_type("response_format.json_schema", "an object", other))
                }
            };
            unknown_key(js, JSON_SCHEMA_FIELDS, "response_format.json_schema")?;
            for (key, want, ok) in [
                ("name", "a string", Value::is_string as fn(&Value) -> bool),
                ("description", "a string", Value::is_string),
                ("strict", "a boolean", Value::is_boolean),
            ] {
                let param = format!("response_format.json_schema.{key}");
                match js.get(key) {
                    Some(v) if !v.is_null() && !ok(v) => return Err(wrong_type(&param, want, v)),
                    _ => {}
                }
            }
            let param = "response_format.json_schema.schema";
            // OpenAI's default when `schema` is absent: any JSON value.
            let spec = match js.get("schema").filter(|v| !v.is_null()) {
                Some(s) => schema(param, s)?,
                None => ConstraintSpec::JsonSchema(Value::Object(Map::new())),
            };
            Ok(Some((param.into(), spec)))
        }
        other => Err(ApiError::param(
            "response_format.type",
            format!(
                "Invalid value for `response_format.type`: `{other}`; supported: text, json_object, json_schema"
            ),
        )),
    }
}

fn schema(param: &str, v: &Value) -> Result<ConstraintSpec, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(ConstraintSpec::JsonSchema(v.clone())),
        other => Err(wrong_type(param, "a JSON schema (an object)", other)),
    }
}

fn unknown_key(o: &Map<String, Value>, known: &[&str], at: &str) -> Result<(), ApiError> {
    match o.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => {
            let param = format!("{at}.{k}");
            Err(ApiError::param(
                &param,
                format!("Unrecognized request argument supplied: {param}"),
            )
            .with_code("unknown_parameter"))
        }
        None => Ok(()),
    }
}

/// Compile what `field` asked for against the model's trie (built on
/// first use), on the blocking pool. A spec that does not compile is a 400
/// naming `field`.
pub async fn compile(
    app: &Arc<App>,
    field: String,
    spec: ConstraintSpec,
) -> Result<Grammar, ApiError> {
    let app = app.clone();
    tokio::task::spawn_blocking(move || {
        let compiler = app
            .grammars
            .get_or_init(|| GrammarCompiler::new(&app.vocab, app.n_vocab));
        let compiler = compiler
            .as_ref()
            .map_err(|e| ApiError::invalid(e.to_string()).with_param(&field))?;
        compiler.compile(&spec).map_err(|e| match e {
            ConstraintError::Invalid { .. } => {
                ApiError::param(&field, format!("`{field}`: {e}")).with_code("invalid_grammar")
            }
            other => ApiError::internal(other.to_string()),
        })
    })
    .await
    .map_err(|_| ApiError::internal("Compiling the output constraint failed"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(s: &str) -> Map<String, Value> {
        serde_json::from_str(s).unwrap()
    }

    fn err(s: &str) -> ApiError {
        spec(&obj(s)).expect_err(s)
    }

    #[test]
    fn each_field_gives_its_spec() {
        let cases = [
            (r#"{}"#, None),
            (r#"{"response_format": {"type": "text"}}"#, None),
            (r#"{"grammar": ""}"#, None),
            (
                r#"{"response_format": {"type": "json_object"}}"#,
                Some(("response_format", ConstraintSpec::JsonObject)),
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "integer"}}}}"#,
                Some((
                    "response_format.json_schema.schema",
                    ConstraintSpec::JsonSchema(serde_json::json!({"type": "integer"})),
                )),
            ),
            (
                r#"{"response_format": {"type": "json_object", "schema": {"type": "integer"}}}"#,
                Some((
                    "response_format.schema",
                    ConstraintSpec::JsonSchema(serde_json::json!({"type": "integer"})),
                )),
            ),
            (
                r#"{"json_schema": {"type": "string"}}"#,
                Some((
                    "json_schema",
                    ConstraintSpec::JsonSchema(serde_json::json!({"type": "string"})),
                )),
            ),
            (
                r#"{"grammar": "root ::= \"a\""}"#,
                Some(("grammar", ConstraintSpec::Gbnf("root ::= \"a\"".into()))),
            ),
            (
                r#"{"grammar": "%llguidance {}\nstart: \"a\""}"#,
                Some((
                    "grammar",
                    ConstraintSpec::Lark("%llguidance {}\nstart: \"a\"".into()),
                )),
            ),
        ];
        for (body, want) in cases {
            let got = spec(&obj(body)).unwrap();
            assert_eq!(
                got.as_ref().map(|(f, s)| (f.as_str(), s)),
                want.as_ref().map(|(f, s)| (*f, s)),
                "{body}"
            );
        }
    }

    #[test]
    fn bad_shapes_name_the_field() {
        let cases = [
            (r#"{"response_format": "json"}"#, "response_format"),
            (r#"{"response_format": {}}"#, "response_format.type"),
            (
                r#"{"response_format": {"type": "yaml"}}"#,
                "response_format.type",
            ),
            (
                r#"{"response_format": {"type": "json_object", "strict": true}}"#,
                "response_format.strict",
            ),
            (
                r#"{"response_format": {"type": "json_schema"}}"#,
                "response_format.json_schema",
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}"#,
                "response_format.json_schema.schema",
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}}"#,
                "response_format.json_schema.strict",
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "format": 1}}}"#,
                "response_format.json_schema.format",
            ),
            (
                r#"{"response_format": {"type": "text", "schema": {}}}"#,
                "response_format.schema",
            ),
            (r#"{"json_schema": "{}"}"#, "json_schema"),
            (r#"{"grammar": 7}"#, "grammar"),
            (
                r#"{"grammar": "root ::= \"a\"", "json_schema": {}}"#,
                "grammar",
            ),
        ];
        for (body, param) in cases {
            let e = err(body);
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
            assert_eq!(e.status, 400, "{body}");
        }
    }
}
