//! The `models` section of the fixtures manifest (`reference/manifest.json`): file name, size and sha256 of
//! each real model. Only what xtask needs is read; the rest of the manifest is for the tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::paths;

/// One model's entry in the manifest.
#[derive(Debug, Deserialize)]
pub struct ManifestModel {
    pub file: String,
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Deserialize)]
struct Manifest {
    models: BTreeMap<String, ManifestModel>,
}

/// Path of the reference manifest inside the fixtures folder.
pub fn manifest_path() -> PathBuf {
    paths::fixtures_dir()
        .join("reference")
        .join("manifest.json")
}

/// The manifest's models by key, or `None` when the fixtures folder (or its manifest) is absent.
/// A manifest that exists but cannot be read or parsed is an error.
pub fn load_models() -> Result<Option<BTreeMap<String, ManifestModel>>> {
    load_models_from(&manifest_path())
}

fn load_models_from(path: &Path) -> Result<Option<BTreeMap<String, ManifestModel>>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let manifest: Manifest = serde_json::from_str(&text)
        .with_context(|| format!("parsing the `models` section of {}", path.display()))?;
    Ok(Some(manifest.models))
}
