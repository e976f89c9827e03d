//! The OpenAI wire format: request bodies of `/v1/completions` and `/v1/chat/completions`, the
//! JSON of responses and stream chunks, and the error type whose body is
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use llama::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// An error answered to a client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's string `code` (e.g. `invalid_api_key`); the status number when `None`.
    pub code: Option<&'static str>,
    /// The request field the error is about (OpenAI's `param`).
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            code: None,
            param: None,
        }
    }

    /// This error about request field `param`.
    pub fn with_param(self, param: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.into()),
            ..self
        }
    }

    pub fn with_code(self, code: &'static str) -> ApiError {
        ApiError {
            code: Some(code),
            ..self
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// OpenAI's error `type` for this status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => "server_overloaded",
            StatusCode::NOT_FOUND => "not_found_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    pub fn body(&self) -> Value {
        let code = match self.code {
            Some(c) => json!(c),
            None => json!(self.status.as_u16()),
        };
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// A prompt: text, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    /// Several prompts (batches), refused with a clear message.
    Many(Vec<Value>),
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        let v = match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        };
        v.into_iter().filter(|s| !s.is_empty()).collect()
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields both endpoints share (flattened into each request).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<usize>,
    /// The slot to run in (llama.cpp's field); any free slot when absent.
    pub id_slot: Option<usize>,
    /// Reuse the prefix a slot's cache shares with the prompt (llama.cpp's field; default true).
    pub cache_prompt: Option<bool>,
    /// Token id (as a string) -> bias in `[-100, 100]` added to its logit; -100 bans it.
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    /// OpenAI's end-user id: accepted and ignored.
    pub user: Option<Value>,
    /// OpenAI's request metadata: accepted and ignored.
    pub metadata: Option<Value>,
    /// OpenAI's storage switch: accepted and ignored (nothing is stored).
    pub store: Option<Value>,
    /// OpenAI's service tier: accepted and ignored.
    pub service_tier: Option<Value>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}` (see [`super::constrain`]).
    pub response_format: Option<Value>,
    /// llama-server's grammar, here in llguidance's Lark syntax.
    pub grammar: Option<String>,
    /// llama-server's JSON schema field.
    pub json_schema: Option<Value>,
}

impl CommonParams {
    /// The sampling parameters: llama.cpp's defaults (temperature 0.8, top_k 40, top_p 0.95,
    /// min_p 0.05, no penalties) where absent, and `fresh_seed` when no seed is given.
    pub fn sampling(&self, fresh_seed: u64) -> SamplingParams {
        let d = SamplingParams::default();
        SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            seed: self.seed.unwrap_or(fresh_seed),
            ..d
        }
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// The log-probabilities of the chosen tokens and of this many most likely ones.
    pub logprobs: Option<usize>,
    /// Answer the prompt in front of the completion (with `logprobs`, its tokens' too).
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub common: CommonParams,
    /// Every field not above (refused by [`check_extra`]).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Message content: text, or OpenAI's parts (`[{"type": "text", "text": ...}]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

