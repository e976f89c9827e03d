//! The OpenAI API surface beyond plain generation, end to end on 127.0.0.1 with the tiny llama
//! fixture: prompt log-likelihoods (`echo` + `logprobs`, `max_tokens: 0`) against a log-softmax of
//! the logits computed through the llama library directly, chat `logprobs` / `top_logprobs`
//! (streaming too), `logit_bias`, `n` choices sharing one evaluation of the prompt, unknown roles
//! and fields refused, `/tokenize`, `/detokenize`, `/props`, `tools` refused by a template
//! without tool syntax, and forced tool calls constrained to the tool's schema.

mod api;
mod common;
mod tool_model;

use api::{post, start, stream_events};
use common::{arch_fixture, single};
use llama::runtime::{Outputs, Session, SessionOptions};
use llama::tokenizer::Tokenizer;
use llama::Model;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use tool_model::{tool_model, TOOL_TEMPLATE};

/// A metric's value from `/metrics`.
async fn metric(base: &str, name: &str) -> u64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("ggml_tp_{name} ")))
        .unwrap_or_else(|| panic!("no metric {name}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// The log-probability of every prompt token after the first, from the llama library's logits
/// (f64 log-softmax), and the prompt's tokens.
fn library_logprobs(model: &PathBuf, prompt: &str) -> (Vec<u32>, Vec<f64>) {
    let m = Arc::new(Model::load(model, &single()).unwrap());
    let file = ggml_core::gguf::GgufFile::open(model).unwrap();
    let tokens = Tokenizer::from_gguf(&file)
        .unwrap()
        .encode(prompt, true, true);
    let opts = SessionOptions {
        n_ctx: 256,
        ..SessionOptions::default()
    };
    let logits = Session::new(m, opts)
        .unwrap()
        .eval(&tokens, Outputs::All)
        .unwrap();
    let lps = (1..tokens.len())
        .map(|i| {
            let row = logits.row(i - 1);
            let max = row.iter().fold(f64::MIN, |a, &b| a.max(f64::from(b)));
            let z: f64 = row.iter().map(|&l| (f64::from(l) - max).exp()).sum();
            f64::from(row[tokens[i] as usize]) - max - z.ln()
        })
        .collect();
    (tokens, lps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_log_likelihoods_match_the_library() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let prompt = "The quick brown fox jumps over the lazy dog, then naps";
    let (tokens, want) = library_logprobs(&model, prompt);
    assert!(tokens.len() > 8, "{} tokens", tokens.len());
    // Chunks of 5 prompt tokens: the log-likelihoods cross chunk boundaries.
    let base = start(model, |c| c.prompt_chunk = 5).await;
    let body =
        json!({"prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 1, "temperature": 0});
    let (status, v) = post(&base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let lp = &c["logprobs"];
    let got = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(got.len(), tokens.len());
    assert!(got[0].is_null());
    for (i, (g, w)) in got[1..].iter().zip(&want).enumerate() {
        let g = g.as_f64().unwrap();
        assert!((g - w).abs() < 1e-4, "token {}: {g} vs {w}", i + 1);
    }
    // The tokens' texts add up to the echoed text, at their offsets.
    let text = c["text"].as_str().unwrap();
    let pieces: String = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(pieces.trim_start(), text.trim_start());
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[0] == 0);
    assert_eq!(lp["top_logprobs"][1].as_object().unwrap().len(), 1);
    assert!(lp["top_logprobs"][0].is_null());

    // Echo with generated tokens: the prompt's entries, then one per generated token, each with
    // its top alternatives; the chosen greedy token is the most likely.
    let body =
        json!({"prompt": prompt, "max_tokens": 3, "echo": true, "logprobs": 2, "temperature": 0});
    let (status, v) = post(&base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let n = tokens.len() + v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), n);
    let last = lp["top_logprobs"][n - 1].as_object().unwrap();
    assert_eq!(last.len(), 2);
    let best = last
        .values()
        .map(|x| x.as_f64().unwrap())
        .fold(f64::MIN, f64::max);
    assert!((lp["token_logprobs"][n - 1].as_f64().unwrap() - best).abs() < 1e-9);
    assert!(v["choices"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with(prompt));
    let bad = json!({"prompt": "x", "max_tokens": 0});
    assert_eq!(post(&base, "/v1/completions", &bad).await.0, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_logprobs_and_logit_bias() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let base = start(model.clone(), |_| {}).await;
    let chat = "/v1/chat/completions";
    let messages = json!([{"role": "user", "content": "Tell me a story"}]);
    let body = json!({"messages": messages, "max_tokens": 5, "temperature": 0,
        "logprobs": true, "top_logprobs": 3});
    let (status, v) = post(&base, chat, &body).await;
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let mut first = None;
    for e in content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely, and the alternatives are in order.
        assert_eq!(top[0]["token"], e["token"]);
        assert_eq!(top[0]["logprob"], e["logprob"]);
        assert!(top
            .windows(2)
            .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
        let bytes: Vec<u8> = e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            e["token"].as_str().unwrap()
        );
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        first.get_or_insert_with(|| e["token"].as_str().unwrap().to_string());
    }
    // Streaming gives the same entries, chunk by chunk.
    let mut streamed = Vec::new();
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    for ev in stream_events(&base, chat, &sbody).await {
        if let Some(c) = ev["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(c.iter().cloned());
        }
    }
    assert_eq!(streamed.len(), content.len());
    for (s, c) in streamed.iter().zip(content) {
        // The second request reuses the cached prompt: its logits may differ in rounding.
        assert_eq!(s["token"], c["token"]);
        assert!((s["logprob"].as_f64().unwrap() - c["logprob"].as_f64().unwrap()).abs() < 1e-4);
        assert_eq!(s["top_logprobs"].as_array().unwrap().len(), 3);
    }

    // The first greedy token banned: another one comes first; a +100 bias forces a token.
    let file = ggml_core::gguf::GgufFile::open(&model).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let first = first.unwrap();
    let bias: serde_json::Map<String, Value> = (0..tok.n_vocab() as u32)
        .filter(|&id| tok.token_to_piece(id) == first.as_bytes())
        .map(|id| (id.to_string(), json!(-100)))
        .collect();
    assert!(!bias.is_empty());
    let mut b = body.clone();
    b["logit_bias"] = Value::Object(bias);
    let (status, v) = post(&base, chat, &b).await;
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_ne!(content[0]["token"].as_str().unwrap(), first);
    let forced = (100..tok.n_vocab() as u32)
        .find(|&id| tok.token_to_piece(id).len() > 2 && !tok.is_eog(id))
        .unwrap();
    b["logit_bias"] = json!({ forced.to_string(): 100 });
    b["max_tokens"] = json!(3);
    let (_, v) = post(&base, chat, &b).await;
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    for e in content {
        let bytes: Vec<u8> = e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(bytes, tok.token_to_piece(forced));
    }
    for bad in [json!({"x": 1}), json!({"99999999": 1}), json!({"5": 101})] {
        let mut b = body.clone();
        b["logit_bias"] = bad;
        let (status, v) = post(&base, chat, &b).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], "logit_bias");
    }
    let mut b = body.clone();
    b["top_logprobs"] = json!(21);
    assert_eq!(
        post(&base, chat, &b).await.1["error"]["param"],
        "top_logprobs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_share_one_prompt_evaluation() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let base = start(model, |c| c.n_slots = 4).await;
    let cmpl = "/v1/completions";
    let body = json!({"prompt": "Once upon a time in a land far away", "max_tokens": 6,
        "temperature": 1.0, "top_k": 0, "min_p": 0, "seed": 11, "n": 3, "cache_prompt": false});
    let before = metric(&base, "batch_tokens_total").await;
    let (status, v) = post(&base, cmpl, &body).await;
    assert_eq!(status, 200, "{v}");
    let evaluated = metric(&base, "batch_tokens_total").await - before;
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    // Every choice feeds back each sampled token but the last of a `length` finish; the prompt
    // is evaluated once for the three.
    let total = v["usage"]["completion_tokens"].as_u64().unwrap();
    let lengths = choices
        .iter()
        .filter(|c| c["finish_reason"] == "length")
        .count() as u64;
    assert_eq!(evaluated, prompt_tokens + total - lengths);
    let mut texts = Vec::new();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        texts.push(c["text"].as_str().unwrap().to_string());
    }
    // The choices draw distinct deterministic streams: the same request answers the same, and
    // choice 0 is what the request alone (n = 1) answers.
    let (_, again) = post(&base, cmpl, &body).await;
    let again: Vec<&str> = again["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(again, texts);
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "{texts:?}");
    let mut alone = body.clone();
    alone["n"] = json!(1);
    let (_, a) = post(&base, cmpl, &alone).await;
    assert_eq!(a["choices"][0]["text"], texts[0]);

    // Streaming: deltas under each index, one finish per choice, then the usage.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
        "n": 2, "seed": 3, "stream": true, "stream_options": {"include_usage": true}});
    let events = stream_events(&base, "/v1/chat/completions", &chat).await;
    let mut finishes = [0, 0];
    let mut roles = [0, 0];
    for e in &events {
        for c in e["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            roles[i] += usize::from(c["delta"]["role"] == "assistant");
            finishes[i] += usize::from(!c["finish_reason"].is_null());
        }
    }
    assert_eq!((roles, finishes), ([1, 1], [1, 1]));
    assert_eq!(events.last().unwrap()["choices"], json!([]));
    let mut too_many = body.clone();
    too_many["n"] = json!(5);
    let (status, v) = post(&base, cmpl, &too_many).await;
    assert_eq!((status, &v["error"]["param"]), (400, &json!("n")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_roles_and_fields_are_refused() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let base = start(model, |_| {}).await;
    let chat = "/v1/chat/completions";
    let cases = [
        (
            chat,
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]}),
            "messages[1].role",
            "wizard",
        ),
        (
            chat,
            json!({"messages": [{"role": "user", "content": "a"}], "temprature": 0.5}),
            "temprature",
            "unrecognized",
        ),
        (
            chat,
            json!({"messages": [{"role": "user", "content": "a"}], "functions": []}),
            "functions",
            "not supported",
        ),
        (
            chat,
            json!({"messages": [{"role": "user", "content": "a"}],
                "tools": [{"type": "function", "function": {"name": "f"}}]}),
            "tools",
            "tool-call syntax",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "suffix": "b"}),
            "suffix",
            "not supported",
        ),
    ];
    for (path, body, param, needle) in cases {
        let (status, v) = post(&base, path, &body).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{msg}");
    }
    // Known roles, ignored OpenAI fields and `null`s pass.
    let ok = json!({"messages": [{"role": "developer", "content": "Be brief"},
        {"role": "user", "content": "a"}], "user": "u1", "metadata": {"k": "v"},
        "response_format": null, "max_tokens": 2});
    let (status, v) = post(&base, chat, &ok).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_detokenize_and_props() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let base = start(model.clone(), |c| c.n_slots = 3).await;
    let text = "Hello world, tokens: 12345 and ünïcödé!";
    let (status, v) = post(&base, "/tokenize", &json!({"content": text})).await;
    assert_eq!(status, 200, "{v}");
    let ids = v["tokens"].clone();
    let file = ggml_core::gguf::GgufFile::open(&model).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(ids, json!(tok.encode(text, false, true)));
    let (_, d) = post(&base, "/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(d["content"], text);
    let (_, p) = post(
        &base,
        "/tokenize",
        &json!({"content": text, "with_pieces": true}),
    )
    .await;
    let pieces = p["tokens"].as_array().unwrap();
    assert_eq!(pieces.len(), ids.as_array().unwrap().len());
    for (p, id) in pieces.iter().zip(ids.as_array().unwrap()) {
        assert_eq!(&p["id"], id);
        assert!(p["piece"].is_string() || p["piece"].is_array());
    }
    let with_bos = post(
        &base,
        "/tokenize",
        &json!({"content": text, "add_special": true}),
    )
    .await
    .1;
    assert_eq!(with_bos["tokens"], json!(tok.encode(text, true, true)));
    let (status, v) = post(&base, "/detokenize", &json!({"tokens": [99999999]})).await;
    assert_eq!((status, &v["error"]["param"]), (400, &json!("tokens")));

    let props: Value = reqwest::get(format!("{base}/props"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(props["total_slots"], 3);
    assert_eq!(props["n_ctx"], 256);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 256);
    assert_eq!(
        props["default_generation_settings"]["params"]["n_predict"],
        64
    );
    assert_eq!(props["model_path"], model.display().to_string());
    assert!(props["chat_template"]
        .as_str()
        .unwrap()
        .contains("im_start"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_and_tool_calls_reach_the_template() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let (path, tok) = tool_model(&model, "tools");
    let base = start(path.clone(), |_| {}).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let messages = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": -3}"},
    ]);
    // What the template gives, rendered here with the arguments as an object.
    let template = llama::chat::ChatTemplate::new(TOOL_TEMPLATE, "", "").unwrap();
    let mut call = llama::chat::Message::assistant("");
    call.tool_calls = Some(json!([{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]));
    let mut answer = llama::chat::Message::new("tool", "{\"temp\": -3}");
    answer.tool_call_id = Some("c1".into());
    let msgs = [llama::chat::Message::user("Weather in Oslo?"), call, answer];
    let expected = |with_tools: bool| {
        let options = llama::chat::RenderOptions {
            add_generation_prompt: true,
            tools: with_tools.then(|| tools.clone()),
            ..Default::default()
        };
        let text = template.render_with(&msgs, &options).unwrap();
        // The arguments are an object in the template, not an escaped JSON string.
        assert!(
            text.contains("<tool_call>") && text.contains("Oslo"),
            "{text}"
        );
        assert!(!text.contains("\\\""), "{text}");
        tok.encode(&text, true, true).len()
    };
    let chat = "/v1/chat/completions";
    for (choice, with_tools) in [(json!("auto"), true), (json!("none"), false)] {
        let body = json!({"messages": messages, "tools": tools, "tool_choice": choice,
            "max_tokens": 2, "temperature": 0});
        let (status, v) = post(&base, chat, &body).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(
            v["usage"]["prompt_tokens"],
            expected(with_tools),
            "{choice}"
        );
    }
    let unknown = json!({"messages": messages, "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_time"}}});
    let (status, v) = post(&base, chat, &unknown).await;
    assert_eq!((status, &v["error"]["param"]), (400, &json!("tool_choice")));
    assert!(
        v["error"]["message"].as_str().unwrap().contains("get_time"),
        "{v}"
    );
    let bad_tools = json!({"messages": messages, "tools": [{"type": "function"}]});
    let (status, v) = post(&base, chat, &bad_tools).await;
    assert_eq!((status, &v["error"]["param"]), (400, &json!("tools[0]")));
    let _ = std::fs::remove_file(&path);
}

