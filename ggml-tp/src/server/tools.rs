//! Tool calling on the server side: checking `tools` / `tool_choice`, turning the OpenAI messages'
//! tool calls into what chat templates expect (arguments as objects), and the calls parsed from a
//! reply ([`llama::tool_calls`]) into `message.tool_calls` and streamed `delta.tool_calls`.
//! `tool_choice: "required"` or a named function constrains the reply to a call whose arguments
//! follow the tool's `parameters` schema ([`llama::constraint::tools`]) where the template's call
//! syntax is JSON (Hermes / Qwen, Llama 3).

use super::api::{ApiError, ChatRequest};
use llama::constraint::tools::{call_grammar, can_constrain, ToolSpec};
use llama::constraint::Grammar;
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
    /// The grammar of a forced call (`required` or a named function).
    pub grammar: Option<Grammar>,
}

/// What `tool_choice` asks for.
enum Choice {
    Auto,
    Required,
    Named(String),
}

/// Parses `tool_choice`; `None` for `"none"`.
fn choice(v: Option<&Value>) -> Result<Option<Choice>, ApiError> {
    let bad = |other: &Value| {
        ApiError::bad_request(format!(
            "tool_choice {other} is not supported (\"none\", \"auto\", \"required\" or \
             {{\"type\": \"function\", \"function\": {{\"name\": ...}}}})"
        ))
        .with_param("tool_choice")
    };
    match v {
        None | Some(Value::Null) => Ok(Some(Choice::Auto)),
        Some(Value::String(s)) if s == "auto" => Ok(Some(Choice::Auto)),
        Some(Value::String(s)) if s == "required" => Ok(Some(Choice::Required)),
        Some(Value::String(s)) if s == "none" => Ok(None),
        Some(v @ Value::Object(_)) if v["type"] == "function" => {
            let name = v["function"]["name"].as_str().ok_or_else(|| bad(v))?;
            Ok(Some(Choice::Named(name.to_string())))
        }
        Some(other) => Err(bad(other)),
    }
}

/// Checks `tools` and `tool_choice` against the template (`source`): tools need a template that
/// reads them and whose call syntax is known; `tool_choice` may be `none`, `auto`, `required` or
/// a named function. `required` and a named function constrain the reply to a call where the
/// call syntax is JSON; elsewhere `required` is left to the model and a named function refused.
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
    let Some(choice) = choice(req.tool_choice.as_ref())? else {
        return Ok(ToolSetup::default());
    };
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
    let specs = list.iter().map(|t| ToolSpec {
        name: t["function"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        parameters: t["function"].get("parameters").cloned(),
    });
    let grammar = match choice {
        Choice::Auto => None,
        Choice::Required => call_grammar(format, &specs.collect::<Vec<_>>(), true),
        Choice::Named(name) => {
            let named: Vec<ToolSpec> = specs.filter(|t| t.name == name).collect();
            if named.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "tool_choice names the function {name:?}, which is not in tools"
                ))
                .with_param("tool_choice"));
            }
            if !can_constrain(format) {
                return Err(ApiError::bad_request(format!(
                    "tool_choice naming a function is enforced only for JSON tool calls (Qwen \
                     <tool_call>, Llama 3); this template's calls are {format:?}"
                ))
                .with_param("tool_choice"));
            }
            call_grammar(format, &named, false)
        }
    };
    Ok(ToolSetup {
        tools: Some(tools.clone()),
        format: Some(format),
        grammar,
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
