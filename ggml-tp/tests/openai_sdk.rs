//! The official `openai` Python client against `ggml-tp serve` (the tiny llama fixture with a
//! Hermes-style tool template, tensor parallel over two CPU devices): the checks of
//! `tests/openai_sdk/checks.py`, one function per feature (models list, chat, completions,
//! streaming with `include_usage`, stop strings, seeds, `max_tokens`, 400 errors, concurrent
//! streams with some cancelled, `response_format` json_schema and json_object, a forced tool call).
//!
//! The Python is `GGML_TP_OPENAI_PYTHON` when set (`cargo xtask ci` sets it to a venv in the user's
//! cache with the pinned client, and then a Python without the client fails the test), else
//! `python3`, where a missing client prints `skipped: no openai client`. Fixtures:
//! `GGML_TP_FIXTURES`, else `<CARGO_MANIFEST_DIR>/../../shared/fixtures`; absent, the test prints
//! `skipped: fixtures not found`.

#[allow(dead_code)] // the server tests' one-device placement is not used here
mod common;
mod tool_model;

use common::arch_fixture;
use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tool_model::tool_model;

/// The Python to run the checks with, or `None` (after saying why) when the client is missing
/// and no Python was named.
fn openai_python() -> Option<OsString> {
    let named = std::env::var_os("GGML_TP_OPENAI_PYTHON").filter(|p| !p.is_empty());
    let python = named.clone().unwrap_or_else(|| "python3".into());
    let has_client = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    match (has_client, named) {
        (true, _) => Some(python),
        (false, Some(p)) => panic!(
            "GGML_TP_OPENAI_PYTHON={} cannot import openai",
            p.to_string_lossy()
        ),
        (false, None) => {
            println!("skipped: no openai client");
            None
        }
    }
}

/// The server process, killed when dropped (also when a check fails).
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `ggml-tp serve` on `model` on a free port and waits until it accepts connections.
fn serve(model: &Path) -> Server {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_ggml-tp"))
        .args(["serve", "-m"])
        .arg(model)
        .args(["--split-mode", "tensor", "--cpu-devices", "2", "-t", "2"])
        .args(["-c", "512", "--slots", "4", "--max-tokens", "64"])
        .args(["--port", &port.to_string(), "--no-progress"])
        .stdout(Stdio::null())
        .spawn()
        .expect("the ggml-tp binary starts");
    let mut server = Server {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    };
    // Loading the tiny fixture takes well under a second; the limit only keeps a broken start
    // from hanging the test.
    let deadline = Instant::now() + Duration::from_secs(120);
    while TcpStream::connect(server.addr).is_err() {
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!("ggml-tp serve exited before listening: {status}");
        }
        assert!(Instant::now() < deadline, "ggml-tp serve did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

#[test]
fn the_openai_python_client_is_answered_as_by_openai() {
    let Some(fixture) = arch_fixture("llama") else {
        return;
    };
    let Some(python) = openai_python() else {
        return;
    };
    // The fixture with a Hermes-style template, for the tool-call checks.
    let (model, _) = tool_model(&fixture, "openai-sdk");
    let server = serve(&model);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_sdk/checks.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg("--base-url")
        .arg(format!("http://{}/v1", server.addr))
        .output()
        .expect("the Python of the checks runs");
    drop(server);
    let _ = std::fs::remove_file(&model);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let summary = stdout.lines().last().unwrap_or_default();
    let passed = stdout.lines().filter(|l| l.starts_with("ok ")).count();
    assert_eq!(
        summary,
        format!("openai sdk checks: {passed} ok, 0 failed"),
        "{stdout}"
    );
    assert!(passed >= 9, "{stdout}");
}
