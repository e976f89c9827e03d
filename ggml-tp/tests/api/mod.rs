//! Helpers of the API tests: a server on 127.0.0.1 (a 256-position context, 64 tokens at most
//! unless `edit` says otherwise), a JSON POST, and the data objects of an SSE answer.

use super::common::single;
use futures::StreamExt;
use ggml_tp::server::{Server, ServerConfig};
use serde_json::Value;
use std::path::PathBuf;

pub async fn start(model: PathBuf, edit: impl FnOnce(&mut ServerConfig)) -> String {
    let mut cfg = ServerConfig::new(model, single());
    cfg.addr = "127.0.0.1:0".parse().unwrap();
    cfg.n_ctx = 256;
    cfg.max_tokens = 64;
    edit(&mut cfg);
    let server = Server::bind(cfg).await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run());
    format!("http://{addr}")
}

/// The answer to a JSON POST of `body` to `path`.
async fn send(base: &str, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap()
}

pub async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = send(base, path, body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// The data objects of an SSE answer, checking it ends with `[DONE]`.
pub async fn stream_events(base: &str, path: &str, body: &Value) -> Vec<Value> {
    let r = send(base, path, body).await;
    assert_eq!(r.status().as_u16(), 200);
    let mut text = String::new();
    let mut s = r.bytes_stream();
    while let Some(b) = s.next().await {
        text.push_str(std::str::from_utf8(&b.unwrap()).unwrap());
    }
    let data: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("a data line"))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"));
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}
