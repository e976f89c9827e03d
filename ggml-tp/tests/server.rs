//! The HTTP server end to end on 127.0.0.1 (an ephemeral port) with the tiny random-weight llama
//! fixtures: concurrent streaming requests with clients that disconnect midway, concurrent requests
//! batched into shared forward passes answering exactly like the same requests alone, request
//! errors, overload (503), the info endpoints, and a slot saved and restored continuing exactly like
//! the live slot, on one device and tensor parallel over two.
//!
//! Requests use `temperature: 0` (greedy) and, where answers are compared across slots,
//! `cache_prompt: false`. Where answers of batched and unbatched passes are compared, the model is
//! the fixture with Q8_0 matrices: the CPU computes each token's row bit-identically whatever else
//! is in the batch (float weights go through a blocked GEMM from 8 columns on, whose rounding
//! differs from the row kernels', which could flip a greedy near-tie).

mod common;

use backend_cpu::device::cpu_devices;
use backend_meta::MetaDevice;
use common::{arch_fixture, single};
use futures::StreamExt;
use ggml_core::backend::Device;
use ggml_core::DType;
use ggml_tp::server::{Server, ServerConfig};
use llama::Placement;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;

/// The tiny llama fixture (F32 weights), if the fixtures are present.
fn fixture() -> Option<PathBuf> {
    arch_fixture("llama")
}

/// The tiny llama fixture with Q8_0 matrices.
fn q8_fixture() -> Option<PathBuf> {
    arch_fixture("llama-q8_0")
}

fn tensor2() -> Placement {
    let devs: Vec<Arc<dyn Device>> = cpu_devices(2, 1)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    Placement::Tensor(MetaDevice::new(devs, None).unwrap())
}

/// Starts a server in the background and returns its base URL.
async fn start(
    model: PathBuf,
    placement: Placement,
    edit: impl FnOnce(&mut ServerConfig),
) -> String {
    let mut cfg = ServerConfig::new(model, placement);
    cfg.addr = "127.0.0.1:0".parse().unwrap();
    cfg.n_ctx = 512;
    cfg.max_tokens = 1000;
    edit(&mut cfg);
    let server = Server::bind(cfg).await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run());
    format!("http://{addr}")
}

