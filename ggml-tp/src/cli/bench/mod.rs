//! `ggml-tp bench`: prompt processing (`pp<P>`: one batch of P tokens) and generation (`tg<N>`: N
//! tokens one at a time) speed, from an empty cache or after `-d` tokens already in it, like
//! llama.cpp's `llama-bench`: mean ± standard deviation over repetitions after one warm-up run, as
//! a markdown table, JSON, JSON lines or CSV with llama-bench's field names ([`report`], [`setup`]). Several models (`-m` files and `--synthetic`
//! presets), `--split-mode` values and `--cpu-devices` counts give one row per combination (split
//! mode none always on the first device); `-p`, `-n` and `-d` take lists (`-p 512,2048`), each
//! value a test on the same loaded model.

mod report;
mod setup;

use super::load::{load, Loaded, ModelArgs, Setup, SplitMode};
use super::CliResult;
use llama::runtime::{Outputs, Session};
use report::{utc_timestamp, Format, Record, Report, TestShape};
use setup::{placement_devices, setup_fields};
use std::time::{Instant, SystemTime};

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
    /// Tokens already in the cache when each test starts, comma-separated (like llama-bench's
    /// `-d`): they are processed first, in micro-batches, untimed.
    #[arg(
        short = 'd',
        long = "n-depth",
        default_value = "0",
        value_delimiter = ','
    )]
    pub n_depth: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: usize,
    /// Output format: a markdown table, JSON, JSON lines or CSV (llama-bench's field names).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Md)]
    pub output: Format,
}

/// Micro-batch of the untimed fill to the test's depth when `-u` is 0.
const DEPTH_UBATCH: usize = 512;

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

/// Fills the cache with `depth` tokens (untimed), in passes of at most `ubatch` tokens.
fn fill_to_depth(s: &mut Session, depth: &[u32], ubatch: usize) -> CliResult {
    s.reset();
    let step = if ubatch == 0 { DEPTH_UBATCH } else { ubatch };
    for chunk in depth.chunks(step) {
        s.eval(chunk, Outputs::Last)?;
    }
    Ok(())
}

/// Seconds of a pp run after `depth`: the prompt in passes of at most `ubatch` tokens (0: all at
/// once).
fn time_pp(s: &mut Session, depth: &[u32], tokens: &[u32], ubatch: usize) -> CliResult<f64> {
    fill_to_depth(s, depth, ubatch)?;
    let step = if ubatch == 0 { tokens.len() } else { ubatch };
    let t = Instant::now();
    for chunk in tokens.chunks(step.max(1)) {
        s.eval(chunk, Outputs::Last)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds of a tg run after `depth`: one token per step.
fn time_tg(s: &mut Session, depth: &[u32], tokens: &[u32], ubatch: usize) -> CliResult<f64> {
    fill_to_depth(s, depth, ubatch)?;
    let t = Instant::now();
    for &id in tokens {
        s.eval(&[id], Outputs::Last)?;
    }
    Ok(t.elapsed().as_secs_f64())
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

/// The tests of one run, in order: every pp then every tg, each at every depth.
fn tests(args: &Args) -> Vec<TestShape> {
    let depths = || args.n_depth.iter().copied();
    let ubatch_given = args.ubatch > 0;
    // The tokens per forward pass: `-u`, else the whole prompt (pp) or the fill's passes (tg).
    let ubatch = |whole: usize| if ubatch_given { args.ubatch } else { whole };
    let pp = args
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .flat_map(move |&n| {
            depths().map(move |d| TestShape {
                n_prompt: n,
                n_depth: d,
                n_ubatch: ubatch(n),
                ubatch_given,
                ..TestShape::default()
            })
        });
    let tg = args.n_gen.iter().filter(|&&n| n > 0).flat_map(move |&n| {
        depths().map(move |d| TestShape {
            n_gen: n,
            n_depth: d,
            n_ubatch: ubatch(DEPTH_UBATCH),
            ubatch_given,
            ..TestShape::default()
        })
    });
    pp.chain(tg).collect()
}

/// Seconds of each repetition of `test` (after one warm-up; a short one for tg).
fn measure(
    session: &mut Session,
    test: TestShape,
    reps: usize,
    n_vocab: usize,
) -> CliResult<Vec<f64>> {
    let depth = bench_tokens(test.n_depth, n_vocab);
    // 0 without `-u`: the pp prompt in one pass, the fill to the depth in passes of DEPTH_UBATCH.
    let ub = if test.ubatch_given { test.n_ubatch } else { 0 };
    if test.n_gen > 0 {
        let tokens = bench_tokens(test.n_gen, n_vocab);
        time_tg(session, &depth, &tokens[..tokens.len().min(4)], ub)?;
        (0..reps)
            .map(|_| time_tg(session, &depth, &tokens, ub))
            .collect()
    } else {
        let tokens = bench_tokens(test.n_prompt, n_vocab);
        time_pp(session, &depth, &tokens, ub)?;
        (0..reps)
            .map(|_| time_pp(session, &depth, &tokens, ub))
            .collect()
    }
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
    // Fail early on an impossible placement before loading anything.
    for s in &setups {
        args.model.placement(s)?;
    }
    let tests = tests(args);
    let longest = tests
        .iter()
        .map(|t| t.n_depth + t.n_prompt.max(t.n_gen))
        .max();
    let mut report = Report::start(args.output);
    for setup in &setups {
        let loaded = load(&args.model, setup)?;
        let n_vocab = loaded.model.config.n_vocab;
        let opts = args.model.session_options(longest.unwrap_or(1).max(1));
        let mut session = Session::new(loaded.model.clone(), opts)?;
        for &test in &tests {
            let seconds = measure(&mut session, test, reps, n_vocab)?;
            let tokens = test.n_prompt.max(test.n_gen);
            report.add(Record::new(
                setup_fields(&loaded, &args.model),
                test,
                tokens,
                &seconds,
                utc_timestamp(SystemTime::now()),
            ));
        }
        report_memory(&loaded);
    }
    report.finish();
    Ok(())
}
