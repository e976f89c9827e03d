//! `cargo xtask check-dequant`: cross-checks ggml-core's dequantization against gguf-py.
//!
//! For every tensor of each GGUF file, both sides dequantize to f32 and hash the little-endian bytes
//! (`reference` runs `scripts/dequant_ref.py`, `native` uses ggml-core). The hashes are compared; for a
//! tensor whose hashes differ, the reference dumps the tensor's values so the first differing element can be
//! reported. Any mismatch makes the command fail.

mod native;
mod reference;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ggml_core::DType;

use crate::{models, python};

use native::NativeTensor;
use reference::RefTensor;

/// At most this many mismatching tensors per file are dumped to find their first differing element.
const MAX_DETAILED: usize = 5;

/// A tensor on which the two sides disagree.
struct Mismatch {
    name: String,
    dtype: String,
    detail: String,
}

/// The outcome for one file.
#[derive(Default)]
struct Report {
    /// Tensors dequantized by both sides and compared.
    checked: usize,
    /// Tensor count per type, over the compared tensors.
    types: BTreeMap<String, usize>,
    /// Tensors gguf-py cannot dequantize: (name, type, reason).
    skipped: Vec<(String, String, String)>,
    mismatches: Vec<Mismatch>,
}

/// The files to check: `--file` paths, else the fetched models (all, or `--only`).
fn targets(only: Option<&str>, files: &[PathBuf]) -> Result<Vec<(String, PathBuf)>> {
    if !files.is_empty() {
        if only.is_some() {
            bail!("give either --only or --file, not both");
        }
        return Ok(files
            .iter()
            .map(|f| (f.display().to_string(), f.clone()))
            .collect());
    }
    let mut targets = Vec::new();
    for recipe in models::select(only)? {
        let path = models::model_path(recipe)?;
        if !path.is_file() {
            bail!(
                "model `{}` is not at {}: run `cargo xtask models` first",
                recipe.key,
                path.display()
            );
        }
        targets.push((recipe.key.to_string(), path));
    }
    Ok(targets)
}

/// Runs the cross-check on each target and fails if any tensor differs.
pub fn check(only: Option<&str>, files: &[PathBuf]) -> Result<()> {
    let targets = targets(only, files)?;
    let python = python::dequant_python()?;
    let mut failed = Vec::new();
    for (label, path) in &targets {
        println!("==> {label}: {}", path.display());
        let report =
            check_file(&python, path).with_context(|| format!("checking {}", path.display()))?;
        report.print(label);
        if !report.mismatches.is_empty() {
            failed.push(label.as_str());
        }
    }
    if !failed.is_empty() {
        bail!(
            "dequantization differs from gguf-py in: {}",
            failed.join(", ")
        );
    }
    println!(
        "check-dequant: all {} file(s) agree with gguf-py bit for bit",
        targets.len()
    );
    Ok(())
}

/// Compares both sides on one file.
fn check_file(python: &OsString, path: &Path) -> Result<Report> {
    let pending = reference::start_hashes(python, path)?;
    let ours = native::tensor_hashes(path);
    let theirs = pending.wait()?;
    let ours = ours?;
    let mut report = compare(&ours, theirs);
    for m in report
        .mismatches
        .iter_mut()
        .filter(|m| m.detail.is_empty())
        .take(MAX_DETAILED)
    {
        m.detail = first_difference(python, path, &m.name)?;
    }
    for m in report.mismatches.iter_mut().filter(|m| m.detail.is_empty()) {
        m.detail = format!("values differ (not dumped: only the first {MAX_DETAILED} are)");
    }
    Ok(report)
}

/// Matches the two listings by name. Hash mismatches get an empty `detail`, filled in by the caller.
fn compare(ours: &[NativeTensor], theirs: Vec<RefTensor>) -> Report {
    let mut theirs: BTreeMap<String, RefTensor> =
        theirs.into_iter().map(|t| (t.name.clone(), t)).collect();
    let mut report = Report::default();
    for t in ours {
        let dtype = t.dtype.name().to_string();
        let mut mismatch = |detail: String| {
            report.mismatches.push(Mismatch {
                name: t.name.clone(),
                dtype: dtype.clone(),
                detail,
            })
        };
        let Some(r) = theirs.remove(&t.name) else {
            mismatch("gguf-py does not list this tensor".into());
            continue;
        };
        if DType::from_name(&r.dtype) != Some(t.dtype) {
            mismatch(format!("type differs: gguf-py reads {}", r.dtype));
        } else if r.n_elements != t.n_elements {
            mismatch(format!(
                "element count differs: ggml-core {}, gguf-py {}",
                t.n_elements, r.n_elements
            ));
        } else if let Some(reason) = r.skipped {
            report.skipped.push((t.name.clone(), dtype, reason));
        } else {
            match (&t.sha256, &r.sha256) {
                (Err(e), _) => mismatch(format!("ggml-core failed: {e}")),
                (Ok(_), None) => mismatch("gguf-py printed no hash".into()),
                (Ok(a), Some(b)) => {
                    if a != b {
                        mismatch(String::new());
                    }
                    report.checked += 1;
                    *report.types.entry(dtype).or_default() += 1;
                }
            }
        }
    }
    for r in theirs.into_values() {
        report.mismatches.push(Mismatch {
            name: r.name,
            dtype: r.dtype,
            detail: "ggml-core's reader does not list this tensor".into(),
        });
    }
    report
}

/// Describes where tensor `name`'s values first differ between ggml-core and gguf-py.
fn first_difference(python: &OsString, path: &Path, name: &str) -> Result<String> {
    let (ours, ne0) = native::tensor_values(path, name)?;
    let theirs = reference::dump_tensor(python, path, name)?;
    if ours.len() != theirs.len() {
        return Ok(format!(
            "ggml-core gives {} values, gguf-py {}",
            ours.len(),
            theirs.len()
        ));
    }
    let differs = |(a, b): &(&f32, &f32)| a.to_bits() != b.to_bits();
    let pairs = || ours.iter().zip(&theirs);
    let Some(first) = pairs().position(|p| differs(&p)) else {
        return Ok(
            "hashes differ but the dumped values are identical (nondeterministic dequantization?)"
                .into(),
        );
    };
    let count = pairs().filter(differs).count();
    let max_abs = pairs()
        .filter(differs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, |m, d| if d.is_nan() { m } else { m.max(d) });
    let (a, b) = (ours[first], theirs[first]);
    Ok(format!(
        "first difference at element {first} (row {}, column {}): ggml-core {a:e} ({:#010x}), gguf-py {b:e} ({:#010x}); \
         {count} of {} elements differ, max |diff| {max_abs:e}",
        first / ne0.max(1),
        first % ne0.max(1),
        a.to_bits(),
        b.to_bits(),
        ours.len()
    ))
}

impl Report {
    fn print(&self, label: &str) {
        let types: Vec<String> = self
            .types
            .iter()
            .map(|(t, n)| format!("{t} x{n}"))
            .collect();
        println!(
            "{label}: {} tensors checked, {} mismatches, {} skipped; types: {}",
            self.checked,
            self.mismatches.len(),
            self.skipped.len(),
            types.join(", ")
        );
        for (name, dtype, reason) in &self.skipped {
            println!("  skipped {name} ({dtype}): gguf-py cannot dequantize it: {reason}");
        }
        for m in &self.mismatches {
            println!("  MISMATCH {} ({}): {}", m.name, m.dtype, m.detail);
        }
    }
}
