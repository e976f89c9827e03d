//! Turning the worker's events into an answer: one JSON object with every choice, or an SSE stream
//! of `data: {...}` chunks (each choice's deltas under its own `index`) ending with `data: [DONE]`.
//! Log-probabilities go with the text they belong to; with `echo` (completions) the prompt comes
//! first, and its tokens' log-likelihoods with it.

use super::api::{ApiError, ChoiceOut, Delta, Endpoint, Envelope, FinishReason, Usage};
use super::engine::Event;
use super::logprobs::{self, Legacy};
use super::tools::ToolCallParser;
use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use llama::sampling::TokenLogProbs;
use llama::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// Completions' `echo`: the prompt put in front of every choice.
#[derive(Debug, Clone)]
pub struct Echo {
    pub text: String,
    pub tokens: Vec<u32>,
}

/// How to answer one request.
pub struct Answer {
    pub env: Envelope,
    /// Choices.
    pub n: usize,
    pub tokenizer: Arc<Tokenizer>,
    /// Log-probabilities were asked for.
    pub logprobs: bool,
    pub echo: Option<Echo>,
    pub include_usage: bool,
    /// Parses tool calls out of each chat choice's text (chat with `tools`).
    pub tools: Option<ToolCallParser>,
}

/// What one choice has gathered.
#[derive(Debug, Default)]
struct Gathered {
    text: String,
    logprobs: Vec<TokenLogProbs>,
    finish: Option<FinishReason>,
}

/// Adds one choice's usage: the prompt counts once, the completions add up.
fn add_usage(total: &mut Usage, u: Usage) {
    total.prompt_tokens = u.prompt_tokens;
    total.cached_tokens = u.cached_tokens;
    total.completion_tokens += u.completion_tokens;
}

fn dropped() -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the inference worker dropped the request",
    )
}

impl Answer {
    /// The `logprobs` field of a choice with `lps`, after the prompt's when echoed.
    fn logprobs_json(&self, prompt: Option<&[TokenLogProbs]>, lps: &[TokenLogProbs]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let tok = &self.tokenizer;
        match self.env.endpoint {
            Endpoint::Chat => logprobs::chat(tok, lps),
            Endpoint::Completions => {
                let mut legacy = Legacy::default();
                if let (Some(echo), Some(p)) = (&self.echo, prompt) {
                    legacy.push_prompt(tok, &echo.tokens, p);
                }
                for lp in lps {
                    legacy.push(tok, lp);
                }
                legacy.take()
            }
        }
    }

    /// Waits for the whole answer.
    pub async fn collect(self, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
        let mut choices: Vec<Gathered> = (0..self.n).map(|_| Gathered::default()).collect();
        let mut prompt = None;
        let (mut usage, mut done) = (Usage::default(), 0);
        while done < self.n {
            match rx.recv().await.ok_or_else(dropped)? {
                Event::Text {
                    index,
                    text,
                    logprobs,
                } => {
                    let c = &mut choices[index];
                    c.text.push_str(&text);
                    c.logprobs.extend(logprobs);
                }
                Event::Prompt(lps) => prompt = Some(lps),
                Event::Done {
                    index,
                    finish,
                    usage: u,
                } => {
                    choices[index].finish = Some(finish);
                    add_usage(&mut usage, u);
                    done += 1;
                }
                Event::Failed(e) => return Err(e),
            }
        }
        let out = choices
            .into_iter()
            .map(|c| {
                let logprobs = self.logprobs_json(prompt.as_deref(), &c.logprobs);
                let mut finish = c.finish.unwrap_or(FinishReason::Stop);
                let (mut text, mut tool_calls) = (c.text, None);
                if let Some(parser) = &self.tools {
                    let parsed = parser.parse(&text);
                    if !parsed.calls.is_empty() {
                        finish = FinishReason::ToolCalls;
                        tool_calls = Some(parsed.calls_json());
                    }
                    text = parsed.content;
                }
                if let Some(echo) = &self.echo {
                    text.insert_str(0, &echo.text);
                }
                ChoiceOut {
                    text,
                    finish,
                    logprobs,
                    tool_calls,
                }
            })
            .collect();
        Ok(Json(self.env.complete(out, usage)).into_response())
    }

