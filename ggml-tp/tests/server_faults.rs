//! The server under real faults, on 127.0.0.1 with the tiny llama fixture on a fault-injecting CPU
//! device ([`ggml_tp_tests::fault`]): a panic while a pass is computed, a device lost mid-stream,
//! out of memory while a compute buffer grows, out of memory while loading, and a full disk under a
//! slot save (a child process whose file size limit is one block). Each fault ends the affected
//! request with an error in OpenAI's shape; the slots it did not touch keep their caches and the
//! server goes on serving.

mod common;
mod http;

use backend_cpu::device::cpu_devices;
use common::{arch_fixture, single};
use ggml_tp::server::{Server, ServerConfig, ServerError};
use ggml_tp_tests::fault::{FaultDevice, FaultPlan};
use http::{completion, error_shape, health_becomes, send, slot, start_on, stream_text, temp_path};
use llama::Placement;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A one-thread CPU device with injected faults, and its plan.
fn faulty_placement() -> (Placement, Arc<FaultPlan>) {
    let plan = Arc::new(FaultPlan::default());
    let cpu = cpu_devices(1, 1).unwrap().remove(0);
    (Placement::Single(FaultDevice::new(cpu, plan.clone())), plan)
}

/// A server with two slots on a faulty device.
async fn start_faulty(model: PathBuf) -> (String, Arc<FaultPlan>) {
    let (placement, plan) = faulty_placement();
    let addr: SocketAddr = start_on(model, placement, |c| c.n_slots = 2).await;
    (format!("http://{addr}"), plan)
}

/// A greedy completion in slot `slot`, keeping the slot's cached prefix.
fn in_slot(prompt: &str, max_tokens: usize, slot: usize) -> Value {
    let mut body = completion(prompt, max_tokens);
    body["cache_prompt"] = json!(true);
    body["id_slot"] = json!(slot);
    body
}

async fn complete(base: &str, body: &Value) -> (u16, Value) {
    let c = reqwest::Client::new();
    let (status, _, v) = send(c.post(format!("{base}/v1/completions")).json(body)).await;
    (status, v)
}

/// The tokens slot `id` holds in its cache (`GET /slots`).
async fn slot_tokens(base: &str, id: usize) -> u64 {
    let (status, _, v) = send(reqwest::Client::new().get(format!("{base}/slots"))).await;
    assert_eq!(status, 200, "{v}");
    v[id]["n_past"].as_u64().unwrap()
}

