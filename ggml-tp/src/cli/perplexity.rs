//! `ggml-tp perplexity`: perplexity over a text file the way llama.cpp's `llama-perplexity` measures
//! it: the tokens are cut into chunks of `--chunk` tokens (the first replaced by BOS when the model
//! adds one), each chunk runs as one batch from an empty cache, and the second half of each chunk is
//! scored.
//!
//! `--kl-base FILE` saves the scored logits; `--kl-against FILE` compares against them (the same
//! text and chunking) and reports the KL divergence of the saved distribution to this run's
//! (mean, max) and how often both pick the same top token. The file: magic `GGTPKLD1`, then
//! little-endian u32 `n_vocab`, `chunk`, `n_chunks`, then per chunk its `chunk` token ids (i32) and
//! the logits (f32) of positions `chunk/2 .. chunk-1`.

use super::load::{load, ModelArgs};
use super::logits::f32_bytes;
use super::{CliError, CliResult};
use llama::runtime::{Outputs, Session};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::time::Instant;

const MAGIC: &[u8; 8] = b"GGTPKLD1";

/// Options of `perplexity`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file.
    #[arg(short = 'f', long)]
    pub file: PathBuf,
    /// Tokens per chunk (default 512, or the saved file's with --kl-against).
    #[arg(long)]
    pub chunk: Option<usize>,
    /// Score at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Save the scored logits to this file.
    #[arg(long, conflicts_with = "kl_against")]
    pub kl_base: Option<PathBuf>,
    /// Report the KL divergence against logits saved with --kl-base.
    #[arg(long)]
    pub kl_against: Option<PathBuf>,
}

/// `log_softmax(row)`, accumulated in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// Running KL statistics.
#[derive(Default)]
struct KlStats {
    sum: f64,
    max: f64,
    same_top: usize,
    n: usize,
}

impl KlStats {
    fn add(&mut self, base: &[f32], new: &[f32]) {
        let (lp, lq) = (log_softmax(base), log_softmax(new));
        let kl: f64 = lp.iter().zip(&lq).map(|(p, q)| p.exp() * (p - q)).sum();
        self.sum += kl;
        self.max = self.max.max(kl);
        self.same_top += usize::from(argmax(base) == argmax(new));
        self.n += 1;
    }
}

/// The saved-logits file, read or written chunk by chunk.
enum KlFile {
    None,
    Write(BufWriter<File>),
    Read(BufReader<File>),
}

