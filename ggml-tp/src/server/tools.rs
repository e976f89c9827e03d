//! Tool calling on the server side: checking `tools` / `tool_choice`, turning the OpenAI messages'
//! tool calls into what chat templates expect (arguments as objects), and the calls parsed from a
//! reply ([`llama::tool_calls`]) into `message.tool_calls` and streamed `delta.tool_calls`.

use super::api::{ApiError, ChatRequest};
use llama::tool_calls::{ParsedReply, ToolCall, ToolFormat};
use serde_json::{json, Value};

/// Parses the tool calls of one request's replies.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    format: ToolFormat,
    /// Calls are named `<id_prefix>_<k>`.
    id_prefix: String,
}

/// A reply's content and calls.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub content: String,
    pub calls: Vec<ToolCall>,
    id_prefix: String,
}

impl ToolCallParser {
    pub fn new(format: ToolFormat, id_prefix: String) -> ToolCallParser {
        ToolCallParser { format, id_prefix }
    }

    pub fn parse(&self, reply: &str) -> Parsed {
        let ParsedReply { content, calls } = self.format.parse(reply);
        Parsed {
            content,
            calls,
            id_prefix: self.id_prefix.clone(),
        }
    }
}

impl Parsed {
    fn call_json(&self, k: usize, c: &ToolCall) -> Value {
        json!({
            "id": format!("{}_{k}", self.id_prefix),
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        })
    }

    /// `message.tool_calls`.
    pub fn calls_json(&self) -> Value {
        let calls = self.calls.iter().enumerate();
        calls.map(|(k, c)| self.call_json(k, c)).collect()
    }

    /// One `delta.tool_calls` entry per call (each whole, with its `index`).
    pub fn delta_calls(&self) -> Vec<Value> {
        self.calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let mut v = self.call_json(k, c);
                v["index"] = json!(k);
                v
            })
            .collect()
    }
}

/// What a chat request's tools ask of the template and the reply.
#[derive(Debug, Clone, Default)]
pub struct ToolSetup {
    /// The `tools` the template gets (none for `tool_choice: "none"` or no tools).
    pub tools: Option<Value>,
    /// The family whose calls are parsed from the reply.
    pub format: Option<ToolFormat>,
}

/// Checks `tools` and `tool_choice` against the template (`source`): tools need a template that
/// reads them and whose call syntax is known; `tool_choice` may be `none`, `auto` or `required`
/// (a named function is refused: without constrained decoding it cannot be enforced).
pub fn setup(req: &ChatRequest, source: &str) -> Result<ToolSetup, ApiError> {
    let Some(tools) = req.tools.as_ref().filter(|t| !t.is_null()) else {
        return Ok(ToolSetup::default());
    };
    let list = tools
        .as_array()
        .ok_or_else(|| ApiError::bad_request("tools must be an array").with_param("tools"))?;
    for (i, t) in list.iter().enumerate() {
        let named = t["type"] == "function" && t["function"]["name"].is_string();
        if !named {
            return Err(ApiError::bad_request(format!(
                "tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\", ...}}}}"
            ))
            .with_param(format!("tools[{i}]")));
        }
    }
    match req.tool_choice.as_ref() {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "auto" || s == "required" => {}
        Some(Value::String(s)) if s == "none" => return Ok(ToolSetup::default()),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "tool_choice {other} is not supported (\"none\", \"auto\" or \"required\")"
            ))
            .with_param("tool_choice"))
        }
    }
    if list.is_empty() {
        return Ok(ToolSetup::default());
    }
    let format = ToolFormat::detect(source)
        .filter(|_| source.contains("tools"))
        .ok_or_else(|| {
            ApiError::bad_request(
                "the model's chat template has no tool-call syntax this server knows (Qwen \
                 <tool_call>, Llama 3, gpt-oss harmony, Gemma 4)",
            )
            .with_param("tools")
        })?;
    Ok(ToolSetup {
        tools: Some(tools.clone()),
        format: Some(format),
    })
}

/// An OpenAI `tool_calls` array as templates expect it: each function's `arguments` (a JSON
/// string) turned into an object; anything else is passed as it is.
pub fn template_calls(calls: &Value) -> Value {
    let Some(list) = calls.as_array() else {
        return calls.clone();
    };
    list.iter()
        .map(|c| {
            let mut c = c.clone();
            if let Some(Value::String(args)) = c.pointer("/function/arguments") {
                if let Ok(v) = serde_json::from_str::<Value>(args) {
                    c["function"]["arguments"] = v;
                }
            }
            c
        })
        .collect()
}
