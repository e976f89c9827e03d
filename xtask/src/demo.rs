//! `cargo xtask demo`: the README's main job as one command. Fetches the demo model (SmolLM2-135M)
//! into the user's model cache when it is missing (sha256-verified, as `cargo xtask models` does),
//! then runs `ggml-tp run` on it with tensor parallelism over two CPU devices.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::{models, paths, process};

/// The model key of the demo (see `model_cache::RECIPES`).
pub const DEMO_MODEL: &str = "smollm2-135m";

/// What the demo asks of the model.
pub struct Demo {
    pub prompt: String,
    pub n_predict: usize,
    /// More options for `ggml-tp run`, after the demo's own.
    pub extra: Vec<String>,
}

/// The cargo arguments that build the program and run the demo on `model`.
fn cargo_args(demo: &Demo, model: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["run", "--release", "-p", "ggml-tp", "--", "run", "-m"]
        .map(OsString::from)
        .to_vec();
    args.push(model.into());
    let n_predict = demo.n_predict.to_string();
    let placement = ["--split-mode", "tensor", "--cpu-devices", "2"];
    args.extend(placement.map(OsString::from));
    args.extend(["-p", &demo.prompt, "-n", &n_predict].map(OsString::from));
    args.extend(demo.extra.iter().map(OsString::from));
    args
}

/// Fetches the demo model if needed, then runs it.
pub fn run(demo: &Demo) -> Result<()> {
    models::fetch_all(Some(DEMO_MODEL))?;
    let recipe = models::select(Some(DEMO_MODEL))?[0];
    let model = models::model_path(recipe)?;
    process::run(
        Command::new(process::cargo())
            .current_dir(paths::repo_root())
            .args(cargo_args(demo, &model)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_runs_the_model_over_two_cpu_devices_with_the_extra_options_last() {
        let demo = Demo {
            prompt: "Hi there".into(),
            n_predict: 16,
            extra: vec!["--seed".into(), "3".into()],
        };
        let args = cargo_args(&demo, Path::new("/cache/m.gguf"));
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "run",
                "--release",
                "-p",
                "ggml-tp",
                "--",
                "run",
                "-m",
                "/cache/m.gguf",
                "--split-mode",
                "tensor",
                "--cpu-devices",
                "2",
                "-p",
                "Hi there",
                "-n",
                "16",
                "--seed",
                "3"
            ]
        );
        assert!(models::select(Some(DEMO_MODEL)).is_ok());
    }
}
