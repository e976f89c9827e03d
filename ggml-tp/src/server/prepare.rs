//! Turning a request body into a prompt, bounded and off the async workers: the body is read
//! within a deadline and a size limit, then parsing, rendering the chat template and tokenizing run
//! on a blocking thread (at most [`Limits::prepare_threads`] at once, each within
//! [`Limits::prepare_timeout`]). Cheap checks come before expensive ones: a text whose length alone
//! shows it cannot fit a slot's context is refused before it is tokenized.

use super::api::ApiError;
use super::config::Limits;
use super::handlers::AppState;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Reads the whole body within `limits.body_timeout` (408 beyond) and `max_bytes` (413 beyond; a
/// `Content-Length` over it is refused before reading).
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    max_bytes: usize,
    limits: &Limits,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body exceeds the server's size limit of {max_bytes} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_bytes as u64) {
        return Err(too_large());
    }
    let collect = Limited::new(body, max_bytes).collect();
    match tokio::time::timeout(limits.body_timeout, collect).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                limits.body_timeout.as_secs_f64()
            ),
        )),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::bad_request(format!(
            "failed to read the request body: {e}"
        ))),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// Parses a JSON body (400 with serde's reason when it is not JSON or not the expected shape).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

/// Runs `work` on a blocking thread once one of the `permits` is free, giving up after
/// `limits.prepare_timeout` (503 while waiting for a permit, 400 while working). The permit goes
/// with the work, so work that outlives its deadline still counts against the bound until it ends.
pub async fn off_thread<T: Send + 'static>(
    permits: &Arc<Semaphore>,
    limits: &Limits,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let deadline = tokio::time::Instant::now() + limits.prepare_timeout;
    let secs = limits.prepare_timeout.as_secs_f64();
    let permit = tokio::time::timeout_at(deadline, permits.clone().acquire_owned())
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the server is busy preparing other prompts (waited {secs} s); retry later"
                ),
            )
        })?
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping"))?;
    let task = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    });
    match tokio::time::timeout_at(deadline, task).await {
        Err(_) => Err(ApiError::bad_request(format!(
            "preparing the prompt (chat template, tokenizer) took longer than {secs} s"
        ))),
        Ok(Err(e)) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("preparing the prompt failed: {e}"),
        )),
        Ok(Ok(r)) => r,
    }
}

/// Refuses a prompt text whose length alone shows it has at least a slot's context of tokens
/// (every token covers at most `s.max_token_bytes` bytes of text).
pub fn check_text_len(s: &AppState, text: &str) -> Result<(), ApiError> {
    if text.len() > s.n_ctx.saturating_mul(s.max_token_bytes.max(1)) {
        return Err(ApiError::bad_request(format!(
            "the prompt of {} bytes cannot fit a slot's context of {} positions",
            text.len(),
            s.n_ctx
        )));
    }
    Ok(())
}

/// The stop strings, bounded in count and length.
pub fn check_stops(stops: Vec<String>, limits: &Limits) -> Result<Vec<String>, ApiError> {
    if stops.len() > limits.max_stops {
        return Err(ApiError::bad_request(format!(
            "{} stop strings given; at most {} are accepted",
            stops.len(),
            limits.max_stops
        )));
    }
    if let Some(long) = stops.iter().find(|s| s.len() > limits.max_stop_bytes) {
        return Err(ApiError::bad_request(format!(
            "a stop string of {} bytes; at most {} bytes are accepted",
            long.len(),
            limits.max_stop_bytes
        )));
    }
    Ok(stops)
}
