//! `POST /v1/embeddings`, as OpenAI shapes it: `input` a string, an array
//! of strings, an array of token ids or an array of such arrays; vectors
//! from the engine's [`Embedder`] (pooled last hidden states,
//! L2-normalized) on a thread and state of their own, so embedding never
//! takes a generation slot; `encoding_format` `float` or `base64`
//! (little-endian f32, as OpenAI's client decodes it).

use std::sync::mpsc;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use engine::embed::{EmbedError, Embedder};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::api;
use crate::error::ApiError;
use crate::http::{error_response, json_response, read_body, App};

/// Most inputs in one request (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

/// Token sequences to embed, and where their vectors go.
pub struct EmbedRequest {
    pub inputs: Vec<Vec<u32>>,
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, EmbedError>>,
}

/// The embedding thread's loop: one request at a time until every sender
/// is gone.
pub fn run(mut embedder: Embedder<'_>, rx: mpsc::Receiver<EmbedRequest>) {
    for req in rx {
        let out = req
            .inputs
            .iter()
            .map(|t| embedder.embed(t))
            .collect::<Result<Vec<_>, _>>();
        let _ = req.reply.send(out);
    }
}

pub async fn embeddings(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    match handle(&app, &headers, body).await {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => error_response(e),
    }
}

async fn handle(app: &App, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    let bytes = read_body(headers, body, app.max_body_bytes, app.body_timeout).await?;
    let obj = api::parse_body(&bytes)?;
    const KNOWN: [&str; 5] = ["input", "model", "encoding_format", "dimensions", "user"];
    if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ApiError::param(
            k,
            format!(
                "Unknown field `{k}` (this endpoint takes: {})",
                KNOWN.join(", ")
            ),
        ));
    }
    let base64 = match obj.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "float" => false,
        Some(Value::String(s)) if s == "base64" => true,
        Some(other) => {
            return Err(ApiError::param(
                "encoding_format",
                format!("`encoding_format` is \"float\" or \"base64\", not {other}"),
            ))
        }
    };
    if let Some(d) = obj.get("dimensions").filter(|v| !v.is_null()) {
        if d.as_u64() != Some(app.embedding_dim as u64) {
            return Err(ApiError::param(
                "dimensions",
                format!(
                    "This model's embeddings have {} dimensions; other sizes are not supported (got {d})",
                    app.embedding_dim
                ),
            ));
        }
    }
    let inputs = inputs(app, obj.get("input"))?;
    let Some(tx) = &app.embed else {
        return Err(ApiError::unavailable("The embedding thread has stopped"));
    };
    let (reply, rx) = oneshot::channel();
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    tx.send(EmbedRequest { inputs, reply })
        .map_err(|_| ApiError::unavailable("The embedding thread has stopped"))?;
    let vectors = rx
        .await
        .map_err(|_| ApiError::internal("The embedding thread ended without an answer"))?
        .map_err(|e| match e {
            EmbedError::Model(m) => {
                ApiError::invalid(format!("Embeddings: {m}")).with_code("not_supported")
            }
            other => ApiError::param("input", format!("Embeddings: {other}")),
        })?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                json!(base64_f32(v))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(json!({
        "object": "list",
        "data": data,
        "model": app.model_name,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
}

/// `input` as token sequences: strings through the tokenizer (with the
/// model's BOS, control-token text as text), id arrays as given.
fn inputs(app: &App, input: Option<&Value>) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = |what: String| ApiError::param("input", what);
    let ids = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|v| match v.as_u64() {
                Some(id) if id < app.n_vocab as u64 => Ok(id as u32),
                _ => Err(bad(format!(
                    "Token ids in `input` must be below {}; got {v}",
                    app.n_vocab
                ))),
            })
            .collect()
    };
    let text = |s: &str| app.vocab.encode(s, true, false);
    let out = match input {
        None | Some(Value::Null) => return Err(bad("`input` is required".into())),
        Some(Value::String(s)) => vec![text(s)],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(bad("`input` is an empty array".into()))
        }
        Some(Value::Array(items)) if items.len() > MAX_INPUTS => {
            return Err(bad(format!("At most {MAX_INPUTS} inputs per request")))
        }
        Some(Value::Array(items)) => match &items[0] {
            Value::String(_) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(text(s)),
                    other => Err(api::wrong_type("input", "an array of strings", other)),
                })
                .collect::<Result<_, _>>()?,
            Value::Number(_) => vec![ids(items)?],
            Value::Array(_) => items
                .iter()
                .map(|v| match v {
                    Value::Array(inner) => ids(inner),
                    other => Err(api::wrong_type(
                        "input",
                        "an array of token-id arrays",
                        other,
                    )),
                })
                .collect::<Result<_, _>>()?,
            other => {
                return Err(api::wrong_type(
                    "input",
                    "a string, strings, token ids or arrays of token ids",
                    other,
                ))
            }
        },
        Some(other) => {
            return Err(api::wrong_type(
                "input",
                "a string, strings, token ids or arrays of token ids",
                other,
            ))
        }
    };
    Ok(out)
}

/// Standard base64 (with padding) of the vector's little-endian f32 bytes.
fn base64_f32(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ABC[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64_f32;

    #[test]
    fn base64_of_known_bytes() {
        // 1.0f32 = 00 00 80 3f; 2.0 = 00 00 00 40.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(base64_f32(&[]), "");
    }
}