/// `tool_choice` naming a function (or `required`) constrains even a random-weight model's reply
/// to a call of that function whose arguments follow its schema, streamed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_tool_calls_follow_the_schema() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let (path, _) = tool_model(&model, "forced-tools");
    let base = start(path.clone(), |c| {
        c.n_ctx = 1024;
        c.max_tokens = 200;
    })
    .await;
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
            "properties": {}, "additionalProperties": false}}},
    ]);
    let messages = json!([{"role": "user", "content": "Weather in Oslo?"}]);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for (seed, choice) in [(1, named.clone()), (2, named), (3, json!("required"))] {
        let body = json!({"messages": messages, "tools": tools, "tool_choice": choice,
            "seed": seed, "temperature": 1.0});
        let (status, v) = post(&base, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        let call = &c["message"]["tool_calls"][0]["function"];
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        match call["name"].as_str().unwrap() {
            "get_weather" => {
                assert!(args["city"].as_str().unwrap().chars().count() <= 8, "{v}");
                assert!((1..=7).contains(&args["days"].as_i64().unwrap()), "{v}");
            }
            name => {
                assert_eq!((name, &args), ("get_time", &json!({})), "{v}");
                assert_eq!(choice, "required");
            }
        }
    }
    let both = json!({"messages": messages, "tools": tools, "tool_choice": "required",
        "response_format": {"type": "json_object"}});
    let (status, v) = post(&base, "/v1/chat/completions", &both).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("response_format")),
        "{v}"
    );
    let _ = std::fs::remove_file(&path);
}
