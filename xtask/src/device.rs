//! Packing work for a remote GPU machine that receives at most [`TRANSFER_LIMIT`] per call:
//! `device-pack` builds release binaries (the `ggml-tp` program, test binaries, examples), strips
//! them into a git-ignored folder with the fixtures they need and a size check; `device-chunks`
//! cuts a fetched model into parts of at most [`DEFAULT_CHUNK_MIB`] MiB (one part per call) with a
//! `stage.sh` that joins them on the machine and checks the sha256.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::paths::{fixtures_dir, repo_root};
use crate::process::{output, run};
use model_cache::hashing::sha256_file;

/// Most bytes one call carries (working tree and carried folders together).
pub const TRANSFER_LIMIT: u64 = 64 << 20;

/// Default size of a model part, leaving room for the working tree in the same call.
pub const DEFAULT_CHUNK_MIB: u64 = 60;

/// What `device-pack` builds.
pub struct Pack {
    /// `PKG:TEST` integration test binaries.
    pub tests: Vec<String>,
    /// `PKG:EXAMPLE` examples.
    pub examples: Vec<String>,
    /// Whether to add the `ggml-tp` program.
    pub program: bool,
    /// Fixture paths relative to the fixtures folder (`arch`, `reference/smollm2-135m`).
    pub fixtures: Vec<String>,
    /// Output folder.
    pub out: PathBuf,
}

/// `PKG:NAME` split in two.
fn package_and_name(spec: &str) -> Result<(&str, &str)> {
    match spec.split_once(':') {
        Some((p, n)) if !p.is_empty() && !n.is_empty() => Ok((p, n)),
        _ => bail!("`{spec}`: expected PKG:NAME (e.g. ggml-tp-tests:conformance_cuda)"),
    }
}

/// The executables cargo reports building (`--message-format=json` lines of compiler artifacts).
fn executables(json_lines: &str) -> Vec<(String, PathBuf)> {
    json_lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact")
        .filter_map(|v| {
            let exe = v["executable"].as_str()?;
            let name = v["target"]["name"].as_str()?;
            Some((name.to_string(), PathBuf::from(exe)))
        })
        .collect()
}

/// Builds with `cargo build`/`test --no-run` in release and returns the executables built.
fn build(args: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(repo_root())
        .args(args)
        .args(["--release", "--message-format=json"]);
    let out = output(&mut cmd)?;
    Ok(executables(&String::from_utf8_lossy(&out.stdout)))
}

/// Builds the `ggml-tp` program (package `ggml-tp`, default features) in release; its path.
pub fn build_program() -> Result<PathBuf> {
    let built = build(&["build", "-p", "ggml-tp", "--bin", "ggml-tp"])?;
    built
        .into_iter()
        .find(|(name, _)| name == "ggml-tp")
        .map(|(_, exe)| exe)
        .context("cargo built no ggml-tp")
}

/// Copies `exe` into `dir` as `name`, stripped of debug information when `strip` is present.
fn place(exe: &Path, dir: &Path, name: &str) -> Result<()> {
    let dst = dir.join(name);
    fs::copy(exe, &dst).with_context(|| format!("copying {}", exe.display()))?;
    if run(Command::new("strip").arg(&dst)).is_err() {
        eprintln!("xtask: `strip` failed or is missing; {name} keeps its debug information");
    }
    Ok(())
}

/// Bytes of every file under `path`.
fn size_of(path: &Path) -> Result<u64> {
    let meta = fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let mut total = 0;
    for entry in fs::read_dir(path)? {
        total += size_of(&entry?.path())?;
    }
    Ok(total)
}

fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    if src.is_file() {
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(src, dst).with_context(|| format!("copying {}", src.display()))?;
        return Ok(());
    }
    fs::create_dir_all(dst)?;
    for entry in fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let entry = entry?;
        copy_tree(&entry.path(), &dst.join(entry.file_name()))?;
    }
    Ok(())
}

/// Builds and packs what `p` names; prints the folder's size against the transfer limit.
pub fn pack(p: &Pack) -> Result<()> {
    let out = repo_root().join(&p.out);
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    for spec in &p.tests {
        let (pkg, test) = package_and_name(spec)?;
        let built = build(&["test", "-p", pkg, "--test", test, "--no-run"])?;
        let (_, exe) = built
            .iter()
            .find(|(name, _)| name == test)
            .with_context(|| format!("cargo built no test binary {test} in {pkg}"))?;
        place(exe, &out, test)?;
    }
    for spec in &p.examples {
        let (pkg, example) = package_and_name(spec)?;
        let built = build(&["build", "-p", pkg, "--example", example])?;
        let (_, exe) = built
            .iter()
            .find(|(name, _)| name == example)
            .with_context(|| format!("cargo built no example {example} in {pkg}"))?;
        place(exe, &out, example)?;
    }
    if p.program {
        place(&build_program()?, &out, "ggml-tp")?;
    }
    for f in &p.fixtures {
        copy_tree(&fixtures_dir().join(f), &out.join("fx").join(f))?;
    }
    let size = size_of(&out)?;
    println!(
        "{}: {:.1} MiB of the {} MiB a call carries (the working tree travels too)",
        p.out.display(),
        size as f64 / (1 << 20) as f64,
        TRANSFER_LIMIT >> 20
    );
    if size > TRANSFER_LIMIT {
        bail!(
            "{} is over the transfer limit: pack less per call",
            p.out.display()
        );
    }
    Ok(())
}

