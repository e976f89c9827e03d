//! `ggml-tp serve`: the OpenAI-compatible HTTP server ([`crate::server`]) for one model in any split
//! mode.

use super::load::{ModelArgs, ModelSource};
use super::{CliError, CliResult};
use crate::server::{serve_blocking, ServerConfig};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

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
    eprintln!(
        "serving on http://{} ({} slots)",
        config.addr, config.n_slots
    );
    serve_blocking(config)?;
    Ok(())
}
