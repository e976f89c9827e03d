//! The OpenAI wire format: request bodies of `/v1/completions` and `/v1/chat/completions`, the
//! JSON of responses and stream chunks, and the error type whose body is
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use llama::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};

/// An error answered to a client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's string `code` (e.g. `invalid_api_key`); the status number when `None`.
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            code: None,
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
            "param": null,
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
    #[serde(flatten)]
    pub common: CommonParams,
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
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub common: CommonParams,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` or the end of the context.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
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
    pub fn complete(&self, text: &str, finish: FinishReason, usage: Usage) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish.as_str(),
            }),
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish.as_str(),
            }),
        };
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion",
        };
        self.wrap(object, json!([choice]), Some(usage))
    }

    /// A stream chunk carrying `delta` text (`role` marks the first chat chunk) and, on the last,
    /// the finish reason.
    pub fn chunk(&self, delta: &str, role: bool, finish: Option<FinishReason>) -> Value {
        let reason = finish.map(FinishReason::as_str);
        match self.endpoint {
            Endpoint::Completions => self.wrap(
                "text_completion",
                json!([{"index": 0, "text": delta, "logprobs": null, "finish_reason": reason}]),
                None,
            ),
            Endpoint::Chat => {
                let d = if role {
                    json!({"role": "assistant", "content": delta})
                } else if finish.is_some() && delta.is_empty() {
                    json!({})
                } else {
                    json!({"content": delta})
                };
                self.wrap(
                    "chat.completion.chunk",
                    json!([{"index": 0, "delta": d, "logprobs": null, "finish_reason": reason}]),
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
