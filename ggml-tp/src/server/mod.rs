//! `ggml-tp serve`: an OpenAI-compatible HTTP server over one model.
//!
//! Endpoints:
//! * `POST /v1/completions`, `POST /v1/chat/completions`: one JSON answer, or with `"stream": true`
//!   server-sent events `data: {...}` ending with `data: [DONE]` (OpenAI's field names, finish
//!   reasons `stop`/`length`, `usage` with `prompt_tokens_details.cached_tokens`;
//!   `stream_options.include_usage` adds a usage chunk). Sampling fields `temperature`, `top_p`,
//!   `seed`, `presence_penalty`, `frequency_penalty`, `stop`, plus `top_k`, `min_p`,
//!   `repeat_penalty` ([`llama::sampling`]; llama.cpp's defaults where absent, a fresh seed when
//!   none is given) and llama.cpp's `id_slot` (run in that slot) and `cache_prompt` (reuse the
//!   prefix a slot's cache shares with the prompt; default true). Chat prompts are rendered with
//!   the model's template ([`llama::chat`]).
//! * `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text), `GET /slots`.
//! * `POST /slots/{id}?action=save&filename=X`, `action=restore`, `action=erase`: a slot's tokens and
//!   KV cache to and from a file in the configured directory ([`llama::slot_file`]).
//!
//! Requests run in slots, each a sequence with its own region of one KV cache, served by one
//! inference thread that advances every active slot per step in one forward pass (continuous
//! batching, [`engine`]); `/metrics` shows the sequences per pass. Errors are JSON
//! `{"error": {"message", "type", "code"}}` with a 4xx/5xx status: a malformed body, a prompt that
//! does not fit a slot's context, `max_tokens` over the limit or a body over the size limit give
//! 4xx; full slots and queue give 503.

pub mod api;
pub mod engine;
pub mod handlers;
pub mod metrics;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use engine::{Engine, WorkerSetup};
use ggml_core::gguf::{GgufError, GgufFile};
use ggml_core::DType;
use handlers::AppState;
use llama::chat::{ChatError, ChatTemplate};
use llama::model::{Model, ModelError, Placement};
use llama::runtime::{BatchSession, SessionOptions};
use llama::tokenizer::{Tokenizer, TokenizerError};
use metrics::Metrics;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Settings of a server.
#[derive(Clone)]
pub struct ServerConfig {
    pub model_path: PathBuf,
    pub placement: Placement,
    /// Address to listen on (port 0: any free port, see [`Server::local_addr`]).
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
}

impl ServerConfig {
    /// Defaults: 127.0.0.1:8080, 4 slots of 4096 positions, F16 cache, a queue of 64,
    /// `max_tokens` up to 4096, bodies up to 8 MiB, prompt chunks of 512, no slot directory.
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
        }
    }
}

/// Errors of starting or running a server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("invalid server configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Chat(#[from] ChatError),
    #[error("server I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the inference thread failed: {0}")]
    Worker(String),
}

/// A server bound to its address, with the model loaded; [`Server::run`] serves it.
pub struct Server {
    listener: tokio::net::TcpListener,
    router: Router,
}

