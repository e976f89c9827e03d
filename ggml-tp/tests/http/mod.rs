//! HTTP helpers of the hostile-client and fault tests of the server: starting a server, sending
//! requests, reading streams, checking OpenAI's error shape.

use futures::StreamExt;
use ggml_tp::server::{Server, ServerConfig};
use llama::Placement;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Starts a server on `placement` in the background (127.0.0.1, any port, 256 positions per slot,
/// `max_tokens` up to 200, then `edit`); returns its address.
pub async fn start_on(
    model: PathBuf,
    placement: Placement,
    edit: impl FnOnce(&mut ServerConfig),
) -> SocketAddr {
    let mut cfg = ServerConfig::new(model, placement);
    cfg.addr = "127.0.0.1:0".parse().unwrap();
    cfg.n_ctx = 256;
    cfg.max_tokens = 200;
    edit(&mut cfg);
    let server = Server::bind(cfg).await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run());
    addr
}

/// A fresh path in the temporary directory (nothing is created there).
pub fn temp_path(what: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::env::temp_dir().join(format!("ggml-tp-{what}-{}-{nanos}", std::process::id()))
}

/// Asserts OpenAI's error shape and returns the message.
pub fn error_shape(v: &Value) -> String {
    let e = &v["error"];
    assert!(e["message"].is_string(), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.as_object().unwrap().contains_key("param"), "{v}");
    assert!(!e["code"].is_null(), "{v}");
    e["message"].as_str().unwrap().to_string()
}

/// Sends a request: its status, headers and JSON body (`null` when the body is not JSON).
pub async fn send(rb: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// A greedy completion request body without prompt caching.
pub fn completion(prompt: &str, max_tokens: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "cache_prompt": false})
}

/// Polls `/health` until its status is `want` (at most `within`); returns the body.
pub async fn health_becomes(base: &str, want: u16, within: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let (status, _, v) = send(reqwest::Client::new().get(format!("{base}/health"))).await;
        if status == want {
            return v;
        }
        assert!(t0.elapsed() < within, "/health stayed {status}: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads a stream to its end: the text and whether it ended with a finish reason and `[DONE]`;
/// an error chunk gives `Err`.
pub async fn stream_text(
    base: &str,
    body: &Value,
    keep: Option<usize>,
) -> Result<(String, bool), String> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if r.status() != 200 {
        return Err(format!("status {}", r.status()));
    }
    let mut s = r.bytes_stream();
    let (mut buf, mut text, mut finished, mut chunks) = (String::new(), String::new(), false, 0);
    while let Some(bytes) = s.next().await {
        buf.push_str(&String::from_utf8_lossy(&bytes.map_err(|e| e.to_string())?));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let data = event.trim_end().trim_start_matches("data: ").to_string();
            if data == "[DONE]" {
                return Ok((text, finished));
            }
            let v: Value = serde_json::from_str(&data).map_err(|e| e.to_string())?;
            if v.get("error").is_some() {
                return Err(v.to_string());
            }
            let c = &v["choices"][0];
            text.push_str(c["text"].as_str().unwrap_or(""));
            finished |= c["finish_reason"].is_string();
            chunks += 1;
            if keep.is_some_and(|k| chunks >= k) {
                return Ok((text, false));
            }
        }
    }
    Err(format!("the stream ended without [DONE] after {text:?}"))
}

/// `POST /slots/{query}`: the status and JSON body.
pub async fn slot(base: &str, query: &str) -> (u16, Value) {
    let (status, _, v) = send(reqwest::Client::new().post(format!("{base}/slots/{query}"))).await;
    (status, v)
}