/// Part file names of `file_name` cut into `parts` parts: `NAME.00`, `NAME.01`, ...
fn part_names(file_name: &str, parts: usize) -> Vec<String> {
    (0..parts).map(|i| format!("{file_name}.{i:02}")).collect()
}

/// Cuts `model` (a file) into parts of at most `chunk_mib` MiB under `out`, one folder per part
/// (`out/NN/NAME.NN`, to carry one per call), and writes `out/stage.sh`, which joins the parts
/// staged in a folder and checks the sha256.
pub fn chunks(model: &Path, out: &Path, chunk_mib: u64) -> Result<()> {
    if chunk_mib == 0 || chunk_mib << 20 > TRANSFER_LIMIT {
        bail!(
            "a part of {chunk_mib} MiB: choose 1..={} MiB",
            TRANSFER_LIMIT >> 20
        );
    }
    let data = fs::read(model).with_context(|| format!("reading {}", model.display()))?;
    let file_name = model
        .file_name()
        .and_then(|n| n.to_str())
        .context("model path without a file name")?;
    let (sha, _) = sha256_file(model)?;
    let chunk = (chunk_mib << 20) as usize;
    let parts = data.len().div_ceil(chunk).max(1);
    let names = part_names(file_name, parts);
    for (i, name) in names.iter().enumerate() {
        let dir = out.join(format!("{i:02}"));
        fs::create_dir_all(&dir)?;
        let end = ((i + 1) * chunk).min(data.len());
        fs::write(dir.join(name), &data[i * chunk..end])?;
    }
    let script = format!(
        "#!/bin/bash\n# Joins the parts of {file_name} copied into DIR (default /root/m) and checks the sha256.\n\
         set -e\ncd \"${{1:-/root/m}}\"\ncat {parts} > {file_name}\n\
         echo \"{sha}  {file_name}\" | sha256sum -c -\nrm -f {parts}\n",
        parts = names.join(" "),
    );
    fs::write(out.join("stage.sh"), script)?;
    println!(
        "{}: {parts} part(s) of at most {chunk_mib} MiB under {} (sha256 {sha}); carry one \
         NN folder per call, copy its file into the staging folder, then run stage.sh",
        model.display(),
        out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_messages_name_their_executables() {
        let lines = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"conformance_cuda"},"executable":"/t/conformance_cuda-1"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"ggml_core"},"executable":null}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
            "\nnot json\n"
        );
        assert_eq!(
            executables(lines),
            vec![(
                "conformance_cuda".to_string(),
                PathBuf::from("/t/conformance_cuda-1")
            )]
        );
    }

    #[test]
    fn specs_need_a_package_and_a_name() {
        assert_eq!(
            package_and_name("llama:logits_real").unwrap(),
            ("llama", "logits_real")
        );
        for bad in ["llama", ":x", "x:", ""] {
            assert!(package_and_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn models_are_cut_into_parts_that_join_back() {
        let dir = std::env::temp_dir().join(format!("xtask-chunks-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let model = dir.join("m.gguf");
        let data: Vec<u8> = (0..(2 << 20) + 5).map(|i| (i * 7 % 251) as u8).collect();
        fs::write(&model, &data).unwrap();
        let out = dir.join("parts");
        chunks(&model, &out, 1).unwrap();
        let names = part_names("m.gguf", 3);
        let mut joined = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let part = fs::read(out.join(format!("{i:02}")).join(name)).unwrap();
            assert!(part.len() <= 1 << 20);
            joined.extend(part);
        }
        assert_eq!(joined, data);
        let script = fs::read_to_string(out.join("stage.sh")).unwrap();
        assert!(script.contains("cat m.gguf.00 m.gguf.01 m.gguf.02 > m.gguf"));
        assert!(script.contains(&sha256_file(&model).unwrap().0));
        assert!(chunks(&model, &out, 65).is_err(), "over the transfer limit");
        fs::remove_dir_all(&dir).unwrap();
    }
}
