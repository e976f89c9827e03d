//! What passes between the HTTP side and the inference worker: a request ([`GenRequest`]), the
//! events the worker answers with ([`Event`]), the admission bound ([`Admission`], [`Ticket`]), a
//! submitted request ([`Job`], shared by the slots of its choices) and the slot operations.

use super::api::{ApiError, FinishReason, Usage};
use llama::constraint::Constraint;
use llama::sampling::{Sampler, TokenLogProbs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// What one request asks the worker to generate.
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    /// The request's sampler (built, so its parameters are already checked).
    pub sampler: Sampler,
    pub stop: Vec<String>,
    /// Run in this slot (waiting until it is free); any free slot when `None`.
    pub slot: Option<usize>,
    /// Keep the prefix the slot's cache shares with the prompt (else evaluate it all).
    pub cache_prompt: bool,
    /// A fault to simulate (test aid, see [`super::ServerConfig::test_faults`]).
    pub fault: Option<Fault>,
    /// Report each sampled token's log-probability and those of this many most likely tokens.
    pub logprobs: Option<usize>,
    /// Report the log-probability of every prompt token after the first (the prompt is then
    /// evaluated whole, with no cached prefix).
    pub prompt_logprobs: bool,
    /// Choices (sequences) to generate; the prompt is evaluated once and its cache copied.
    pub n: usize,
    /// Decode control tokens as their text (replies whose tool-call markers are control tokens).
    pub special_text: bool,
    /// The grammar the reply follows (each choice follows its own copy).
    pub constraint: Option<Constraint>,
}

/// Faults the worker simulates for tests of the server's failure handling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every pass holding this request's slot fails like an evaluation error.
    EvalError,
    /// The worker panics when it takes the request.
    Panic,
    /// The worker sleeps this long when it takes the request, with the request pending.
    Stall(std::time::Duration),
}

/// What the worker reports to a request's handler.
#[derive(Debug)]
pub enum Event {
    /// Generated text of choice `index` and the log-probabilities of the tokens it ends (when
    /// asked for); the text is empty only when it carries the last log-probabilities.
    Text {
        index: usize,
        text: String,
        logprobs: Vec<TokenLogProbs>,
    },
    /// The log-probabilities of the prompt's tokens after the first, before any text.
    Prompt(Vec<TokenLogProbs>),
    /// The end of choice `index`.
    Done {
        index: usize,
        finish: FinishReason,
        usage: Usage,
    },
    /// A failure after the request was accepted.
    Failed(ApiError),
}

/// Bounds the requests in slots or queue; a [`Ticket`] holds one place.
#[derive(Debug)]
pub struct Admission {
    capacity: usize,
    in_flight: AtomicUsize,
}

/// One admitted request's place; given back when dropped (when the worker drops the job).
#[derive(Debug)]
pub struct Ticket(Arc<Admission>);

impl Admission {
    pub fn new(capacity: usize) -> Arc<Admission> {
        Arc::new(Admission {
            capacity,
            in_flight: AtomicUsize::new(0),
        })
    }

    pub(super) fn admit(self: &Arc<Self>) -> Option<Ticket> {
        let prev = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if prev >= self.capacity {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Ticket(self.clone()))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A submitted request; the slots of its choices share it, and its ticket is given back when the
/// last of them lets go.
pub(super) struct Job {
    pub(super) req: GenRequest,
    pub(super) events: mpsc::UnboundedSender<Event>,
    pub(super) _ticket: Ticket,
}

impl Job {
    /// Whether the client has gone.
    pub(super) fn gone(&self) -> bool {
        self.events.is_closed()
    }

    pub(super) fn send(&self, e: Event) {
        // A closed receiver is noticed at the next step.
        let _ = self.events.send(e);
    }
}

/// A slot's state as `GET /slots` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlotInfo {
    pub id: usize,
    pub busy: bool,
    pub n_past: usize,
    pub n_ctx: usize,
}

/// Operations on an idle slot; the files' disk I/O happens on the HTTP side.
#[derive(Debug)]
pub enum SlotAction {
    /// Encode the slot's tokens and cache ([`slot_file::encode`]).
    Save,
    /// Load a slot file's bytes into the slot.
    Restore(Vec<u8>),
    Erase,
}

/// The result of a slot action: the slot's tokens afterwards and, for a save, the file's bytes.
#[derive(Debug)]
pub struct SlotDone {
    pub n_tokens: usize,
    pub data: Option<Vec<u8>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_bounds_tickets() {
        let a = Admission::new(2);
        let t1 = a.admit();
        let t2 = a.admit();
        assert!(t1.is_some() && t2.is_some());
        assert!(a.admit().is_none());
        drop(t1);
        assert!(a.admit().is_some());
    }
}
