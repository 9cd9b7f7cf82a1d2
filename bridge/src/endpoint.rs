//! Named endpoints: the per-endpoint limiter, retries and accounting.
//!
//! [`Endpoints`] is the registry a caller picks models from by name (`root`, `sub`, …). Each
//! [`Endpoint`] owns a client, a semaphore shared by every caller of that endpoint (so nested
//! or recursive callers together never exceed `max_in_flight`), and a handle on the common
//! [`Ledger`]. [`Endpoint::call`] is the one path every call takes:
//!
//! ```text
//! call ─ index ─ budget reservation ─┬─ permit ─ attempt ─ release ─┬─ record ─ result
//!                                    └──── backoff (retryable) ◄────┘
//! ```
//!
//! A retryable failure uses up one of the [`RetryPolicy`](crate::RetryPolicy)'s attempts,
//! except a 429 that says when to come back, waited out within the policy's
//! `rate_limit_patience` (a busy server is not a failing one).
//! Every wait on that path (permit, attempt, backoff) races the caller's cancellation token.
//! The index, the reservation and the attempts live in a `CallTicket` whose `Drop` records
//! the call as cancelled if its future is dropped before it ends (a caller's `timeout`, an
//! aborted batch task), so every index gets exactly one record and a call that was never
//! sent gives its reservation back.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::chat::{ChatRequest, ChatResponse};
use crate::client::{AnthropicClient, LmClient, OpenAiClient};
use crate::config::{EndpointConfig, Provider};
use crate::error::{BridgeError, FailureKind};
use crate::ledger::{CallEstimate, Claim, Ledger, Reservation, SubCallMetadata};
use crate::limiter::{Limiter, LimiterStats, Outcome};
use crate::record::{Answer, AnswerRef, CacheUse, RecordKey, SubCallRecord, Turn};
use crate::secret;
use crate::window::{LOOKUP_FLOOR, WindowSource, known_window};

/// Per-call options.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Cancelling it aborts the call wherever it is (queued, in flight or backing off).
    pub cancel: CancellationToken,
    /// Use SSE streaming on the wire.
    pub stream: bool,
    /// The call is an iteration of an RLM loop (a root-model reply): it takes a
    /// [`Budget::max_iterations`](crate::Budget::max_iterations) slot.
    pub iteration: bool,
    /// The REPL session whose code makes the call, kept in its record
    /// ([`SubCallMetadata::session`]) so a block's calls can be told from other sessions'.
    pub session: Option<u64>,
    /// A sub-call from model code: it goes through the run's [`SubCallRecord`], which keeps
    /// its answer and, when caching, answers a repeat of it without a request.
    pub sub_call: bool,
}

