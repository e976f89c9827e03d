//! The HTTP handlers: request validation (body size, JSON shape, prompt and `max_tokens` limits),
//! prompt building (chat template, tokenizer), handing requests to the [`Engine`], and answering as
//! one JSON object or as an SSE stream of `data: {...}` chunks ending with `data: [DONE]`.

use super::api::{
    ApiError, ChatRequest, CommonParams, CompletionRequest, Endpoint, Envelope, Prompt,
};
use super::engine::{Engine, Event, GenRequest, SlotAction};
use super::metrics::Metrics;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use llama::chat::{ChatTemplate, Message};
use llama::sampling::Sampler;
use llama::tokenizer::Tokenizer;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// What every handler shares.
pub struct AppState {
    pub engine: Engine,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub metrics: Arc<Metrics>,
    pub model_name: String,
    /// Unix time the server started (the model's `created`).
    pub created: u64,
    /// Positions of one slot's cache.
    pub n_ctx: usize,
    pub n_vocab: usize,
    /// The largest `max_tokens` a request may ask for.
    pub max_tokens: usize,
    /// Where slot files go; `None` disables save/restore.
    pub slot_dir: Option<PathBuf>,
    pub next_id: AtomicU64,
}

type Shared = State<Arc<AppState>>;

fn unix_now() -> u64 {
    unix_nanos() / 1_000_000_000
}

fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Counts an error answer in the metrics and turns it into a response.
fn reply(state: &AppState, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(resp) => resp,
        Err(e) => {
            Metrics::inc(&state.metrics.requests_failed);
            if e.status == StatusCode::SERVICE_UNAVAILABLE {
                Metrics::inc(&state.metrics.requests_rejected);
            }
            e.into_response()
        }
    }
}

/// Parses a JSON body, mapping size and syntax problems to 4xx errors.
fn parse<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body.map_err(|r| {
        let msg = if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body exceeds the server's size limit".to_string()
        } else {
            r.body_text()
        };
        ApiError::new(r.status(), msg)
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

pub async fn completions(State(s): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let req: CompletionRequest = parse(body)?;
        let prompt = match req.prompt {
            Prompt::Text(text) => s.tokenizer.encode(&text, true, true),
            Prompt::Tokens(ids) => {
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= s.n_vocab) {
                    return Err(ApiError::bad_request(format!(
                        "prompt token {bad} is outside the vocabulary of {}",
                        s.n_vocab
                    )));
                }
                ids
            }
            Prompt::Many(_) => return Err(ApiError::bad_request(
                "prompt must be one string or one array of token ids (batches are not supported)",
            )),
        };
        generate(&s, Endpoint::Completions, prompt, req.common).await
    };
    let r = r.await;
    reply(&s, r)
}

pub async fn chat(State(s): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let req: ChatRequest = parse(body)?;
        if req.messages.is_empty() {
            return Err(ApiError::bad_request("messages must not be empty"));
        }
        let messages = req
            .messages
            .iter()
            .map(|m| {
                let text = match &m.content {
                    Some(c) => c.text()?,
                    None => String::new(),
                };
                Ok(Message::new(m.role.clone(), text))
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let rendered = s
            .template
            .render(&messages, true)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let text =
            s.template
                .strip_special(&rendered, s.tokenizer.add_bos(), s.tokenizer.add_eos());
        let prompt = s.tokenizer.encode(text, true, true);
        generate(&s, Endpoint::Chat, prompt, req.common).await
    };
    let r = r.await;
    reply(&s, r)
}

/// Checks the limits, submits the request and answers it (streaming or not).
async fn generate(
    s: &AppState,
    endpoint: Endpoint,
    prompt: Vec<u32>,
    p: CommonParams,
) -> Result<Response, ApiError> {
    if p.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only n = 1 is supported"));
    }
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if prompt.len() >= s.n_ctx {
        return Err(ApiError::bad_request(format!(
            "the prompt has {} tokens but a slot's context holds {} positions (at most {} prompt \
             tokens, so that at least one can be generated)",
            prompt.len(),
            s.n_ctx,
            s.n_ctx - 1
        )));
    }
    let max_tokens = match p.max_tokens.or(p.max_completion_tokens) {
        Some(0) => return Err(ApiError::bad_request("max_tokens must be at least 1")),
        Some(m) if m > s.max_tokens => {
            return Err(ApiError::bad_request(format!(
                "max_tokens {m} exceeds the server's limit of {}",
                s.max_tokens
            )))
        }
        Some(m) => m,
        None => s.max_tokens,
    };
    let env = Envelope {
        endpoint,
        id: format!(
            "{}-{:x}",
            match endpoint {
                Endpoint::Completions => "cmpl",
                Endpoint::Chat => "chatcmpl",
            },
            s.next_id.fetch_add(1, Ordering::Relaxed)
        ),
        created: unix_now(),
        model: s.model_name.clone(),
    };
    let include_usage = p.include_usage();
    let fresh_seed = unix_nanos() ^ s.next_id.load(Ordering::Relaxed).rotate_left(32);
    let sampler =
        Sampler::new(p.sampling(fresh_seed)).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let rx = s.engine.submit(GenRequest {
        prompt,
        max_tokens,
        sampler,
        stop: p.stop.map(|x| x.into_vec()).unwrap_or_default(),
        slot: p.id_slot,
        cache_prompt: p.cache_prompt.unwrap_or(true),
    })?;
    if p.stream {
        return Ok(stream(env, rx, include_usage));
    }
    collect(env, rx).await
}

