//! The HTTP handlers: request validation (body size, JSON shape, prompt and `max_tokens` limits),
//! prompt building (chat template, tokenizer; off the async workers, [`super::prepare`]), handing
//! requests to the [`Engine`] (a place in its queue is taken once the parameters are checked and
//! before the prompt is rendered and tokenized), and
//! answering as one JSON object or as an SSE stream of `data: {...}` chunks ending with
//! `data: [DONE]`.

use super::api::{
    ApiError, ChatRequest, CommonParams, CompletionRequest, Endpoint, Envelope, Prompt,
};
use super::config::Limits;
use super::engine::{Engine, Event, Fault, GenRequest, Ticket};
use super::metrics::Metrics;
use super::prepare::{check_stops, check_text_len, off_thread, parse, read_body};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use llama::chat::{ChatTemplate, Message};
use llama::sampling::Sampler;
use llama::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::Semaphore;

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
    /// Files and bytes the slot directory may hold.
    pub slot_max_files: usize,
    pub slot_max_bytes: u64,
    /// Serialises the disk stage of slot saves, so that a quota check and its write are one step.
    pub slot_io: tokio::sync::Mutex<()>,
    pub next_id: AtomicU64,
    pub max_body_bytes: usize,
    /// The longest text one token stands for, in bytes (bounds the tokens of a text from below).
    pub max_token_bytes: usize,
    pub limits: Limits,
    /// Permits to prepare prompts on blocking threads ([`Limits::prepare_threads`]).
    pub prep: Arc<Semaphore>,
    /// Test aid: simulate worker faults ([`super::ServerConfig::test_faults`]).
    pub test_faults: bool,
}

pub type Shared = State<Arc<AppState>>;

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
pub fn reply(state: &AppState, r: Result<Response, ApiError>) -> Response {
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

pub async fn completions(State(s): Shared, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let bytes = read_body(&headers, body, s.max_body_bytes, &s.limits).await?;
        let st = s.clone();
        let (prompt, p, ticket) = off_thread(&s.prep, &s.limits, move || {
            let req: CompletionRequest = parse(&bytes)?;
            let mut p = check_params(&st, req.common)?;
            let ticket = st.engine.admit()?;
            let prompt = match req.prompt {
                Prompt::Text(text) => {
                    check_text_len(&st, &text)?;
                    p.fault = test_fault(&st, &text);
                    st.tokenizer.encode(&text, true, true)
                }
                Prompt::Tokens(ids) => {
                    if let Some(bad) = ids.iter().find(|&&t| t as usize >= st.n_vocab) {
                        return Err(ApiError::bad_request(format!(
                            "prompt token {bad} is outside the vocabulary of {}",
                            st.n_vocab
                        )));
                    }
                    ids
                }
                Prompt::Many(_) => return Err(ApiError::bad_request(
                    "prompt must be one string or one array of token ids (batches are not supported)",
                )),
            };
            check_prompt(&st, &prompt)?;
            Ok((prompt, p, ticket))
        })
        .await?;
        generate(&s, Endpoint::Completions, prompt, p, ticket).await
    };
    let r = r.await;
    reply(&s, r)
}

pub async fn chat(State(s): Shared, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let bytes = read_body(&headers, body, s.max_body_bytes, &s.limits).await?;
        let st = s.clone();
        let (prompt, p, ticket) = off_thread(&s.prep, &s.limits, move || {
            let req: ChatRequest = parse(&bytes)?;
            if req.messages.is_empty() {
                return Err(ApiError::bad_request("messages must not be empty"));
            }
            let p = check_params(&st, req.common)?;
            let ticket = st.engine.admit()?;
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
            let rendered = st
                .template
                .render(&messages, true)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            let text = st.template.strip_special(
                &rendered,
                st.tokenizer.add_bos(),
                st.tokenizer.add_eos(),
            );
            check_text_len(&st, text)?;
            let prompt = st.tokenizer.encode(text, true, true);
            check_prompt(&st, &prompt)?;
            Ok((prompt, p, ticket))
        })
        .await?;
        generate(&s, Endpoint::Chat, prompt, p, ticket).await
    };
    let r = r.await;
    reply(&s, r)
}

/// A request's checked parameters.
struct Params {
    max_tokens: usize,
    sampler: Sampler,
    stop: Vec<String>,
    slot: Option<usize>,
    cache_prompt: bool,
    stream: bool,
    include_usage: bool,
    fault: Option<Fault>,
}

/// Checks the parameters against the server's limits (before any expensive work).
fn check_params(s: &AppState, p: CommonParams) -> Result<Params, ApiError> {
    if p.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only n = 1 is supported"));
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
    let fresh_seed = unix_nanos() ^ s.next_id.load(Ordering::Relaxed).rotate_left(32);
    let sampler =
        Sampler::new(p.sampling(fresh_seed)).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let stop = check_stops(
        p.stop.clone().map(|x| x.into_vec()).unwrap_or_default(),
        &s.limits,
    )?;
    Ok(Params {
        max_tokens,
        sampler,
        stop,
        slot: p.id_slot,
        cache_prompt: p.cache_prompt.unwrap_or(true),
        stream: p.stream,
        include_usage: p.include_usage(),
        fault: None,
    })
}

/// The fault a test prompt asks for, where the server simulates faults.
fn test_fault(s: &AppState, text: &str) -> Option<Fault> {
    if !s.test_faults {
        return None;
    }
    match text.strip_prefix("ggml-tp-test-fault:")? {
        "eval-error" => Some(Fault::EvalError),
        "panic" => Some(Fault::Panic),
        "stall" => Some(Fault::Stall(s.limits.stuck_after * 3)),
        _ => None,
    }
}

/// Checks the prompt's length against a slot's context.
fn check_prompt(s: &AppState, prompt: &[u32]) -> Result<(), ApiError> {
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
    Ok(())
}

/// Submits the request and answers it (streaming or not).
async fn generate(
    s: &AppState,
    endpoint: Endpoint,
    prompt: Vec<u32>,
    p: Params,
    ticket: Ticket,
) -> Result<Response, ApiError> {
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
    let rx = s.engine.submit(
        GenRequest {
            prompt,
            max_tokens: p.max_tokens,
            sampler: p.sampler,
            stop: p.stop,
            slot: p.slot,
            cache_prompt: p.cache_prompt,
            fault: p.fault,
        },
        ticket,
    )?;
    if p.stream {
        return Ok(stream(env, rx, p.include_usage));
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

/// `GET /health`: 200 `"ok"` while the inference worker is alive and making progress; 503 with
/// the reason in OpenAI's error shape when it has stopped or is stuck. Both count the panics the
/// worker caught and survived (`worker_recoveries`).
pub async fn health(State(s): Shared) -> Response {
    let active = s.metrics.slots_active.load(Ordering::Relaxed);
    if let Err(reason) = s.engine.health().check(s.limits.stuck_after) {
        let mut body = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, reason.clone()).body();
        body["status"] = json!("error");
        body["reason"] = json!(reason);
        body["worker_recoveries"] = json!(s.engine.health().recoveries());
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    Json(json!({
        "status": "ok",
        "slots_processing": active,
        "slots_idle": (s.engine.n_slots() as u64).saturating_sub(active),
        "queue_length": s.metrics.queue_length.load(Ordering::Relaxed),
        "worker_recoveries": s.engine.health().recoveries(),
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

pub async fn not_found() -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint").into_response()
}

pub async fn method_not_allowed() -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "this endpoint does not take this method",
    )
    .into_response()
}