/// One named model: configuration, client, limiter and ledger.
pub struct Endpoint {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    config: EndpointConfig,
    client: Arc<dyn LmClient>,
    limiter: Limiter,
    ledger: Arc<Ledger>,
    /// The run's record of sub-call answers (shared by an [`Endpoints`] registry).
    record: Arc<SubCallRecord>,
    /// The window the server's model listing gives, asked once ([`crate::window`]).
    listed_window: tokio::sync::OnceCell<Option<u64>>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.shared.config.name)
            .field("provider", &self.shared.config.provider)
            .field("base_url", &self.shared.config.base_url)
            .field("model", &self.shared.config.model)
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// An endpoint with the client its `provider` calls for.
    pub fn new(config: EndpointConfig, ledger: Arc<Ledger>) -> Result<Self, BridgeError> {
        config.validate()?;
        let client = Self::client_for(&config)?;
        Self::with_client(config, client, ledger)
    }

    /// An endpoint over a client of your own.
    pub fn with_client(
        config: EndpointConfig,
        client: Arc<dyn LmClient>,
        ledger: Arc<Ledger>,
    ) -> Result<Self, BridgeError> {
        Self::with_record(config, client, ledger, Arc::default())
    }

    /// An endpoint over `client` whose sub-calls go through `record` (which an
    /// [`Endpoints`] registry shares between its endpoints).
    pub fn with_record(
        config: EndpointConfig,
        client: Arc<dyn LmClient>,
        ledger: Arc<Ledger>,
        record: Arc<SubCallRecord>,
    ) -> Result<Self, BridgeError> {
        config.validate()?;
        Ok(Self {
            shared: Arc::new(Shared {
                limiter: Limiter::new(config.max_in_flight, config.adaptive),
                config,
                client,
                ledger,
                record,
                listed_window: tokio::sync::OnceCell::new(),
            }),
        })
    }

    /// The client `config`'s provider calls for.
    fn client_for(config: &EndpointConfig) -> Result<Arc<dyn LmClient>, BridgeError> {
        Ok(match config.provider {
            Provider::OpenAi => Arc::new(OpenAiClient::new(config)?),
            Provider::Anthropic => Arc::new(AnthropicClient::new(config)?),
        })
    }

    /// The endpoint's name.
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// Its configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.shared.config
    }

    /// Its client (one attempt per call, no limiter, no accounting).
    pub fn client(&self) -> &Arc<dyn LmClient> {
        &self.shared.client
    }

    /// The ledger its calls are recorded in.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.shared.ledger
    }

    /// The record its sub-calls' answers are kept in (and answered from, when caching).
    pub fn sub_calls(&self) -> &Arc<SubCallRecord> {
        &self.shared.record
    }

    /// The key under which `request`, sent here as a sub-call, is recorded (computed on the
    /// request as sent: with known secrets redacted).
    pub fn record_key(&self, request: &ChatRequest) -> RecordKey {
        let mut request = request.clone();
        request.redact(&secret::redactor());
        RecordKey::for_call(&self.shared.config, &request)
    }

    /// Requests in flight right now.
    pub fn in_flight(&self) -> usize {
        self.shared.limiter.in_flight()
    }

    /// What its limiter has seen: the limit now and at its highest, attempts, 429s.
    pub fn limiter_stats(&self) -> LimiterStats {
        self.shared.limiter.stats()
    }

    /// Open up to `connections` keep-alive connections to the endpoint's server (at most
    /// `max_in_flight`, the most its calls use at once) without calling the model: nothing
    /// is recorded or counted against the budget. A measurement started next (`rlm bench`)
    /// then times calls, not connection set-up. Returns how many the server answered.
    pub async fn warm_up(&self, connections: usize) -> usize {
        let connections = connections.min(self.shared.config.max_in_flight);
        self.shared.client.warm_up(connections).await
    }

    /// One call: limiter, budget reservation, retries and accounting; one
    /// [`SubCallMetadata`] is recorded whatever the outcome.
    pub async fn call(
        &self,
        req: ChatRequest,
        opts: &CallOptions,
    ) -> Result<ChatResponse, BridgeError> {
        self.call_recorded(req, opts).await.result
    }

    /// Like [`call`](Self::call), also returning the call's own ledger record (other calls
    /// may share the ledger, even this endpoint, at the same time).
    pub async fn call_recorded(&self, req: ChatRequest, opts: &CallOptions) -> RecordedCall {
        self.shared.call(req, opts, None, None).await
    }

    /// Like [`call`](Self::call) but streamed, passing each piece of text to `on_delta`
    /// as it arrives (a retried attempt streams again from the start).
    pub async fn call_streaming(
        &self,
        req: ChatRequest,
        opts: &CallOptions,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<ChatResponse, BridgeError> {
        let opts = CallOptions {
            stream: true,
            ..opts.clone()
        };
        self.shared
            .call(req, &opts, Some(on_delta), None)
            .await
            .result
    }
}

/// A finished call: its result and the record it left in the ledger.
#[derive(Debug, Clone)]
pub struct RecordedCall {
    /// The answer, or why there is none (after retries).
    pub result: Result<ChatResponse, BridgeError>,
    /// The call's ledger record.
    pub record: SubCallMetadata,
    /// For a sub-call ([`CallOptions::sub_call`]): which answer of the run's
    /// [`SubCallRecord`] it got.
    pub answer: Option<AnswerRef>,
}

/// The HTTP attempts of a call so far.
#[derive(Debug, Default)]
struct Attempts {
    count: u32,
    first_sent: Option<Instant>,
}

