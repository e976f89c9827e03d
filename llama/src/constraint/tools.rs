//! The grammar of a forced tool call (`tool_choice: "required"` or one named function): the reply
//! is the call syntax of the template's family around a JSON object whose `name` is one of the
//! tools and whose arguments follow that tool's `parameters` schema.
//!
//! Families whose calls are JSON can be constrained: Hermes (`<tool_call>\n{"name", "arguments"}\n
//! </tool_call>`, one or more) and Llama 3 (a bare `{"name", "parameters"}` object). Harmony and
//! Gemma 4 write calls in their own syntax and get no grammar.

use serde_json::{json, Value};

use crate::tool_calls::ToolFormat;

use super::{compact_json, Grammar};

/// One tool as the grammar sees it: its name and its parameters' JSON schema.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// The `parameters` schema; `None` means any object.
    pub parameters: Option<Value>,
}

/// Whether calls of `format` can be constrained.
pub fn can_constrain(format: ToolFormat) -> bool {
    matches!(format, ToolFormat::Hermes | ToolFormat::Llama3)
}

/// The grammar of a reply that calls one of `tools` (`several`: one call or more, else exactly
/// one) in `format`'s syntax; `None` for a format that cannot be constrained or no tools.
pub fn call_grammar(format: ToolFormat, tools: &[ToolSpec], several: bool) -> Option<Grammar> {
    if tools.is_empty() || !can_constrain(format) {
        return None;
    }
    let args_key = if format == ToolFormat::Llama3 {
        "parameters"
    } else {
        "arguments"
    };
    let options: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": t.name},
                    args_key: t.parameters.clone().unwrap_or_else(|| json!({"type": "object"})),
                },
                "required": ["name", args_key],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = compact_json(json!({"anyOf": options}));
    let call = match format {
        ToolFormat::Hermes => format!("\"<tool_call>\\n\" %json {schema} \"\\n</tool_call>\""),
        _ => format!("%json {schema}"),
    };
    let start = if several {
        "start: call (\"\\n\" call)*"
    } else {
        "start: call"
    };
    Some(Grammar::Lark(format!("{start}\ncall: {call}\n")))
}
