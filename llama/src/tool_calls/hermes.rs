//! Hermes-style tool calls (Qwen2.5, Qwen3): each call is `<tool_call>\n{"name": ..., "arguments":
//! {...}}\n</tool_call>`, anywhere in the reply; the text around them is the content.

use super::{call_from_json, join_content, leading_json, ParsedReply};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Splits `reply` into content and the calls of its `<tool_call>` blocks. An unclosed last block
/// (the reply ended first) still counts when its JSON is whole.
pub fn parse(reply: &str) -> ParsedReply {
    let mut calls = Vec::new();
    let mut content = Vec::new();
    let mut rest = reply;
    while let Some(start) = rest.find(OPEN) {
        let body_start = start + OPEN.len();
        let (body, after) = match rest[body_start..].find(CLOSE) {
            Some(end) => (
                &rest[body_start..body_start + end],
                &rest[body_start + end + CLOSE.len()..],
            ),
            None => (&rest[body_start..], ""),
        };
        let call = leading_json(body)
            .filter(|(_, tail)| tail.trim().is_empty())
            .and_then(|(v, _)| call_from_json(&v, &["arguments", "parameters"]));
        match call {
            Some(c) => {
                content.push(&rest[..start]);
                calls.push(c);
            }
            None => content.push(&rest[..body_start + body.len()]),
        }
        rest = after;
    }
    content.push(rest);
    ParsedReply {
        content: join_content(&content),
        calls,
    }
}