/// The bookkeeping of one call in progress: its ledger index, its budget reservation and its
/// attempts. It is settled exactly once: by [`finish`](Self::finish) when the call returns,
/// or by `Drop` when the call's future is dropped first (a caller's `timeout`, an aborted
/// batch task), which records the call as cancelled. Either way a reservation whose call was
/// never sent is given back.
struct CallTicket<'a> {
    shared: &'a Shared,
    req: &'a ChatRequest,
    session: Option<u64>,
    index: u64,
    started_at_ms: u64,
    batch_size: Option<usize>,
    attempts: Attempts,
    /// What the call holds against the budget once admitted.
    reservation: Option<Reservation>,
    settled: bool,
}

impl<'a> CallTicket<'a> {
    /// Take the next call index.
    fn begin(
        shared: &'a Shared,
        req: &'a ChatRequest,
        session: Option<u64>,
        batch_size: Option<usize>,
    ) -> Self {
        Self {
            shared,
            req,
            session,
            index: shared.ledger.begin_call(),
            started_at_ms: unix_ms(),
            batch_size,
            attempts: Attempts::default(),
            reservation: None,
            settled: false,
        }
    }

    /// Record how the call ended; returns the record.
    fn finish(mut self, result: &Result<ChatResponse, BridgeError>) -> SubCallMetadata {
        self.settled = true;
        self.settle(result)
    }

    fn settle(&mut self, result: &Result<ChatResponse, BridgeError>) -> SubCallMetadata {
        let record = self.shared.record(
            Started {
                index: self.index,
                at_ms: self.started_at_ms,
                session: self.session,
                batch_size: self.batch_size,
            },
            self.req,
            result,
            &self.attempts,
        );
        // After the record, so the real usage is counted before the estimate is released.
        if let Some(reservation) = self.reservation.take() {
            self.shared
                .ledger
                .release(reservation, self.attempts.count > 0);
        }
        record
    }
}

impl Drop for CallTicket<'_> {
    fn drop(&mut self) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let error = if std::thread::panicking() {
            BridgeError::Internal(format!("call {} panicked", self.index))
        } else {
            BridgeError::Cancelled
        };
        self.settle(&Err(error));
    }
}

impl Shared {
    /// One call, with its ledger record; a sub-call goes through the run's record.
    pub(crate) async fn call(
        &self,
        req: ChatRequest,
        opts: &CallOptions,
        on_delta: Option<&mut (dyn FnMut(&str) + Send)>,
        batch_size: Option<usize>,
    ) -> RecordedCall {
        // No model receives a secret the process knows, whoever put it in the prompt.
        let mut req = req;
        req.redact(&secret::redactor());
        if !opts.sub_call {
            let (result, record) = self.send(req, opts, on_delta, batch_size).await;
            return RecordedCall {
                result,
                record,
                answer: None,
            };
        }
        let key = RecordKey::for_call(&self.config, &req);
        let asked = Instant::now();
        let mut waited = false;
        loop {
            match self.record.begin(key, waited) {
                Turn::Cached(answer, at) => {
                    let cache = if waited {
                        CacheUse::Joined
                    } else {
                        CacheUse::Hit
                    };
                    let started = self.started(opts.session, batch_size);
                    let result = Answer::clone(&answer).map(|mut response| {
                        response.attempts = 0;
                        response.latency = asked.elapsed();
                        response
                    });
                    let record = self.record_cached(started, &req, &result, cache, asked);
                    return RecordedCall {
                        result,
                        record,
                        answer: Some(at),
                    };
                }
                Turn::Wait(flight) => {
                    tokio::select! {
                        biased;
                        () = opts.cancel.cancelled() => {
                            let error = BridgeError::Cancelled;
                            let started = self.started(opts.session, batch_size);
                            let record = self.record(started, &req, &Err(error.clone()), &Attempts::default());
                            return RecordedCall { result: Err(error), record, answer: None };
                        }
                        () = flight.wait() => waited = true,
                    }
                }
                Turn::Send(lead) => {
                    let (result, record) = self.send(req, opts, on_delta, batch_size).await;
                    let at = self.record.finish(lead, result.clone());
                    return RecordedCall {
                        result,
                        record,
                        answer: Some(at),
                    };
                }
            }
        }
    }

    /// A new call index, now.
    fn started(&self, session: Option<u64>, batch_size: Option<usize>) -> Started {
        Started {
            index: self.ledger.begin_call(),
            at_ms: unix_ms(),
            session,
            batch_size,
        }
    }

