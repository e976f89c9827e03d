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
//!   the model's template ([`llama::chat`]). `logprobs` / `top_logprobs` (chat) and `logprobs` +
//!   `echo` (completions, the prompt's log-likelihoods; `max_tokens: 0` with `echo`) report
//!   log-probabilities of the raw logits ([`logprobs`]); `logit_bias` biases or bans tokens; `n`
//!   choices (up to [`handlers::MAX_CHOICES`] and the slots) share one evaluation of the prompt,
//!   its cache copied into their slots; `tools` / `tool_choice` go to the template and calls are
//!   parsed back per template family ([`tools`], [`llama::tool_calls`]). Unknown roles and fields
//!   are refused with 400 naming them in `param`.
//! * `POST /tokenize`, `POST /detokenize`, `GET /props` (llama-server's shapes, [`tokens`]).
//! * `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text), `GET /slots`.
//! * `POST /slots/{id}?action=save&filename=X[&overwrite=true]`, `action=restore`, `action=erase`:
//!   a slot's tokens and KV cache to and from a file in the configured directory
//!   ([`llama::slot_file`], [`slots`]: a quota of files and bytes, no silent overwrite).
//!
//! Requests run in slots, each a sequence with its own region of one KV cache, served by one
//! inference thread that advances every active slot per step in one forward pass (continuous
//! batching, [`engine`]); `/metrics` shows the sequences per pass. Errors are JSON
//! `{"error": {"message", "type", "param", "code"}}` with a 4xx/5xx status: a malformed body, a
//! prompt that does not fit a slot's context, `max_tokens` over the limit, an unknown path (404),
//! a wrong method (405) or a body over the size limit (413) give 4xx; full slots and queue give 503.
//!
//! Hostile clients are bounded ([`config::Limits`]): connections by a cap and a timeout for request
//! heads that also ends idle keep-alive connections ([`listen`]), bodies by a size and a deadline,
//! prompts by being prepared off the async workers within a time bound after a place in the queue
//! was taken ([`prepare`]), stop lists by count and length. [`guard`] checks `Host` (against DNS
//! rebinding), `Origin` (CORS only for named origins) and the API key. `/health` is 503 when the
//! inference worker died or is stuck ([`health`]).

pub mod api;
pub mod config;
pub mod constrain;
pub mod engine;
pub mod guard;
pub mod handlers;
pub mod health;
pub mod job;
pub mod listen;
pub mod logprobs;
pub mod metrics;
pub mod prepare;
pub mod respond;
pub mod slots;
pub mod stop;
pub mod tokens;
pub mod tools;

use axum::routing::{get, post};
use axum::Router;
pub use config::{Access, Limits, ServerConfig};
use engine::{Engine, WorkerSetup};
use ggml_core::gguf::{GgufError, GgufFile};
use guard::Guard;
use handlers::AppState;
use health::WorkerHealth;
use llama::chat::{ChatError, ChatTemplate};
use llama::model::{Model, ModelError};
use llama::runtime::{BatchSession, SessionOptions};
use llama::tokenizer::{Tokenizer, TokenizerError};
use metrics::Metrics;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

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
    limits: Limits,
}

impl Server {
    /// Loads the model (on the inference thread, which then serves the slots) and binds the
    /// listening socket.
    pub async fn bind(config: ServerConfig) -> Result<Server, ServerError> {
        config.check()?;
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
        let max_token_bytes = (0..loaded.n_vocab as u32)
            .filter_map(|id| loaded.tokenizer.token_text(id).map(str::len))
            .max()
            .unwrap_or(1)
            + 1;
        let state = Arc::new(AppState {
            engine,
            tokenizer: loaded.tokenizer,
            template: loaded.template,
            metrics,
            model_name,
            model_path: config.model_path.clone(),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            n_ctx: config.n_ctx,
            n_vocab: loaded.n_vocab,
            max_tokens: config.max_tokens,
            slot_dir: config.slot_dir.clone(),
            slot_max_files: config.slot_max_files,
            slot_max_bytes: config.slot_max_bytes,
            slot_io: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
            max_body_bytes: config.max_body_bytes,
            max_token_bytes,
            limits: config.limits.clone(),
            prep: Arc::new(tokio::sync::Semaphore::new(config.limits.prepare_threads)),
            test_faults: config.test_faults,
            constraints: std::sync::OnceLock::new(),
        });
        let listener = tokio::net::TcpListener::bind(config.addr).await?;
        let guard = Guard::new(&config.access, listener.local_addr()?);
        let mut router = Router::new()
            .route("/v1/completions", post(handlers::completions))
            .route("/v1/chat/completions", post(handlers::chat))
            .route("/v1/models", get(handlers::models))
            .route("/tokenize", post(tokens::tokenize))
            .route("/detokenize", post(tokens::detokenize))
            .route("/props", get(tokens::props))
            .route("/health", get(handlers::health))
            .route("/metrics", get(handlers::metrics))
            .route("/slots", get(slots::slots))
            .route("/slots/{id}", post(slots::slot_action))
            .fallback(handlers::not_found)
            .method_not_allowed_fallback(handlers::method_not_allowed)
            .with_state(state);
        if let Some(cors) = guard.cors() {
            router = router.layer(cors);
        }
        let router = router.layer(axum::middleware::from_fn_with_state(guard, guard::guard));
        Ok(Server {
            listener,
            router,
            limits: config.limits,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until the process ends.
    pub async fn run(self) -> Result<(), ServerError> {
        self.run_until(std::future::pending()).await
    }

    /// Serves until `shutdown` completes, then finishes the open requests and returns.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        listen::serve(self.listener, self.router, &self.limits, shutdown).await?;
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
    let health = WorkerHealth::new();
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
                    health,
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
