//! The JSON of log-probabilities: chat's `logprobs.content[] = {token, logprob, bytes,
//! top_logprobs: [{token, logprob, bytes}]}` and the legacy completions object `{tokens,
//! token_logprobs, top_logprobs, text_offset}` (with `echo`, the prompt's tokens first, the very
//! first one without a log-probability). Token texts are the tokens' pieces (lossy UTF-8), `bytes`
//! their raw bytes.

use llama::sampling::TokenLogProbs;
use llama::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// A token's text and bytes.
fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_to_piece(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat's entries of `logprobs.content` for `lps`.
pub fn chat_entries(tok: &Tokenizer, lps: &[TokenLogProbs]) -> Vec<Value> {
    let entry = |id: u32, logprob: f64| {
        let (text, bytes) = piece(tok, id);
        json!({"token": text, "logprob": logprob, "bytes": bytes})
    };
    lps.iter()
        .map(|lp| {
            let mut e = entry(lp.token, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|&(id, p)| entry(id, p)).collect();
            e
        })
        .collect()
}

/// Chat's `logprobs` object of `lps`.
pub fn chat(tok: &Tokenizer, lps: &[TokenLogProbs]) -> Value {
    json!({"content": chat_entries(tok, lps), "refusal": null})
}

/// The legacy completions `logprobs` object, built token by token; `text_offset` counts the
/// characters of the answer's text before each token (the echoed prompt included).
#[derive(Debug, Default)]
pub struct Legacy {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
    /// Characters of the text so far.
    offset: usize,
}

impl Legacy {
    /// The echoed prompt `tokens`, whose log-probabilities (of tokens 1..) are `lps`.
    pub fn push_prompt(&mut self, tok: &Tokenizer, tokens: &[u32], lps: &[TokenLogProbs]) {
        if let Some(&first) = tokens.first() {
            self.push_token(tok, first, None, Value::Null);
        }
        for lp in lps {
            self.push(tok, lp);
        }
    }

    /// One generated (or prompt) token.
    pub fn push(&mut self, tok: &Tokenizer, lp: &TokenLogProbs) {
        let top: Map<String, Value> = lp
            .top
            .iter()
            .map(|&(id, p)| (piece(tok, id).0, json!(p)))
            .collect();
        let top = if lp.top.is_empty() {
            Value::Null
        } else {
            Value::Object(top)
        };
        self.push_token(tok, lp.token, Some(lp.logprob), top);
    }

    fn push_token(&mut self, tok: &Tokenizer, id: u32, logprob: Option<f64>, top: Value) {
        let (text, _) = piece(tok, id);
        self.tokens.push(json!(text));
        self.token_logprobs.push(json!(logprob));
        self.top_logprobs.push(top);
        self.text_offset.push(self.offset);
        self.offset += text.chars().count();
    }

    /// The object; the entries go with it, the offset stays.
    pub fn take(&mut self) -> Value {
        json!({
            "tokens": std::mem::take(&mut self.tokens),
            "token_logprobs": std::mem::take(&mut self.token_logprobs),
            "top_logprobs": std::mem::take(&mut self.top_logprobs),
            "text_offset": std::mem::take(&mut self.text_offset),
        })
    }
}
