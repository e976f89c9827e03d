//! Unit tests on a small byte-level vocabulary: random walks through the masks of JSON schemas,
//! a Lark grammar and a tool call end in text the grammar describes; bad grammars are errors.

use std::sync::Arc;

use ggml_core::gguf::{GgufFile, GgufWriter, Value as Meta};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::{json, Value};

use super::tools::{call_grammar, ToolSpec};
use super::{ConstraintEngine, ConstraintError, Grammar};
use crate::tokenizer::Tokenizer;
use crate::tool_calls::ToolFormat;

/// GPT-2's byte-to-character table: printable bytes stand for themselves, the others for
/// characters from U+0100 on.
fn byte_chars() -> Vec<char> {
    let mut next = 256u32;
    (0u32..256)
        .map(|b| {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            if printable {
                char::from_u32(b).unwrap()
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

/// The 256 bytes, a few merged JSON pieces, `<|im_end|>` (control, EOS) and `<tool_call>`,
/// `</tool_call>` (user-defined, as in Qwen2.5).
fn tokenizer() -> Arc<Tokenizer> {
    let chars = byte_chars();
    let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let mut types = vec![1i32; 256];
    let q = chars[b'"' as usize];
    let merged = [format!("{q}:"), format!("{{{q}"), "tr".into(), "ue".into()];
    let merges: Vec<String> = [
        format!("{q} :"),
        format!("{{ {q}"),
        "t r".into(),
        "u e".into(),
    ]
    .to_vec();
    for t in &merged {
        tokens.push(t.clone());
        types.push(1);
    }
    tokens.push("<|im_end|>".into());
    types.push(3);
    for t in ["<tool_call>", "</tool_call>"] {
        tokens.push(t.into());
        types.push(4);
    }
    let eos = tokens.iter().position(|t| t == "<|im_end|>").unwrap() as u32;
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", Meta::from("gpt2"));
    w.set("tokenizer.ggml.pre", Meta::from("qwen2"));
    let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    w.set("tokenizer.ggml.tokens", Meta::from(token_refs));
    w.set("tokenizer.ggml.token_type", Meta::from(types));
    let merge_refs: Vec<&str> = merges.iter().map(String::as_str).collect();
    w.set("tokenizer.ggml.merges", Meta::from(merge_refs));
    w.set("tokenizer.ggml.eos_token_id", Meta::U32(eos));
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    Arc::new(Tokenizer::from_gguf(&file).unwrap())
}

/// Follows `grammar` with uniformly random allowed tokens (an end token only when nothing else is
/// allowed, so that walks explore) until it is complete or ends; the text, or the error.
fn walk(engine: &ConstraintEngine, tok: &Tokenizer, grammar: &Grammar, seed: u64) -> String {
    let mut c = engine.compile(grammar).unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut ids = Vec::new();
    for _ in 0..2000 {
        c.ready().unwrap();
        let allowed: Vec<u32> = (0..tok.n_vocab() as u32).filter(|&t| c.allows(t)).collect();
        assert!(!allowed.is_empty(), "no token allowed after {ids:?}");
        let text: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|&t| !tok.is_eog(t))
            .collect();
        if text.is_empty() {
            break;
        }
        let t = text[rng.gen_range(0..text.len())];
        ids.push(t);
        if c.advance(t).unwrap() {
            assert!(c.is_complete());
            break;
        }
    }
    String::from_utf8(tok.detokenize(&ids, false, false)).unwrap()
}

#[test]
fn json_schema_walks_give_valid_json() {
    let tok = tokenizer();
    let engine = ConstraintEngine::new(tok.clone()).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 4},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        },
        "required": ["name", "age", "ok", "tags"],
        "additionalProperties": false,
    });
    for seed in 0..8 {
        let text = walk(&engine, &tok, &Grammar::JsonSchema(schema.clone()), seed);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v["name"].as_str().unwrap().chars().count() <= 4, "{text}");
        let age = v["age"].as_i64().unwrap();
        assert!((0..=120).contains(&age), "{text}");
        assert!(v["ok"].is_boolean(), "{text}");
        let tags = v["tags"].as_array().unwrap();
        assert!(tags.len() <= 2 && tags.iter().all(|t| t == "a" || t == "b"));
        assert_eq!(v.as_object().unwrap().len(), 4, "{text}");
    }
}

