//! `cargo xtask ci`: the whole CI, in order, stopping at the first failing step.
//!
//! Steps: `cargo fmt --check`, clippy with `-D warnings`, the workspace's release build and a
//! `cargo check` of every other entry of `FEATURE_BUILDS` (the program's vendor features, the library
//! alone), a `cargo check` of the workspace for aarch64 (the NEON kernels), then the tests (`cargo nextest run`, or `cargo test` when nextest is not installed), after
//! fetching the real models (`cargo xtask models`) that the logit checks use and setting up the
//! Pythons the tests drive: gguf-py for the GGUF cross-check (`GGML_TP_GGUF_PYTHON`) and the
//! official openai client for the server's SDK test (`GGML_TP_OPENAI_PYTHON`, a venv in the user's
//! cache). Each step is timed.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::process::cargo;
use crate::{paths, process};

/// One feature set that CI compiles.
pub struct FeatureBuild {
    /// The package, or the plain workspace (`None`).
    pub package: Option<&'static str>,
    /// `--no-default-features`: only `features` are on.
    pub no_default_features: bool,
    pub features: &'static [&'static str],
    /// `cargo check` of every target rather than a release build: enough to show the feature set
    /// compiles, at a fraction of a release build's time (the tests use the workspace's build).
    pub check: bool,
}

impl FeatureBuild {
    /// The release build of the whole workspace with default features, which the tests then use.
    const fn workspace() -> FeatureBuild {
        FeatureBuild {
            package: None,
            no_default_features: false,
            features: &[],
            check: false,
        }
    }