/// The server goes on after a fault in slot 1: slot 0's cache survived (the same request again
/// reads its prompt from the cache and answers the same), and slot 1 serves again.
async fn other_slot_kept_and_server_serves(base: &str, before: &Value) {
    let (status, again) = complete(base, &in_slot("Once upon a time there", 6, 0)).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["choices"][0]["text"], before["choices"][0]["text"]);
    let cached = &again["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert!(cached.as_u64().unwrap() > 0, "{again}");
    let (status, v) = complete(base, &in_slot("The river ran", 4, 1)).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_computing_ends_that_request_and_the_worker_goes_on() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let (base, plan) = start_faulty(model).await;
    let (status, before) = complete(&base, &in_slot("Once upon a time there", 6, 0)).await;
    assert_eq!(status, 200, "{before}");
    plan.panic_computes_after(0);
    let (status, v) = complete(&base, &in_slot("The river ran", 4, 1)).await;
    assert_eq!(status, 500, "{v}");
    let msg = error_shape(&v);
    assert!(
        msg.contains("panics in compute") && msg.contains("reset"),
        "{msg}"
    );
    plan.heal();
    let h = health_becomes(&base, 200, Duration::from_secs(5)).await;
    assert_eq!(h["worker_recoveries"], 1, "{h}");
    assert_eq!(
        slot_tokens(&base, 1).await,
        0,
        "the panicking slot was reset"
    );
    assert!(slot_tokens(&base, 0).await > 0);
    other_slot_kept_and_server_serves(&base, &before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_lost_mid_stream_ends_that_stream_and_the_server_goes_on() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let (base, plan) = start_faulty(model).await;
    let (status, before) = complete(&base, &in_slot("Once upon a time there", 6, 0)).await;
    assert_eq!(status, 200, "{before}");
    // The prompt's pass and a few tokens go through, then the device is lost.
    let computes = plan.computes.load(Ordering::SeqCst);
    plan.fail_computes_after(4);
    let lost = stream_text(&base, &in_slot("The river ran", 40, 1), None).await;
    let e = lost.expect_err("the stream outlived the device");
    assert!(e.contains("device was lost"), "{e}");
    assert!(plan.computes.load(Ordering::SeqCst) > computes + 4);
    plan.heal();
    let h = health_becomes(&base, 200, Duration::from_secs(5)).await;
    assert_eq!(h["worker_recoveries"], 0, "{h}");
    assert_eq!(slot_tokens(&base, 1).await, 0, "the failed slot was reset");
    other_slot_kept_and_server_serves(&base, &before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_growing_a_buffer_fails_only_that_request() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    let (base, plan) = start_faulty(model).await;
    let (status, before) = complete(&base, &in_slot("Once upon a time there", 6, 0)).await;
    assert_eq!(status, 200, "{before}");
    // A prompt far longer than any pass so far needs a larger compute buffer.
    let allocs = plan.allocs.load(Ordering::SeqCst);
    plan.fail_allocs_after(0);
    let long = "a story of a cat and a dog ".repeat(12);
    let (status, v) = complete(&base, &in_slot(&long, 4, 1)).await;
    assert_eq!(status, 500, "{v}");
    assert!(error_shape(&v).contains("out of memory"), "{v}");
    assert!(plan.allocs.load(Ordering::SeqCst) > allocs);
    plan.heal();
    let (status, v) = complete(&base, &in_slot(&long, 4, 1)).await;
    assert_eq!(status, 200, "{v}");
    other_slot_kept_and_server_serves(&base, &before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_while_loading_is_a_startup_error() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    for n in [0, 1, 3] {
        let (placement, plan) = faulty_placement();
        plan.fail_allocs_after(n);
        let mut cfg = ServerConfig::new(model.clone(), placement);
        cfg.addr = "127.0.0.1:0".parse().unwrap();
        cfg.n_ctx = 256;
        match Server::bind(cfg).await {
            Err(ServerError::Model(e)) => assert!(e.to_string().contains("out of memory"), "{e}"),
            Err(e) => panic!("allocation {n}: {e}"),
            Ok(_) => panic!("allocation {n}: the server started"),
        }
    }
}

/// Set in the child process of [`a_full_disk_fails_the_slot_save_and_leaves_nothing`].
const FULL_DISK_CHILD: &str = "GGML_TP_TEST_FULL_DISK";

/// A slot save onto a full disk: the test runs itself again in a child process whose files may
/// not grow past one 512-byte block (`ulimit -f 1`, `SIGXFSZ` ignored, so a write past it fails
/// with `EFBIG` as on a full disk). There the save gets a 507, no file or temporary file is left,
/// and the server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_slot_save_and_leaves_nothing() {
    let Some(model) = arch_fixture("llama") else {
        return;
    };
    if std::env::var_os(FULL_DISK_CHILD).is_none() {
        let out = std::process::Command::new("sh")
            .args(["-c", "trap '' XFSZ; ulimit -f 1; exec \"$0\" \"$@\""])
            .arg(std::env::current_exe().unwrap())
            .args([
                "a_full_disk_fails_the_slot_save_and_leaves_nothing",
                "--exact",
                "--nocapture",
            ])
            .env(FULL_DISK_CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "{stdout}\n{stderr}");
        return;
    }
    let dir = temp_path("full-disk");
    let d = dir.clone();
    let addr = start_on(model, single(), move |c| c.slot_dir = Some(d)).await;
    let base = format!("http://{addr}");
    let (status, v) = complete(&base, &in_slot("Once upon a time there was", 4, 0)).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = slot(&base, "0?action=save&filename=a.bin").await;
    assert_eq!(status, 507, "{v}");
    assert!(error_shape(&v).contains("disk is full"), "{v}");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    let (status, v) = complete(&base, &in_slot("Once upon a time there was", 4, 0)).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = slot(&base, "0?action=erase").await;
    assert_eq!(status, 200, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}