/// Waits for the whole answer.
async fn collect(env: Envelope, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(e) = rx.recv().await {
        match e {
            Event::Text(t) => text.push_str(&t),
            Event::Done { finish, usage } => {
                return Ok(Json(env.complete(&text, finish, usage)).into_response())
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the inference worker dropped the request",
    ))
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

const DONE: &str = "data: [DONE]\n\n";

/// Streams the answer as server-sent events. Dropping the body (the client went away) drops the
/// receiver, which the worker notices at its next step.
fn stream(env: Envelope, rx: UnboundedReceiver<Event>, include_usage: bool) -> Response {
    // A chat stream opens with the assistant role.
    let opening = (env.endpoint == Endpoint::Chat).then(|| sse(&env.chunk("", true, None)));
    let state = (Some(rx), env, opening);
    let body = futures::stream::unfold(state, move |(rx, env, opening)| async move {
        if let Some(first) = opening {
            return Some((Ok::<_, Infallible>(Bytes::from(first)), (rx, env, None)));
        }
        let mut rx = rx?;
        let out = match rx.recv().await {
            Some(Event::Text(t)) => {
                return Some((
                    Ok(Bytes::from(sse(&env.chunk(&t, false, None)))),
                    (Some(rx), env, None),
                ))
            }
            Some(Event::Done { finish, usage }) => {
                let mut out = sse(&env.chunk("", false, Some(finish)));
                if include_usage {
                    out.push_str(&sse(&env.usage_chunk(usage)));
                }
                out
            }
            Some(Event::Failed(e)) => sse(&e.body()),
            None => sse(&ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the inference worker dropped the request",
            )
            .body()),
        };
        Some((Ok(Bytes::from(out + DONE)), (None, env, None)))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        })
}

pub async fn models(State(s): Shared) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.model_name,
            "object": "model",
            "created": s.created,
            "owned_by": "ggml-tp",
            "meta": {
                "n_ctx_slot": s.n_ctx,
                "n_vocab": s.n_vocab,
                "n_slots": s.engine.n_slots(),
            },
        }],
    }))
    .into_response()
}

pub async fn health(State(s): Shared) -> Response {
    let active = s.metrics.slots_active.load(Ordering::Relaxed);
    Json(json!({
        "status": "ok",
        "slots_processing": active,
        "slots_idle": (s.engine.n_slots() as u64).saturating_sub(active),
        "queue_length": s.metrics.queue_length.load(Ordering::Relaxed),
    }))
    .into_response()
}

pub async fn metrics(State(s): Shared) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

pub async fn slots(State(s): Shared) -> Response {
    let r = s.engine.slots().await.map(|v| Json(v).into_response());
    reply(&s, r)
}

#[derive(Debug, serde::Deserialize)]
pub struct SlotQuery {
    action: String,
    filename: Option<String>,
}

/// `POST /slots/{id}?action=save|restore|erase[&filename=X]`.
pub async fn slot_action(
    State(s): Shared,
    id: Result<Path<usize>, PathRejection>,
    query: Result<Query<SlotQuery>, QueryRejection>,
) -> Response {
    let r = async {
        let Path(id) = id.map_err(|e| ApiError::bad_request(e.body_text()))?;
        let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
        let action = match q.action.as_str() {
            "save" => SlotAction::Save(slot_path(&s, q.filename.as_deref())?),
            "restore" => SlotAction::Restore(slot_path(&s, q.filename.as_deref())?),
            "erase" => SlotAction::Erase,
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown action {other:?} (save, restore or erase)"
                )))
            }
        };
        let report = s.engine.slot_action(id, action).await?;
        Ok(Json(report).into_response())
    };
    let r = r.await;
    reply(&s, r)
}

/// The file `name` in the slot directory; only plain names (`[A-Za-z0-9._-]`, not starting with
/// a dot) are accepted, so a request cannot reach outside the directory.
fn slot_path(s: &AppState, name: Option<&str>) -> Result<PathBuf, ApiError> {
    let dir = s.slot_dir.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "slot save/restore is disabled: start the server with a slot save directory",
        )
    })?;
    let name = name.ok_or_else(|| ApiError::bad_request("filename is required"))?;
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !ok {
        return Err(ApiError::bad_request(format!(
            "invalid filename {name:?} (letters, digits, '.', '_', '-'; not starting with '.')"
        )));
    }
    Ok(dir.join(name))
}

pub async fn not_found() -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint").into_response()
}
