//! `ggml-tp logits`: runs a prompt (text, or token ids from a raw little-endian `.i32` file) as one
//! batch and writes the logits of every position to `DIR/logits.f32` (raw little-endian float32,
//! row-major `[n_tokens, n_vocab]`) and the token ids to `DIR/tokens.json`, the layout of the
//! reference fixtures.

use super::load::{load, ModelArgs};
use super::{CliError, CliResult};
use llama::runtime::{Outputs, Session};
use std::path::{Path, PathBuf};

/// Options of `logits`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (tokenized with BOS when the model adds one).
    #[arg(
        short = 'p',
        long,
        required_unless_present = "tokens_file",
        conflicts_with = "tokens_file"
    )]
    pub prompt: Option<String>,
    /// Token ids instead of a prompt: raw little-endian int32.
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// Output directory (created if missing).
    #[arg(short = 'o', long)]
    pub out: PathBuf,
}

/// Reads raw little-endian int32 token ids.
pub fn read_tokens_i32(path: &Path) -> CliResult<Vec<u32>> {
    let bytes = std::fs::read(path).map_err(|e| CliError::from(e).context(path.display()))?;
    if bytes.len() % 4 != 0 || bytes.is_empty() {
        return Err(CliError::new(format!(
            "{}: {} bytes is not a non-empty list of int32",
            path.display(),
            bytes.len()
        )));
    }
    bytes
        .chunks_exact(4)
        .map(|c| {
            let v = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            u32::try_from(v)
                .map_err(|_| CliError::new(format!("{}: negative token id {v}", path.display())))
        })
        .collect()
}

/// Raw little-endian bytes of `values`.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn run(args: &Args) -> CliResult {
    let setup = args.model.setup()?;
    let loaded = load(&args.model, &setup)?;
    let tokens = match (&args.prompt, &args.tokens_file) {
        (_, Some(f)) => read_tokens_i32(f)?,
        (Some(p), None) => loaded.tokenizer.encode(p, true, true),
        (None, None) => return Err(CliError::new("give -p PROMPT or --tokens-file FILE")),
    };
    if tokens.is_empty() {
        return Err(CliError::new("the prompt has no tokens"));
    }
    let opts = args.model.session_options(tokens.len());
    let mut session = Session::new(loaded.model.clone(), opts)?;
    let logits = session.eval(&tokens, Outputs::All)?;
    let out = &args.out;
    let ctx = |e: std::io::Error| CliError::from(e).context(out.display());
    std::fs::create_dir_all(out).map_err(ctx)?;
    std::fs::write(out.join("logits.f32"), f32_bytes(&logits.data)).map_err(ctx)?;
    std::fs::write(out.join("tokens.json"), serde_json::to_string(&tokens)?).map_err(ctx)?;
    eprintln!(
        "wrote logits [{}, {}] to {}",
        tokens.len(),
        logits.n_vocab,
        out.join("logits.f32").display()
    );
    Ok(())
}
