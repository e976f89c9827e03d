//! llama-server's `/tokenize` (`{"content", "add_special", "parse_special", "with_pieces"}` ->
//! `{"tokens": [...]}`, with pieces `[{"id", "piece"}]`, a piece that is not UTF-8 as its bytes),
//! `/detokenize` (`{"tokens"}` -> `{"content"}`) and `/props` (the default generation settings,
//! the slots, the model's path, chat template and context).

use super::api::ApiError;
use super::handlers::{reply, Shared};
use super::prepare::{check_text_len, off_thread, parse, read_body};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llama::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    content: String,
    /// Add BOS/EOS where the model does (default false, as llama-server).
    #[serde(default)]
    add_special: bool,
    /// Special tokens' texts become those tokens (default true).
    parse_special: Option<bool>,
    #[serde(default)]
    with_pieces: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

pub async fn tokenize(State(s): Shared, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let bytes = read_body(&headers, body, s.max_body_bytes, &s.limits).await?;
        let st = s.clone();
        off_thread(&s.prep, &s.limits, move || {
            let req: TokenizeRequest = parse(&bytes)?;
            check_text_len(&st, &req.content)?;
            let ids = st.tokenizer.encode(
                &req.content,
                req.add_special,
                req.parse_special.unwrap_or(true),
            );
            let tokens: Vec<Value> = if req.with_pieces {
                ids.iter()
                    .map(|&id| {
                        let bytes = st.tokenizer.token_to_piece_with(id, true);
                        let piece = match String::from_utf8(bytes) {
                            Ok(text) => json!(text),
                            Err(e) => json!(e.into_bytes()),
                        };
                        json!({"id": id, "piece": piece})
                    })
                    .collect()
            } else {
                ids.iter().map(|&id| json!(id)).collect()
            };
            Ok(Json(json!({ "tokens": tokens })).into_response())
        })
        .await
    };
    let r = r.await;
    reply(&s, r)
}

pub async fn detokenize(State(s): Shared, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let bytes = read_body(&headers, body, s.max_body_bytes, &s.limits).await?;
        let req: DetokenizeRequest = parse(&bytes)?;
        if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= s.n_vocab) {
            return Err(ApiError::bad_request(format!(
                "token {bad} is outside the vocabulary of {}",
                s.n_vocab
            ))
            .with_param("tokens"));
        }
        let content = s.tokenizer.decode(&req.tokens);
        Ok(Json(json!({ "content": content })).into_response())
    };
    let r = r.await;
    reply(&s, r)
}

pub async fn props(State(s): Shared) -> Response {
    let d = SamplingParams::default();
    Json(json!({
        "default_generation_settings": {
            "n_ctx": s.n_ctx,
            "params": {
                "n_predict": s.max_tokens,
                "temperature": d.temperature,
                "top_k": d.top_k,
                "top_p": d.top_p,
                "min_p": d.min_p,
                "repeat_penalty": d.repeat_penalty,
                "repeat_last_n": d.repeat_last_n,
                "presence_penalty": d.presence_penalty,
                "frequency_penalty": d.frequency_penalty,
            },
        },
        "total_slots": s.engine.n_slots(),
        "model_path": s.model_path.display().to_string(),
        "chat_template": s.template.source(),
        "bos_token": s.template.bos_token(),
        "eos_token": s.template.eos_token(),
        "n_ctx": s.n_ctx,
        "n_vocab": s.n_vocab,
    }))
    .into_response()
}
