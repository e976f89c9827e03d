//! The inference worker: one dedicated thread that owns the model and a [`BatchSession`] with one
//! sequence (a region of the KV cache) per slot, and serves every active slot with continuous
//! batching.
//!
//! Each step advances the active slots in **one forward pass**: every generating slot contributes
//! its last sampled token, and the slots still reading their prompts share a budget of
//! `prompt_chunk` prompt tokens per step, oldest request first (so a pass stays bounded and long
//! prompts do not stall the generating slots). After the pass each slot that has read its whole
//! prompt samples its next token from its own logits. The weights are read once per step for all
//! slots, so throughput grows with the active slots. New requests join between steps, so nobody
//! waits for another request to finish. A model that cannot hold several sequences in one pass
//! ([`BatchSession::batches_sequences`]) gets one pass per slot instead.
//!
//! Requests beyond the free slots wait in a FIFO queue; the [`Admission`] counter bounds slots plus
//! queue, and a request past that bound is refused before it reaches the worker. A request whose
//! event receiver is gone (the client disconnected) is dropped at the next step and its slot
//! freed. When a slot is assigned, the prefix its cache shares with the new prompt is kept. A pass
//! that fails ends the requests whose slots caused it and the others go on; a panic while a pass is
//! computed or a slot samples is caught: it ends the requests of those slots with a 500, resets
//! their caches and counts a recovery. A constrained choice samples among the tokens its grammar
//! allows; the next mask is computed on a rayon thread while the next forward pass runs, and the
//! choice ends (`stop`) when the grammar is complete. The worker's progress is reported to `/health`
//! ([`WorkerHealth`]).

use super::api::{ApiError, FinishReason, Usage};
use super::health::{panic_message, AliveGuard, WorkerHealth};
use super::job::Job;
pub use super::job::{Admission, Event, Fault, GenRequest, SlotAction, SlotDone, SlotInfo, Ticket};
use super::metrics::Metrics;
use super::stop::StopFilter;
use axum::http::StatusCode;
use llama::constraint::Constraint;
use llama::model::ModelError;
use llama::runtime::{BatchSession, Logits, Outputs, SeqTokens};
use llama::sampling::{log_probs, Sampler, TokenLogProbs};
use llama::slot_file;
use llama::tokenizer::{StreamDecoder, Tokenizer};
use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

enum Command {
    Submit(Box<Job>),
    Slot {
        id: usize,
        action: SlotAction,
        reply: oneshot::Sender<Result<SlotDone, ApiError>>,
    },
    List(oneshot::Sender<Vec<SlotInfo>>),
}

/// The handle of the worker used by the HTTP side (cheap to clone).
#[derive(Clone)]
pub struct Engine {
    tx: Sender<Command>,
    admission: Arc<Admission>,
    n_slots: usize,
    health: Arc<WorkerHealth>,
}

/// Settings of the worker.
pub struct WorkerSetup {
    /// One sequence per slot.
    pub session: BatchSession,
    pub tokenizer: Arc<Tokenizer>,
    pub metrics: Arc<Metrics>,
    pub prompt_chunk: usize,
    pub queue_len: usize,
    pub health: Arc<WorkerHealth>,
}

fn unavailable() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the inference worker has stopped",
    )
}

impl Engine {
    /// A worker over `setup`'s session and its handle. The worker is run (by [`Worker::run`]) on
    /// the thread that made the session; the handle goes to the HTTP side.
    pub fn new(setup: WorkerSetup) -> (Engine, Worker) {
        let (tx, rx) = std::sync::mpsc::channel();
        let n_slots = setup.session.kv().n_seq();
        setup
            .metrics
            .slots_total
            .store(n_slots as u64, Ordering::Relaxed);
        let engine = Engine {
            tx,
            admission: Admission::new(n_slots + setup.queue_len),
            n_slots,
            health: setup.health.clone(),
        };
        let worker = Worker {
            rx,
            session: setup.session,
            slots: (0..n_slots)
                .map(|_| SlotState {
                    tokens: Vec::new(),
                    active: None,
                })
                .collect(),
            waiting: VecDeque::new(),
            tokenizer: setup.tokenizer,
            metrics: setup.metrics,
            prompt_chunk: setup.prompt_chunk.max(1),
            started: 0,
            health: setup.health,
        };
        (engine, worker)
    }

    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    /// The worker's liveness.
    pub fn health(&self) -> &WorkerHealth {
        &self.health
    }