    /// A check of `package` with exactly `features`.
    const fn check_only(package: &'static str, features: &'static [&'static str]) -> FeatureBuild {
        FeatureBuild {
            package: Some(package),
            no_default_features: true,
            features,
            check: true,
        }
    }
}

/// Every feature set that CI compiles: the workspace, the `ggml-tp` program without vendors, with
/// each vendor alone and with all of them, and the `llama` library alone. Add backends here; an entry
/// whose package is not (yet) a workspace member is skipped with a note.
pub const FEATURE_BUILDS: &[FeatureBuild] = &[
    FeatureBuild::workspace(),
    FeatureBuild::check_only("ggml-tp", &[]),
    FeatureBuild::check_only("ggml-tp", &["cuda"]),
    FeatureBuild::check_only("ggml-tp", &["hip"]),
    FeatureBuild::check_only("ggml-tp", &["vulkan"]),
    FeatureBuild::check_only("ggml-tp", &["cuda", "hip", "vulkan"]),
    FeatureBuild::check_only("llama", &[]),
];

/// One CI step: a name and the cargo arguments to run, or a reason it is skipped.
struct Step {
    name: String,
    args: Result<Vec<String>, String>,
}

fn step(name: impl Into<String>, args: &[&str]) -> Step {
    Step {
        name: name.into(),
        args: Ok(args.iter().map(|a| a.to_string()).collect()),
    }
}

/// Names of the workspace's member packages, from `cargo metadata`.
fn workspace_members() -> Result<Vec<String>> {
    let out = process::output(Command::new(cargo()).current_dir(paths::repo_root()).args([
        "metadata",
        "--no-deps",
        "--format-version",
        "1",
    ]))?;
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing `cargo metadata` output")?;
    let packages = meta["packages"]
        .as_array()
        .context("`cargo metadata` output has no `packages` list")?;
    Ok(packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect())
}

/// The build (or check) step of one feature set.
fn build_step(build: &FeatureBuild, members: &[String]) -> Step {
    let mut args: Vec<String> = if build.check {
        vec!["check".into()]
    } else {
        vec!["build".into(), "--release".into()]
    };
    args.extend(["--all-targets", "--locked"].map(String::from));
    let mut name = match build.package {
        None => {
            args.push("--workspace".into());
            format!("{} workspace", args[0])
        }
        Some(pkg) => {
            args.extend(["--package".into(), pkg.into()]);
            format!("{} {pkg}", args[0])
        }
    };
    if build.no_default_features {
        args.push("--no-default-features".into());
        name.push_str(" --no-default-features");
    }
    if !build.features.is_empty() {
        args.extend(["--features".into(), build.features.join(",")]);
        name = format!("{name} --features {}", build.features.join(","));
    }
    match build.package {
        Some(pkg) if !members.iter().any(|m| m == pkg) => Step {
            name,
            args: Err(format!("package `{pkg}` is not in the workspace")),
        },
        _ => Step {
            name,
            args: Ok(args),
        },
    }
}

/// The test step: nextest when it is installed, else `cargo test`.
fn test_step() -> Step {
    if process::succeeds(Command::new(cargo()).args(["nextest", "--version"])) {
        step(
            "tests (nextest)",
            &["nextest", "run", "--workspace", "--release", "--locked"],
        )
    } else {
        eprintln!("xtask: cargo-nextest not found; running the tests with `cargo test`");
        step(
            "tests (cargo test)",
            &["test", "--workspace", "--release", "--locked"],
        )
    }
}

/// All steps, in order.
fn steps() -> Result<Vec<Step>> {
    let members = workspace_members()?;
    let mut steps = vec![
        step("fmt", &["fmt", "--all", "--", "--check"]),
        step(
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        ),
    ];
    steps.extend(FEATURE_BUILDS.iter().map(|b| build_step(b, &members)));
    steps.push(cross_check_step());
    steps.push(test_step());
    Ok(steps)
}

/// The other target whose build CI checks: aarch64, where the CPU backend's NEON kernels compile
/// (this machine cannot run them).
const CROSS_TARGET: &str = "aarch64-unknown-linux-gnu";

/// `cargo check` of every target of the workspace for [`CROSS_TARGET`], its standard library
/// added through rustup when missing; skipped, saying why, where rustup cannot add it.
fn cross_check_step() -> Step {
    let name = format!("check workspace --target {CROSS_TARGET}");
    let args = ensure_rust_target(CROSS_TARGET).map(|()| {
        [
            "check",
            "--workspace",
            "--all-targets",
            "--locked",
            "--target",
            CROSS_TARGET,
        ]
        .map(String::from)
        .to_vec()
    });
    Step { name, args }
}

/// Adds the standard library of `target` with rustup unless it is installed.
fn ensure_rust_target(target: &str) -> std::result::Result<(), String> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map_err(|e| format!("rustup not found: {e}"))?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == target)
    {
        return Ok(());
    }
    process::run(Command::new("rustup").args(["target", "add", target]))
        .map_err(|e| format!("rustup could not add the {target} standard library: {e:#}"))
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Runs every step, printing a timing per step and a summary; fails at the first failing step.
pub fn run_all() -> Result<()> {
    let root = paths::repo_root();
    let total = Instant::now();
    // The GGUF cross-check test reads our files with the Python reference implementation.
    let python = crate::python::dequant_python()?;
    // The server's SDK test drives `ggml-tp serve` with the official openai client.
    let openai_python = crate::python::openai_python()?;
    // The real-model logit checks need the three models (fetched once, verified by sha256).
    crate::models::fetch_all(None)?;
    let mut timings: Vec<(String, String)> = Vec::new();
    for Step { name, args } in steps()? {
        let args = match args {
            Ok(args) => args,
            Err(reason) => {
                println!("==> {name}: skipped ({reason})");
                timings.push((name, "skipped".into()));
                continue;
            }
        };
        println!("==> {name}: cargo {}", args.join(" "));
        let start = Instant::now();
        let result = process::run(
            Command::new(cargo())
                .current_dir(&root)
                .env("GGML_TP_GGUF_PYTHON", &python)
                .env("GGML_TP_OPENAI_PYTHON", &openai_python)
                .args(&args),
        );
        let took = start.elapsed();
        println!(
            "==> {name}: {} in {}",
            if result.is_ok() { "ok" } else { "FAILED" },
            secs(took)
        );
        if let Err(err) = result {
            print_summary(&timings, total.elapsed());
            bail!("CI failed at step `{name}` after {}: {err:#}", secs(took));
        }
        timings.push((name, secs(took)));
    }
    print_summary(&timings, total.elapsed());
    println!("CI passed in {}", secs(total.elapsed()));
    Ok(())
}

fn print_summary(timings: &[(String, String)], total: Duration) {
    println!("---- CI step timings ----");
    for (name, took) in timings {
        println!("  {name:<40} {took:>10}");
    }
    println!("  {:<40} {:>10}", "total", secs(total));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_sets_become_cargo_arguments() {
        let members = ["ggml-tp".to_string()];
        let all = build_step(&FeatureBuild::workspace(), &members);
        assert_eq!(all.name, "build workspace");
        assert_eq!(
            all.args.unwrap(),
            [
                "build",
                "--release",
                "--all-targets",
                "--locked",
                "--workspace"
            ]
        );
        let one = build_step(
            &FeatureBuild::check_only("ggml-tp", &["cuda", "hip"]),
            &members,
        );
        assert_eq!(
            one.name,
            "check ggml-tp --no-default-features --features cuda,hip"
        );
        assert_eq!(
            one.args.unwrap(),
            [
                "check",
                "--all-targets",
                "--locked",
                "--package",
                "ggml-tp",
                "--no-default-features",
                "--features",
                "cuda,hip"
            ]
        );
        let absent = build_step(&FeatureBuild::check_only("nothing", &[]), &members);
        assert!(absent.args.unwrap_err().contains("not in the workspace"));
    }
}
