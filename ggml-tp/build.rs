//! Build script: the git commit the program is built from and the number of commits up to it
//! (`GGML_TP_BUILD_COMMIT`, `GGML_TP_BUILD_NUMBER`), for `bench`'s `build_commit` and `build_number`
//! as llama-bench reports them; `unknown` and 0 outside a git checkout.

use std::process::Command;

/// The trimmed output of `git args`, if git runs and says something.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    let commit = git(&["rev-parse", "--short=7", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let number = git(&["rev-list", "--count", "HEAD"]).unwrap_or_else(|| "0".into());
    println!("cargo:rustc-env=GGML_TP_BUILD_COMMIT={commit}");
    println!("cargo:rustc-env=GGML_TP_BUILD_NUMBER={number}");
    println!("cargo:rerun-if-changed=build.rs");
    // Run again when HEAD moves: HEAD itself (a checkout) and the branch it names (a commit).
    let refs = std::iter::once("HEAD".to_string()).chain(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in refs {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