    /// Sends one call (the request already redacted): budget, limiter, retries, record.
    async fn send(
        &self,
        req: ChatRequest,
        opts: &CallOptions,
        on_delta: Option<&mut (dyn FnMut(&str) + Send)>,
        batch_size: Option<usize>,
    ) -> (Result<ChatResponse, BridgeError>, SubCallMetadata) {
        let mut ticket = CallTicket::begin(self, &req, opts.session, batch_size);
        let result = self
            .run(&req, opts, on_delta, &mut ticket)
            .await
            .map(|mut answer| {
                answer.attempts = ticket.attempts.count;
                if let Some(t0) = ticket.attempts.first_sent {
                    answer.latency = t0.elapsed();
                }
                answer
            });
        let record = ticket.finish(&result);
        (result, record)
    }

    /// Record a call that never started (e.g. its batch was cancelled first).
    pub(crate) fn record_unsent(
        &self,
        req: &ChatRequest,
        error: &BridgeError,
        session: Option<u64>,
        batch_size: usize,
    ) -> SubCallMetadata {
        let started = self.started(session, Some(batch_size));
        self.record(started, req, &Err(error.clone()), &Attempts::default())
    }

    /// Push the record of a sub-call answered from the run's record: no request, no tokens,
    /// no cost; its latency is the wait.
    fn record_cached(
        &self,
        started: Started,
        req: &ChatRequest,
        result: &Result<ChatResponse, BridgeError>,
        cache: CacheUse,
        asked: Instant,
    ) -> SubCallMetadata {
        let mut record = self.metadata(started, req, result, &Attempts::default());
        record.prompt_tokens = 0;
        record.completion_tokens = 0;
        record.tokens_estimated = false;
        record.cost_usd = self.config.price.map(|_| 0.0);
        record.latency_ms = asked.elapsed().as_secs_f64() * 1000.0;
        record.cache = Some(cache);
        self.ledger.record(record.clone());
        record
    }

    /// The outcome of a batch slot whose call left no record of its own to hand back (its
    /// task panicked, a bug: its ticket recorded it in the ledger). The record returned is
    /// not in the ledger; its `call_index` is `u64::MAX`.
    pub(crate) fn unrecorded(&self, error: BridgeError, batch_size: usize) -> RecordedCall {
        let record = SubCallMetadata {
            call_index: u64::MAX,
            endpoint: self.config.name.clone(),
            model: self.config.model.clone(),
            prompt_chars: 0,
            response_chars: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            tokens_estimated: false,
            latency_ms: 0.0,
            attempts: 0,
            batched: true,
            batch_size,
            started_at_ms: unix_ms(),
            cost_usd: None,
            error: Some(error.to_string()),
            error_kind: Some(error.kind()),
            session: None,
            cache: None,
        };
        RecordedCall {
            result: Err(error),
            record,
            answer: None,
        }
    }

