//! The HTTP server against hostile clients and faults, on 127.0.0.1 with the tiny llama fixtures:
//! slow and idle connections and the connection cap, the API key, cross-origin requests and a
//! rebinding `Host`, malformed and oversize bodies, unknown paths and methods, hostile requests
//! (huge stop lists and prompts), a hostile chat template, a dead or stuck worker, one slot's
//! failed pass, the slot directory's quota and no-overwrite rule, and a soak of everything mixed.
//! Faults of the device and the disk are in `server_faults.rs`.
//!
//! Raw TCP is used where a client must misbehave (send bytes slowly, lie about its `Host`).

mod common;
mod http;

use common::{arch_fixture, single};
use ggml_core::gguf::{GgufFile, GgufWriter};
use ggml_core::DType;
use ggml_tp::server::ServerConfig;
use http::{completion, error_shape, health_becomes, send, slot, start_on, stream_text, temp_path};
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Starts a server on one CPU device in the background; returns its address.
async fn start(model: PathBuf, edit: impl FnOnce(&mut ServerConfig)) -> SocketAddr {
    start_on(model, single(), edit).await
}

/// Sends `req` on a new connection and reads until the server closes it (at most 5 s).
async fn raw(addr: SocketAddr, req: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(resp: &str) -> u16 {
    resp.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_idle_and_too_many_connections_are_cut() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let addr = start(model, |c| {
        c.limits.header_timeout = Duration::from_millis(500);
        c.limits.max_connections = 3;
    })
    .await;
    // The cap: three silent connections hold every place; a fourth gets a 503 and is closed.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let over = raw(addr, "").await;
    assert_eq!(status_of(&over), 503, "{over}");
    assert!(over.contains("open connections"), "{over}");
    // The silent ones are closed by the head timeout, freeing their places.
    let t0 = Instant::now();
    for mut s in held {
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
            .await
            .expect("a silent connection stayed open");
        assert!(
            !matches!(n, Ok(n) if n > 0 && !String::from_utf8_lossy(&buf[..n]).contains("408"))
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(3));
    let ok = raw(
        addr,
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&ok), 200, "{ok}");

    // A client sending its head a byte every 100 ms is cut before it finishes.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    let t0 = Instant::now();
    let mut cut = false;
    for &b in head.iter() {
        if s.write_all(&[b]).await.is_err() {
            cut = true;
            break;
        }
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                cut = true;
                break;
            }
            Ok(Ok(n)) => {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                assert!(!text.contains(" 200 "), "the slow head was served: {text}");
            }
            Err(_) => {}
        }
    }
    assert!(cut, "the slow client was not disconnected");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());

    // A keep-alive connection left idle after its answer is closed.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(status_of(&String::from_utf8_lossy(&buf[..n])), 200);
    let t0 = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("the idle connection stayed open");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_required_except_for_health() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let addr = start(model, |c| c.access.api_key = Some("s3cret".into())).await;
    let base = format!("http://{addr}");
    let c = reqwest::Client::new();
    let (status, _, _) = send(c.get(format!("{base}/health"))).await;
    assert_eq!(status, 200);
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("s3cret"),
        Some("Basic s3cret"),
        Some("Bearer s3cret2"),
    ] {
        let mut rb = c.get(format!("{base}/v1/models"));
        if let Some(a) = auth {
            rb = rb.header("authorization", a);
        }
        let (status, _, v) = send(rb).await;
        assert_eq!(status, 401, "{auth:?}");
        error_shape(&v);
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    let (status, _, v) = send(
        c.post(format!("{base}/v1/completions"))
            .json(&completion("Hello", 2)),
    )
    .await;
    assert_eq!(status, 401, "{v}");
    let (status, _, v) = send(c.get(format!("{base}/v1/models")).bearer_auth("s3cret")).await;
    assert_eq!((status, &v["object"]), (200, &json!("list")));
    // The scheme is case-insensitive (RFC 9110).
    let (status, _, _) = send(
        c.get(format!("{base}/v1/models"))
            .header("authorization", "bearer s3cret"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, v) = send(
        c.post(format!("{base}/v1/completions"))
            .bearer_auth("s3cret")
            .json(&completion("Hello", 2)),
    )
    .await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_origins_and_rebinding_hosts_are_refused() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let addr = start(model.clone(), |c| {
        c.access.cors_origins = vec!["http://app.example".into()];
        c.access.allowed_hosts = vec!["my.box".into()];
    })
    .await;
    let base = format!("http://{addr}");
    let c = reqwest::Client::new();
    let models = || c.get(format!("{base}/v1/models"));
    let (status, h, _) = send(models()).await;
    assert_eq!(status, 200);
    assert!(h.get("access-control-allow-origin").is_none());
    let (status, _, v) = send(models().header("origin", "http://evil.example")).await;
    assert_eq!(status, 403);
    assert!(error_shape(&v).contains("origin"));
    let (status, h, _) = send(models().header("origin", "http://app.example")).await;
    assert_eq!(status, 200);
    assert_eq!(h["access-control-allow-origin"], "http://app.example");
    let own = format!("http://127.0.0.1:{}", addr.port());
    let (status, h, _) = send(models().header("origin", own)).await;
    assert_eq!(status, 200);
    assert!(h.get("access-control-allow-origin").is_none());
    let other_port = format!("http://127.0.0.1:{}", addr.port() ^ 1);
    let (status, _, _) = send(models().header("origin", other_port)).await;
    assert_eq!(status, 403);
    // Preflight: answered for the allowed origin only.
    let preflight = |origin: &str| {
        c.request(
            reqwest::Method::OPTIONS,
            format!("{base}/v1/chat/completions"),
        )
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
    };
    let (status, h, _) = send(preflight("http://app.example")).await;
    assert!((200..300).contains(&status), "{status}");
    assert_eq!(h["access-control-allow-origin"], "http://app.example");
    let (status, h, _) = send(preflight("http://evil.example")).await;
    assert_eq!(status, 403);
    assert!(h.get("access-control-allow-origin").is_none());
    // Host: a rebound name is refused; the server's names are served.
    let get = |host: &str| {
        format!("GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    };
    let port = addr.port();
    let refused = raw(addr, &get(&format!("evil.example:{port}"))).await;
    assert_eq!(status_of(&refused), 403, "{refused}");
    assert!(refused.contains("rebinding"), "{refused}");
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("my.box:{port}"),
        "LOCALHOST".to_string(),
    ] {
        let ok = raw(addr, &get(&host)).await;
        assert_eq!(status_of(&ok), 200, "{host}: {ok}");
    }
    // Without --cors-origin no origin but the server's own is accepted, and none gets headers.
    let addr = start(model, |_| {}).await;
    let (status, _, _) = send(
        c.get(format!("http://{addr}/v1/models"))
            .header("origin", "http://app.example"),
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_openai_errors() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let addr = start(model, |c| {
        c.n_ctx = 64;
        c.max_body_bytes = 64 << 10;
        c.limits.body_timeout = Duration::from_millis(500);
    })
    .await;
    let base = format!("http://{addr}");
    let c = reqwest::Client::new();
    let post = |path: &str, body: String| {
        c.post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body)
    };
    let cmpl = "/v1/completions";
    let many_stops: Vec<String> = (0..1000).map(|i| format!("s{i}")).collect();
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (cmpl, "not json at all".into(), 400, "invalid request body"),
        (cmpl, "{\"prompt\": ".into(), 400, "invalid request body"),
        (cmpl, r#"{"prompt": 5}"#.into(), 400, "invalid request body"),
        (cmpl, r#"[1, 2, 3]"#.into(), 400, "invalid request body"),
        (
            "/v1/chat/completions",
            r#"{"messages": "hi"}"#.into(),
            400,
            "invalid request body",
        ),
        (
            cmpl,
            json!({"prompt": "x", "stop": many_stops}).to_string(),
            400,
            "stop strings",
        ),
        (
            cmpl,
            json!({"prompt": "x", "stop": ["y".repeat(10_000)]}).to_string(),
            400,
            "stop string of",
        ),
        (
            cmpl,
            json!({"prompt": "word ".repeat(10_000)}).to_string(),
            400,
            "cannot fit",
        ),
        (
            cmpl,
            json!({"prompt": "</s><s>".repeat(5_000)}).to_string(),
            400,
            "",
        ),
        (
            cmpl,
            json!({"prompt": vec![1; 100]}).to_string(),
            400,
            "context",
        ),
        (cmpl, "x".repeat(100 << 10), 413, "size limit"),
        ("/nowhere", "{}".into(), 404, "no such endpoint"),
    ];
    for (path, body, want, needle) in cases {
        let (status, _, v) = send(post(path, body)).await;
        assert_eq!(status, want, "{path}: {v}");
        let msg = error_shape(&v);
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    }
    let (status, _, v) = send(c.get(format!("{base}{cmpl}"))).await;
    assert_eq!(status, 405, "{v}");
    error_shape(&v);
    let (status, _, v) = send(c.delete(format!("{base}/health"))).await;
    assert_eq!(status, 405, "{v}");
    // A declared length over the limit is refused before any body is sent; a body that does not
    // come is timed out.
    let head = |len: usize| {
        format!(
            "POST {cmpl} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\nConnection: close\r\n\r\n"
        )
    };
    let t0 = Instant::now();
    let r = raw(addr, &head(1 << 30)).await;
    assert_eq!(status_of(&r), 413, "{r}");
    let r = raw(addr, &(head(100) + "{\"prompt\"")).await;
    assert_eq!(status_of(&r), 408, "{r}");
    assert!(t0.elapsed() < Duration::from_secs(4));
    // Still serving.
    let (status, _, v) = send(c.post(format!("{base}{cmpl}")).json(&completion("Hi", 3))).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_chat_template_gives_an_error_and_the_server_goes_on() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let file = GgufFile::open(&model).unwrap();
    let hostile = [
        "{{ messages|tojson(indent=1000000000000) }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    ];
    for template in hostile {
        let mut w = GgufWriter::from_file(&file).unwrap();
        w.set("tokenizer.chat_template", template);
        let path = temp_path("hostile-template").with_extension("gguf");
        w.write_to_path(&path).unwrap();
        let addr = start(path.clone(), |_| {}).await;
        let base = format!("http://{addr}");
        let c = reqwest::Client::new();
        let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
        for _ in 0..2 {
            let t0 = Instant::now();
            let (status, _, v) =
                send(c.post(format!("{base}/v1/chat/completions")).json(&chat)).await;
            assert!((400..500).contains(&status), "{status} {v}");
            println!("hostile template: {status} {}", error_shape(&v));
            assert!(t0.elapsed() < Duration::from_secs(10));
            let (status, _, v) = send(
                c.post(format!("{base}/v1/completions"))
                    .json(&completion("Hi", 3)),
            )
            .await;
            assert_eq!(status, 200, "{v}");
        }
        let (status, _, _) = send(c.get(format!("{base}/health"))).await;
        assert_eq!(status, 200);
        let _ = std::fs::remove_file(&path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_a_stuck_or_dead_worker() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let addr = start(model.clone(), |c| {
        c.test_faults = true;
        c.limits.stuck_after = Duration::from_millis(300);
    })
    .await;
    let base = format!("http://{addr}");
    health_becomes(&base, 200, Duration::ZERO).await;
    let b = base.clone();
    let stalled = tokio::spawn(async move {
        let c = reqwest::Client::new();
        send(
            c.post(format!("{b}/v1/completions"))
                .json(&completion("ggml-tp-test-fault:stall", 2)),
        )
        .await
    });
    let v = health_becomes(&base, 503, Duration::from_secs(5)).await;
    assert!(error_shape(&v).contains("no progress"), "{v}");
    assert_eq!(v["status"], "error");
    // The stall ends: the request completes and the worker is healthy again.
    let (status, _, v) = stalled.await.unwrap();
    assert_eq!(status, 200, "{v}");
    health_becomes(&base, 200, Duration::from_secs(5)).await;

    let addr = start(model, |c| c.test_faults = true).await;
    let base = format!("http://{addr}");
    let c = reqwest::Client::new();
    let (status, _, v) = send(
        c.post(format!("{base}/v1/completions"))
            .json(&completion("ggml-tp-test-fault:panic", 2)),
    )
    .await;
    assert!(status >= 500, "{status} {v}");
    error_shape(&v);
    let v = health_becomes(&base, 503, Duration::from_secs(5)).await;
    assert!(error_shape(&v).contains("stopped"), "{v}");
    let (status, _, v) = send(
        c.post(format!("{base}/v1/completions"))
            .json(&completion("Hi", 2)),
    )
    .await;
    assert_eq!(status, 503, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_slot_ends_only_its_own_request() {
    let Some(model) = arch_fixture("llama-q8_0") else {
        return;
    };
    let addr = start(model, |c| {
        c.test_faults = true;
        c.n_slots = 4;
        c.kv_type = DType::F32;
    })
    .await;
    let base = format!("http://{addr}");
    let prompts = ["One day a cat", "The river ran", "Far away in"];
    let mut alone = Vec::new();
    for p in prompts {
        alone.push(stream_text(&base, &completion(p, 40), None).await.unwrap());
    }
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (b, body) = (base.clone(), completion(p, 40));
            tokio::spawn(async move { stream_text(&b, &body, None).await })
        })
        .collect();
    let faulty = stream_text(
        &base,
        &completion("ggml-tp-test-fault:eval-error", 40),
        None,
    )
    .await;
    let e = faulty.unwrap_err();
    assert!(e.contains("test fault"), "{e}");
    for (i, t) in tasks.into_iter().enumerate() {
        let got = t.await.unwrap().unwrap();
        assert_eq!(got, alone[i], "request {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_files_have_a_quota_and_are_not_overwritten() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let dir = temp_path("slot-quota");
    let d = dir.clone();
    let addr = start(model.clone(), move |c| {
        c.slot_dir = Some(d);
        c.slot_max_files = 2;
    })
    .await;
    let base = format!("http://{addr}");
    let c = reqwest::Client::new();
    let mut body = completion("Once upon a time there was", 4);
    body["id_slot"] = json!(0);
    let (status, _, _) = send(c.post(format!("{base}/v1/completions")).json(&body)).await;
    assert_eq!(status, 200);
    let (status, v) = slot(&base, "0?action=save&filename=a.bin").await;
    assert_eq!(status, 200, "{v}");
    let size = std::fs::metadata(dir.join("a.bin")).unwrap().len();
    assert_eq!(v["n_bytes"].as_u64(), Some(size));
    let (status, v) = slot(&base, "0?action=save&filename=a.bin").await;
    assert_eq!(status, 409, "{v}");
    assert!(error_shape(&v).contains("overwrite=true"));
    let (status, v) = slot(&base, "0?action=save&filename=a.bin&overwrite=true").await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = slot(&base, "1?action=save&filename=b.bin").await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = slot(&base, "0?action=save&filename=c.bin").await;
    assert_eq!(status, 507, "{v}");
    assert!(error_shape(&v).contains("quota"));
    // Replacing a file within the quota is still allowed; restoring works.
    let (status, v) = slot(&base, "0?action=save&filename=b.bin&overwrite=true").await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = slot(&base, "1?action=restore&filename=a.bin").await;
    assert_eq!(status, 200, "{v}");
    assert!(v["n_tokens"].as_u64().unwrap() > 0);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a.bin", "b.bin"], "no temporary files left");

    // A byte quota smaller than one file: the save fails and leaves nothing behind; a file over
    // it is not restored.
    let d = dir.clone();
    let addr = start(model, move |c| {
        c.slot_dir = Some(d);
        c.slot_max_bytes = size * 2 + size / 2;
    })
    .await;
    let base = format!("http://{addr}");
    let (status, _, _) = send(c.post(format!("{base}/v1/completions")).json(&body)).await;
    assert_eq!(status, 200);
    let (status, v) = slot(&base, "0?action=save&filename=c.bin").await;
    assert_eq!(status, 507, "{v}");
    assert!(!dir.join("c.bin").exists());
    let n = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(n, 2, "no temporary files left");
    let _ = std::fs::remove_dir_all(&dir);
}

/// What one soak client did.
#[derive(Default, Debug)]
struct Tally {
    well_formed: usize,
    complete: usize,
    cancelled: usize,
    hostile: usize,
    failures: Vec<String>,
}

async fn soak_client(base: String, addr: SocketAddr, k: usize, until: Instant) -> Tally {
    let c = reqwest::Client::new();
    let mut t = Tally::default();
    let mut i = k;
    while Instant::now() < until {
        i += 7;
        let prompt = format!("Story {i} starts when");
        match i % 6 {
            0 | 1 => {
                t.well_formed += 1;
                match stream_text(&base, &completion(&prompt, 8 + i % 16), None).await {
                    Ok((_, true)) => t.complete += 1,
                    other => t.failures.push(format!("stream {i}: {other:?}")),
                }
            }
            2 => {
                t.well_formed += 1;
                let body =
                    json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 8});
                let (status, _, v) =
                    send(c.post(format!("{base}/v1/chat/completions")).json(&body)).await;
                if status == 200 && v["choices"][0]["finish_reason"].is_string() {
                    t.complete += 1;
                } else {
                    t.failures.push(format!("chat {i}: {status} {v}"));
                }
            }
            3 => {
                t.cancelled += 1;
                let _ = stream_text(&base, &completion(&prompt, 150), Some(1)).await;
            }
            4 => {
                t.hostile += 1;
                let bodies = [
                    "{".to_string(),
                    json!({"prompt": "x", "stop": vec!["s"; 5000]}).to_string(),
                    json!({"prompt": "y ".repeat(20_000)}).to_string(),
                    json!({"prompt": "x", "max_tokens": 1_000_000}).to_string(),
                ];
                let b = bodies[i / 6 % bodies.len()].clone();
                let (status, _, v) = send(
                    c.post(format!("{base}/v1/completions"))
                        .header("content-type", "application/json")
                        .body(b),
                )
                .await;
                if status != 400 {
                    t.failures.push(format!("hostile {i}: {status} {v}"));
                }
            }
            _ => {
                t.hostile += 1;
                // A foreign origin, and a client that sends half a head and walks away.
                let (status, _, _) = send(
                    c.get(format!("{base}/v1/models"))
                        .header("origin", "http://evil.example"),
                )
                .await;
                if status != 403 {
                    t.failures.push(format!("origin {i}: {status}"));
                }
                let mut s = TcpStream::connect(addr).await.unwrap();
                let _ = s
                    .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: 127")
                    .await;
            }
        }
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_of_streams_cancellations_and_hostile_requests() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let addr = start(model, |c| {
        c.n_slots = 4;
        c.queue_len = 32;
        c.limits.header_timeout = Duration::from_secs(1);
    })
    .await;
    let base = format!("http://{addr}");
    let until = Instant::now() + Duration::from_secs(8);
    let clients: Vec<_> = (0..8)
        .map(|k| tokio::spawn(soak_client(base.clone(), addr, k, until)))
        .collect();
    let mut all = Tally::default();
    for c in clients {
        let t = tokio::time::timeout(Duration::from_secs(50), c)
            .await
            .expect("a soak client hung")
            .unwrap();
        all.well_formed += t.well_formed;
        all.complete += t.complete;
        all.cancelled += t.cancelled;
        all.hostile += t.hostile;
        all.failures.extend(t.failures);
    }
    println!(
        "soak: {} well-formed ({} complete), {} cancelled, {} hostile",
        all.well_formed, all.complete, all.cancelled, all.hostile
    );
    assert!(all.failures.is_empty(), "{:#?}", all.failures);
    assert_eq!(all.complete, all.well_formed);
    assert!(all.well_formed > 20 && all.hostile > 10, "{all:?}");
    let v = health_becomes(&base, 200, Duration::from_secs(5)).await;
    assert_eq!(v["status"], "ok");
}
