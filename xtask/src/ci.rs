//! `cargo xtask ci`: the whole CI, in order, stopping at the first failing step.
//!
//! Steps: `cargo fmt --check`, clippy with `-D warnings`, one release build per entry of `FEATURE_BUILDS`,
//! then the tests (`cargo nextest run`, or `cargo test` when nextest is not installed), after fetching the
//! real models (`cargo xtask models`) that the logit checks use. Each step is timed.

use std::ffi::OsString;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{paths, process};

/// A build of one feature set: a package with features, or the plain workspace (`package: None`).
pub struct FeatureBuild {
    pub package: Option<&'static str>,
    pub features: &'static [&'static str],
}

/// Every feature set that CI builds. Add backends here, e.g.
/// `FeatureBuild { package: Some("backend-cuda"), features: &["cuda"] }`; an entry whose package is not
/// (yet) a workspace member is skipped with a note.
pub const FEATURE_BUILDS: &[FeatureBuild] = &[FeatureBuild {
    package: None,
    features: &[],
}];

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

/// The cargo that runs xtask (`$CARGO`), else `cargo` from PATH.
fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
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

/// The build step of one feature set.
fn build_step(build: &FeatureBuild, members: &[String]) -> Step {
    let mut args: Vec<String> = ["build", "--release", "--all-targets", "--locked"]
        .map(String::from)
        .to_vec();
    let name = match build.package {
        None => {
            args.push("--workspace".into());
            "build workspace".to_string()
        }
        Some(pkg) => {
            args.extend(["--package".into(), pkg.into()]);
            format!("build {pkg}")
        }
    };
    let name = if build.features.is_empty() {
        name
    } else {
        args.extend(["--features".into(), build.features.join(",")]);
        format!("{name} --features {}", build.features.join(","))
    };
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
    steps.push(test_step());
    Ok(steps)
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
