//! Who may talk to the server, checked before any handler runs:
//!
//! * `Host` must name the server: `localhost`, a loopback address, the address the connection came
//!   in on, or a name of [`Access::allowed_hosts`] (403 otherwise). A web page that rebinds its own
//!   DNS name to 127.0.0.1 sends its name as `Host` and is refused.
//! * `Origin`, when a browser sends one, must be the server's own (`http://` + an accepted host +
//!   the port it serves on) or one of [`Access::cors_origins`] (403 otherwise). Only the latter get
//!   CORS headers and preflight answers ([`cors`], tower-http's `CorsLayer`); curl and the SDKs send
//!   no `Origin` and are not affected.
//! * With an API key, every endpoint but `/health` needs `Authorization: Bearer KEY` (401 in
//!   OpenAI's error shape otherwise, compared in constant time). Preflight requests carry no
//!   credentials and are answered by the CORS layer before this check.

use super::api::ApiError;
use super::config::Access;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tower_http::cors::{AllowOrigin, CorsLayer};

/// The address a connection came in on (set per connection by the accept loop).
#[derive(Debug, Clone, Copy)]
pub struct LocalAddr(pub SocketAddr);

/// The checks' settings.
#[derive(Debug)]
pub struct Guard {
    api_key: Option<String>,
    /// Lower-cased, without a trailing slash.
    cors_origins: Vec<String>,
    /// Lower-cased names, without ports.
    hosts: Vec<String>,
    /// The port the server listens on (its own origin's port).
    port: u16,
}

impl Guard {
    pub fn new(access: &Access, bound: SocketAddr) -> Arc<Guard> {
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
            .iter()
            .map(|h| h.to_string())
            .chain(access.allowed_hosts.iter().map(|h| h.to_ascii_lowercase()))
            .collect();
        if !bound.ip().is_unspecified() {
            hosts.push(bound.ip().to_string());
        }
        Arc::new(Guard {
            api_key: access.api_key.clone(),
            cors_origins: access.cors_origins.iter().map(|o| normalize(o)).collect(),
            hosts,
            port: bound.port(),
        })
    }

    /// Whether `host` (a name or address, no port, brackets removed) names this server for a
    /// connection that came in on `local`.
    fn host_ok(&self, host: &str, local: Option<IpAddr>) -> bool {
        let host = host.to_ascii_lowercase();
        if self.hosts.contains(&host) {
            return true;
        }
        match host.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || Some(ip) == local,
            Err(_) => false,
        }
    }

    /// Whether `origin` is the server's own (`http://` + an accepted host + this port).
    fn own_origin(&self, origin: &str, local: Option<IpAddr>) -> bool {
        let Some(rest) = origin.strip_prefix("http://") else {
            return false;
        };
        let Some((host, port)) = split_host(rest) else {
            return false;
        };
        port.unwrap_or(80) == self.port && self.host_ok(host, local)
    }

    fn check(&self, req: &Request) -> Result<(), ApiError> {
        let local = req.extensions().get::<LocalAddr>().map(|a| a.0.ip());
        let forbidden = |m: String| ApiError::new(StatusCode::FORBIDDEN, m);
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or(req.uri().authority().map(|a| a.as_str()))
            .ok_or_else(|| forbidden("the request has no Host header".into()))?;
        match split_host(host) {
            Some((name, _)) if self.host_ok(name, local) => {}
            _ => {
                return Err(forbidden(format!(
                    "host {host:?} is not this server's name (DNS rebinding protection); start the \
                     server with --allowed-host NAME to accept it"
                )))
            }
        }
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let o = normalize(origin.to_str().unwrap_or(""));
            if !self.cors_origins.contains(&o) && !self.own_origin(&o, local) {
                return Err(forbidden(format!(
                    "origin {o:?} is not allowed; start the server with --cors-origin {o} to \
                     accept it"
                )));
            }
        }
        if let Some(key) = &self.api_key {
            let preflight = req.method() == Method::OPTIONS
                && req
                    .headers()
                    .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
            if req.uri().path() != "/health" && !preflight {
                let given = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.split_once(' '))
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                    .map(|(_, token)| token.trim());
                if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
                    return Err(ApiError::new(
                        StatusCode::UNAUTHORIZED,
                        "invalid or missing API key: send the header 'Authorization: Bearer KEY'",
                    )
                    .with_code("invalid_api_key"));
                }
            }
        }
        Ok(())
    }

    /// The CORS layer for the allowed origins, if any.
    pub fn cors(&self) -> Option<CorsLayer> {
        if self.cors_origins.is_empty() {
            return None;
        }
        let origins: Vec<HeaderValue> = self
            .cors_origins
            .iter()
            .filter_map(|o| HeaderValue::from_str(o).ok())
            .collect();
        Some(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(origins))
                .allow_methods([Method::GET, Method::POST])
                .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
                .max_age(std::time::Duration::from_secs(600)),
        )
    }
}

/// The middleware: refuses requests that fail [`Guard::check`].
pub async fn guard(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    match g.check(&req) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

fn normalize(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// Splits `host[:port]` (`[v6]:port` for IPv6) into the host without brackets and the port.
fn split_host(s: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        (h, after.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse().ok()?),
        None => None,
    };
    (!host.is_empty()).then_some((host, port))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins() {
        let access = Access {
            cors_origins: vec!["https://app.example/".into()],
            allowed_hosts: vec!["My.Box".into()],
            ..Access::default()
        };
        let g = Guard::new(&access, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(split_host("[::1]:80"), Some(("::1", Some(80))));
        assert_eq!(split_host("localhost"), Some(("localhost", None)));
        assert_eq!(split_host("a:b"), None);
        assert!(g.host_ok("LOCALHOST", None));
        assert!(g.host_ok("my.box", None));
        assert!(g.host_ok("127.0.0.2", None));
        assert!(g.host_ok("10.0.0.5", "10.0.0.5".parse().ok()));
        assert!(!g.host_ok("10.0.0.5", None));
        assert!(!g.host_ok("evil.example", None));
        assert!(g.own_origin("http://localhost:8080", None));
        assert!(!g.own_origin("http://localhost:8081", None));
        assert!(!g.own_origin("http://evil.example:8080", None));
        assert_eq!(g.cors_origins, ["https://app.example"]);
        assert!(constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd"));
    }
}
