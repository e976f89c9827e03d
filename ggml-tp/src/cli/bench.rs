//! `ggml-tp bench`: prompt processing (`pp<P>`: one batch of P tokens from an empty cache) and
//! generation (`tg<N>`: N tokens one at a time from an empty cache) speed, as a markdown table like
//! llama.cpp's `llama-bench`, mean ± standard deviation over repetitions after one warm-up run.
//! Several models (`-m` files and `--synthetic` presets), `--split-mode` values and `--cpu-devices`
//! counts give one row per combination (split mode none always on the first device); `-p` and `-n`
//! take lists (`-p 512,2048`), each value a test on the same loaded model.

use super::load::{load, Loaded, ModelArgs, Setup, SplitMode};
use super::CliResult;
use ggml_core::backend::Device;
use llama::model::Placement;
use llama::runtime::{Outputs, Session};
use std::sync::Arc;
use std::time::Instant;

/// Options of `bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens of the pp tests, comma-separated (0 skips a test).
    #[arg(
        short = 'p',
        long = "n-prompt",
        default_value = "512",
        value_delimiter = ','
    )]
    pub n_prompt: Vec<usize>,
    /// Generated tokens of the tg tests, comma-separated (0 skips a test).
    #[arg(
        short = 'n',
        long = "n-gen",
        default_value = "128",
        value_delimiter = ','
    )]
    pub n_gen: Vec<usize>,
    /// Micro-batch of prompt processing: the pp prompt goes through in forward passes of at most
    /// this many tokens (0: the whole prompt in one pass), like llama-bench's `-ub`.
    #[arg(long = "ubatch", short = 'u', default_value_t = 0)]
    pub ubatch: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: usize,
}

/// Token ids spread over the vocabulary (fixed, so every run sees the same batch).
fn bench_tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % n_vocab as u64) as u32
        })
        .collect()
}

/// Seconds of a pp run: the prompt in passes of at most `ubatch` tokens (0: all at once).
fn time_pp(s: &mut Session, tokens: &[u32], ubatch: usize) -> CliResult<f64> {
    s.reset();
    let step = if ubatch == 0 { tokens.len() } else { ubatch };
    let t = Instant::now();
    for chunk in tokens.chunks(step.max(1)) {
        s.eval(chunk, Outputs::Last)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds of a tg run: one token per step.
fn time_tg(s: &mut Session, tokens: &[u32]) -> CliResult<f64> {
    s.reset();
    let t = Instant::now();
    for &id in tokens {
        s.eval(&[id], Outputs::Last)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The devices a placement uses.
fn placement_devices(p: &Placement) -> Vec<Arc<dyn Device>> {
    match p {
        Placement::Single(d) => vec![d.clone()],
        Placement::Layers { devices, .. } => devices.clone(),
        Placement::Tensor(m) => m.devices().to_vec(),
    }
}

/// Memory in use on each device (total − free: for GPUs this includes the driver's context and
/// anything else on the device), on stderr after a setup's tests, with the model, its cache and the
/// compute buffers still allocated.
fn report_memory(l: &Loaded) {
    let used: Vec<String> = placement_devices(l.model.placement())
        .iter()
        .map(|d| {
            let m = d.memory();
            let mib = |b: usize| b as f64 / (1 << 20) as f64;
            let held = m
                .allocated
                .map(|a| format!(" ({:.1} MiB in ggml-tp buffers)", mib(a)))
                .unwrap_or_default();
            format!(
                "{} {:.1} MiB{held}",
                d.name(),
                mib(m.total - m.free.min(m.total))
            )
        })
        .collect();
    eprintln!("memory in use per device: {}", used.join(", "));
}

/// Mean and sample standard deviation.
fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

fn row(l: &Loaded, threads: usize, test: &str, rates: &[f64]) {
    let (mean, std) = mean_std(rates);
    println!(
        "| {} | {:.1} MiB | {} | {} | {} | {} | {:.2} ± {:.2} |",
        l.name(),
        l.file_size as f64 / (1 << 20) as f64,
        l.split_mode.name(),
        l.device_names.join(","),
        threads,
        test,
        mean,
        std
    );
}

pub fn run(args: &Args) -> CliResult {
    // Split mode none runs on the first device whatever --devices or --cpu-devices list for the
    // other modes.
    let mut setups: Vec<Setup> = Vec::new();
    for mut s in args.model.setups() {
        if s.split_mode == Some(SplitMode::None) {
            s.first_device_only = true;
            s.cpu_devices = None;
        }
        if !setups.contains(&s) {
            setups.push(s);
        }
    }
    let reps = args.repetitions.max(1);
    let threads = args.model.threads();
    // Fail early on an impossible placement before loading anything.
    for s in &setups {
        args.model.placement(s)?;
    }
    println!("| model | size | split | devices | threads | test | t/s |");
    println!("| --- | ---: | --- | --- | ---: | ---: | ---: |");
    let longest = args.n_prompt.iter().chain(&args.n_gen).copied().max();
    for setup in &setups {
        let loaded = load(&args.model, setup)?;
        let n_vocab = loaded.model.config.n_vocab;
        let opts = args.model.session_options(longest.unwrap_or(1).max(1));
        let mut session = Session::new(loaded.model.clone(), opts)?;
        for &n_prompt in args.n_prompt.iter().filter(|&&n| n > 0) {
            let tokens = bench_tokens(n_prompt, n_vocab);
            time_pp(&mut session, &tokens, args.ubatch)?;
            let rates = (0..reps)
                .map(|_| {
                    time_pp(&mut session, &tokens, args.ubatch).map(|t| tokens.len() as f64 / t)
                })
                .collect::<CliResult<Vec<f64>>>()?;
            let test = if args.ubatch > 0 && args.ubatch < n_prompt {
                format!("pp{n_prompt} ub{}", args.ubatch)
            } else {
                format!("pp{n_prompt}")
            };
            row(&loaded, threads, &test, &rates);
        }
        for &n_gen in args.n_gen.iter().filter(|&&n| n > 0) {
            let tokens = bench_tokens(n_gen, n_vocab);
            time_tg(&mut session, &tokens[..tokens.len().min(4)])?;
            let rates = (0..reps)
                .map(|_| time_tg(&mut session, &tokens).map(|t| tokens.len() as f64 / t))
                .collect::<CliResult<Vec<f64>>>()?;
            row(&loaded, threads, &format!("tg{n_gen}"), &rates);
        }
        report_memory(&loaded);
    }
    Ok(())
}
