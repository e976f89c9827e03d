//! `ggml-tp serve`: the OpenAI-compatible HTTP server ([`crate::server`]) for one model in any split
//! mode.

use super::load::{ModelArgs, ModelSource};
use super::{CliError, CliResult};
use crate::server::{serve_blocking, Access, Limits, ServerConfig};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Options of `serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Concurrent sequences, each with its own KV cache.
    #[arg(long, default_value_t = 4)]
    pub slots: usize,
    /// Requests that may wait for a free slot (more get 503).
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// The largest `max_tokens` a request may ask for.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: usize,
    /// Directory for per-slot KV state files (`POST /slots/{id}?action=save|restore`).
    #[arg(long)]
    pub slot_dir: Option<PathBuf>,
    /// Files the slot directory may hold (a save past it gets 507).
    #[arg(long, default_value_t = 64)]
    pub slot_max_files: usize,
    /// Bytes the slot directory may hold (a save past it gets 507).
    #[arg(long, default_value_t = 8 << 30)]
    pub slot_max_bytes: u64,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health (401 otherwise).
    #[arg(long, env = "GGML_TP_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Browser origins (scheme://host[:port], comma-separated) allowed to call the server: they
    /// get CORS headers. Requests with any other Origin than the server's own get 403.
    #[arg(long, value_delimiter = ',')]
    pub cors_origin: Vec<String>,
    /// Host names accepted in the Host header besides localhost, loopback addresses and the
    /// address connected to (others get 403, against DNS rebinding); comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub allowed_host: Vec<String>,
    /// The largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body: usize,
    /// Open connections at most (one more gets 503 and is closed).
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Seconds a connection has to send a request head, after opening or after its previous
    /// response (so also the idle time of keep-alive connections).
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a request has to send its body (408 beyond).
    #[arg(long, default_value_t = 30.0)]
    pub body_timeout: f64,
    /// Seconds rendering and tokenizing one prompt may take (400 beyond).
    #[arg(long, default_value_t = 10.0)]
    pub prepare_timeout: f64,
    /// Seconds without progress on pending work after which /health reports the inference
    /// worker stuck (503).
    #[arg(long, default_value_t = 60.0)]
    pub stuck_after: f64,
}

fn seconds(name: &str, s: f64) -> Result<Duration, CliError> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| CliError::new(format!("--{name} needs a positive number of seconds")))
}

pub fn run(args: &Args) -> CliResult {
    let setup = args.model.setup()?;
    let (placement, _, _) = args.model.placement(&setup)?;
    let opts = args.model.session_options(4096);
    let ModelSource::File(path) = setup.model else {
        return Err(CliError::new(
            "serve needs a model file (-m), not --synthetic",
        ));
    };
    let mut config = ServerConfig::new(path, placement);
    config.addr = SocketAddr::new(args.host, args.port);
    config.n_slots = args.slots;
    config.queue_len = args.queue;
    config.max_tokens = args.max_tokens;
    config.n_ctx = opts.n_ctx;
    config.kv_type = opts.kv_type;
    config.slot_dir = args.slot_dir.clone();
    config.slot_max_files = args.slot_max_files;
    config.slot_max_bytes = args.slot_max_bytes;
    config.max_body_bytes = args.max_body;
    config.access = Access {
        api_key: args.api_key.clone(),
        cors_origins: args.cors_origin.clone(),
        allowed_hosts: args.allowed_host.clone(),
    };
    config.limits = Limits {
        header_timeout: seconds("header-timeout", args.header_timeout)?,
        body_timeout: seconds("body-timeout", args.body_timeout)?,
        max_connections: args.max_connections,
        prepare_timeout: seconds("prepare-timeout", args.prepare_timeout)?,
        stuck_after: seconds("stuck-after", args.stuck_after)?,
        ..Limits::default()
    };
    eprintln!(
        "serving on http://{} ({} slots)",
        config.addr, config.n_slots
    );
    serve_blocking(config)?;
    Ok(())
}
