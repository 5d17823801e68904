//! llama-server's utility endpoints, shaped as it shapes them:
//! `POST /tokenize`, `POST /detokenize`, `GET /props`, `GET /slots`, and
//! OpenAI's `GET /v1/models/{id}`. Bodies are checked as the generation endpoints'
//! are: a field we do not know is a 400 naming it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Map, Value};

use crate::api;
use crate::error::ApiError;
use crate::http::{error_response, json_response, read_body, App};

/// `{"content": "...", "add_special": false, "parse_special": true,
/// "with_pieces": false}` → `{"tokens": [ids]}`, or with pieces
/// `{"tokens": [{"id": 1, "piece": "text"}]}` (a piece that is not whole
/// UTF-8 is given as its bytes, as llama-server does).
pub async fn tokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    answer(async {
        let obj = body_object(&app, &headers, body).await?;
        only(
            &obj,
            &["content", "add_special", "parse_special", "with_pieces"],
        )?;
        let content = match obj.get("content") {
            Some(Value::String(s)) => s.as_str(),
            Some(other) => return Err(api::wrong_type("content", "a string", other)),
            None => return Err(ApiError::param("content", "`content` is required")),
        };
        let flag = |name: &str, default: bool| match obj.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(api::wrong_type(name, "a boolean", other)),
        };
        let (add_special, parse_special) =
            (flag("add_special", false)?, flag("parse_special", true)?);
        let with_pieces = flag("with_pieces", false)?;
        let ids = app.vocab.encode(content, add_special, parse_special);
        let tokens: Vec<Value> = if with_pieces {
            ids.iter()
                .map(|&id| {
                    let bytes = app.vocab.decode_with(&[id], Default::default());
                    let piece = match String::from_utf8(bytes) {
                        Ok(s) => json!(s),
                        Err(e) => json!(e.into_bytes()),
                    };
                    json!({"id": id, "piece": piece})
                })
                .collect()
        } else {
            ids.iter().map(|&id| json!(id)).collect()
        };
        Ok(json!({ "tokens": tokens }))
    })
    .await
}

/// `{"tokens": [ids]}` → `{"content": "..."}`.
pub async fn detokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    answer(async {
        let obj = body_object(&app, &headers, body).await?;
        only(&obj, &["tokens"])?;
        let items = match obj.get("tokens") {
            Some(Value::Array(items)) => items,
            Some(other) => return Err(api::wrong_type("tokens", "an array of token ids", other)),
            None => return Err(ApiError::param("tokens", "`tokens` is required")),
        };
        let n_vocab = app.n_vocab as u64;
        let ids = items
            .iter()
            .map(|v| match v.as_u64() {
                Some(id) if id < n_vocab => Ok(id as u32),
                _ => Err(ApiError::param(
                    "tokens",
                    format!("`tokens` must hold token ids below {n_vocab}; got {v}"),
                )),
            })
            .collect::<Result<Vec<u32>, _>>()?;
        Ok(json!({ "content": app.vocab.decode(&ids) }))
    })
    .await
}

/// What this server runs and how it generates by default.
pub async fn props(State(app): State<Arc<App>>) -> Response {
    let d = &app.defaults;
    let s = &d.sampling;
    let text = |id: Option<u32>| id.and_then(|i| app.vocab.token_text(i)).map(str::to_string);
    let max_tokens = if d.max_tokens == usize::MAX {
        -1
    } else {
        d.max_tokens as i64
    };
    json_response(
        StatusCode::OK,
        &json!({
            "default_generation_settings": {
                "n_ctx": app.n_ctx,
                "params": {
                    "temperature": s.temp,
                    "top_k": s.top_k,
                    "top_p": s.top_p,
                    "min_p": s.min_p,
                    "repeat_penalty": s.repeat_penalty,
                    "frequency_penalty": s.frequency_penalty,
                    "presence_penalty": s.presence_penalty,
                    "n_predict": max_tokens,
                    "stop": d.stop,
                    "ignore_eos": d.ignore_eos,
                },
            },
            "total_slots": app.metrics.stats.n_slots,
            "model_path": app.model_name,
            "chat_template": app.template.source(),
            "chat_template_is_fallback": app.template.is_fallback(),
            "bos_token": text(app.vocab.bos()),
            "eos_token": text(app.vocab.eos()),
            "n_vocab": app.n_vocab,
            "build_info": concat!("cachefit ", env!("CARGO_PKG_VERSION")),
        }),
    )
}

/// Each slot as of the engine's last step: llama-server's `id`, `n_ctx`,
/// `is_processing`, plus the job on it (`id_task`), its prompt and
/// generated tokens, and the positions its cache holds (a prompt sharing
/// their start reuses them).
pub async fn slots(State(app): State<Arc<App>>) -> Response {
    let slots: Vec<Value> = app
        .metrics
        .stats
        .slots()
        .iter()
        .map(|s| {
            json!({
                "id": s.id,
                "n_ctx": app.n_ctx,
                "is_processing": s.job.is_some(),
                "id_task": s.job.map_or(-1, |j| j as i64),
                "n_prompt_tokens": s.prompt_tokens,
                "n_decoded": s.generated_tokens,
                "n_cached_tokens": s.cached_tokens,
            })
        })
        .collect();
    json_response(StatusCode::OK, &Value::Array(slots))
}

/// The model, as one entry of `/v1/models`, or 404 for another id.
pub async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    if id != app.model_name {
        return error_response(
            ApiError::not_found(&format!(
                "model `{id}` (this server runs `{}`)",
                app.model_name
            ))
            .with_code("model_not_found"),
        );
    }
    json_response(StatusCode::OK, &crate::http::model_entry(&app))
}

async fn answer(f: impl std::future::Future<Output = Result<Value, ApiError>>) -> Response {
    match f.await {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => error_response(e),
    }
}

async fn body_object(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> Result<Map<String, Value>, ApiError> {
    let bytes = read_body(headers, body, app.max_body_bytes, app.body_timeout).await?;
    api::parse_body(&bytes)
}

/// A 400 naming the first field not in `known`.
fn only(obj: &Map<String, Value>, known: &[&str]) -> Result<(), ApiError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(ApiError::param(
            k,
            format!(
                "Unknown field `{k}` (this endpoint takes: {})",
                known.join(", ")
            ),
        )),
    }
}
