//! The generation loop shared by the `ggml-tp` program and the server: a prompt's tokens are run in
//! one batch, then tokens are sampled one at a time and streamed as text through a callback until an
//! end-of-generation token, the token limit, a stop string or the end of the context.
//!
//! With [`GenerateOptions::constraint`] only the tokens its grammar allows are sampled, the next
//! mask is computed while the next token's forward pass runs, and generation ends when the grammar
//! is complete ([`StopReason::Complete`]).
//!
//! A [`Generator`] owns a [`Session`] and remembers which tokens its KV cache holds, so a prompt
//! that extends the previous one (the next turn of a chat) only runs its new tokens.

use crate::constraint::{Constraint, ConstraintError};
use crate::model::{Model, ModelError};
use crate::runtime::{Outputs, Session, SessionOptions};
use crate::sampling::{Sampler, SamplingError};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Errors of generating.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {n} tokens, the context only {n_ctx}")]
    PromptTooLong { n: usize, n_ctx: usize },
}

/// Limits of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation stops when the text contains one of these; the text ends before it.
    pub stop: Vec<String>,
    /// Only what this grammar allows is generated (each generation follows its own copy).
    pub constraint: Option<Constraint>,
}

/// Why generation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    Eog,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The text reached one of the stop strings (this one).
    Stop(String),
    /// The KV cache is full.
    ContextFull,
    /// The callback asked to stop.
    Cancelled,
    /// The constraint's grammar is complete: nothing more may follow.
    Complete,
}

/// Counts and times of one generation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// Prompt tokens run through the model (those already cached are not counted).
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    /// Tokens sampled.
    pub generated_tokens: usize,
    /// Time from the end of the prompt to the last token (sampling and one decode step per token
    /// after the first).
    pub generation_time: Duration,
}

fn per_second(n: usize, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

impl Timings {
    /// Prompt tokens per second.
    pub fn prompt_tps(&self) -> f64 {
        per_second(self.prompt_tokens, self.prompt_time)
    }

    /// Generated tokens per second (the first token comes with the prompt's logits, so the rate
    /// counts the decode steps after it).
    pub fn generation_tps(&self) -> f64 {
        per_second(
            self.generated_tokens.saturating_sub(1),
            self.generation_time,
        )
    }
}

/// The outcome of one generation.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The sampled tokens (the end-of-generation token included when there was one).
    pub tokens: Vec<u32>,
    /// The generated text, cut before a stop string.
    pub text: String,
    pub stop: StopReason,
    pub timings: Timings,
}

/// A session plus the tokens its KV cache holds.
pub struct Generator {
    session: Session,
    n_ctx: usize,
    cached: Vec<u32>,
}

impl Generator {
    /// A generator over a new session of `model`.
    pub fn new(model: Arc<Model>, opts: SessionOptions) -> Result<Generator, ModelError> {
        Ok(Generator {
            session: Session::new(model, opts)?,
            n_ctx: opts.n_ctx,
            cached: Vec::new(),
        })
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The tokens whose keys and values are in the cache.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.cached
    }

    /// Forgets the cache.
    pub fn reset(&mut self) {
        self.session.reset();
        self.cached.clear();
    }

