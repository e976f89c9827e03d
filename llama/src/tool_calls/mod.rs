//! Tool calls parsed back out of a model's reply, one parser per chat-template family, the family
//! detected from the template's text ([`ToolFormat::detect`]):
//!
//! * [`hermes`]: Qwen2.5 / Qwen3 (and other Hermes-style templates), `<tool_call>{json}</tool_call>`;
//! * [`llama3`]: Llama 3.1+, a bare JSON object `{"name", "parameters"}` (after `<|python_tag|>`);
//! * [`harmony`]: gpt-oss, `<|channel|>commentary to=functions.NAME ... <|message|>{json}<|call|>`;
//! * [`gemma4`]: Gemma 4, `<|tool_call>call:NAME{key:value,...}<tool_call|>` (strings quoted by
//!   `<|"|>`).
//!
//! The reply must be decoded with its special tokens' text (the markers of harmony and Gemma 4 are
//! control tokens). A call whose arguments do not parse stays in the content as text.

pub mod gemma4;
pub mod harmony;
pub mod hermes;
pub mod llama3;

use serde_json::Value;

/// A template family's tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Harmony,
    Gemma4,
}

/// One call: the function's name and its arguments as a JSON object's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// A reply split into its text and its tool calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedReply {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

impl ToolFormat {
    /// The family of a chat template that renders `tools`, from markers in its text; `None` when
    /// it has no tool syntax this module knows.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("<|channel|>") {
            Some(ToolFormat::Harmony)
        } else if template.contains("<|tool_call>") {
            Some(ToolFormat::Gemma4)
        } else if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if template.contains("<|start_header_id|>") && template.contains("tools") {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }

    /// Splits `reply` (the generated text, special tokens included) into content and calls.
    pub fn parse(self, reply: &str) -> ParsedReply {
        match self {
            ToolFormat::Hermes => hermes::parse(reply),
            ToolFormat::Llama3 => llama3::parse(reply),
            ToolFormat::Harmony => harmony::parse(reply),
            ToolFormat::Gemma4 => gemma4::parse(reply),
        }
    }
}

/// The arguments of a call as JSON text: an object as it is, a string holding JSON parsed first;
/// `None` for anything else.
fn arguments_text(v: &Value) -> Option<String> {
    match v {
        Value::Object(_) => Some(v.to_string()),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(o @ Value::Object(_)) => Some(o.to_string()),
            _ => None,
        },
        Value::Null => Some("{}".to_string()),
        _ => None,
    }
}

/// A call from a JSON object `{"name", <args_key>}` (the first of `args_keys` present).
fn call_from_json(v: &Value, args_keys: &[&str]) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = args_keys
        .iter()
        .find_map(|k| v.get(*k))
        .unwrap_or(&Value::Null);
    Some(ToolCall {
        name,
        arguments: arguments_text(args)?,
    })
}

/// The first JSON value at the start of `text` (after whitespace) and the rest after it.
fn leading_json(text: &str) -> Option<(Value, &str)> {
    let trimmed = text.trim_start();
    let mut it = serde_json::Deserializer::from_str(trimmed).into_iter::<Value>();
    let v = it.next()?.ok()?;
    Some((v, &trimmed[it.byte_offset()..]))
}

/// Joins content pieces, trimming the whitespace around the calls.
fn join_content(parts: &[&str]) -> String {
    parts
        .iter()
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}
