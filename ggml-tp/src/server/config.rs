//! The settings of a server ([`ServerConfig`]): the model and its slots, and the limits that keep
//! hostile clients from exhausting it ([`Limits`], [`Access`]).

use super::ServerError;
use ggml_core::DType;
use llama::model::Placement;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Settings of a server.
#[derive(Clone)]
pub struct ServerConfig {
    pub model_path: PathBuf,
    pub placement: Placement,
    /// Address to listen on (port 0: any free port, see [`super::Server::local_addr`]).
    pub addr: SocketAddr,
    /// The model id in responses; the file name without extension when `None`.
    pub model_name: Option<String>,
    /// Concurrent sequences, each with its own region of the KV cache.
    pub n_slots: usize,
    /// Positions of each slot's cache (prompt plus generated tokens).
    pub n_ctx: usize,
    pub kv_type: DType,
    /// Requests that may wait for a slot; more are refused with 503.
    pub queue_len: usize,
    /// The largest `max_tokens` a request may ask for (also the default).
    pub max_tokens: usize,
    /// The largest request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Prompt tokens evaluated per step over all slots (oldest request first), so a step stays
    /// bounded and long prompts do not stall the generating slots.
    pub prompt_chunk: usize,
    /// Directory of slot files; `None` disables `/slots/{id}?action=save|restore`.
    pub slot_dir: Option<PathBuf>,
    /// Files the slot directory may hold (a save past it gets 507).
    pub slot_max_files: usize,
    /// Bytes the slot directory may hold (a save past it gets 507; a larger file is not restored).
    pub slot_max_bytes: u64,
    pub access: Access,
    pub limits: Limits,
    /// Test aid: prompts `ggml-tp-test-fault:eval-error`, `:panic` and `:stall` make the worker
    /// fail that slot's pass, panic, or stall for [`Limits::stuck_after`] and a bit. Off outside
    /// the server's tests.
    #[doc(hidden)]
    pub test_faults: bool,
}

/// Who may use the server: API key, browser origins and host names.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// When set, every endpoint but `/health` needs `Authorization: Bearer KEY` (401 otherwise).
    pub api_key: Option<String>,
    /// Origins (`scheme://host[:port]`) that browsers may call from: they get CORS headers and
    /// preflight answers. A request with another `Origin` than these or the server's own is refused.
    pub cors_origins: Vec<String>,
    /// Names accepted in the `Host` header besides `localhost`, loopback addresses and the address a
    /// connection came in on (a different name is refused, against DNS rebinding).
    pub allowed_hosts: Vec<String>,
}

/// Bounds on connections and on the work one request may cause.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Time a connection has to send a complete request head, counted from its opening or from the
    /// end of its previous response (so also the longest idle time of a keep-alive connection).
    pub header_timeout: Duration,
    /// Time a request has to send its whole body (408 beyond).
    pub body_timeout: Duration,
    /// Open connections; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Time rendering the chat template and tokenizing one prompt may take (400 beyond).
    pub prepare_timeout: Duration,
    /// Prompts rendered and tokenized at once (on blocking threads, off the async workers).
    pub prepare_threads: usize,
    /// Stop strings one request may give (400 beyond).
    pub max_stops: usize,
    /// Bytes of one stop string (400 beyond).
    pub max_stop_bytes: usize,
    /// How long the inference worker may go without progress while work is pending before
    /// `/health` reports it stuck.
    pub stuck_after: Duration,
}

impl Default for Limits {
    /// Headers within 10 s (also the keep-alive idle time), bodies within 30 s, 256 connections,
    /// prompts prepared within 10 s by up to 2 threads, 16 stop strings of at most 512 bytes, a
    /// worker stuck after 60 s.
    fn default() -> Limits {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 256,
            prepare_timeout: Duration::from_secs(10),
            prepare_threads: 2,
            max_stops: 16,
            max_stop_bytes: 512,
            stuck_after: Duration::from_secs(60),
        }
    }
}

impl ServerConfig {
    /// Defaults: 127.0.0.1:8080, 4 slots of 4096 positions, F16 cache, a queue of 64,
    /// `max_tokens` up to 4096, bodies up to 8 MiB, prompt chunks of 512, no slot directory (64
    /// files and 8 GiB when one is set), no API key, no CORS origins, [`Limits::default`].
    pub fn new(model_path: impl Into<PathBuf>, placement: Placement) -> ServerConfig {
        ServerConfig {
            model_path: model_path.into(),
            placement,
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            model_name: None,
            n_slots: 4,
            n_ctx: 4096,
            kv_type: DType::F16,
            queue_len: 64,
            max_tokens: 4096,
            max_body_bytes: 8 << 20,
            prompt_chunk: 512,
            slot_dir: None,
            slot_max_files: 64,
            slot_max_bytes: 8 << 30,
            access: Access::default(),
            limits: Limits::default(),
            test_faults: false,
        }
    }

    pub(super) fn check(&self) -> Result<(), ServerError> {
        let bad = |m: &str| Err(ServerError::Config(m.into()));
        if self.n_slots == 0 {
            return bad("at least one slot is needed");
        }
        if self.n_ctx < 2 {
            return bad("a slot's context needs at least 2 positions");
        }
        if self.max_tokens == 0 || self.prompt_chunk == 0 || self.max_body_bytes == 0 {
            return bad("max_tokens, prompt_chunk and max_body_bytes must be positive");
        }
        let l = &self.limits;
        if l.max_connections == 0 || l.prepare_threads == 0 {
            return bad("max_connections and prepare_threads must be positive");
        }
        if self.access.api_key.as_deref() == Some("") {
            return bad("the API key must not be empty");
        }
        Ok(())
    }
}
