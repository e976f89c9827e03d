//! The `ggml-tp` binary end to end on the tiny Llama fixture: `devices`, greedy `run` giving the same
//! tokens with split modes none and tensor (two CPU devices), `logits` equal to what the library
//! computes, bad inputs ending with a non-zero status and a one-line error, and `run NAME` with a
//! known model found in the model cache.
//!
//! Fixtures: `GGML_TP_FIXTURES`, else `<CARGO_MANIFEST_DIR>/../../shared/fixtures`; absent, the
//! model tests print `skipped: fixtures not found`.

use backend_cpu::device::cpu_devices;
use ggml_core::gguf::{GgufFile, GgufWriter};
use llama::{Model, Outputs, Placement, Session, SessionOptions};
use std::path::PathBuf;
use std::process::{Command, Output};

fn fixture(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("GGML_TP_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"));
    let path = dir.join(name);
    if path.exists() {
        Some(path)
    } else {
        println!("skipped: fixtures not found");
        None
    }
}

fn ggml_tp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ggml-tp"))
        .args(args)
        .output()
        .expect("the ggml-tp binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A fresh directory under the system temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ggml-tp-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Fails unless `out` failed with exactly one line on stderr, `error: ...` containing `want`.
fn assert_one_line_error(out: &Output, want: &str) {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "succeeded; stderr: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "stderr: {err}");
    assert!(lines[0].starts_with("error: "), "stderr: {err}");
    assert!(lines[0].contains(want), "want {want:?} in: {err}");
    assert!(!err.contains("panicked"), "stderr: {err}");
}

#[test]
fn devices_lists_the_cpu() {
    let out = ggml_tp(&["devices"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("cpu:") && s.contains("cpu:0"), "{s}");
}

#[test]
fn greedy_run_is_the_same_with_tensor_parallelism() {
    let Some(model) = fixture("arch/llama.gguf") else {
        return;
    };
    let model = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "-m",
            model,
            "-p",
            "Hello world",
            "-n",
            "24",
            "--temp",
            "0",
            "--print-ids",
            "-t",
            "2",
        ];
        args.extend_from_slice(extra);
        let out = ggml_tp(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        let ids = err
            .lines()
            .find(|l| l.starts_with("ids: "))
            .unwrap_or_else(|| panic!("no ids in {err}"))
            .to_string();
        assert!(err.contains("t/s"), "{err}");
        (ids, text(&out.stdout))
    };
    let none = run(&["--split-mode", "none"]);
    let tensor = run(&["--split-mode", "tensor", "--cpu-devices", "2"]);
    assert_eq!(none.0.split_whitespace().count(), 25, "{}", none.0);
    assert_eq!(none, tensor);
    assert!(none.1.starts_with("Hello world"), "{}", none.1);
}

#[test]
fn logits_match_the_library() {
    let Some(model) = fixture("arch/llama.gguf") else {
        return;
    };
    let dir = temp_dir("logits");
    let out = ggml_tp(&[
        "logits",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "The quick brown fox",
        "-t",
        "1",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let tokens: Vec<u32> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokens.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("logits.f32")).unwrap();
    let got: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();

    let placement = Placement::Single(cpu_devices(1, 1).unwrap().remove(0));
    let m = std::sync::Arc::new(Model::load(&model, &placement).unwrap());
    let mut s = Session::new(
        m.clone(),
        SessionOptions {
            n_ctx: tokens.len(),
            ..SessionOptions::default()
        },
    )
    .unwrap();
    let want = s.eval(&tokens, Outputs::All).unwrap();
    assert!(tokens.len() > 2);
    assert_eq!(got.len(), tokens.len() * m.config.n_vocab);
    assert_eq!(got, want.data);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_inputs_give_one_line_errors() {
    let out = ggml_tp(&["run", "-m", "/nonexistent/model.gguf", "-p", "hi"]);
    assert_one_line_error(&out, "model file not found");

    let Some(model) = fixture("arch/llama.gguf") else {
        return;
    };
    let m = model.to_str().unwrap();
    let out = ggml_tp(&[
        "run",
        "-m",
        m,
        "-p",
        "hi",
        "--split-mode",
        "tensor",
        "--cpu-devices",
        "2",
        "--tensor-split",
        "3,1,1",
    ]);
    assert_one_line_error(&out, "--tensor-split has 3 values for 2 devices");
    let out = ggml_tp(&[
        "run",
        "-m",
        m,
        "-p",
        "hi",
        "--split-mode",
        "none",
        "--cpu-devices",
        "2",
    ]);
    assert_one_line_error(&out, "split-mode none");

    // A copy of the fixture whose architecture is unknown.
    let dir = temp_dir("arch");
    let bad = dir.join("mamba9.gguf");
    let file = GgufFile::open(&model).unwrap();
    let mut w = GgufWriter::from_file(&file).unwrap();
    w.set("general.architecture", "mamba9");
    w.write_to_path(&bad).unwrap();
    let out = ggml_tp(&["run", "-m", bad.to_str().unwrap(), "-p", "hi"]);
    assert_one_line_error(&out, "unknown architecture \"mamba9\"");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn chat_reads_turns_from_stdin() {
    let Some(model) = fixture("arch/llama.gguf") else {
        return;
    };
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ggml-tp"))
        .args([
            "chat",
            "-m",
            model.to_str().unwrap(),
            "--temp",
            "0",
            "-n",
            "8",
        ])
        .args(["--stop", "\n"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Hello there\nAnd again\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    // One reply line per turn (a newline in a reply is a stop string).
    assert_eq!(
        text(&out.stdout).matches('\n').count(),
        2,
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn perplexity_kl_against_itself_is_zero() {
    let Some(model) = fixture("arch/llama.gguf") else {
        return;
    };
    let dir = temp_dir("ppl");
    let txt = dir.join("text.txt");
    std::fs::write(
        &txt,
        "The quick brown fox jumps over the lazy dog. ".repeat(12),
    )
    .unwrap();
    let base = dir.join("base.kld");
    let m = model.to_str().unwrap();
    let common = [
        "perplexity",
        "-m",
        m,
        "-f",
        txt.to_str().unwrap(),
        "-t",
        "1",
    ];
    let mut first = common.to_vec();
    first.extend(["--chunk", "32", "--kl-base", base.to_str().unwrap()]);
    let out = ggml_tp(&first);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("PPL = "),
        "{}",
        text(&out.stdout)
    );
    let mut second = common.to_vec();
    second.extend(["--kl-against", base.to_str().unwrap()]);
    let out = ggml_tp(&second);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        s.contains("mean 0.000000, max 0.000000; top-1 agreement 100.00%"),
        "{s}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_answers_http_until_killed() {
    use std::io::{Read, Write};
    let Some(model) = fixture("arch/llama.gguf") else {
        println!("skipped: fixtures not found");
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ggml-tp"))
        .args([
            "serve",
            "-m",
            model.to_str().unwrap(),
            "--port",
            &port.to_string(),
            "--no-progress",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let request = |body: &str| -> Option<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    };
    let mut answer = None;
    for _ in 0..100 {
        answer = request(r#"{"prompt":"hello","max_tokens":4,"temperature":0}"#);
        if answer.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let bad = request("not json");
    child.kill().unwrap();
    child.wait().unwrap();
    let answer = answer.expect("the server answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"completion_tokens\":4"), "{answer}");
    assert!(bad.unwrap().starts_with("HTTP/1.1 400"));
}

/// `ggml-tp` with `args` and an environment whose model cache is `cache` (`XDG_CACHE_HOME`) and
/// whose Python does not exist, so that a fetch could not happen; `stdin` is its input.
fn ggml_tp_cached(cache: &std::path::Path, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ggml-tp"))
        .args(args)
        .env("XDG_CACHE_HOME", cache)
        .env("PYTHON", "/nonexistent/python3")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the ggml-tp binary runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `ggml-tp run smollm2` finds SmolLM2 by name in the model cache (verified, nothing fetched):
/// a one-shot prompt gives what `run -m FILE` gives, no `-p` is a chat over stdin, a wrong file
/// in the cache would be fetched again (and fails here, with no Python), an unknown name lists the
/// known ones.
#[test]
fn run_finds_a_known_model_by_name_in_the_cache() {
    let file = "SmolLM2-135M-Instruct.Q4_1.gguf";
    let Some(real) = ggml_core::env::models_cache_dir()
        .map(|d| d.join(file))
        .filter(|p| p.is_file())
    else {
        println!("skipped: models not found ({file} in the model cache)");
        return;
    };
    let cache = temp_dir("named");
    let models = cache.join("ggml-tp/models");
    std::fs::create_dir_all(&models).unwrap();
    std::os::unix::fs::symlink(&real, models.join(file)).unwrap();
    let args = [
        "-p",
        "The capital of France is",
        "-n",
        "6",
        "--temp",
        "0",
        "--no-progress",
    ];
    let by_name = ggml_tp_cached(&cache, &[&["run", "smollm2"][..], &args].concat(), "");
    assert!(by_name.status.success(), "{}", text(&by_name.stderr));
    let path = real.to_str().unwrap();
    let by_path = ggml_tp_cached(&cache, &[&["run", path][..], &args].concat(), "");
    assert!(by_path.status.success(), "{}", text(&by_path.stderr));
    let out = text(&by_name.stdout);
    assert!(out.starts_with("The capital of France is"), "{out}");
    assert!(out.len() > "The capital of France is".len(), "{out}");
    assert_eq!(out, text(&by_path.stdout));
    assert!(text(&by_name.stderr).contains("already in the cache"));

    let chat_args = ["run", "smollm2", "-n", "8", "--temp", "0", "--no-progress"];
    let chat = ggml_tp_cached(&cache, &chat_args, "Hi\n\n");
    assert!(chat.status.success(), "{}", text(&chat.stderr));
    assert!(!text(&chat.stdout).trim().is_empty());

    let wrong = temp_dir("named-wrong");
    let wrong_models = wrong.join("ggml-tp/models");
    std::fs::create_dir_all(&wrong_models).unwrap();
    std::fs::write(wrong_models.join(file), b"not the model").unwrap();
    let refetch = ggml_tp_cached(&wrong, &[&["run", "smollm2"][..], &args].concat(), "");
    assert!(!refetch.status.success());
    let err = text(&refetch.stderr);
    assert!(
        err.contains("fetching it again") && err.contains("python3"),
        "{err}"
    );

    let unknown = ggml_tp_cached(&cache, &["run", "no-such-model", "-p", "x"], "");
    assert_one_line_error(&unknown, "known models: smollm2-135m");
    for d in [cache, wrong] {
        std::fs::remove_dir_all(d).unwrap();
    }
}
