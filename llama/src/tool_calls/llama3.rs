//! Llama 3.1+ tool calls: the reply is a JSON object `{"name": ..., "parameters": {...}}`
//! (`"type": "function"` optional, `arguments` accepted too), possibly after `<|python_tag|>`;
//! several calls are separated by `;` or new lines. A reply that is not such JSON is content.

use super::{call_from_json, leading_json, ParsedReply};

const PYTHON_TAG: &str = "<|python_tag|>";

/// Splits `reply` into content and calls: calls only when the whole reply (after an optional text
/// before `<|python_tag|>`) is a sequence of call objects.
pub fn parse(reply: &str) -> ParsedReply {
    let (before, body) = match reply.find(PYTHON_TAG) {
        Some(i) => (&reply[..i], &reply[i + PYTHON_TAG.len()..]),
        None => ("", reply),
    };
    let mut calls = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let Some((v, tail)) = leading_json(rest) else {
            break;
        };
        let Some(call) = call_from_json(&v, &["parameters", "arguments"]) else {
            break;
        };
        calls.push(call);
        rest = tail.trim_start().trim_start_matches(';').trim();
    }
    if calls.is_empty() || !rest.is_empty() {
        return ParsedReply {
            content: reply.replace(PYTHON_TAG, "").trim().to_string(),
            calls: Vec::new(),
        };
    }
    ParsedReply {
        content: before.trim().to_string(),
        calls,
    }
}
