//! The HTTP handlers: request validation (body size, JSON shape, prompt and `max_tokens` limits),
//! prompt building (chat template, tokenizer; off the async workers, [`super::prepare`]), handing
//! requests to the [`Engine`] (a place in its queue is taken once the parameters are checked and
//! before the prompt is rendered and tokenized), and answering ([`super::respond`]) as one JSON
//! object or as an SSE stream. Unknown fields and roles are refused with 400 naming the field.

use super::api::{
    check_extra, check_role, ApiError, ChatMessage, ChatRequest, CommonParams, CompletionRequest,
    Endpoint, Envelope, Prompt,
};
use super::config::Limits;
use super::constrain;
use super::engine::{Engine, Fault, GenRequest, Ticket};
use super::metrics::Metrics;
use super::prepare::{check_stops, check_text_len, off_thread, parse, read_body};
use super::respond::{Answer, Echo};
use super::tools::{self, ToolCallParser};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use llama::chat::{ChatTemplate, Message, RenderOptions};
use llama::constraint::{Constraint, ConstraintEngine, ConstraintError};
use llama::sampling::{Sampler, BIAS_LIMIT};
use llama::tokenizer::Tokenizer;
use llama::tool_calls::ToolFormat;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// What every handler shares.
pub struct AppState {
    pub engine: Engine,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub metrics: Arc<Metrics>,
    pub model_name: String,
    /// The model file (`/props`).
    pub model_path: PathBuf,
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
    /// The constraint engine of the model's vocabulary, built for the first constrained request.
    pub constraints: std::sync::OnceLock<Result<ConstraintEngine, ConstraintError>>,
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
            check_extra(&req.extra)?;
            let logprobs = check_top(req.logprobs, "logprobs")?;
            let requested = constrain::requested(&req.common)?;
            let mut p = check_params(&st, req.common, logprobs, req.echo)?;
            p.constraint = constrain::constraint(&st, requested, None)?;
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
            if req.echo {
                p.echo = Some(Echo {
                    text: st.tokenizer.decode(&prompt),
                    tokens: prompt.clone(),
                });
            }
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
            check_extra(&req.extra)?;
            if req.messages.is_empty() {
                return Err(ApiError::bad_request("messages must not be empty"));
            }
            for (i, m) in req.messages.iter().enumerate() {
                check_role(i, m)?;
            }
            let logprobs = match (req.logprobs, req.top_logprobs) {
                (false, Some(_)) => {
                    return Err(ApiError::bad_request("top_logprobs needs logprobs: true")
                        .with_param("top_logprobs"))
                }
                (false, None) => None,
                (true, top) => check_top(Some(top.unwrap_or(0)), "top_logprobs")?,
            };
            let tools = tools::setup(&req, st.template.source())?;
            let requested = constrain::requested(&req.common)?;
            let mut p = check_params(&st, req.common.clone(), logprobs, false)?;
            p.constraint = constrain::constraint(&st, requested, tools.grammar.clone())?;
            let ticket = st.engine.admit()?;
            let messages = req
                .messages
                .iter()
                .map(template_message)
                .collect::<Result<Vec<_>, ApiError>>()?;
            let options = RenderOptions {
                add_generation_prompt: true,
                tools: tools.tools.clone(),
                ..RenderOptions::default()
            };
            let rendered = st
                .template
                .render_with(&messages, &options)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            let text = st.template.strip_special(
                &rendered,
                st.tokenizer.add_bos(),
                st.tokenizer.add_eos(),
            );
            check_text_len(&st, text)?;
            let prompt = st.tokenizer.encode(text, true, true);
            check_prompt(&st, &prompt)?;
            p.tools = tools.format;
            Ok((prompt, p, ticket))
        })
        .await?;
        generate(&s, Endpoint::Chat, prompt, p, ticket).await
    };
    let r = r.await;
    reply(&s, r)
}

/// A request message as the chat template sees it: the text of its content, `developer` as
/// `system`, tool calls with their arguments as objects.
fn template_message(m: &ChatMessage) -> Result<Message, ApiError> {
    let text = match &m.content {
        Some(c) => c.text()?,
        None => String::new(),
    };
    let role = if m.role == "developer" {
        "system"
    } else {
        &m.role
    };
    let mut out = Message::new(role, text);
    out.tool_calls = m.tool_calls.as_ref().map(tools::template_calls);
    out.tool_call_id = m.tool_call_id.clone();
    out.name = m.name.clone();
    Ok(out)
}