    /// A place in the slots or the queue, taken before a request's prompt is prepared (503 when
    /// every place is taken).
    pub fn admit(&self) -> Result<Ticket, ApiError> {
        self.admission.admit().ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is busy: every slot is serving and the queue is full; retry later",
            )
        })
    }

    /// Hands `req`, admitted with `ticket`, to the worker; events arrive on the returned receiver.
    /// Dropping the receiver cancels the request.
    pub fn submit(
        &self,
        req: GenRequest,
        ticket: Ticket,
    ) -> Result<mpsc::UnboundedReceiver<Event>, ApiError> {
        if let Some(id) = req.slot {
            self.check_slot(id)?;
        }
        let (events, rx) = mpsc::unbounded_channel();
        let job = Job {
            req,
            events,
            _ticket: ticket,
        };
        self.send(Command::Submit(Box::new(job)))?;
        Ok(rx)
    }

    fn send(&self, c: Command) -> Result<(), ApiError> {
        self.health.sent();
        self.tx.send(c).map_err(|_| unavailable())
    }

    /// Runs `action` on slot `id` between two steps of the worker.
    pub async fn slot_action(&self, id: usize, action: SlotAction) -> Result<SlotDone, ApiError> {
        self.check_slot(id)?;
        let (reply, rx) = oneshot::channel();
        self.send(Command::Slot { id, action, reply })?;
        rx.await.map_err(|_| unavailable())?
    }

    /// The state of every slot.
    pub async fn slots(&self) -> Result<Vec<SlotInfo>, ApiError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::List(reply))?;
        rx.await.map_err(|_| unavailable())
    }

    fn check_slot(&self, id: usize) -> Result<(), ApiError> {
        if id >= self.n_slots {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("slot {id} does not exist (the server has {})", self.n_slots),
            ));
        }
        Ok(())
    }
}

/// One choice of a request, generated in one slot.
struct Active {
    job: Arc<Job>,
    /// The choice (`0..n`).
    index: usize,
    sampler: Sampler,
    decoder: StreamDecoder,
    stop: StopFilter,
    /// The last sampled token, not yet in the cache.
    next: Option<u32>,
    usage: Usage,
    /// When the request got its slot (a worker-wide count): older prompts are read first.
    started: u64,
    /// Log-probabilities of sampled tokens whose text is not sent yet.
    pending: Vec<TokenLogProbs>,
    /// Log-probabilities of the prompt tokens read so far (when asked for).
    prompt_logprobs: Vec<TokenLogProbs>,
    /// The slots of choices `1..n`: they get a copy of this slot's cache once the prompt is read.
    followers: Vec<usize>,
    /// A follower waiting for its leader's prompt: it has no input of its own until then.
    following: bool,
    /// The grammar this choice follows.
    constraint: Option<Constraint>,
}

/// Slot `i` is sequence `i` of the worker's session.
struct SlotState {
    /// The tokens of the cached positions (as many as the sequence's `n_past`).
    tokens: Vec<u32>,
    active: Option<Active>,
}

/// The worker's state: the session, the slots and the queue.
pub struct Worker {
    rx: Receiver<Command>,
    session: BatchSession,
    slots: Vec<SlotState>,
    waiting: VecDeque<Job>,
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    prompt_chunk: usize,
    /// Requests that got a slot so far.
    started: u64,
    health: Arc<WorkerHealth>,
}

impl Worker {
    /// Serves requests until every [`Engine`] handle is dropped and no slot is busy.
    pub fn run(mut self) {
        let _alive = AliveGuard(self.health.clone());
        let mut connected = true;
        loop {
            let busy = self.slots.iter().any(|s| s.active.is_some());
            self.health.beat(busy || !self.waiting.is_empty());
            if !busy && self.waiting.is_empty() {
                if !connected {
                    return;
                }
                match self.rx.recv() {
                    Ok(c) => self.command(c),
                    Err(_) => return,
                }
            }
            loop {
                match self.rx.try_recv() {
                    Ok(c) => self.command(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        connected = false;
                        break;
                    }
                }
            }
            self.assign();
            self.gauges();
            self.step();
            Metrics::inc(&self.metrics.steps);
            self.gauges();
        }
    }

