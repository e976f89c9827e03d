//! Constrained answers on the server side: a request's `response_format` (OpenAI's `json_object`
//! and `json_schema`), llama-server's `grammar` (Lark syntax, as llguidance takes it) and
//! `json_schema` fields, and forced tool calls (`tool_choice: "required"` or one named function),
//! each turned into a [`Grammar`] and compiled with the model's [`ConstraintEngine`] (built the
//! first time a request needs it). A bad schema or grammar is a 400 naming the field.

use super::api::{ApiError, CommonParams};
use super::handlers::AppState;
use axum::http::StatusCode;
use llama::constraint::{Constraint, ConstraintEngine, ConstraintError, Grammar};
use serde_json::Value;

/// A request's grammar and the field it came from (for errors).
#[derive(Debug, Clone, PartialEq)]
pub struct Requested {
    pub grammar: Grammar,
    pub param: &'static str,
}

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message).with_param(param)
}

/// The grammar of `response_format`, `grammar` or `json_schema` (at most one of them).
pub fn requested(p: &CommonParams) -> Result<Option<Requested>, ApiError> {
    let mut found = Vec::new();
    if let Some(rf) = p.response_format.as_ref().filter(|v| !v.is_null()) {
        if let Some(grammar) = response_format(rf)? {
            found.push(Requested {
                grammar,
                param: "response_format",
            });
        }
    }
    if let Some(text) = &p.grammar {
        found.push(Requested {
            grammar: lark(text)?,
            param: "grammar",
        });
    }
    if let Some(schema) = p.json_schema.as_ref().filter(|v| !v.is_null()) {
        found.push(Requested {
            grammar: schema_grammar(schema, "json_schema")?,
            param: "json_schema",
        });
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|r| r.param).collect();
        return Err(bad(
            found[1].param,
            format!("only one of {} may be given", names.join(", ")),
        ));
    }
    Ok(found.pop())
}

/// OpenAI's `response_format`: `text` (no constraint), `json_object` (llama-server also takes a
/// `schema` there) or `json_schema` with `json_schema.schema`.
fn response_format(rf: &Value) -> Result<Option<Grammar>, ApiError> {
    let param = "response_format";
    let kind = rf["type"].as_str().ok_or_else(|| {
        bad(
            param,
            "response_format must be an object with a string \"type\"",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => match rf.get("schema").filter(|s| !s.is_null()) {
            Some(schema) => schema_grammar(schema, param).map(Some),
            None => Ok(Some(Grammar::JsonObject)),
        },
        "json_schema" => {
            let inner = &rf["json_schema"];
            let schema = inner.get("schema").ok_or_else(|| {
                bad(
                    "response_format.json_schema.schema",
                    "response_format of type json_schema needs json_schema.schema",
                )
            })?;
            if !inner["name"].is_null() && !inner["name"].is_string() {
                return Err(bad(
                    "response_format.json_schema.name",
                    "json_schema.name must be a string",
                ));
            }
            schema_grammar(schema, "response_format.json_schema.schema").map(Some)
        }
        other => Err(bad(
            "response_format.type",
            format!("response_format type {other:?}: one of text, json_object, json_schema"),
        )),
    }
}

/// A JSON schema: an object (or `true`, any JSON).
fn schema_grammar(schema: &Value, param: &str) -> Result<Grammar, ApiError> {
    match schema {
        Value::Object(_) => Ok(Grammar::JsonSchema(schema.clone())),
        Value::Bool(true) => Ok(Grammar::JsonSchema(serde_json::json!({}))),
        _ => Err(bad(param, "a JSON schema must be an object")),
    }
}

/// llama-server's `grammar`, in Lark syntax; GBNF (`::=` rules) is refused with a hint, as
/// llguidance does not read it.
fn lark(text: &str) -> Result<Grammar, ApiError> {
    if text.trim().is_empty() {
        return Err(bad("grammar", "the grammar is empty"));
    }
    if text.contains("::=") {
        return Err(bad(
            "grammar",
            "GBNF grammars (rules written with ::=) are not supported: write the grammar in \
             llguidance's Lark syntax (rule: expansion, e.g. start: \"yes\" | \"no\")",
        ));
    }
    Ok(Grammar::Lark(text.to_string()))
}

/// The constraint of a request: its `response_format` / `grammar` / `json_schema` (`requested`)
/// or a forced tool call (`tool_call`), not both.
pub fn constraint(
    s: &AppState,
    requested: Option<Requested>,
    tool_call: Option<Grammar>,
) -> Result<Option<Constraint>, ApiError> {
    let r = match (requested, tool_call) {
        (None, None) => return Ok(None),
        (Some(r), None) => r,
        (None, Some(grammar)) => Requested {
            grammar,
            param: "tool_choice",
        },
        (Some(r), Some(_)) => {
            return Err(bad(
                r.param,
                format!(
                    "{} cannot be combined with a forced tool call (tool_choice)",
                    r.param
                ),
            ))
        }
    };
    compile(s, &r).map(Some)
}

/// Compiles `r` with the model's engine: 400 for a grammar that is invalid or allows nothing.
fn compile(s: &AppState, r: &Requested) -> Result<Constraint, ApiError> {
    let engine = s
        .constraints
        .get_or_init(|| ConstraintEngine::new(s.tokenizer.clone()))
        .as_ref()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    engine.compile(&r.grammar).map_err(|e| match e {
        ConstraintError::Invalid { .. } | ConstraintError::Impossible { .. } => {
            bad(r.param, e.to_string())
        }
        e => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    })
}