/// The most log-probabilities per position a request may ask for.
const MAX_TOP_LOGPROBS: usize = 20;

/// The most choices (`n`) of one request.
pub const MAX_CHOICES: usize = 8;

/// Checks a count of top log-probabilities (`field` names it in the error).
fn check_top(top: Option<usize>, field: &str) -> Result<Option<usize>, ApiError> {
    match top {
        Some(k) if k > MAX_TOP_LOGPROBS => Err(ApiError::bad_request(format!(
            "{field} {k} exceeds the limit of {MAX_TOP_LOGPROBS}"
        ))
        .with_param(field)),
        t => Ok(t),
    }
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
    n: usize,
    /// Top log-probabilities per token (`Some(0)`: the chosen token's only).
    logprobs: Option<usize>,
    /// Completions' `echo`.
    echo: Option<Echo>,
    /// The tool-call syntax parsed from the reply (chat with tools).
    tools: Option<ToolFormat>,
    /// The grammar the reply follows.
    constraint: Option<Constraint>,
}

/// Checks the parameters against the server's limits (before any expensive work). `echo` allows
/// `max_tokens: 0` (the prompt's log-likelihoods alone).
fn check_params(
    s: &AppState,
    p: CommonParams,
    logprobs: Option<usize>,
    echo: bool,
) -> Result<Params, ApiError> {
    let n = p.n.unwrap_or(1);
    let n_limit = MAX_CHOICES.min(s.engine.n_slots());
    if n == 0 || n > n_limit {
        return Err(ApiError::bad_request(format!(
            "n = {n}: at least 1 and at most {n_limit} (the server's slots, up to {MAX_CHOICES})"
        ))
        .with_param("n"));
    }
    let max_tokens = match p.max_tokens.or(p.max_completion_tokens) {
        Some(0) if !echo => {
            return Err(ApiError::bad_request(
                "max_tokens must be at least 1 (0 only with echo)",
            ))
        }
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
    let bias = check_logit_bias(s, p.logit_bias.as_ref())?;
    let sampler = Sampler::new(p.sampling(fresh_seed))
        .and_then(|x| x.with_logit_bias(bias))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
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
        n,
        logprobs,
        echo: None,
        tools: None,
        constraint: None,
    })
}

/// `logit_bias` as (token, bias): keys must be token ids of the vocabulary, biases in
/// `[-100, 100]`.
fn check_logit_bias(
    s: &AppState,
    bias: Option<&BTreeMap<String, f32>>,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(bias) = bias else {
        return Ok(Vec::new());
    };
    bias.iter()
        .map(|(key, &b)| {
            let bad = |why: String| {
                Err(ApiError::bad_request(format!("logit_bias[{key:?}]: {why}"))
                    .with_param("logit_bias"))
            };
            let Ok(token) = key.parse::<u32>() else {
                return bad("keys must be token ids".into());
            };
            if token as usize >= s.n_vocab {
                return bad(format!("outside the vocabulary of {}", s.n_vocab));
            }
            if !(b.is_finite() && b.abs() <= BIAS_LIMIT) {
                return bad(format!("{b} is not in [-{BIAS_LIMIT}, {BIAS_LIMIT}]"));
            }
            Ok((token, b))
        })
        .collect()
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
    let id = format!(
        "{}-{:x}",
        match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        },
        s.next_id.fetch_add(1, Ordering::Relaxed)
    );
    let answer = Answer {
        tools: p
            .tools
            .map(|f| ToolCallParser::new(f, format!("call_{}", id.replace('-', "_")))),
        env: Envelope {
            endpoint,
            id,
            created: unix_now(),
            model: s.model_name.clone(),
        },
        n: p.n,
        tokenizer: s.tokenizer.clone(),
        logprobs: p.logprobs.is_some(),
        include_usage: p.include_usage,
        echo: p.echo.clone(),
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
            logprobs: p.logprobs,
            prompt_logprobs: p.echo.is_some() && p.logprobs.is_some(),
            n: p.n,
            special_text: p.tools.is_some(),
            constraint: p.constraint,
        },
        ticket,
    )?;
    if p.stream {
        return Ok(answer.stream(rx));
    }
    answer.collect(rx).await
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
