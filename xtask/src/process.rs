//! Running external programs with clear errors: which program is missing, which command failed and how.

use std::ffi::OsString;
use std::io;
use std::process::{Child, Command, Output};

use anyhow::{bail, Result};

/// The command line of `cmd` as a person would type it (for messages).
pub fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Explains a spawn error: a missing program gets its own message.
fn spawn_error(cmd: &Command, err: io::Error) -> anyhow::Error {
    if err.kind() == io::ErrorKind::NotFound {
        anyhow::anyhow!(
            "`{}` not found: is it installed and on PATH? (while running `{}`)",
            cmd.get_program().to_string_lossy(),
            describe(cmd)
        )
    } else {
        anyhow::Error::new(err).context(format!("could not start `{}`", describe(cmd)))
    }
}

/// Runs `cmd` with inherited stdio; fails if it cannot start or exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().map_err(|e| spawn_error(cmd, e))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Runs `cmd` capturing its output; fails if it cannot start or exits non-zero (stderr in the message).
pub fn output(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().map_err(|e| spawn_error(cmd, e))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}):\n{}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    Ok(out)
}

/// True if `cmd` can be started and exits with success (its output is discarded).
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

/// Starts `cmd` without waiting for it; fails with a clear message if it cannot start.
pub fn spawn(cmd: &mut Command) -> Result<Child> {
    cmd.spawn().map_err(|e| spawn_error(cmd, e))
}

/// The cargo that runs xtask (`$CARGO`), else `cargo` from PATH.
pub fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Runs `attempt` up to `attempts` times, waiting 5 s, 10 s, ... between tries (for downloads that a
/// dropped connection breaks off, which pip's own retries do not cover); `what` names it in messages.
pub fn retry(attempts: u32, what: &str, mut attempt: impl FnMut() -> Result<()>) -> Result<()> {
    let mut n = 1;
    loop {
        match attempt() {
            Ok(()) => return Ok(()),
            Err(err) if n < attempts => {
                eprintln!(
                    "xtask: {what} failed (attempt {n} of {attempts}): {err:#}; trying again"
                );
                std::thread::sleep(std::time::Duration::from_secs(5 * u64::from(n)));
                n += 1;
            }
            Err(err) => return Err(err.context(format!("{what} ({attempts} attempts)"))),
        }
    }
}
