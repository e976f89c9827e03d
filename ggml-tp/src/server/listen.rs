//! The accept loop: HTTP/1 connections served by hyper (through hyper-util's tokio glue and
//! graceful shutdown) with a timeout for request heads, and a cap on open connections.
//!
//! hyper's `header_read_timeout` runs from the moment it waits for a request head: after a
//! connection opens and after each response, so it bounds both a client that sends its head slowly
//! and an idle keep-alive connection. A connection past [`Limits::max_connections`] gets a 503 in
//! OpenAI's error shape, written without waiting, and is closed.

use super::api::ApiError;
use super::config::Limits;
use super::guard::LocalAddr;
use axum::http::{Request, StatusCode};
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Serves `router` on `listener` until `shutdown` completes, then waits for the open connections
/// to finish their requests.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: &Limits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true)
        .max_headers(100);
    let graceful = GracefulShutdown::new();
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let refusal = over_cap_response(limits.max_connections);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: wait and go on.
                    eprintln!("ggml-tp serve: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            let _ = stream.try_write(refusal.as_bytes());
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Ok(local) = stream.local_addr().map(LocalAddr) else {
            continue;
        };
        let service = router
            .clone()
            .map_request(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(local);
                req
            });
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // Errors are the client's (a reset, a timed-out head): the connection just ends.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The raw HTTP answer to a connection over the cap.
fn over_cap_response(cap: usize) -> String {
    let body = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the server has {cap} open connections, its limit; retry later"),
    )
    .body()
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}