fn read_u32s(r: &mut impl Read, n: usize) -> std::io::Result<Vec<u32>> {
    let mut b = vec![0u8; n * 4];
    r.read_exact(&mut b)?;
    Ok(b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

pub fn run(args: &Args) -> CliResult {
    let setup = args.model.setup()?;
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| CliError::from(e).context(args.file.display()))?;
    // The saved file fixes the chunking.
    let mut kl = KlFile::None;
    let mut saved: Option<(usize, usize, usize)> = None;
    if let Some(path) = &args.kl_against {
        let ctx = |e: std::io::Error| CliError::from(e).context(path.display());
        let mut r = BufReader::new(File::open(path).map_err(ctx)?);
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic).map_err(ctx)?;
        if &magic != MAGIC {
            return Err(CliError::new(format!(
                "{}: not a file written by --kl-base",
                path.display()
            )));
        }
        let v = read_u32s(&mut r, 1).map_err(ctx)?[0] as usize;
        let c = read_u32s(&mut r, 1).map_err(ctx)?[0] as usize;
        let n = read_u32s(&mut r, 1).map_err(ctx)?[0] as usize;
        saved = Some((v, c, n));
        kl = KlFile::Read(r);
    }
    let chunk = match (args.chunk, saved) {
        (Some(c), Some((_, s, _))) if c != s => {
            return Err(CliError::new(format!(
                "--chunk {c} differs from the saved logits' {s}"
            )))
        }
        (_, Some((_, s, _))) => s,
        (c, None) => c.unwrap_or(512),
    };
    if chunk < 2 {
        return Err(CliError::new("--chunk must be at least 2"));
    }
    let loaded = load(&args.model, &setup)?;
    let tok = &loaded.tokenizer;
    let n_vocab = loaded.model.config.n_vocab;
    let tokens = tok.encode(&text, true, false);
    let mut n_chunks = tokens.len() / chunk;
    if let Some(m) = args.chunks {
        n_chunks = n_chunks.min(m);
    }
    if let Some((v, _, n)) = saved {
        if v != n_vocab {
            return Err(CliError::new(format!(
                "the saved logits have {v} tokens of vocabulary, the model {n_vocab}"
            )));
        }
        n_chunks = n_chunks.min(n);
    }
    if n_chunks == 0 {
        return Err(CliError::new(format!(
            "{} tokens: fewer than one chunk of {chunk}",
            tokens.len()
        )));
    }
    if let Some(path) = &args.kl_base {
        let ctx = |e: std::io::Error| CliError::from(e).context(path.display());
        let mut w = BufWriter::new(File::create(path).map_err(ctx)?);
        w.write_all(MAGIC).map_err(ctx)?;
        for v in [n_vocab, chunk, n_chunks] {
            w.write_all(&(v as u32).to_le_bytes()).map_err(ctx)?;
        }
        kl = KlFile::Write(w);
    }
    eprintln!(
        "{} tokens, {n_chunks} chunks of {chunk}, scoring positions {}..{} of each",
        tokens.len(),
        chunk / 2,
        chunk - 1
    );
    let opts = args.model.session_options(chunk);
    let mut session = Session::new(loaded.model.clone(), opts)?;
    let first = chunk / 2;
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut stats = KlStats::default();
    let start = Instant::now();
    for c in 0..n_chunks {
        let mut batch = tokens[c * chunk..(c + 1) * chunk].to_vec();
        if let (true, Some(bos)) = (tok.add_bos(), tok.bos()) {
            batch[0] = bos;
        }
        session.reset();
        let logits = session.eval(&batch, Outputs::All)?;
        let scored = &logits.data[first * n_vocab..(chunk - 1) * n_vocab];
        for j in first..chunk - 1 {
            let lp = log_softmax(logits.row(j));
            let v = -lp[batch[j + 1] as usize];
            nll += v;
            nll2 += v * v;
            count += 1;
        }
        match &mut kl {
            KlFile::None => {}
            KlFile::Write(w) => {
                let ids: Vec<u8> = batch.iter().flat_map(|&t| t.to_le_bytes()).collect();
                w.write_all(&ids)?;
                w.write_all(&f32_bytes(scored))?;
            }
            KlFile::Read(r) => {
                if read_u32s(r, chunk)? != batch {
                    return Err(CliError::new(format!(
                        "chunk {}: the saved logits are of other tokens (another text or tokenizer)",
                        c + 1
                    )));
                }
                let base: Vec<f32> = read_u32s(r, scored.len())?
                    .into_iter()
                    .map(f32::from_bits)
                    .collect();
                for (b, n) in base.chunks_exact(n_vocab).zip(scored.chunks_exact(n_vocab)) {
                    stats.add(b, n);
                }
            }
        }
        eprint!("[{}]{:.4},", c + 1, (nll / count as f64).exp());
        if c == 0 {
            let per = start.elapsed().as_secs_f64();
            eprint!(" ({per:.2} s per chunk) ");
        }
    }
    eprintln!();
    if let KlFile::Write(w) = &mut kl {
        w.flush()?;
    }
    let mean = nll / count as f64;
    let var = (nll2 / count as f64 - mean * mean).max(0.0);
    let ppl = mean.exp();
    println!(
        "PPL = {ppl:.4} +/- {:.4} over {count} tokens in {n_chunks} chunks ({:.1} s)",
        ppl * (var / (count as f64 - 1.0).max(1.0)).sqrt(),
        start.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.kl_base {
        println!("saved the scored logits to {}", path.display());
    }
    if stats.n > 0 {
        println!(
            "KL divergence: mean {:.6}, max {:.6}; top-1 agreement {:.2}% over {} positions",
            stats.sum / stats.n as f64,
            stats.max,
            100.0 * stats.same_top as f64 / stats.n as f64,
            stats.n
        );
    }
    Ok(())
}
