//! Stand-ins for `crate::sampling` and `crate::chat` until those modules land in this branch, with
//! the same call shapes (`SamplingParams`, `Sampler::new(params)?.sample(logits, history)?`,
//! `ChatTemplate::from_gguf(&file, &tokenizer)?.render(&messages, add_generation_prompt)?`), so the
//! server switches over by changing its `use` lines and deleting this file.
//!
//! Until then the sampler is greedy whatever the parameters say (the argmax, the lowest id on
//! ties) and the chat template is ChatML (`<|im_start|>role\ncontent<|im_end|>\n`), llama.cpp's
//! fallback for models without a template.

use crate::tokenizer::Tokenizer;
use ggml_core::gguf::GgufFile;

/// Sampling knobs of a request; only validated by the greedy stand-in.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            seed: 0x5EED,
        }
    }
}

/// Errors of building a sampler or sampling.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("invalid sampling parameter {name} = {value}: {reason}")]
    InvalidParam {
        name: &'static str,
        value: f32,
        reason: &'static str,
    },
    #[error("empty logits")]
    EmptyLogits,
}

/// Picks tokens from logits rows.
#[derive(Debug, Clone)]
pub struct Sampler {
    _params: SamplingParams,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        let p = &params;
        let checks: [(&'static str, f32, bool, &'static str); 4] = [
            (
                "temperature",
                p.temperature,
                p.temperature.is_finite(),
                "not finite",
            ),
            (
                "top_p",
                p.top_p,
                (0.0..=1.0).contains(&p.top_p),
                "outside [0, 1]",
            ),
            (
                "min_p",
                p.min_p,
                (0.0..=1.0).contains(&p.min_p),
                "outside [0, 1]",
            ),
            (
                "repeat_penalty",
                p.repeat_penalty,
                p.repeat_penalty > 0.0 && p.repeat_penalty.is_finite(),
                "not positive",
            ),
        ];
        for (name, value, ok, reason) in checks {
            if !ok {
                return Err(SamplingError::InvalidParam {
                    name,
                    value,
                    reason,
                });
            }
        }
        Ok(Sampler { _params: params })
    }

    /// The argmax of `logits` (NaN counts as `-inf`), the lowest id on ties.
    pub fn sample(&mut self, logits: &[f32], _history: &[u32]) -> Result<u32, SamplingError> {
        let mut best: Option<(usize, f32)> = None;
        for (i, &x) in logits.iter().enumerate() {
            let x = if x.is_nan() { f32::NEG_INFINITY } else { x };
            if best.is_none_or(|(_, b)| x > b) {
                best = Some((i, x));
            }
        }
        best.map(|(i, _)| i as u32)
            .ok_or(SamplingError::EmptyLogits)
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Errors of rendering chat prompts.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// A chat template (ChatML in this stand-in).
#[derive(Debug, Clone)]
pub struct ChatTemplate;

impl ChatTemplate {
    pub fn from_gguf(_file: &GgufFile, _tokenizer: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        Ok(ChatTemplate)
    }

    /// ChatML turns, with the assistant's header appended when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let mut out = String::new();
        for m in messages {
            out.push_str(&format!(
                "<|im_start|>{}\n{}<|im_end|>\n",
                m.role, m.content
            ));
        }
        if add_generation_prompt {
            out.push_str("<|im_start|>assistant\n");
        }
        Ok(out)
    }

    /// `rendered` as the tokenizer should see it (ChatML has no BOS or EOS text to strip).
    pub fn strip_special<'a>(&self, rendered: &'a str, _add_bos: bool, _add_eos: bool) -> &'a str {
        rendered
    }
}