async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn get_text(base: &str, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("{base}{path}")).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// A metric's value from the `/metrics` text.
async fn metric(base: &str, name: &str) -> u64 {
    let (_, text) = get_text(base, "/metrics").await;
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("ggml_tp_{name} ")))
        .unwrap_or_else(|| panic!("no metric {name} in {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// The request body of prompt `i`: completions for even `i`, chat for odd.
fn body(i: usize, max_tokens: usize, stream: bool) -> (&'static str, Value) {
    let mut b = json!({
        "max_tokens": max_tokens,
        "temperature": 0,
        "cache_prompt": false,
        "stream": stream,
        "stream_options": {"include_usage": true},
    });
    if i.is_multiple_of(2) {
        b["prompt"] = json!(format!("The story number {i} begins"));
        ("/v1/completions", b)
    } else {
        b["messages"] = json!([{"role": "user", "content": format!("Tell me tale {i}")}]);
        ("/v1/chat/completions", b)
    }
}

/// The text of a non-streaming answer.
fn answer_text(v: &Value) -> String {
    let c = &v["choices"][0];
    c["text"]
        .as_str()
        .or(c["message"]["content"].as_str())
        .unwrap()
        .to_string()
}

/// Reads an SSE stream to the end: the concatenated text, the finish reason, the usage chunk,
/// and whether `[DONE]` came last. With `stop_after` chunks, drops the response there instead.
async fn read_stream(
    base: &str,
    path: &str,
    body: &Value,
    stop_after: Option<usize>,
) -> (String, Option<String>, Option<Value>, bool) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let mut stream = r.bytes_stream();
    let (mut buf, mut text, mut finish, mut usage, mut done) =
        (String::new(), String::new(), None, None, false);
    let mut chunks = 0;
    while let Some(bytes) = stream.next().await {
        buf.push_str(std::str::from_utf8(&bytes.unwrap()).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let data = event
                .trim_end()
                .strip_prefix("data: ")
                .expect("a data line");
            assert!(!done, "data after [DONE]");
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_str(data).unwrap();
            assert!(v.get("error").is_none(), "error chunk {v}");
            chunks += 1;
            if let Some(u) = v.get("usage") {
                usage = Some(u.clone());
            }
            if let Some(c) = v["choices"].get(0) {
                let t = c["text"].as_str().or(c["delta"]["content"].as_str());
                text.push_str(t.unwrap_or(""));
                if let Some(f) = c["finish_reason"].as_str() {
                    finish = Some(f.to_string());
                }
            }
            if stop_after.is_some_and(|n| chunks >= n) {
                return (text, finish, usage, done);
            }
        }
    }
    (text, finish, usage, done)
}

async fn concurrent_streams_with_disconnects(placement: Placement) {
    let Some(model) = q8_fixture() else { return };
    let base = start(model, placement, |c| {
        c.n_slots = 4;
        c.queue_len = 64;
    })
    .await;
    const N: usize = 32;
    let dropped = |i: usize| i % 4 == 3;
    // The answers every kept request must get, one at a time without streaming.
    let mut expected = Vec::new();
    for i in 0..N {
        let (path, b) = body(i, 24, false);
        let (status, v) = post(&base, path, &b).await;
        assert_eq!(status, 200, "{v}");
        expected.push((
            answer_text(&v),
            v["choices"][0]["finish_reason"].clone(),
            v["usage"].clone(),
        ));
    }
    let before = metric(&base, "requests_cancelled_total").await;
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let base = base.clone();
            tokio::spawn(async move {
                // Disconnecting clients ask for long answers and leave after two chunks.
                let (path, b) = body(i, if dropped(i) { 900 } else { 24 }, true);
                read_stream(&base, path, &b, dropped(i).then_some(2)).await
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let (text, finish, usage, done) = t.await.unwrap();
        if dropped(i) {
            continue;
        }
        let (want_text, want_finish, want_usage) = &expected[i];
        assert!(done, "request {i}: no [DONE]");
        assert_eq!(&text, want_text, "request {i}");
        assert_eq!(finish.as_deref(), want_finish.as_str(), "request {i}");
        assert_eq!(usage.as_ref(), Some(want_usage), "request {i}");
    }
    // Every slot is freed, the disconnected requests counted as cancelled.
    let mut idle = false;
    for _ in 0..200 {
        let (_, h) = get_text(&base, "/health").await;
        let h: Value = serde_json::from_str(&h).unwrap();
        if h["slots_processing"] == 0 && h["queue_length"] == 0 {
            idle = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(idle, "slots still busy after every client finished");
    let cancelled = metric(&base, "requests_cancelled_total").await;
    // Those that would have run past the two chunks their client read were all cut short.
    let long = (0..N)
        .filter(|&i| dropped(i) && expected[i].1 == "length")
        .count() as u64;
    assert!(long > 0);
    assert!(
        cancelled - before >= long,
        "{} of {long} disconnects noticed",
        cancelled - before
    );
    let total = metric(&base, "requests_total").await;
    let completed = metric(&base, "requests_completed_total").await;
    assert_eq!(total, completed + cancelled, "a request was lost");
    // The server still answers.
    let (path, b) = body(0, 24, false);
    let (status, v) = post(&base, path, &b).await;
    assert_eq!((status, answer_text(&v)), (200, expected[0].0.clone()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_with_disconnects_single_device() {
    concurrent_streams_with_disconnects(single()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_with_disconnects_tensor_parallel() {
    concurrent_streams_with_disconnects(tensor2()).await;
}

/// Passes that held more than one sequence, from the `batch_sequences` histogram.
async fn batched_passes(base: &str) -> u64 {
    let passes = metric(base, "batch_sequences_count").await;
    passes - metric(base, r#"batch_sequences_bucket{le="1"}"#).await
}

/// `N` concurrent greedy requests (F32 KV cache) share forward passes and answer exactly as each
/// does alone.
async fn batched_equals_alone(placement: Placement) {
    let Some(model) = q8_fixture() else { return };
    const N: usize = 8;
    let base = start(model, placement, |c| {
        c.n_slots = 4;
        c.kv_type = DType::F32;
    })
    .await;
    let mut alone = Vec::new();
    for i in 0..N {
        let (path, b) = body(i, 48, false);
        let (status, v) = post(&base, path, &b).await;
        assert_eq!(status, 200, "{v}");
        alone.push(v);
    }
    // One request at a time: a pass never holds two sequences.
    assert_eq!(batched_passes(&base).await, 0);
    let passes_alone = metric(&base, "batch_sequences_count").await;
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let base = base.clone();
            tokio::spawn(async move {
                let (path, b) = body(i, 48, false);
                post(&base, path, &b).await
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let (status, v) = t.await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(answer_text(&v), answer_text(&alone[i]), "request {i}");
        assert_eq!(v["usage"], alone[i]["usage"], "request {i}");
        assert_eq!(
            v["choices"][0]["finish_reason"],
            alone[i]["choices"][0]["finish_reason"]
        );
    }
    let batched = batched_passes(&base).await;
    let passes_together = metric(&base, "batch_sequences_count").await - passes_alone;
    let seqs = metric(&base, "batch_sequences_sum").await;
    println!("{batched} of {passes_together} concurrent passes held several sequences ({seqs} sequence-passes in all)");
    assert!(batched > 0, "no pass held more than one sequence");
    assert!(
        passes_together < passes_alone,
        "{passes_together} passes together, {passes_alone} alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_requests_answer_as_alone_single_device() {
    batched_equals_alone(single()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_requests_answer_as_alone_tensor_parallel() {
    batched_equals_alone(tensor2()).await;
}

async fn expect_error(base: &str, path: &str, body: reqwest::Body, status: u16, needle: &str) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), status, "{path}");
    let v: Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    assert!(v["error"]["type"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_and_info_endpoints() {
    let Some(model) = fixture() else { return };
    let base = start(model, single(), |c| {
        c.n_ctx = 64;
        c.max_tokens = 32;
        c.max_body_bytes = 4096;
    })
    .await;
    let b = |s: &str| reqwest::Body::from(s.to_string());
    let cmpl = "/v1/completions";
    let chat = "/v1/chat/completions";
    expect_error(&base, cmpl, b("{not json"), 400, "invalid request body").await;
    expect_error(&base, cmpl, b(r#"{"max_tokens": 3}"#), 400, "prompt").await;
    expect_error(
        &base,
        cmpl,
        b(r#"{"prompt": "x", "max_tokens": "many"}"#),
        400,
        "",
    )
    .await;
    expect_error(&base, chat, b(r#"{"prompt": "x"}"#), 400, "messages").await;
    expect_error(&base, chat, b(r#"{"messages": []}"#), 400, "empty").await;
    expect_error(
        &base,
        cmpl,
        b(r#"{"prompt": "x", "max_tokens": 33}"#),
        400,
        "limit",
    )
    .await;
    expect_error(&base, cmpl, b(r#"{"prompt": [5000]}"#), 400, "vocabulary").await;
    expect_error(&base, cmpl, b(r#"{"prompt": "x", "n": 9}"#), 400, "at most").await;
    expect_error(
        &base,
        cmpl,
        b(r#"{"prompt": "x", "top_p": 2}"#),
        400,
        "top_p",
    )
    .await;
    let long = format!(r#"{{"prompt": "{}"}}"#, "word ".repeat(200));
    expect_error(&base, cmpl, b(&long), 400, "context").await;
    let huge = format!(r#"{{"prompt": "{}"}}"#, "x".repeat(5000));
    expect_error(&base, cmpl, b(&huge), 413, "size limit").await;
    expect_error(&base, "/v1/nothing", b("{}"), 404, "no such endpoint").await;
    expect_error(
        &base,
        "/slots/0?action=save&filename=a",
        b(""),
        501,
        "disabled",
    )
    .await;
    expect_error(&base, "/slots/9?action=erase", b(""), 404, "does not exist").await;

    // Still serving, with the info endpoints answering.
    let (status, v) = post(
        &base,
        cmpl,
        &json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["model"], "llama");
    let u = &v["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );
    let (status, v) = post(&base, chat, &json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 4})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    // Seeded sampling repeats itself.
    let seeded = json!({"prompt": "Hello", "max_tokens": 8, "temperature": 0.9, "seed": 7, "cache_prompt": false});
    let (s1, a) = post(&base, cmpl, &seeded).await;
    let (s2, b2) = post(&base, cmpl, &seeded).await;
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(answer_text(&a), answer_text(&b2));
    let (status, h) = get_text(&base, "/health").await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&h).unwrap()["status"], "ok");
    let (status, m) = get_text(&base, "/v1/models").await;
    let m: Value = serde_json::from_str(&m).unwrap();
    assert_eq!(
        (status, &m["object"], &m["data"][0]["id"]),
        (200, &json!("list"), &json!("llama"))
    );
    assert!(metric(&base, "requests_total").await >= 2);
    assert!(metric(&base, "tokens_generated_total").await >= 1);
    assert!(metric(&base, "prompt_tokens_total").await >= 2);
    assert!(metric(&base, "requests_failed_total").await >= 13);
    assert_eq!(metric(&base, "slots_total").await, 4);
    metric(&base, "slots_active").await;
    metric(&base, "queue_length").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_answers_503() {
    let Some(model) = fixture() else { return };
    let base = start(model, single(), |c| {
        c.n_slots = 1;
        c.queue_len = 1;
        c.prompt_chunk = 1;
        c.n_ctx = 2048;
    })
    .await;
    // The first request holds the only slot for a few hundred steps (one prompt token a step);
    // a streaming answer's headers come back as soon as it is admitted.
    let client = reqwest::Client::new();
    let send = |b: Value| {
        client
            .post(format!("{base}/v1/completions"))
            .json(&b)
            .send()
    };
    let hold = json!({"prompt": "a ".repeat(600), "max_tokens": 4, "stream": true});
    let r1 = send(hold).await.unwrap();
    assert_eq!(r1.status().as_u16(), 200);
    // The queue takes one more; the third is refused.
    let q = send(json!({"prompt": "queued", "max_tokens": 2, "stream": true}))
        .await
        .unwrap();
    assert_eq!(q.status().as_u16(), 200);
    let (status, v) = post(
        &base,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["type"], "server_overloaded");
    assert_eq!(metric(&base, "requests_rejected_total").await, 1);
    let mut active = 0;
    for _ in 0..100 {
        active = metric(&base, "slots_active").await;
        if active == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(active, 1);
    // Both admitted requests still complete.
    for r in [r1, q] {
        let text = r.text().await.unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_cut_the_answer() {
    let Some(model) = fixture() else { return };
    let base = start(model, single(), |_| {}).await;
    let (path, mut b) = body(0, 24, false);
    let (_, v) = post(&base, path, &b).await;
    let full = answer_text(&v);
    let cuts: Vec<usize> = full.char_indices().map(|(i, _)| i).collect();
    assert!(cuts.len() > 6, "{full:?}");
    let stop = &full[cuts[cuts.len() / 2]..cuts[cuts.len() / 2 + 2]];
    let want = &full[..full.find(stop).unwrap()];
    b["stop"] = json!(["never-appears", stop]);
    let (_, v) = post(&base, path, &b).await;
    assert_eq!(answer_text(&v), want);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    b["stream"] = json!(true);
    let (text, finish, _, done) = read_stream(&base, path, &b, None).await;
    assert_eq!(
        (text.as_str(), finish.as_deref(), done),
        (want, Some("stop"), true)
    );
}

/// Runs prompt `p` on `slot` and returns the answer and the cached prompt tokens it reused.
async fn run_on(base: &str, slot: usize, prompt: &str, max_tokens: usize) -> (String, u64) {
    let (status, v) = post(
        base,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "id_slot": slot}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    (answer_text(&v), cached)
}

async fn save_restore(placement: Placement) {
    let Some(model) = fixture() else { return };
    let dir = std::env::temp_dir().join(format!(
        "ggml-tp-slots-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    let d = dir.clone();
    let base = start(model, placement, move |c| {
        c.n_slots = 2;
        c.slot_dir = Some(d);
    })
    .await;
    let p = "Once upon a time in a land far away there lived";
    let (first, _) = run_on(&base, 0, p, 12).await;
    let (status, v) = post(&base, "/slots/0?action=save&filename=s0.bin", &json!({})).await;
    assert_eq!(status, 200, "{v}");
    let n_saved = v["n_tokens"].as_u64().unwrap();
    assert!(n_saved > 0, "{v}");
    // The live slot continues from its cache.
    let (live, cached) = run_on(&base, 0, p, 40).await;
    assert!(cached > 0);
    assert!(
        live.starts_with(&first) || first.starts_with(&live),
        "{live:?} vs {first:?}"
    );
    // Overwrite slot 0, restore it and also restore the file into slot 1: both continue alike.
    run_on(&base, 0, "Something else entirely, with other words", 30).await;
    for slot in [0, 1] {
        let (status, v) = post(
            &base,
            &format!("/slots/{slot}?action=restore&filename=s0.bin"),
            &json!({}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["n_tokens"].as_u64(), Some(n_saved));
        let (again, cached_again) = run_on(&base, slot, p, 40).await;
        assert_eq!(cached_again, cached, "slot {slot}");
        assert_eq!(again, live, "slot {slot}");
    }
    let (_, slots) = get_text(&base, "/slots").await;
    let slots: Value = serde_json::from_str(&slots).unwrap();
    assert_eq!(slots.as_array().map(Vec::len), Some(2));
    assert_eq!(slots[1]["busy"], false);
    // Bad names and missing files are refused.
    let (status, _) = post(&base, "/slots/0?action=restore&filename=../etc", &json!({})).await;
    assert_eq!(status, 400);
    let (status, _) = post(
        &base,
        "/slots/0?action=restore&filename=missing.bin",
        &json!({}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = post(&base, "/slots/0?action=dance&filename=s0.bin", &json!({})).await;
    assert_eq!(status, 400);
    std::fs::write(dir.join("junk.bin"), b"not a slot file").unwrap();
    let (status, v) = post(
        &base,
        "/slots/0?action=restore&filename=junk.bin",
        &json!({}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_save_restore_single_device() {
    save_restore(single()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_save_restore_tensor_parallel() {
    save_restore(tensor2()).await;
}
