//! Constrained decoding: the tokens a grammar allows next, applied as a mask when sampling.
//!
//! The engine is the `llguidance` crate, chosen because it is the structured-output engine that
//! llama.cpp, vLLM and SGLang use: it takes JSON schemas, Lark grammars and regexes, computes a
//! token mask over a large vocabulary in tens of microseconds with its token trie and lazy lexer,
//! and compiles a grammar in milliseconds with no per-vocabulary precomputation.
//!
//! * [`ConstraintEngine`] is built once per model from our tokenizer ([`vocab`]: the bytes of every
//!   token, the end token) and compiles a [`Grammar`] into a [`Constraint`].
//! * [`Constraint`] follows one generation: [`Constraint::allows`] says whether a token may come
//!   next (for [`crate::sampling::Sampler::sample_allowed`]), [`Constraint::advance`] takes the
//!   sampled token and starts computing the next mask on a rayon thread, so that the mask is made
//!   while the next forward pass runs; [`Constraint::ready`] waits for it.
//! * [`tools`] builds the grammar of a tool call whose arguments follow the tool's JSON schema.
//!
//! A grammar that does not compile, or allows no token at all, is a [`ConstraintError`], never a
//! panic or a generation that cannot end.

pub mod tools;
mod vocab;

use std::sync::{mpsc, Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::tokenizer::Tokenizer;

/// Errors of compiling a grammar or following it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    #[error("the model's vocabulary has no end-of-generation token to end a constrained answer")]
    NoEndToken,
    #[error("the constraint engine could not be set up for this vocabulary: {0}")]
    Setup(String),
    #[error("invalid {kind}: {message}")]
    Invalid { kind: &'static str, message: String },
    #[error("the {kind} allows no token at its start: nothing could be generated")]
    Impossible { kind: &'static str },
    #[error("the constraint rejected token {token}: {message}")]
    Rejected { token: u32, message: String },
    #[error("the constraint failed: {0}")]
    Failed(String),
}

/// What a generation is constrained to.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON that validates against this schema.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark syntax (which may embed `%json {schema}`).
    Lark(String),
}

impl Grammar {
    /// A name for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Grammar::JsonObject => "JSON object constraint",
            Grammar::JsonSchema(_) => "JSON schema",
            Grammar::Lark(_) => "grammar",
        }
    }

    /// llguidance's form. JSON is compact (`", "` and `": "` separators, no free whitespace), so
    /// that a bounded schema has bounded output.
    fn top_level(&self) -> Result<TopLevelGrammar, ConstraintError> {
        let schema = match self {
            Grammar::Lark(text) => return Ok(TopLevelGrammar::from_lark(text.clone())),
            Grammar::JsonObject => json!({"type": "object"}),
            Grammar::JsonSchema(s) => s.clone(),
        };
        Ok(TopLevelGrammar::from_json_schema(compact_json(schema)))
    }
}

/// `schema` with llguidance's compact JSON options, unless it sets its own (`x-guidance`).
pub(crate) fn compact_json(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// Compiles grammars for one model's vocabulary (built once per model).
pub struct ConstraintEngine {
    factory: ParserFactory,
    tokenizer: Arc<Tokenizer>,
}

impl ConstraintEngine {
    /// The engine of `tokenizer`'s vocabulary.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<ConstraintEngine, ConstraintError> {
        let env: TokEnv = Arc::new(vocab::ModelTokEnv::new(tokenizer.clone())?);
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Setup(e.to_string()))?;
        factory.quiet();
        Ok(ConstraintEngine { factory, tokenizer })
    }

    /// A constraint following `grammar` from its start; its first mask is computed here, so a
    /// grammar that allows nothing is refused at once.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, ConstraintError> {
        let kind = grammar.kind();
        let invalid = |message: String| ConstraintError::Invalid { kind, message };
        let parser = self
            .factory
            .create_parser(grammar.top_level()?)
            .map_err(|e| invalid(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        let mask = matcher
            .compute_mask_or_eos()
            .map_err(|e| invalid(e.to_string()))?;
        if mask.is_zero() {
            return Err(ConstraintError::Impossible { kind });
        }
        Ok(Constraint {
            state: State::Ready(Box::new(matcher), mask),
            eog: self.tokenizer.eog_tokens().iter().copied().collect(),
            eos: self.factory.tok_env().tok_trie().eos_token(),
        })
    }
}

type Computed = (Box<Matcher>, anyhow::Result<SimpleVob>);

