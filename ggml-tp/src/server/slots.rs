//! `GET /slots` and `POST /slots/{id}?action=save|restore|erase[&filename=X][&overwrite=true]`.
//!
//! The inference worker only encodes a slot into bytes or loads bytes into it; the files are read
//! and written here on blocking threads ([`llama::slot_file::write_file`]: a temporary name, then
//! moved into place, removed on failure). The slot directory has a quota of files and bytes (507
//! beyond; also when the disk itself is full), and a save does not replace an existing file unless
//! `overwrite=true` (409 otherwise).

use super::api::ApiError;
use super::engine::SlotAction;
use super::handlers::{reply, AppState, Shared};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llama::slot_file::{self, SlotFileError};
use std::path::PathBuf;

#[derive(Debug, serde::Deserialize)]
pub struct SlotQuery {
    action: String,
    filename: Option<String>,
    /// Let a save replace an existing file of that name.
    #[serde(default)]
    overwrite: bool,
}

/// The answer of a slot action.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlotReport {
    pub id_slot: usize,
    pub n_tokens: usize,
    pub n_bytes: u64,
}

pub async fn slots(State(s): Shared) -> Response {
    let r = s.engine.slots().await.map(|v| Json(v).into_response());
    reply(&s, r)
}

/// `POST /slots/{id}?action=...`.
pub async fn slot_action(
    State(s): Shared,
    id: Result<Path<usize>, PathRejection>,
    query: Result<Query<SlotQuery>, QueryRejection>,
) -> Response {
    let r = async {
        let Path(id) = id.map_err(|e| ApiError::bad_request(e.body_text()))?;
        let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
        let report = match q.action.as_str() {
            "save" => save(&s, id, slot_path(&s, q.filename.as_deref())?, q.overwrite).await?,
            "restore" => restore(&s, id, slot_path(&s, q.filename.as_deref())?).await?,
            "erase" => {
                let done = s.engine.slot_action(id, SlotAction::Erase).await?;
                SlotReport {
                    id_slot: id,
                    n_tokens: done.n_tokens,
                    n_bytes: 0,
                }
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown action {other:?} (save, restore or erase)"
                )))
            }
        };
        Ok(Json(report).into_response())
    };
    let r = r.await;
    reply(&s, r)
}

fn file_error(e: SlotFileError) -> ApiError {
    match e {
        SlotFileError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => {
            ApiError::new(StatusCode::NOT_FOUND, format!("slot file not found: {e}"))
        }
        SlotFileError::Io(e) if disk_full(e.kind()) => ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("the slot directory's disk is full: {e}"),
        ),
        SlotFileError::Exists(_) => ApiError::new(
            StatusCode::CONFLICT,
            format!("{e}; pass overwrite=true to replace it"),
        ),
        SlotFileError::TooLarge { .. } => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string())
        }
        SlotFileError::Mismatch(_) => ApiError::bad_request(e.to_string()),
        e => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Whether a write failed for want of space: a full file system, a disk quota, or a file size
/// limit.
fn disk_full(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::{FileTooLarge, QuotaExceeded, StorageFull};
    matches!(kind, StorageFull | QuotaExceeded | FileTooLarge)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

async fn save(
    s: &AppState,
    id: usize,
    path: PathBuf,
    overwrite: bool,
) -> Result<SlotReport, ApiError> {
    // Refused before the worker spends time encoding; the write itself checks again atomically.
    if !overwrite && path.exists() {
        return Err(file_error(SlotFileError::Exists(
            path.display().to_string(),
        )));
    }
    let done = s.engine.slot_action(id, SlotAction::Save).await?;
    let bytes = done.data.unwrap_or_default();
    let _io = s.slot_io.lock().await;
    let (max_files, max_bytes) = (s.slot_max_files, s.slot_max_bytes);
    let n_bytes = blocking(move || {
        check_quota(&path, bytes.len() as u64, max_files, max_bytes)?;
        slot_file::write_file(&path, &bytes, overwrite).map_err(file_error)
    })
    .await?;
    Ok(SlotReport {
        id_slot: id,
        n_tokens: done.n_tokens,
        n_bytes,
    })
}

async fn restore(s: &AppState, id: usize, path: PathBuf) -> Result<SlotReport, ApiError> {
    let max = s.slot_max_bytes;
    let bytes = blocking(move || slot_file::read_file(&path, max).map_err(file_error)).await?;
    let n_bytes = bytes.len() as u64;
    let done = s.engine.slot_action(id, SlotAction::Restore(bytes)).await?;
    Ok(SlotReport {
        id_slot: id,
        n_tokens: done.n_tokens,
        n_bytes,
    })
}

/// Whether writing `new_bytes` to `path` keeps the slot directory within `max_files` files and
/// `max_bytes` bytes (a file replaced by the write counts with its new size only). Temporary files
/// (names starting with a dot) are not counted.
fn check_quota(
    path: &std::path::Path,
    new_bytes: u64,
    max_files: usize,
    max_bytes: u64,
) -> Result<(), ApiError> {
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let io = |e: std::io::Error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let (mut files, mut total, mut replaced) = (0usize, 0u64, false);
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let meta = entry.metadata().map_err(io)?;
        if !meta.is_file() || entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if entry.path() == path {
            replaced = true;
            continue;
        }
        files += 1;
        total += meta.len();
    }
    let full = |what: String| {
        ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("the slot directory's quota is full: {what}; erase or overwrite a file"),
        )
    };
    if files + 1 > max_files {
        let held = files + usize::from(replaced);
        return Err(full(format!("{held} of {max_files} files")));
    }
    if total + new_bytes > max_bytes {
        return Err(full(format!(
            "{total} bytes held, {new_bytes} more would pass {max_bytes}"
        )));
    }
    Ok(())
}

/// The file `name` in the slot directory; only plain names (`[A-Za-z0-9._-]`, not starting with
/// a dot) are accepted, so a request cannot reach outside the directory.
fn slot_path(s: &AppState, name: Option<&str>) -> Result<PathBuf, ApiError> {
    let dir = s.slot_dir.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "slot save/restore is disabled: start the server with a slot save directory",
        )
    })?;
    let name = name.ok_or_else(|| ApiError::bad_request("filename is required"))?;
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !ok {
        return Err(ApiError::bad_request(format!(
            "invalid filename {name:?} (letters, digits, '.', '_', '-'; not starting with '.')"
        )));
    }
    Ok(dir.join(name))
}