#[test]
fn json_object_and_lark() {
    let tok = tokenizer();
    let engine = ConstraintEngine::new(tok.clone()).unwrap();
    let lark = Grammar::Lark("start: \"yes\" | \"no\" | \"maybe \" /[0-9]/".into());
    for seed in 0..6 {
        let text = walk(&engine, &tok, &lark, seed);
        let digit = text
            .strip_prefix("maybe ")
            .map(|d| d.len() == 1 && d.as_bytes()[0].is_ascii_digit());
        assert!(
            text == "yes" || text == "no" || digit == Some(true),
            "{text:?}"
        );
    }
    // An object's walk may go on for long: its first token is `{` or `{"`.
    let mut c = engine.compile(&Grammar::JsonObject).unwrap();
    let open = tok.encode("{", false, false)[0];
    let quote_open = tok.encode("{\"", false, false)[0];
    let allowed: Vec<u32> = (0..tok.n_vocab() as u32).filter(|&t| c.allows(t)).collect();
    assert_eq!(allowed, [open.min(quote_open), open.max(quote_open)]);
    assert!(!c.advance(open).unwrap());
    c.ready().unwrap();
    assert!(c.allows(tok.encode("}", false, false)[0]));
    assert!(!c.allows(tok.encode("x", false, false)[0]));
}

#[test]
fn the_end_token_comes_only_where_the_grammar_may_end() {
    let tok = tokenizer();
    let engine = ConstraintEngine::new(tok.clone()).unwrap();
    let eos = tok.eos().unwrap();
    let mut c = engine
        .compile(&Grammar::Lark("start: /a+/".into()))
        .unwrap();
    assert!(!c.allows(eos));
    let a = tok.encode("a", false, false)[0];
    assert!(!c.advance(a).unwrap());
    c.ready().unwrap();
    assert!(c.allows(eos) && c.allows(a));
    let e = c.advance(tok.encode("b", false, false)[0]).unwrap_err();
    assert!(matches!(e, ConstraintError::Rejected { .. }), "{e}");
}

#[test]
fn bad_grammars_are_errors() {
    let tok = tokenizer();
    let engine = ConstraintEngine::new(tok).unwrap();
    let cases = [
        Grammar::JsonSchema(json!({"type": "no such type"})),
        Grammar::JsonSchema(json!({"type": "string", "minLength": 5, "maxLength": 2})),
        Grammar::Lark("start: ::= \"a\"".into()),
        Grammar::Lark("start: undefined_rule".into()),
    ];
    for g in cases {
        let e = engine.compile(&g).unwrap_err();
        assert!(
            matches!(
                e,
                ConstraintError::Invalid { .. } | ConstraintError::Impossible { .. }
            ),
            "{g:?}: {e}"
        );
        assert!(!e.to_string().is_empty());
    }
}

#[test]
fn tool_call_grammar_gives_a_parsable_call() {
    let tok = tokenizer();
    let engine = ConstraintEngine::new(tok.clone()).unwrap();
    let tools = [
        ToolSpec {
            name: "get_weather".into(),
            parameters: Some(json!({
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 6}},
                "required": ["city"],
                "additionalProperties": false,
            })),
        },
        ToolSpec {
            name: "now".into(),
            parameters: Some(
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            ),
        },
    ];
    let any = call_grammar(
        ToolFormat::Llama3,
        &[ToolSpec {
            name: "f".into(),
            parameters: None,
        }],
        true,
    );
    assert!(matches!(any, Some(Grammar::Lark(ref g)) if g.contains("\"parameters\"")));
    assert!(call_grammar(ToolFormat::Gemma4, &tools, false).is_none());
    let g = call_grammar(ToolFormat::Hermes, &tools, false).unwrap();
    for seed in 0..6 {
        let text = walk(&engine, &tok, &g, seed);
        let parsed = ToolFormat::Hermes.parse(&text);
        assert_eq!(parsed.calls.len(), 1, "{text:?}");
        let call = &parsed.calls[0];
        let args: Value = serde_json::from_str(&call.arguments).unwrap();
        match call.name.as_str() {
            "get_weather" => assert!(args["city"].is_string(), "{text}"),
            "now" => assert_eq!(args, json!({}), "{text}"),
            other => panic!("unknown tool {other} in {text:?}"),
        }
    }
}