    fn gauges(&self) {
        let active = self.slots.iter().filter(|s| s.active.is_some()).count();
        Metrics::set(&self.metrics.slots_active, active);
        Metrics::set(&self.metrics.queue_length, self.waiting.len());
    }

    fn command(&mut self, c: Command) {
        self.health.taken();
        match c {
            Command::Submit(job) => {
                Metrics::inc(&self.metrics.requests);
                let fault = job.req.fault;
                self.waiting.push_back(*job);
                match fault {
                    Some(Fault::Panic) => panic!("test fault: the inference worker panics"),
                    Some(Fault::Stall(d)) => {
                        self.health.beat(true);
                        std::thread::sleep(d);
                    }
                    _ => {}
                }
            }
            Command::Slot { id, action, reply } => {
                let _ = reply.send(self.slot_action(id, action));
            }
            Command::List(reply) => {
                let info = self
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(id, s)| SlotInfo {
                        id,
                        busy: s.active.is_some(),
                        n_past: s.tokens.len(),
                        n_ctx: self.session.kv().n_ctx(),
                    })
                    .collect();
                let _ = reply.send(info);
            }
        }
        self.gauges();
    }

    fn slot_action(&mut self, id: usize, action: SlotAction) -> Result<SlotDone, ApiError> {
        let slot = &mut self.slots[id];
        if slot.active.is_some() {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("slot {id} is serving a request; retry when it is idle"),
            ));
        }
        let file_error = |e: slot_file::SlotFileError| match e {
            slot_file::SlotFileError::Mismatch(_) | slot_file::SlotFileError::Io(_) => {
                ApiError::bad_request(e.to_string())
            }
            e => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
        let session = &mut self.session;
        let data = match action {
            SlotAction::Save => {
                Some(slot_file::encode(session, id, &slot.tokens).map_err(file_error)?)
            }
            SlotAction::Restore(bytes) => match slot_file::decode_into(session, id, &bytes) {
                Ok(tokens) => {
                    slot.tokens = tokens;
                    None
                }
                Err(e) => {
                    slot.tokens.truncate(session.n_past(id).unwrap_or(0));
                    return Err(file_error(e));
                }
            },
            SlotAction::Erase => {
                forget(session, slot, id);
                None
            }
        };
        Ok(SlotDone {
            n_tokens: slot.tokens.len(),
            data,
        })
    }

    /// Moves waiting jobs into free slots, FIFO (a job pinned to a busy slot, or one whose `n`
    /// choices need more free slots than there are, keeps waiting), and drops waiting jobs whose
    /// client has gone.
    fn assign(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|j| !j.gone());
        let gone = before - self.waiting.len();
        Metrics::add(&self.metrics.requests_cancelled, gone);
        let mut i = 0;
        while i < self.waiting.len() {
            let req = &self.waiting[i].req;
            let leader = match req.slot {
                Some(id) => self.slots[id].active.is_none().then_some(id),
                None => self.best_free_slot(&req.prompt),
            };
            let followers: Vec<usize> = leader
                .map(|l| {
                    (0..self.slots.len())
                        .filter(|&f| f != l && self.slots[f].active.is_none())
                        .take(req.n.saturating_sub(1))
                        .collect()
                })
                .unwrap_or_default();
            match leader {
                Some(id) if followers.len() + 1 >= req.n => {
                    if let Some(job) = self.waiting.remove(i) {
                        self.start(id, job, followers);
                    }
                }
                _ => i += 1,
            }
        }
    }

    /// The free slot whose cache shares the longest prefix with `prompt`.
    fn best_free_slot(&self, prompt: &[u32]) -> Option<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.active.is_none())
            .max_by_key(|(id, s)| (common_prefix(&s.tokens, prompt), std::cmp::Reverse(*id)))
            .map(|(id, _)| id)
    }

    /// Starts `job` in slot `id` (choice 0), reserving the `followers` slots for its other choices.
    fn start(&mut self, id: usize, job: Job, followers: Vec<usize>) {
        let slot = &mut self.slots[id];
        // Keep the shared prefix, but evaluate at least one prompt token to get logits; prompt
        // log-probabilities need every prompt position evaluated.
        let shared = if job.req.cache_prompt && !job.req.prompt_logprobs {
            common_prefix(&slot.tokens, &job.req.prompt)
        } else {
            0
        };
        let keep = match self
            .session
            .keep_prefix(id, shared.min(job.req.prompt.len() - 1))
        {
            Ok(keep) => keep,
            Err(e) => {
                Metrics::inc(&self.metrics.requests_failed);
                let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
                return job.send(Event::Failed(e));
            }
        };
        slot.tokens.truncate(keep);
        let usage = Usage {
            prompt_tokens: job.req.prompt.len(),
            cached_tokens: keep,
            completion_tokens: 0,
        };
        Metrics::add(&self.metrics.prompt_tokens, usage.prompt_tokens);
        Metrics::add(&self.metrics.prompt_tokens_cached, keep);
        self.started += 1;
        let job = Arc::new(job);
        let choice = |index: usize, followers: Vec<usize>| {
            let mut sampler = job.req.sampler.clone();
            if index > 0 {
                // Each choice draws its own deterministic stream.
                sampler.reseed(sampler.params().seed.wrapping_add(index as u64));
            }
            Active {
                job: job.clone(),
                index,
                sampler,
                decoder: StreamDecoder::new(),
                stop: StopFilter::new(job.req.stop.clone()),
                next: None,
                usage,
                started: self.started,
                pending: Vec::new(),
                prompt_logprobs: Vec::new(),
                following: index > 0,
                followers,
                constraint: job.req.constraint.clone(),
            }
        };
        for (k, &f) in followers.iter().enumerate() {
            self.slots[f].active = Some(choice(k + 1, Vec::new()));
        }
        self.slots[id].active = Some(choice(0, followers));
    }

    /// Advances the active slots by one generated token each and by the step's prompt budget, in
    /// one forward pass (one per slot where the model cannot batch sequences). Requests whose
    /// client has gone free their slots first; followers wait for their leader's prompt.
    fn step(&mut self) {
        let mut order = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let Some(a) = slot.active.as_ref() else {
                continue;
            };
            if a.job.gone() {
                if a.index == 0 {
                    Metrics::inc(&self.metrics.requests_cancelled);
                }
                slot.active = None;
                continue;
            }
            if !a.following {
                order.push((a.started, i));
            }
        }
        order.sort_unstable();
        let mut budget = self.prompt_chunk;
        let mut inputs: Vec<Input> = Vec::new();
        for (_, i) in order {
            let slot = &self.slots[i];
            let Some(a) = slot.active.as_ref() else {
                continue;
            };
            let (tokens, outputs) = match a.next {
                Some(t) => (vec![t], Outputs::Last),
                None if budget > 0 => {
                    let prompt = &a.job.req.prompt;
                    let from = slot.tokens.len();
                    let chunk = &prompt[from..prompt.len().min(from + budget)];
                    budget -= chunk.len();
                    let outputs = if a.job.req.prompt_logprobs {
                        Outputs::All
                    } else {
                        Outputs::Last
                    };
                    (chunk.to_vec(), outputs)
                }
                None => continue,
            };
            inputs.push(Input {
                slot: i,
                tokens,
                outputs,
            });
        }
        if self.session.batches_sequences() {
            self.pass(&inputs);
        } else {
            for one in inputs.chunks(1) {
                self.pass(one);
            }
        }
    }

    /// Runs one forward pass over `inputs` and advances each of their slots. When a pass over
    /// several slots fails, each slot whose cache the failure left intact is retried in a pass of
    /// its own, so one slot's failure ends only its own request.
    fn pass(&mut self, inputs: &[Input]) {
        if inputs.is_empty() {
            return;
        }
        let batch: Vec<SeqTokens> = inputs
            .iter()
            .map(|x| SeqTokens {
                seq: x.slot,
                tokens: &x.tokens,
                outputs: x.outputs,
            })
            .collect();
        let faulty = inputs.iter().any(|x| {
            self.slots[x.slot]
                .active
                .as_ref()
                .is_some_and(|a| a.job.req.fault == Some(Fault::EvalError))
        });
        let result = if faulty {
            Err(ModelError::Input("test fault: evaluation error".into()))
        } else {
            match catch_unwind(AssertUnwindSafe(|| self.session.eval(&batch))) {
                Ok(result) => result,
                Err(panic) => return self.recover(inputs.iter().map(|x| x.slot), &*panic),
            }
        };
        match result {
            Ok(logits) => {
                let n_tokens = inputs.iter().map(|x| x.tokens.len()).sum();
                self.metrics.pass(inputs.len(), n_tokens);
                for (x, l) in inputs.iter().zip(&logits) {
                    if let Err(panic) =
                        catch_unwind(AssertUnwindSafe(|| self.advance(x.slot, &x.tokens, l)))
                    {
                        self.recover([x.slot], &*panic);
                    }
                }
            }
            Err(e) => {
                let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
                if inputs.len() == 1 {
                    return self.fail(inputs[0].slot, e);
                }
                for k in 0..inputs.len() {
                    let i = inputs[k].slot;
                    if self.session.n_past(i).ok() == Some(self.slots[i].tokens.len()) {
                        self.pass(&inputs[k..k + 1]);
                    } else {
                        self.fail(i, e.clone());
                    }
                }
            }
        }
    }

    /// Takes slot `i`'s evaluated `input` into account: appends it to the slot's tokens (noting
    /// the prompt tokens' log-probabilities when asked for) and, once the prompt is read, hands
    /// its cache to the followers and samples every choice's next token from the last row of
    /// `logits`.
    fn advance(&mut self, i: usize, input: &[u32], logits: &Logits) {
        let slot = &mut self.slots[i];
        let Some(a) = slot.active.as_mut() else {
            return;
        };
        let reading = a.next.is_none();
        slot.tokens.extend_from_slice(input);
        let prompt = &a.job.req.prompt;
        if reading && a.job.req.prompt_logprobs {
            // Row r (at position p) predicts the prompt token after it.
            let top = a.job.req.logprobs.unwrap_or(0);
            for (r, &p) in logits.positions.iter().enumerate() {
                if let Some(&next) = prompt.get(p + 1) {
                    a.prompt_logprobs.push(log_probs(logits.row(r), next, top));
                }
            }
        }
        if reading && slot.tokens.len() < prompt.len() {
            return; // more prompt to read
        }
        if reading {
            if a.job.req.prompt_logprobs {
                a.job
                    .send(Event::Prompt(std::mem::take(&mut a.prompt_logprobs)));
            }
            let followers = std::mem::take(&mut a.followers);
            if let Err(e) = self.fork(i, &followers) {
                let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
                for f in followers {
                    self.fail(f, e.clone());
                }
                return self.fail(i, e);
            }
            for f in followers {
                self.emit_next(f, logits.last());
            }
        }
        self.emit_next(i, logits.last());
    }

    /// Copies leader `i`'s cache (its prompt) into each follower's sequence, so the prompt is
    /// evaluated once for all the choices.
    fn fork(&mut self, i: usize, followers: &[usize]) -> Result<(), ModelError> {
        let tokens = self.slots[i].tokens.clone();
        for &f in followers {
            self.session.kv().copy_sequence(i, f, tokens.len())?;
            self.session.set_n_past(f, tokens.len())?;
            let slot = &mut self.slots[f];
            slot.tokens.clone_from(&tokens);
            if let Some(a) = slot.active.as_mut() {
                a.following = false;
            }
        }
        Ok(())
    }

    /// Samples slot `i`'s next token from `row` (its logits) and streams its text, or ends the
    /// choice (end of generation, stop string, `max_tokens`, a full context).
    fn emit_next(&mut self, i: usize, row: &[f32]) {
        let slot = &mut self.slots[i];
        let Some(a) = slot.active.as_mut() else {
            return;
        };
        if a.job.req.max_tokens == 0 {
            return self.finish(i, FinishReason::Length);
        }
        let internal = |e: String| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e);
        let sampled = match a.constraint.as_mut() {
            Some(c) => c.ready().map_err(|e| e.to_string()).and_then(|()| {
                let allowed = |t| c.allows(t);
                (a.sampler.sample_allowed(row, &slot.tokens, &allowed)).map_err(|e| e.to_string())
            }),
            None => a
                .sampler
                .sample(row, &slot.tokens)
                .map_err(|e| e.to_string()),
        };
        let tok = match sampled {
            Ok(t) => t,
            Err(e) => return self.fail(i, internal(e)),
        };
        Metrics::inc(&self.metrics.tokens_generated);
        if self.tokenizer.is_eog(tok) {
            return self.finish(i, FinishReason::Stop);
        }
        // The next mask is computed while the next forward pass runs.
        let complete = match a.constraint.as_mut().map(|c| c.advance(tok)) {
            Some(Err(e)) => return self.fail(i, internal(e.to_string())),
            Some(Ok(done)) => done,
            None => false,
        };
        if let Some(top) = a.job.req.logprobs {
            a.pending.push(log_probs(row, tok, top));
        }
        a.usage.completion_tokens += 1;
        let piece = if a.job.req.special_text {
            a.decoder.push_special(&self.tokenizer, tok)
        } else {
            a.decoder.push(&self.tokenizer, tok)
        };
        let (text, hit) = a.stop.push(&piece);
        if !text.is_empty() {
            a.job.send(Event::Text {
                index: a.index,
                text,
                logprobs: std::mem::take(&mut a.pending),
            });
        }
        if hit || complete {
            return self.finish(i, FinishReason::Stop);
        }
        if a.usage.completion_tokens >= a.job.req.max_tokens
            || slot.tokens.len() >= self.session.kv().n_ctx()
        {
            return self.finish(i, FinishReason::Length);
        }
        a.next = Some(tok);
    }

    /// Ends slot `i`'s choice with `finish`, flushing held-back text and log-probabilities.
    fn finish(&mut self, i: usize, finish: FinishReason) {
        let Some(mut a) = self.slots[i].active.take() else {
            return;
        };
        let mut text = String::new();
        if !a.stop.hit {
            let tail = a.decoder.finish();
            let (held, hit) = a.stop.push(&tail);
            text = held;
            if !hit {
                text.push_str(&a.stop.flush());
            }
        }
        if !text.is_empty() || !a.pending.is_empty() {
            a.job.send(Event::Text {
                index: a.index,
                text,
                logprobs: std::mem::take(&mut a.pending),
            });
        }
        if Arc::strong_count(&a.job) == 1 {
            Metrics::inc(&self.metrics.requests_completed);
        }
        a.job.send(Event::Done {
            index: a.index,
            finish,
            usage: a.usage,
        });
    }

    /// After a panic while computing `slots` (caught, so the worker goes on): ends their requests
    /// with a 500 and resets their caches, whose state the panic may have left half-written.
    fn recover(&mut self, slots: impl IntoIterator<Item = usize>, panic: &(dyn Any + Send)) {
        self.health.recovered();
        let e = ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "internal error while computing this request ({}); its slot was reset",
                panic_message(panic)
            ),
        );
        for i in slots {
            self.fail(i, e.clone());
        }
    }

    /// Ends slot `i`'s choice with an error and forgets the slot's cache, and the slots reserved
    /// for the choice's followers.
    fn fail(&mut self, i: usize, e: ApiError) {
        let slot = &mut self.slots[i];
        if let Some(a) = slot.active.take() {
            if a.index == 0 {
                Metrics::inc(&self.metrics.requests_failed);
            }
            a.job.send(Event::Failed(e.clone()));
            for &f in &a.followers {
                self.slots[f].active = None;
            }
        }
        forget(&mut self.session, &mut self.slots[i], i);
    }
}

/// One slot's tokens in a forward pass, and which of them get logits.
struct Input {
    slot: usize,
    tokens: Vec<u32>,
    outputs: Outputs,
}

/// Empties slot `id`'s tokens and its sequence's cache.
fn forget(session: &mut BatchSession, slot: &mut SlotState, id: usize) {
    slot.tokens.clear();
    // `id` indexes the session's sequences, as every slot does.
    let _ = session.truncate(id, 0);
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