    /// Generates a continuation of `prompt`. The longest prefix of `prompt` already in the cache is
    /// kept; the rest runs as one batch. `on_text` receives the text as it becomes final (held back
    /// while it could be the start of a stop string) and returns `false` to stop.
    pub fn generate(
        &mut self,
        tokenizer: &Tokenizer,
        sampler: &mut Sampler,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation, GenerateError> {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        let n_ctx = self.n_ctx;
        if prompt.len() > n_ctx {
            return Err(GenerateError::PromptTooLong {
                n: prompt.len(),
                n_ctx,
            });
        }
        // Keep the common prefix, but always run at least the last prompt token for its logits.
        let keep = common_prefix(&self.cached, prompt).min(prompt.len() - 1);
        let keep = self.session.keep_prefix(keep);
        self.cached.truncate(keep);

        let mut timings = Timings {
            prompt_tokens: prompt.len() - keep,
            ..Timings::default()
        };
        let t0 = Instant::now();
        let mut logits = self.eval(&prompt[keep..])?;
        timings.prompt_time = t0.elapsed();

        let t1 = Instant::now();
        let mut history = prompt.to_vec();
        let mut tokens = Vec::new();
        let mut decoder = StreamDecoder::new();
        let mut text = StopText::new(&opts.stop);
        let mut stop = StopReason::MaxTokens;
        let mut constraint = opts.constraint.clone();
        while tokens.len() < opts.max_tokens {
            let id = match constraint.as_mut() {
                Some(c) => {
                    c.ready()?;
                    sampler.sample_allowed(&logits, &history, &|t| c.allows(t))?
                }
                None => sampler.sample(&logits, &history)?,
            };
            tokens.push(id);
            history.push(id);
            if tokenizer.is_eog(id) {
                stop = StopReason::Eog;
                break;
            }
            // The next mask is computed while the next forward pass runs.
            let complete = match constraint.as_mut() {
                Some(c) => c.advance(id)?,
                None => false,
            };
            let found = text.push(&decoder.push(tokenizer, id));
            let go_on = on_text(text.take_ready());
            if let Some(s) = found {
                stop = StopReason::Stop(s);
                break;
            }
            if !go_on {
                stop = StopReason::Cancelled;
                break;
            }
            if complete {
                stop = StopReason::Complete;
                break;
            }
            if tokens.len() == opts.max_tokens {
                break;
            }
            if self.cached.len() >= n_ctx {
                stop = StopReason::ContextFull;
                break;
            }
            logits = self.eval(&[id])?;
        }
        if !matches!(stop, StopReason::Stop(_) | StopReason::Cancelled) {
            text.push(&decoder.finish());
            text.flush();
            on_text(text.take_ready());
        }
        timings.generated_tokens = tokens.len();
        timings.generation_time = t1.elapsed();
        Ok(Generation {
            tokens,
            text: text.text,
            stop,
            timings,
        })
    }

    /// Runs `tokens` after the cached ones and returns the logits of the last.
    fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let logits = self.session.eval(tokens, Outputs::Last)?;
        self.cached.extend_from_slice(tokens);
        Ok(logits.data)
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Generated text with stop strings: finds them and holds back a tail that may begin one.
struct StopText<'a> {
    stop: &'a [String],
    text: String,
    /// End of the text handed out so far.
    sent: usize,
    /// End of the text that may be handed out.
    ready: usize,
}

impl<'a> StopText<'a> {
    fn new(stop: &'a [String]) -> StopText<'a> {
        StopText {
            stop,
            text: String::new(),
            sent: 0,
            ready: 0,
        }
    }

    /// Appends `piece`; returns the stop string when the text now contains one (the text is cut
    /// before it and everything before it becomes ready).
    fn push(&mut self, piece: &str) -> Option<String> {
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        // A new match must end inside the new piece.
        let mut from = self.text.len().saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.text.push_str(piece);
        let found = self
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| (from + i, s)))
            .min_by_key(|&(i, _)| i);
        if let Some((at, s)) = found {
            self.text.truncate(at);
            self.ready = at;
            return Some(s.clone());
        }
        // Hold back the longest tail that is a proper prefix of a stop string.
        let held = self
            .stop
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .filter(|&k| s.is_char_boundary(k))
                    .map(|k| &s[..k])
            })
            .filter(|p| self.text.ends_with(p))
            .map(|p| p.len())
            .max()
            .unwrap_or(0);
        self.ready = self.text.len() - held;
        None
    }

    /// Makes the held-back tail ready (the end of the stream).
    fn flush(&mut self) {
        self.ready = self.text.len();
    }

    /// The ready text not handed out yet.
    fn take_ready(&mut self) -> &str {
        let start = self.sent.min(self.ready);
        self.sent = self.ready.max(self.sent);
        &self.text[start..self.ready]
    }
}

#[cfg(test)]
mod tests {
    use super::StopText;

    fn run(stop: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let stop: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        let mut t = StopText::new(&stop);
        let mut out = String::new();
        for p in pieces {
            if let Some(s) = t.push(p) {
                out.push_str(t.take_ready());
                return (out, Some(s));
            }
            out.push_str(t.take_ready());
        }
        t.flush();
        out.push_str(t.take_ready());
        (out, None)
    }

    #[test]
    fn stop_strings() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None));
        assert_eq!(
            run(&["END"], &["hello E", "N", "D more"]),
            ("hello ".into(), Some("END".into()))
        );
        assert_eq!(
            run(&["END"], &["hello E", "N", "x"]),
            ("hello ENx".into(), None)
        );
        assert_eq!(run(&["END"], &["tail EN"]), ("tail EN".into(), None));
        assert_eq!(
            run(&["\n\n", "é!"], &["é", "é", "!"]),
            ("é".into(), Some("é!".into()))
        );
    }
}
