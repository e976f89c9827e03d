//! `cargo xtask models`: fetches the real GGUF test models ([`model_cache::RECIPES`]) into the
//! user's model cache (`$XDG_CACHE_HOME/ggml-tp/models`, else `~/.cache/ggml-tp/models`), which
//! every clone on the machine shares; a model file in the repository's `models/` folder is an
//! override and wins. Sizes and hashes come from the fixtures manifest when it is present (the copy
//! in the table is used otherwise); the fetching itself (pip, verification, the per-model lock) is
//! [`model_cache::fetch`], which `ggml-tp run <name>` uses too.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use model_cache::{Expected, Recipe, RECIPES};

use crate::{manifest, paths};

/// The recipes selected by `--only` (all of them when `None`; a key or a short name).
pub fn select(only: Option<&str>) -> Result<Vec<&'static Recipe>> {
    match only {
        None => Ok(RECIPES.iter().collect()),
        Some(key) => Ok(vec![model_cache::find(key)?]),
    }
}

/// Where a model's file is: `models/<file>` when that is there (the override), else its place in
/// the user's cache (where `cargo xtask models` puts it).
pub fn model_path(recipe: &Recipe) -> Result<PathBuf> {
    let local = paths::models_dir().join(recipe.file);
    if local.is_file() {
        return Ok(local);
    }
    Ok(paths::models_cache_dir()?.join(recipe.file))
}

/// Takes size and hash from the fixtures manifest when it lists the model, else from the table.
fn expected(recipe: &Recipe, manifest: Option<&manifest::ManifestModel>) -> Result<Expected> {
    let Some(m) = manifest else {
        return Ok(recipe.expected());
    };
    if m.file != recipe.file {
        bail!(
            "the fixtures manifest names model `{}` `{}`, xtask's table `{}`: update model-cache/src/recipes.rs",
            recipe.key,
            m.file,
            recipe.file
        );
    }
    if m.bytes != recipe.bytes || m.sha256 != recipe.sha256 {
        eprintln!(
            "xtask: warning: the fixtures manifest's size/sha256 of `{}` differ from xtask's table; using the manifest's",
            recipe.key
        );
    }
    Ok(Expected {
        bytes: m.bytes,
        sha256: m.sha256.clone(),
    })
}

/// Fetches the selected models into the cache; a model already in `models/` or in the cache with
/// the right size and hash is left alone (and nothing is downloaded for it).
pub fn fetch_all(only: Option<&str>) -> Result<()> {
    let recipes = select(only)?;
    let manifest = manifest::load_models()?;
    if manifest.is_none() {
        eprintln!(
            "xtask: no fixtures manifest at {}; using the sizes and hashes built into xtask",
            manifest::manifest_path().display()
        );
    }
    let cache = paths::models_cache_dir()?;
    for recipe in recipes {
        let want = expected(recipe, manifest.as_ref().and_then(|m| m.get(recipe.key)))?;
        model_cache::fetch_model(recipe, &want, Some(&paths::models_dir()), &cache)
            .with_context(|| format!("fetching model `{}`", recipe.key))?;
    }
    Ok(())
}