/// Where a constraint's next mask stands.
enum State {
    /// The matcher and the mask of the tokens allowed next.
    Ready(Box<Matcher>, SimpleVob),
    /// The mask is being computed on a rayon thread (the receiver in a mutex, so that a
    /// constraint can be shared between threads: it is `Sync`).
    Pending(Mutex<mpsc::Receiver<Computed>>),
    /// The grammar is complete: only an end token may follow.
    Complete,
    /// A failure, kept to be reported.
    Failed(ConstraintError),
}

/// One generation's grammar state.
pub struct Constraint {
    state: State,
    /// The model's end-of-generation tokens, all allowed where the grammar allows its end.
    eog: Vec<u32>,
    /// The end token llguidance's masks mark.
    eos: u32,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Ready(..) => "ready",
            State::Pending(_) => "pending",
            State::Complete => "complete",
            State::Failed(_) => "failed",
        };
        f.debug_struct("Constraint").field("state", &state).finish()
    }
}

impl Clone for Constraint {
    /// A copy of a ready constraint (the choices of one request each follow their own); a pending
    /// one is waited for first.
    fn clone(&self) -> Constraint {
        let state = match &self.state {
            State::Ready(m, mask) => State::Ready(Box::new(m.deep_clone()), mask.clone()),
            State::Pending(_) => State::Failed(ConstraintError::Failed(
                "a constraint was copied while its mask was being computed".into(),
            )),
            State::Complete => State::Complete,
            State::Failed(e) => State::Failed(e.clone()),
        };
        Constraint {
            state,
            eog: self.eog.clone(),
            eos: self.eos,
        }
    }
}

impl Constraint {
    /// Waits for the mask being computed (if any); the error of a failed step.
    pub fn ready(&mut self) -> Result<(), ConstraintError> {
        if let State::Pending(rx) = &mut self.state {
            let rx = rx
                .get_mut()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            self.state = match rx.recv() {
                Ok((matcher, Ok(mask))) => State::Ready(matcher, mask),
                Ok((_, Err(e))) => State::Failed(ConstraintError::Failed(e.to_string())),
                Err(_) => State::Failed(ConstraintError::Failed(
                    "the mask computation ended without a result".into(),
                )),
            };
        }
        match &self.state {
            State::Failed(e) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Whether `token` may come next (after [`Constraint::ready`]): the grammar's mask, with every
    /// end-of-generation token allowed where the grammar may end. Nothing but an end token once the
    /// grammar is complete, nothing while a mask is pending or after a failure.
    pub fn allows(&self, token: u32) -> bool {
        let end_allowed =
            |mask: &SimpleVob| (self.eos as usize) < mask.len() && mask.is_allowed(self.eos);
        match &self.state {
            State::Ready(_, mask) if self.eog.contains(&token) => end_allowed(mask),
            State::Ready(_, mask) => (token as usize) < mask.len() && mask.is_allowed(token),
            State::Complete => self.eog.contains(&token),
            State::Pending(_) | State::Failed(_) => false,
        }
    }

    /// Whether the grammar is complete (no more text can follow).
    pub fn is_complete(&self) -> bool {
        matches!(self.state, State::Complete)
    }

    /// Takes the sampled `token` (not an end token) and starts computing the next mask on a
    /// rayon thread; returns whether the grammar is now complete.
    pub fn advance(&mut self, token: u32) -> Result<bool, ConstraintError> {
        self.ready()?;
        let state = std::mem::replace(&mut self.state, State::Complete);
        let State::Ready(mut matcher, _) = state else {
            self.state = state;
            return Ok(self.is_complete());
        };
        if let Err(e) = matcher.consume_token(token) {
            let e = ConstraintError::Rejected {
                token,
                message: e.to_string(),
            };
            self.state = State::Failed(e.clone());
            return Err(e);
        }
        if matcher.is_stopped() {
            return Ok(true);
        }
        let (tx, rx) = mpsc::channel();
        rayon::spawn(move || {
            let mask = matcher.compute_mask_or_eos();
            // The receiver is gone only when the generation was dropped.
            let _ = tx.send((matcher, mask));
        });
        self.state = State::Pending(Mutex::new(rx));
        Ok(false)
    }
}

/// The engine's state is shared by the server's threads; a request's constraint goes with it.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<ConstraintEngine>();
    shared::<Constraint>();
};

#[cfg(test)]
mod tests;