    async fn run(
        &self,
        req: &ChatRequest,
        opts: &CallOptions,
        mut on_delta: Option<&mut (dyn FnMut(&str) + Send)>,
        ticket: &mut CallTicket<'_>,
    ) -> Result<ChatResponse, BridgeError> {
        let (cancel, stream) = (&opts.cancel, opts.stream);
        if cancel.is_cancelled() {
            return Err(BridgeError::Cancelled);
        }
        if opts.sub_call {
            self.check_window(req).await?;
        }
        let claim = Claim {
            estimate: CallEstimate::new(
                req.prompt_chars(),
                self.max_tokens(req),
                self.config.price,
            ),
            counted: self.config.counts_toward_call_budget,
            iteration: opts.iteration,
        };
        ticket.reservation = Some(self.ledger.reserve(claim)?);
        let policy = &self.config.retry;
        let attempts = &mut ticket.attempts;
        // Attempts that used up one of `policy.max_attempts` (see `RetryPolicy`).
        let mut used = 0u32;
        let mut garbled_retried = false;
        loop {
            let permit = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(BridgeError::Cancelled),
                permit = self.limiter.acquire() => permit.map_err(|_| {
                    BridgeError::Config(format!("the limiter of endpoint `{}` was closed", self.config.name))
                })?,
            };
            attempts.count += 1;
            let sent = Instant::now();
            let first_sent = *attempts.first_sent.get_or_insert(sent);
            let outcome = tokio::select! {
                biased;
                () = cancel.cancelled() => Err(BridgeError::Cancelled),
                r = self.attempt(req, stream, reborrow(&mut on_delta)) => r,
            };
            let rate_limited = matches!(&outcome, Err(e) if e.kind() == FailureKind::RateLimited);
            permit.release(Outcome::of(&outcome, sent.elapsed()), rate_limited);
            match outcome {
                Err(e) if e.is_retryable() || (e.is_garbled() && !garbled_retried) => {
                    let delay = policy.delay_after(used + 1, e.retry_after());
                    let waited_out = rate_limited
                        && e.retry_after().is_some()
                        && first_sent.elapsed().saturating_add(delay) <= policy.rate_limit_patience;
                    if !waited_out {
                        used += 1;
                        if used >= policy.max_attempts {
                            return Err(e);
                        }
                    }
                    garbled_retried |= e.is_garbled();
                    tracing::info!(
                        endpoint = %self.config.name,
                        attempt = attempts.count,
                        used_up = used,
                        delay_ms = delay.as_millis() as u64,
                        error = %e,
                        "retrying model call"
                    );
                    tokio::select! {
                        biased;
                        () = cancel.cancelled() => return Err(BridgeError::Cancelled),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                other => return other,
            }
        }
    }

    /// The `max_tokens` the request goes out with, if any: the request's, else the endpoint's
    /// default, a number in `extra` winning over both as it does on the wire.
    /// Refuses `req` when its estimate cannot fit the model's context window, if that is
    /// known (see [`crate::window`]).
    async fn check_window(&self, req: &ChatRequest) -> Result<(), BridgeError> {
        let model = req.model.as_deref().unwrap_or(&self.config.model);
        let prompt_tokens = (req.prompt_chars() as u64).div_ceil(4);
        let max_tokens = self.max_tokens(req);
        let needed = prompt_tokens.saturating_add(max_tokens.unwrap_or(0));
        let known = match (self.config.context_window, known_window(model)) {
            (Some(window), _) => Some((window, WindowSource::Setting)),
            (None, Some(window)) => Some((window, WindowSource::KnownModel)),
            (None, None) if needed > LOOKUP_FLOOR && req.model.is_none() => self
                .listed_window
                .get_or_init(|| self.client.listed_context_window(model))
                .await
                .map(|window| (window, WindowSource::Server)),
            (None, None) => None,
        };
        match known {
            Some((window, source)) if needed > window => Err(BridgeError::ContextWindow {
                endpoint: self.config.name.clone(),
                model: model.to_owned(),
                prompt_tokens,
                max_tokens,
                window,
                known_from: source,
            }),
            _ => Ok(()),
        }
    }

    fn max_tokens(&self, req: &ChatRequest) -> Option<u64> {
        let extra = req
            .params
            .extra
            .get("max_tokens")
            .or_else(|| self.config.params.extra.get("max_tokens"));
        match extra {
            Some(value) => value.as_u64(),
            None => req
                .params
                .max_tokens
                .or(self.config.params.max_tokens)
                .map(u64::from),
        }
    }

    async fn attempt(
        &self,
        req: &ChatRequest,
        stream: bool,
        on_delta: Option<&mut (dyn FnMut(&str) + Send)>,
    ) -> Result<ChatResponse, BridgeError> {
        match on_delta {
            Some(f) => self.client.chat_stream(req, f).await,
            None if stream => self.client.chat_stream(req, &mut |_: &str| {}).await,
            None => self.client.chat(req).await,
        }
    }

    /// Push the record of a call to the ledger; returns a copy.
    fn record(
        &self,
        started: Started,
        req: &ChatRequest,
        result: &Result<ChatResponse, BridgeError>,
        attempts: &Attempts,
    ) -> SubCallMetadata {
        let record = self.metadata(started, req, result, attempts);
        self.ledger.record(record.clone());
        record
    }

    /// The record of a call.
    fn metadata(
        &self,
        started: Started,
        req: &ChatRequest,
        result: &Result<ChatResponse, BridgeError>,
        attempts: &Attempts,
    ) -> SubCallMetadata {
        let Started {
            index: call_index,
            at_ms: started_at_ms,
            session,
            batch_size,
        } = started;
        let (response_chars, usage, error, error_kind) = match result {
            Ok(answer) => (answer.response_chars(), answer.usage, None, None),
            Err(e) => (0, Default::default(), Some(e.to_string()), Some(e.kind())),
        };
        let latency_ms = attempts
            .first_sent
            .map_or(0.0, |t0| t0.elapsed().as_secs_f64() * 1000.0);
        let cost_usd = self
            .config
            .price
            .map(|p| p.cost(usage.prompt_tokens, usage.completion_tokens));
        SubCallMetadata {
            call_index,
            endpoint: self.config.name.clone(),
            model: req
                .model
                .clone()
                .unwrap_or_else(|| self.config.model.clone()),
            prompt_chars: req.prompt_chars(),
            response_chars,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            tokens_estimated: usage.estimated,
            latency_ms,
            attempts: attempts.count,
            batched: batch_size.is_some(),
            batch_size: batch_size.unwrap_or(1),
            started_at_ms,
            cost_usd,
            error,
            error_kind,
            session,
            cache: None,
        }
    }
}

/// Where and when a call started, for its record.
#[derive(Debug, Clone, Copy)]
struct Started {
    index: u64,
    at_ms: u64,
    session: Option<u64>,
    batch_size: Option<usize>,
}

/// Lend the delta callback to one attempt (the explicit types let the trait object's
/// lifetime shrink to the loan, which `Option::as_deref_mut` cannot do).
fn reborrow<'s>(
    f: &'s mut Option<&mut (dyn FnMut(&str) + Send)>,
) -> Option<&'s mut (dyn FnMut(&str) + Send + 's)> {
    match f {
        Some(f) => Some(&mut **f),
        None => None,
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The registry of named endpoints sharing one ledger.
pub struct Endpoints {
    by_name: HashMap<String, Arc<Endpoint>>,
    order: Vec<String>,
    /// Set by [`Endpoints::none`]: how to configure a model, for the error of every lookup.
    no_model: Option<String>,
    ledger: Arc<Ledger>,
    record: Arc<SubCallRecord>,
}

impl fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoints")
            .field("names", &self.order)
            .field("ledger", &self.ledger)
            .finish()
    }
}

