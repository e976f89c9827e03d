//! Gemma 4 tool calls: `<|tool_call>call:NAME{key:value,...}<tool_call|>`, where a value is a
//! string quoted by `<|"|>`, a number, `true`/`false`/`null`, a `{...}` dict with bare keys or a
//! `[...]` list. The arguments are turned into JSON; the text outside the calls is the content.

use super::{join_content, ParsedReply, ToolCall};
use serde_json::{Map, Number, Value};

const OPEN: &str = "<|tool_call>call:";
const CLOSE: &str = "<tool_call|>";
const QUOTE: &str = "<|\"|>";

/// Splits `reply` into content and calls.
pub fn parse(reply: &str) -> ParsedReply {
    let mut calls = Vec::new();
    let mut content = Vec::new();
    let mut rest = reply;
    while let Some(start) = rest.find(OPEN) {
        let after_open = &rest[start + OPEN.len()..];
        match call(after_open) {
            Some((c, tail)) => {
                content.push(&rest[..start]);
                calls.push(c);
                rest = tail;
            }
            None => {
                content.push(&rest[..start + OPEN.len()]);
                rest = after_open;
            }
        }
    }
    content.push(rest);
    ParsedReply {
        content: join_content(&content)
            .replace("<|channel>", "")
            .replace("<channel|>", ""),
        calls,
    }
}

/// `NAME{...}<tool_call|>` at the start of `s`, and the text after it.
fn call(s: &str) -> Option<(ToolCall, &str)> {
    let brace = s.find('{')?;
    let name = s[..brace].trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    let mut p = Parser { s: &s[brace..] };
    let args = p.value()?;
    let tail = p.s.trim_start().strip_prefix(CLOSE).unwrap_or(p.s);
    Some((
        ToolCall {
            name: name.to_string(),
            arguments: args.to_string(),
        },
        tail,
    ))
}

/// A recursive-descent reader of Gemma 4's argument syntax.
struct Parser<'a> {
    s: &'a str,
}

impl<'a> Parser<'a> {
    fn eat(&mut self, token: &str) -> bool {
        self.s = self.s.trim_start();
        match self.s.strip_prefix(token) {
            Some(rest) => {
                self.s = rest;
                true
            }
            None => false,
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.s = self.s.trim_start();
        if self.eat(QUOTE) {
            let end = self.s.find(QUOTE)?;
            let text = self.s[..end].to_string();
            self.s = &self.s[end + QUOTE.len()..];
            return Some(Value::String(text));
        }
        if self.eat("{") {
            return self.dict();
        }
        if self.eat("[") {
            return self.list();
        }
        for (word, v) in [
            ("true", Value::Bool(true)),
            ("false", Value::Bool(false)),
            ("null", Value::Null),
        ] {
            if self.eat(word) {
                return Some(v);
            }
        }
        let len = self
            .s
            .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
            .unwrap_or(self.s.len());
        let number: Number = self.s[..len].parse().ok()?;
        self.s = &self.s[len..];
        Some(Value::Number(number))
    }

    fn dict(&mut self) -> Option<Value> {
        let mut map = Map::new();
        if self.eat("}") {
            return Some(Value::Object(map));
        }
        loop {
            self.s = self.s.trim_start();
            let colon = self.s.find(':')?;
            let key = self.s[..colon].trim();
            if key.is_empty() || key.contains('}') {
                return None;
            }
            let key = key.to_string();
            self.s = &self.s[colon + 1..];
            let v = self.value()?;
            map.insert(key, v);
            if self.eat("}") {
                return Some(Value::Object(map));
            }
            if !self.eat(",") {
                return None;
            }
        }
    }

    fn list(&mut self) -> Option<Value> {
        let mut items = Vec::new();
        if self.eat("]") {
            return Some(Value::Array(items));
        }
        loop {
            items.push(self.value()?);
            if self.eat("]") {
                return Some(Value::Array(items));
            }
            if !self.eat(",") {
                return None;
            }
        }
    }
}
