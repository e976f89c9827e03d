//! The Python side: finding `python3` and pip, a Python with the pinned `gguf` package and numpy for
//! the dequantization cross-check (the one on PATH if it already has them, else a venv under
//! `target/`), and a venv with the pinned official `openai` client for the server's SDK test, kept in
//! the user's cache so that later runs (of any clone) need no network.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use model_cache::fetch::{ensure_pip, python3};
use model_cache::lock::FileLock;

use crate::{paths, process};

/// The gguf-py version the cross-check is pinned to.
pub const GGUF_VERSION: &str = "0.19.0";

/// The `openai` client version the server's SDK test (`ggml-tp/tests/openai_sdk.rs`) is pinned to.
pub const OPENAI_VERSION: &str = "3.51.0";

/// True if `python` imports numpy and gguf at the pinned version, with `gguf.quants.dequantize`.
fn has_dequant_deps(python: &OsString) -> bool {
    let probe = format!(
        "import numpy, gguf.quants, importlib.metadata as m\n\
         assert hasattr(gguf.quants, 'dequantize')\n\
         assert m.version('gguf') == '{GGUF_VERSION}'"
    );
    process::succeeds(Command::new(python).args(["-c", &probe]))
}

/// A Python interpreter with gguf (pinned) and numpy, installing them into `target/xtask-python` if needed.
pub fn dequant_python() -> Result<OsString> {
    let system = python3();
    if has_dequant_deps(&system) {
        return Ok(system);
    }
    let venv = paths::repo_root().join("target").join("xtask-python");
    let venv_python: OsString = venv.join("bin").join("python").into_os_string();
    if has_dequant_deps(&venv_python) {
        return Ok(venv_python);
    }
    ensure_pip(&system)?;
    eprintln!(
        "xtask: installing gguf=={GGUF_VERSION} and numpy into {}",
        venv.display()
    );
    if !PathBuf::from(&venv_python).exists() {
        process::run(Command::new(&system).arg("-m").arg("venv").arg(&venv))
            .context("creating a Python venv failed (Debian: apt-get install python3-venv)")?;
    }
    process::run(Command::new(&venv_python).args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        &format!("gguf=={GGUF_VERSION}"),
        "numpy",
    ]))
    .context("installing gguf and numpy failed")?;
    if !has_dequant_deps(&venv_python) {
        bail!(
            "{} still cannot import gguf=={GGUF_VERSION} and numpy after installing them",
            venv_python.to_string_lossy()
        );
    }
    Ok(venv_python)
}

/// The probe that `python` imports `package` at exactly `version`.
fn has_package(python: &OsString, package: &str, version: &str) -> bool {
    let probe = format!(
        "import {package}, importlib.metadata as m\nassert m.version('{package}') == '{version}'"
    );
    process::succeeds(Command::new(python).args(["-c", &probe]))
}

/// The Python of a venv in the user's cache with the pinned `openai` client, created (pip install
/// with retries) when it is missing; a lock keeps two clones from building it at once.
pub fn openai_python() -> Result<OsString> {
    let dir = paths::cache_dir()?.join("python");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let venv = dir.join(format!("openai-{OPENAI_VERSION}"));
    let venv_python: OsString = venv.join("bin").join("python").into_os_string();
    if has_package(&venv_python, "openai", OPENAI_VERSION) {
        return Ok(venv_python);
    }
    let _lock = FileLock::acquire(
        &dir.join(format!(".openai-{OPENAI_VERSION}.lock")),
        "the openai venv",
    )?;
    if has_package(&venv_python, "openai", OPENAI_VERSION) {
        return Ok(venv_python);
    }
    let system = python3();
    ensure_pip(&system)?;
    eprintln!(
        "xtask: installing openai=={OPENAI_VERSION} into {}",
        venv.display()
    );
    // What pip says goes to stderr: stdout is for the Python's path (`cargo xtask openai-python`).
    if !PathBuf::from(&venv_python).exists() {
        process::run(
            Command::new(&system)
                .arg("-m")
                .arg("venv")
                .arg(&venv)
                .stdout(std::io::stderr()),
        )
        .context("creating a Python venv failed (Debian: apt-get install python3-venv)")?;
    }
    let spec = format!("openai=={OPENAI_VERSION}");
    process::retry(
        model_cache::fetch::DOWNLOAD_ATTEMPTS,
        &format!("installing {spec} with pip"),
        || {
            process::run(
                Command::new(&venv_python)
                    .args(["-m", "pip", "install", "--disable-pip-version-check"])
                    .args(["--retries", "5", "--timeout", "60", &spec])
                    .stdout(std::io::stderr()),
            )
        },
    )?;
    if !has_package(&venv_python, "openai", OPENAI_VERSION) {
        bail!(
            "{} still cannot import {spec} after installing it",
            venv_python.to_string_lossy()
        );
    }
    Ok(venv_python)
}
