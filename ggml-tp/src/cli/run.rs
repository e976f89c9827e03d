//! `ggml-tp run [MODEL]`: generates text from a prompt (`-p`), streaming it to stdout, then prints
//! the speed of the prompt and of the generation to stderr; without `-p` it chats (as `ggml-tp
//! chat`). MODEL is a GGUF path or the name of a known model (`smollm2`, `qwen2.5-coder`, see
//! [`model_cache::RECIPES`]), fetched into the user's model cache first when it is missing
//! (sha256-verified). Also home of the sampling options that `chat` shares.

use super::chat;
use super::load::{load, ModelArgs};
use super::{CliError, CliResult};
use llama::generate::{GenerateOptions, Generation, Generator};
use llama::sampling::{Sampler, SamplingParams};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Sampling options (llama.cpp's names and defaults).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplingParams::default().temperature)]
    pub temp: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = SamplingParams::default().top_k)]
    pub top_k: usize,
    /// Nucleus threshold (1 = off).
    #[arg(long, default_value_t = SamplingParams::default().top_p)]
    pub top_p: f32,
    /// Keep tokens with p >= min_p * p_max (0 = off).
    #[arg(long, default_value_t = SamplingParams::default().min_p)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = SamplingParams::default().repeat_penalty)]
    pub repeat_penalty: f32,
    /// Tokens of history the penalty looks at.
    #[arg(long, default_value_t = SamplingParams::default().repeat_last_n)]
    pub repeat_last_n: usize,
    /// Seed of the sampler's RNG.
    #[arg(long, default_value_t = SamplingParams::default().seed)]
    pub seed: u64,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Stop when the text contains this string (may be repeated).
    #[arg(long)]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    pub fn sampler(&self) -> CliResult<Sampler> {
        Ok(Sampler::new(SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
            ..SamplingParams::default()
        })?)
    }

    pub fn generate_options(&self) -> GenerateOptions {
        GenerateOptions {
            max_tokens: self.n_predict,
            stop: self.stop.clone(),
            constraint: None,
        }
    }
}

/// Options of `run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A GGUF file, or a known model's name (smollm2, gemma3, qwen2.5-coder), fetched into the
    /// model cache when missing; instead of -m.
    #[arg(value_name = "MODEL", conflicts_with = "model")]
    pub name: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The prompt; without it, an interactive chat.
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// The chat's system message (without -p).
    #[arg(short = 's', long)]
    pub system: Option<String>,
    /// Do not echo the prompt before the generated text.
    #[arg(long)]
    pub no_display_prompt: bool,
    /// Also print the generated token ids to stderr.
    #[arg(long)]
    pub print_ids: bool,
}

/// Writes `text` to stdout now; `false` once stdout is gone (a closed pipe ends generation).
pub fn print_now(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).is_ok() && out.flush().is_ok()
}

/// The speed line printed after a generation.
pub fn speed_line(g: &Generation) -> String {
    let t = &g.timings;
    format!(
        "prompt: {} tokens in {:.2} s, {:.1} t/s | generation: {} tokens in {:.2} s, {:.1} t/s | stop: {:?}",
        t.prompt_tokens,
        t.prompt_time.as_secs_f64(),
        t.prompt_tps(),
        t.generated_tokens,
        t.generation_time.as_secs_f64(),
        t.generation_tps(),
        g.stop
    )
}

/// The file MODEL names: a path as it is, else a known model in the cache (fetched first when
/// missing or wrong).
pub fn resolve(name: &str) -> CliResult<PathBuf> {
    let path = Path::new(name);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    let recipe = model_cache::find(name).map_err(|e| {
        let e = CliError::from(e);
        match path.extension() {
            Some(_) => e.context(format!("{name} is not a file")),
            None => e,
        }
    })?;
    let cache = model_cache::models_cache_dir()?;
    Ok(model_cache::fetch_model(
        recipe,
        &recipe.expected(),
        None,
        &cache,
    )?)
}

pub fn run(args: &Args) -> CliResult {
    let mut model = args.model.clone();
    if let Some(name) = &args.name {
        model.model = vec![resolve(name)?];
    }
    let Some(prompt) = &args.prompt else {
        return chat::converse(&model, &args.sampling, args.system.as_deref(), false);
    };
    let setup = model.setup()?;
    let mut sampler = args.sampling.sampler()?;
    let loaded = load(&model, &setup)?;
    let tokens = loaded.tokenizer.encode(prompt, true, true);
    let default_ctx = (tokens.len() + args.sampling.n_predict).max(llama::kv::KV_PAD);
    let opts = model.session_options(default_ctx);
    let mut generator = Generator::new(loaded.model.clone(), opts)?;
    if !args.no_display_prompt {
        print_now(prompt);
    }
    let g = generator.generate(
        &loaded.tokenizer,
        &mut sampler,
        &tokens,
        &args.sampling.generate_options(),
        print_now,
    )?;
    print_now("\n");
    if args.print_ids {
        let ids: Vec<String> = g.tokens.iter().map(u32::to_string).collect();
        eprintln!("ids: {}", ids.join(" "));
    }
    eprintln!("{}", speed_line(&g));
    Ok(())
}