impl Endpoints {
    /// Build every endpoint of `configs`; names must be unique.
    pub fn new(configs: Vec<EndpointConfig>, ledger: Arc<Ledger>) -> Result<Self, BridgeError> {
        let mut by_name = HashMap::with_capacity(configs.len());
        let mut order = Vec::with_capacity(configs.len());
        let record = Arc::new(SubCallRecord::default());
        for config in configs {
            let name = config.name.clone();
            if by_name.contains_key(&name) {
                return Err(BridgeError::Config(format!(
                    "two endpoints are named `{name}`; endpoint names must be unique"
                )));
            }
            config.validate()?;
            let client = Endpoint::client_for(&config)?;
            let endpoint =
                Endpoint::with_record(config, client, Arc::clone(&ledger), Arc::clone(&record))?;
            by_name.insert(name.clone(), Arc::new(endpoint));
            order.push(name);
        }
        Ok(Self {
            by_name,
            order,
            ledger,
            record,
            no_model: None,
        })
    }

    /// No endpoint, for a run that was expected to call no model: every lookup fails with
    /// [`BridgeError::NoModel`], which ends with `hint` (how the front end names a model).
    pub fn none(ledger: Arc<Ledger>, hint: impl Into<String>) -> Self {
        Self {
            by_name: HashMap::new(),
            order: Vec::new(),
            ledger,
            record: Arc::new(SubCallRecord::default()),
            no_model: Some(hint.into()),
        }
    }

    /// The endpoint called `name`.
    pub fn get(&self, name: &str) -> Result<Arc<Endpoint>, BridgeError> {
        self.by_name
            .get(name)
            .cloned()
            .ok_or_else(|| match &self.no_model {
                Some(hint) => BridgeError::NoModel {
                    name: name.to_owned(),
                    hint: hint.clone(),
                },
                None => BridgeError::UnknownEndpoint {
                    name: name.to_owned(),
                    known: self.order.clone(),
                },
            })
    }

    /// The endpoint names, in configuration order.
    pub fn names(&self) -> Vec<String> {
        self.order.clone()
    }

    /// The ledger all endpoints record into.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// The record of sub-call answers all endpoints share (the sub-call cache).
    pub fn sub_calls(&self) -> &Arc<SubCallRecord> {
        &self.record
    }
}