impl Content {
    /// The text; parts other than text are refused.
    pub fn text(&self) -> Result<String, ApiError> {
        match self {
            Content::Text(s) => Ok(s.clone()),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match (&*p.kind, &p.text) {
                    ("text", Some(t)) => Ok(t.as_str()),
                    _ => Err(ApiError::bad_request(format!(
                        "content parts of type {:?} are not supported (text only)",
                        p.kind
                    ))),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    /// The calls an assistant message made (OpenAI's shape), rendered back to the template.
    pub tool_calls: Option<Value>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

/// The roles a chat message may have.
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// Report the log-probabilities of the chosen tokens.
    #[serde(default)]
    pub logprobs: bool,
    /// And those of this many most likely tokens per position (needs `logprobs`).
    pub top_logprobs: Option<usize>,
    /// Tool definitions, passed to the chat template.
    pub tools: Option<Value>,
    /// `none`, `auto`, `required` or one named function.
    pub tool_choice: Option<Value>,
    /// Whether the model may call several tools in one turn: accepted.
    pub parallel_tool_calls: Option<bool>,
    #[serde(flatten)]
    pub common: CommonParams,
    /// Every field not above (refused by [`check_extra`]).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Fields of OpenAI's API (or llama-server's) this server knows but does not implement.
const UNSUPPORTED: [&str; 11] = [
    "functions",
    "function_call",
    "audio",
    "modalities",
    "prediction",
    "web_search_options",
    "reasoning_effort",
    "suffix",
    "best_of",
    "tools",
    "tool_choice",
];

/// Refuses the fields no handler took: known-but-unsupported ones with a message saying so, the
/// others as unrecognized, `param` naming the field either way. A `null` value counts as absent.
pub fn check_extra(extra: &Map<String, Value>) -> Result<(), ApiError> {
    let Some((key, _)) = extra.iter().find(|(_, v)| !v.is_null()) else {
        return Ok(());
    };
    let message = if UNSUPPORTED.contains(&key.as_str()) {
        format!("the field {key:?} is not supported by this server")
    } else {
        format!("unrecognized request argument supplied: {key}")
    };
    Err(ApiError::bad_request(message).with_param(key.clone()))
}

/// Refuses a message whose role is not one of [`ROLES`].
pub fn check_role(index: usize, m: &ChatMessage) -> Result<(), ApiError> {
    if ROLES.contains(&m.role.as_str()) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "invalid role {:?} of message {index}: one of {}",
        m.role,
        ROLES.join(", ")
    ))
    .with_param(format!("messages[{index}].role")))
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` or the end of the context.
    Length,
    /// The model called tools (chat with `tools`).
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    pub fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// One finished choice of a non-streaming answer.
#[derive(Debug, Clone)]
pub struct ChoiceOut {
    pub text: String,
    pub finish: FinishReason,
    /// The `logprobs` field (`null` when not asked for).
    pub logprobs: Value,
    /// Chat's `message.tool_calls`, when the model called tools.
    pub tool_calls: Option<Value>,
}

/// What a stream chunk carries.
#[derive(Debug, Clone)]
pub enum Delta {
    /// Generated text.
    Text(String),
    /// A chat delta object as it is (the opening role, tool calls).
    Chat(Value),
}

/// Which endpoint a response belongs to; decides the object names and the choice fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// The envelope fields of one request's responses.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Envelope {
    fn wrap(&self, object: &str, choices: Value, usage: Option<Usage>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u.json();
        }
        v
    }

    /// The whole answer of a non-streaming request.
    pub fn complete(&self, choices: Vec<ChoiceOut>, usage: Usage) -> Value {
        let choices: Vec<Value> = choices
            .into_iter()
            .enumerate()
            .map(|(index, c)| match self.endpoint {
                Endpoint::Completions => json!({
                    "index": index, "text": c.text, "logprobs": c.logprobs,
                    "finish_reason": c.finish.as_str(),
                }),
                Endpoint::Chat => {
                    let mut message = json!({"role": "assistant", "content": c.text});
                    if let Some(calls) = c.tool_calls {
                        message["tool_calls"] = calls;
                    }
                    json!({
                        "index": index,
                        "message": message,
                        "logprobs": c.logprobs,
                        "finish_reason": c.finish.as_str(),
                    })
                }
            })
            .collect();
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion",
        };
        self.wrap(object, json!(choices), Some(usage))
    }

    /// A stream chunk of choice `index` carrying `delta` (text, or a chat delta object such as
    /// `{"role": "assistant", "content": ""}`), its `logprobs` and, on the last, the finish reason.
    pub fn chunk(
        &self,
        index: usize,
        delta: Delta,
        finish: Option<FinishReason>,
        logprobs: Value,
    ) -> Value {
        let reason = finish.map(FinishReason::as_str);
        match self.endpoint {
            Endpoint::Completions => {
                let text = match delta {
                    Delta::Text(t) => t,
                    Delta::Chat(_) => String::new(),
                };
                self.wrap(
                    "text_completion",
                    json!([{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}]),
                    None,
                )
            }
            Endpoint::Chat => {
                let d = match delta {
                    Delta::Text(t) if t.is_empty() && finish.is_some() => json!({}),
                    Delta::Text(t) => json!({"content": t}),
                    Delta::Chat(v) => v,
                };
                self.wrap(
                    "chat.completion.chunk",
                    json!([{"index": index, "delta": d, "logprobs": logprobs, "finish_reason": reason}]),
                    None,
                )
            }
        }
    }

    /// The usage chunk sent after the last one when `stream_options.include_usage`.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        self.wrap(object, json!([]), Some(usage))
    }
}