    /// Streams the answer as server-sent events. Dropping the body (the client went away) drops
    /// the receiver, which the worker notices at its next step.
    pub fn stream(self, rx: UnboundedReceiver<Event>) -> Response {
        let mut s = Streamer {
            legacy: (0..self.n).map(|_| Legacy::default()).collect(),
            tool_text: vec![String::new(); self.n],
            answer: self,
            rx: Some(rx),
            queue: VecDeque::new(),
            done: 0,
            usage: Usage::default(),
        };
        s.open();
        let body = futures::stream::unfold(s, |mut s| async move {
            let next = s.next().await?;
            Some((Ok::<_, Infallible>(Bytes::from(next)), s))
        });
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from_stream(body))
            .unwrap_or_else(|e| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
            })
    }
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

const DONE: &str = "data: [DONE]\n\n";

/// The state of one SSE answer.
struct Streamer {
    answer: Answer,
    rx: Option<UnboundedReceiver<Event>>,
    /// Events ready to send.
    queue: VecDeque<String>,
    /// Per choice, the legacy log-probabilities' running text offset.
    legacy: Vec<Legacy>,
    /// Per choice, the text held back while it may be a tool call.
    tool_text: Vec<String>,
    done: usize,
    usage: Usage,
}

impl Streamer {
    /// The opening chunks: chat's assistant role per choice; completions' echoed prompt when its
    /// log-probabilities are not wanted (else it comes with them).
    fn open(&mut self) {
        let a = &self.answer;
        for index in 0..a.n {
            let opening = match (&a.env.endpoint, &a.echo) {
                (Endpoint::Chat, _) => {
                    Some(Delta::Chat(json!({"role": "assistant", "content": ""})))
                }
                (Endpoint::Completions, Some(echo)) if !a.logprobs => {
                    Some(Delta::Text(echo.text.clone()))
                }
                _ => None,
            };
            if let Some(d) = opening {
                self.queue
                    .push_back(sse(&a.env.chunk(index, d, None, Value::Null)));
            }
        }
    }

