//! Constrained answers end to end on 127.0.0.1 with the real SmolLM2-135M (from the model cache
//! that `cargo xtask models` fills; skipped when it is absent): `response_format` `json_schema`
//! and `json_object`, llama-server's Lark `grammar` on `/v1/completions`, a streamed
//! constrained answer, and the 400s of a malformed schema, a GBNF grammar, two constraints at
//! once and an unknown format type.

mod api;
#[allow(dead_code)] // the fixtures are not used here, only the placement
mod common;

use api::{post, start, stream_events};
use serde_json::{json, Value};
use std::path::PathBuf;

/// SmolLM2 from `GGML_TP_MODELS` or the user's model cache.
fn smollm2() -> Option<PathBuf> {
    let file = "SmolLM2-135M-Instruct.Q4_1.gguf";
    let dir = std::env::var_os("GGML_TP_MODELS")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(ggml_core::env::models_cache_dir)?;
    let path = dir.join(file);
    if !path.is_file() {
        println!("skipped: models not found ({file} in {})", dir.display());
        return None;
    }
    Some(path)
}

const CHAT: &str = "/v1/chat/completions";

fn person_schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "languages": {"type": "array", "items": {"enum": ["en", "fr", "de"]}, "maxItems": 3}},
        "required": ["name", "age", "languages"], "additionalProperties": false})
}

/// Checks `text` is a person of [`person_schema`].
fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!(v["name"].as_str().unwrap().chars().count() <= 20, "{text}");
    assert!((0..=120).contains(&v["age"].as_i64().unwrap()), "{text}");
    let langs = v["languages"].as_array().unwrap();
    assert!(
        langs.len() <= 3
            && langs
                .iter()
                .all(|l| ["en", "fr", "de"].contains(&l.as_str().unwrap()))
    );
    assert_eq!(v.as_object().unwrap().len(), 3, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_json_object_and_lark_answers() {
    let Some(model) = smollm2() else { return };
    let base = start(model, |c| c.max_tokens = 300).await;
    let messages = json!([{"role": "user", "content": "Describe a person as JSON."}]);
    for seed in [1, 2] {
        let body = json!({"messages": messages, "seed": seed, "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": person_schema(), "strict": true}}});
        let (status, v) = post(&base, CHAT, &body).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        check_person(v["choices"][0]["message"]["content"].as_str().unwrap());
    }
    let body = json!({"messages": messages, "seed": 3,
        "response_format": {"type": "json_object"}});
    let (status, v) = post(&base, CHAT, &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        serde_json::from_str::<Value>(text).unwrap().is_object(),
        "{text}"
    );

    let body = json!({"prompt": "Is water wet? Answer:", "seed": 4,
        "grammar": "start: \" \" (\"yes\" | \"no\") \".\""});
    let (status, v) = post(&base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(text == " yes." || text == " no.", "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_constrained_answer() {
    let Some(model) = smollm2() else { return };
    let base = start(model, |c| c.max_tokens = 300).await;
    let body = json!({"messages": [{"role": "user", "content": "A person as JSON?"}],
        "stream": true, "seed": 5, "n": 1,
        "json_schema": person_schema()});
    let events = stream_events(&base, CHAT, &body).await;
    let mut text = String::new();
    let mut finish = Vec::new();
    for e in &events {
        let c = &e["choices"][0];
        text.push_str(c["delta"]["content"].as_str().unwrap_or(""));
        if !c["finish_reason"].is_null() {
            finish.push(c["finish_reason"].clone());
        }
    }
    assert_eq!(finish, [json!("stop")]);
    check_person(&text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_constraints_are_400s() {
    let Some(model) = smollm2() else { return };
    let base = start(model, |_| {}).await;
    let messages = json!([{"role": "user", "content": "Hi"}]);
    let rf = |schema: Value| json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    let cases = [
        (
            json!({"response_format": rf(json!({"type": "no-such-type"}))}),
            "response_format",
            "invalid",
        ),
        (
            json!({"response_format": rf(json!({"type": "string", "minLength": 4, "maxLength": 1}))}),
            "response_format",
            "JSON schema",
        ),
        (
            json!({"response_format": rf(json!(7))}),
            "response_format.json_schema.schema",
            "object",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format.json_schema.schema",
            "json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
            "xml",
        ),
        (json!({"grammar": "root ::= \"a\""}), "grammar", "GBNF"),
        (
            json!({"grammar": "start: undefined_rule"}),
            "grammar",
            "grammar",
        ),
        (
            json!({"grammar": "start: \"a\"", "json_schema": {"type": "object"}}),
            "json_schema",
            "only one",
        ),
    ];
    for (extra, param, needle) in cases {
        let mut body = json!({"messages": messages, "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, v) = post(&base, CHAT, &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{msg}");
    }
    // The server goes on serving.
    let ok = json!({"messages": messages, "max_tokens": 2});
    assert_eq!(post(&base, CHAT, &ok).await.0, 200);
}
