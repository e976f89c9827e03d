//! `ggml-tp chat`: an interactive conversation over stdin, one user turn per line, rendered with the
//! model's chat template (ChatML when the file has none). The KV cache keeps the conversation, so
//! each turn only runs its new tokens. `/reset` starts over; an empty line or end of input quits.

use super::load::{load, ModelArgs};
use super::run::{print_now, speed_line, SamplingArgs};
use super::{CliError, CliResult};
use llama::chat::{ChatTemplate, Message};
use llama::generate::{Generator, StopReason};
use std::io::{BufRead, IsTerminal};

/// Options of `chat`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message to start the conversation with.
    #[arg(short = 's', long)]
    pub system: Option<String>,
    /// Print the speed of every reply to stderr.
    #[arg(long)]
    pub timings: bool,
}

pub fn run(args: &Args) -> CliResult {
    converse(
        &args.model,
        &args.sampling,
        args.system.as_deref(),
        args.timings,
    )
}

/// The conversation over stdin with `model` (`ggml-tp chat`, and `ggml-tp run` without a prompt).
pub fn converse(
    model: &ModelArgs,
    sampling: &SamplingArgs,
    system: Option<&str>,
    timings: bool,
) -> CliResult {
    let setup = model.setup()?;
    let mut sampler = sampling.sampler()?;
    let loaded = load(model, &setup)?;
    let tok = &loaded.tokenizer;
    let template = ChatTemplate::from_gguf(&loaded.file, tok)?;
    if template.is_fallback() {
        eprintln!("the model has no chat template: using ChatML");
    }
    let opts = model.session_options(4096);
    let mut generator = Generator::new(loaded.model.clone(), opts)?;
    let start: Vec<Message> = system.iter().map(|s| Message::system(*s)).collect();
    let mut messages = start.clone();
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("type a message and Enter; /reset starts over, an empty line quits");
    }
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            print_now("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        let line = line.trim();
        if line.is_empty() {
            break;
        }
        if line == "/reset" {
            messages = start.clone();
            generator.reset();
            continue;
        }
        messages.push(Message::user(line));
        let rendered = template.render(&messages, true)?;
        let text = template.strip_special(&rendered, tok.add_bos(), tok.add_eos());
        let prompt = tok.encode(text, true, true);
        let g = generator.generate(
            tok,
            &mut sampler,
            &prompt,
            &sampling.generate_options(),
            print_now,
        )?;
        print_now("\n");
        if timings {
            eprintln!("{}", speed_line(&g));
        }
        if g.stop == StopReason::ContextFull {
            return Err(CliError::new(format!(
                "the context of {} tokens is full (-c to enlarge it, /reset to start over)",
                opts.n_ctx
            )));
        }
        messages.push(Message::assistant(g.text.trim()));
    }
    Ok(())
}