    /// The next event to send; `None` after `[DONE]`.
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(x) = self.queue.pop_front() {
                return Some(x);
            }
            let rx = self.rx.as_mut()?;
            match rx.recv().await {
                Some(e) => self.take(e),
                None => self.end_with(&dropped()),
            }
        }
    }

    fn end_with(&mut self, e: &ApiError) {
        self.queue.push_back(sse(&e.body()));
        self.queue.push_back(DONE.to_string());
        self.rx = None;
    }

    /// Queues the chunks of event `e`.
    fn take(&mut self, e: Event) {
        let a = &self.answer;
        match e {
            Event::Prompt(lps) => {
                let Some(echo) = &a.echo else { return };
                for index in 0..a.n {
                    let legacy = &mut self.legacy[index];
                    legacy.push_prompt(&a.tokenizer, &echo.tokens, &lps);
                    let lp = legacy.take();
                    let d = Delta::Text(echo.text.clone());
                    self.queue.push_back(sse(&a.env.chunk(index, d, None, lp)));
                }
            }
            Event::Text {
                index,
                text,
                logprobs,
            } => {
                let lp = match (a.logprobs, a.env.endpoint) {
                    (false, _) => Value::Null,
                    (true, Endpoint::Chat) => logprobs::chat(&a.tokenizer, &logprobs),
                    (true, Endpoint::Completions) => {
                        let legacy = &mut self.legacy[index];
                        for lp in &logprobs {
                            legacy.push(&a.tokenizer, lp);
                        }
                        legacy.take()
                    }
                };
                if a.tools.is_some() {
                    // Tool calls are parsed from the whole text at the end.
                    self.tool_text[index].push_str(&text);
                    if lp.is_null() {
                        return;
                    }
                    let d = Delta::Chat(json!({}));
                    self.queue.push_back(sse(&a.env.chunk(index, d, None, lp)));
                    return;
                }
                let d = Delta::Text(text);
                self.queue.push_back(sse(&a.env.chunk(index, d, None, lp)));
            }
            Event::Done {
                index,
                finish,
                usage,
            } => {
                add_usage(&mut self.usage, usage);
                let finish = self.flush_tools(index, finish);
                let a = &self.answer;
                let d = Delta::Text(String::new());
                let last = a.env.chunk(index, d, Some(finish), Value::Null);
                self.queue.push_back(sse(&last));
                self.done += 1;
                if self.done == a.n {
                    if a.include_usage {
                        self.queue.push_back(sse(&a.env.usage_chunk(self.usage)));
                    }
                    self.queue.push_back(DONE.to_string());
                    self.rx = None;
                }
            }
            Event::Failed(e) => self.end_with(&e),
        }
    }

    /// At the end of choice `index` of a chat with tools: queues its text and tool calls as
    /// deltas; returns the finish reason (`tool_calls` when there were some).
    fn flush_tools(&mut self, index: usize, finish: FinishReason) -> FinishReason {
        let a = &self.answer;
        let Some(parser) = &a.tools else {
            return finish;
        };
        let parsed = parser.parse(&std::mem::take(&mut self.tool_text[index]));
        if !parsed.content.is_empty() {
            let d = Delta::Text(parsed.content.clone());
            self.queue
                .push_back(sse(&a.env.chunk(index, d, None, Value::Null)));
        }
        if parsed.calls.is_empty() {
            return finish;
        }
        for call in parsed.delta_calls() {
            let d = Delta::Chat(json!({"tool_calls": [call]}));
            self.queue
                .push_back(sse(&a.env.chunk(index, d, None, Value::Null)));
        }
        FinishReason::ToolCalls
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llama::tool_calls::ToolFormat;
    use tokio::sync::mpsc;

    /// The fixture llama's tokenizer, if the fixtures are present.
    fn tokenizer() -> Option<Arc<Tokenizer>> {
        let dir = match std::env::var_os("GGML_TP_FIXTURES") {
            Some(d) => std::path::PathBuf::from(d),
            None => {
                std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures")
            }
        };
        let file = ggml_core::gguf::GgufFile::open(dir.join("arch/llama.gguf")).ok()?;
        Some(Arc::new(Tokenizer::from_gguf(&file).ok()?))
    }

    fn answer(tokenizer: Arc<Tokenizer>, n: usize) -> Answer {
        Answer {
            env: Envelope {
                endpoint: Endpoint::Chat,
                id: "chatcmpl-1".into(),
                created: 0,
                model: "m".into(),
            },
            n,
            tokenizer,
            logprobs: false,
            echo: None,
            include_usage: true,
            tools: Some(ToolCallParser::new(ToolFormat::Hermes, "call_1".into())),
        }
    }

    /// Events of two choices: choice 0 calls a tool, choice 1 answers in text.
    fn events() -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        let text = |index: usize, t: &str| Event::Text {
            index,
            text: t.into(),
            logprobs: Vec::new(),
        };
        let done = |index: usize| Event::Done {
            index,
            finish: FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 5,
                cached_tokens: 0,
                completion_tokens: 7,
            },
        };
        for e in [
            text(0, "<tool_call>\n{\"name\": \"f\", "),
            text(1, "No tools needed."),
            text(0, "\"arguments\": {\"x\": 1}}\n</tool_call>"),
            done(1),
            done(0),
        ] {
            tx.send(e).unwrap();
        }
        rx
    }

    #[tokio::test]
    async fn tool_calls_in_the_whole_answer() {
        let Some(tok) = tokenizer() else { return };
        let resp = answer(tok, 2).collect(events()).await.unwrap();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        let c0 = &v["choices"][0];
        assert_eq!(c0["finish_reason"], "tool_calls");
        assert_eq!(c0["message"]["content"], "");
        assert_eq!(
            c0["message"]["tool_calls"],
            json!([{"id": "call_1_0", "type": "function",
                "function": {"name": "f", "arguments": "{\"x\":1}"}}])
        );
        let c1 = &v["choices"][1];
        assert_eq!(c1["finish_reason"], "stop");
        assert_eq!(c1["message"]["content"], "No tools needed.");
        assert!(c1["message"].get("tool_calls").is_none());
        assert_eq!(v["usage"]["completion_tokens"], 14);
        assert_eq!(v["usage"]["prompt_tokens"], 5);
    }

    #[tokio::test]
    async fn tool_calls_streamed_as_deltas() {
        let Some(tok) = tokenizer() else { return };
        let resp = answer(tok, 2).stream(events());
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        let chunks: Vec<Value> = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert!(text.ends_with("data: [DONE]\n\n"));
        let of = |i: u64| -> Vec<&Value> {
            chunks
                .iter()
                .filter_map(|c| c["choices"].get(0))
                .filter(|c| c["index"] == i)
                .collect()
        };
        let zero = of(0);
        assert_eq!(zero[0]["delta"]["role"], "assistant");
        let calls: Vec<&Value> = zero
            .iter()
            .filter_map(|c| c["delta"].get("tool_calls"))
            .collect();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0][0]["index"], 0);
        assert_eq!(calls[0][0]["function"]["name"], "f");
        assert_eq!(zero.last().unwrap()["finish_reason"], "tool_calls");
        let one = of(1);
        let content: String = one
            .iter()
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "No tools needed.");
        assert_eq!(one.last().unwrap()["finish_reason"], "stop");
        assert_eq!(chunks.last().unwrap()["usage"]["total_tokens"], 19);
    }
}