impl Server {
    /// Loads the model (on the inference thread, which then serves the slots) and binds the
    /// listening socket.
    pub async fn bind(config: ServerConfig) -> Result<Server, ServerError> {
        check(&config)?;
        let metrics = Arc::new(Metrics::default());
        let cfg = config.clone();
        let m = metrics.clone();
        let (engine, loaded) = tokio::task::spawn_blocking(move || start_worker(&cfg, m))
            .await
            .map_err(|e| ServerError::Worker(e.to_string()))??;
        let model_name = config.model_name.clone().unwrap_or_else(|| {
            config
                .model_path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into())
        });
        if let Some(dir) = &config.slot_dir {
            std::fs::create_dir_all(dir)?;
        }
        let state = Arc::new(AppState {
            engine,
            tokenizer: loaded.tokenizer,
            template: loaded.template,
            metrics,
            model_name,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            n_ctx: config.n_ctx,
            n_vocab: loaded.n_vocab,
            max_tokens: config.max_tokens,
            slot_dir: config.slot_dir.clone(),
            next_id: AtomicU64::new(1),
        });
        let router = Router::new()
            .route("/v1/completions", post(handlers::completions))
            .route("/v1/chat/completions", post(handlers::chat))
            .route("/v1/models", get(handlers::models))
            .route("/health", get(handlers::health))
            .route("/metrics", get(handlers::metrics))
            .route("/slots", get(handlers::slots))
            .route("/slots/{id}", post(handlers::slot_action))
            .fallback(handlers::not_found)
            .layer(DefaultBodyLimit::max(config.max_body_bytes))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind(config.addr).await?;
        Ok(Server { listener, router })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until the process ends.
    pub async fn run(self) -> Result<(), ServerError> {
        axum::serve(self.listener, self.router).await?;
        Ok(())
    }

    /// Serves until `shutdown` completes, then finishes the open requests and returns.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await?;
        Ok(())
    }
}

/// Loads the model and serves it at `config.addr` until the process ends.
pub async fn serve(config: ServerConfig) -> Result<(), ServerError> {
    let server = Server::bind(config).await?;
    eprintln!(
        "ggml-tp serve: listening on http://{}",
        server.local_addr()?
    );
    server.run().await
}

/// [`serve`] on a new multi-threaded tokio runtime, blocking the calling thread.
pub fn serve_blocking(config: ServerConfig) -> Result<(), ServerError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(config))
}

fn check(c: &ServerConfig) -> Result<(), ServerError> {
    let bad = |m: &str| Err(ServerError::Config(m.into()));
    if c.n_slots == 0 {
        return bad("at least one slot is needed");
    }
    if c.n_ctx < 2 {
        return bad("a slot's context needs at least 2 positions");
    }
    if c.max_tokens == 0 || c.prompt_chunk == 0 || c.max_body_bytes == 0 {
        return bad("max_tokens, prompt_chunk and max_body_bytes must be positive");
    }
    Ok(())
}

/// What the HTTP side needs from the loaded model.
struct Loaded {
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    n_vocab: usize,
}

/// Starts the inference thread: it loads the model and the slots' session, reports back, and
/// then runs the worker until the server's handles are gone.
fn start_worker(c: &ServerConfig, metrics: Arc<Metrics>) -> Result<(Engine, Loaded), ServerError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let (path, placement) = (c.model_path.clone(), c.placement.clone());
    let opts = SessionOptions {
        n_ctx: c.n_ctx,
        kv_type: c.kv_type,
    };
    let (n_slots, prompt_chunk, queue_len) = (c.n_slots, c.prompt_chunk, c.queue_len);
    std::thread::Builder::new()
        .name("ggml-tp-infer".into())
        .spawn(move || {
            let load = || -> Result<_, ServerError> {
                let file = GgufFile::open(&path)?;
                let tokenizer = Arc::new(Tokenizer::from_gguf(&file)?);
                let template = ChatTemplate::from_gguf(&file, &tokenizer)?;
                let model = Arc::new(Model::from_gguf(&file, &placement)?);
                let n_vocab = model.config.n_vocab;
                let session = BatchSession::new(model, opts, n_slots)?;
                let (engine, worker) = Engine::new(WorkerSetup {
                    session,
                    tokenizer: tokenizer.clone(),
                    metrics,
                    prompt_chunk,
                    queue_len,
                });
                let loaded = Loaded {
                    tokenizer,
                    template,
                    n_vocab,
                };
                Ok((engine, worker, loaded))
            };
            match load() {
                Ok((engine, worker, loaded)) => {
                    if tx.send(Ok((engine, loaded))).is_ok() {
                        worker.run();
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        })?;
    rx.recv()
        .map_err(|_| ServerError::Worker("it stopped while loading the model".into()))?
}
