//! gpt-oss (harmony) tool calls. A reply is a run of messages, each `[<|start|>assistant]` then a
//! header `<|channel|>CHANNEL [to=functions.NAME] [<|constrain|>json]` (the recipient may also come
//! before the channel), `<|message|>`, the body, and `<|end|>`, `<|call|>` or `<|return|>` (or
//! the end of the reply). A message to `functions.NAME` is a call with the body as its arguments;
//! `final` (and recipient-less `commentary`) bodies are the content; `analysis` (the reasoning) is
//! left out.

use super::{arguments_text, join_content, ParsedReply, ToolCall};

const MESSAGE: &str = "<|message|>";
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
const RECIPIENT: &str = "to=functions.";

/// Splits `reply` into content and calls.
pub fn parse(reply: &str) -> ParsedReply {
    let mut calls = Vec::new();
    let mut content = Vec::new();
    let mut rest = reply;
    while let Some(m) = rest.find(MESSAGE) {
        let header = &rest[..m];
        let body_start = m + MESSAGE.len();
        let body_end = ENDS
            .iter()
            .filter_map(|e| rest[body_start..].find(e).map(|i| (i, e.len())))
            .min();
        let (body, next) = match body_end {
            Some((i, len)) => (&rest[body_start..body_start + i], body_start + i + len),
            None => (&rest[body_start..], rest.len()),
        };
        match recipient(header) {
            Some(name) => {
                let args = serde_json::from_str(body.trim())
                    .ok()
                    .and_then(|v| arguments_text(&v));
                match args {
                    Some(arguments) => calls.push(ToolCall { name, arguments }),
                    None => content.push(body),
                }
            }
            None if !header.contains("<|channel|>analysis") => content.push(body),
            None => {}
        }
        rest = &rest[next..];
    }
    ParsedReply {
        content: join_content(&content),
        calls,
    }
}

/// The function a message header addresses (`to=functions.NAME`).
fn recipient(header: &str) -> Option<String> {
    let at = header.find(RECIPIENT)? + RECIPIENT.len();
    let name: String = header[at..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '<')
        .collect();
    (!name.is_empty()).then_some(name)
}
