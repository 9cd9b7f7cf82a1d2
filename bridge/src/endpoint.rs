//! Named endpoints: configuration, the per-endpoint limiter, retries and accounting.
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
//! Every wait on that path (permit, attempt, backoff) races the caller's cancellation token.
//! The index, the reservation and the attempts live in a `CallTicket` whose `Drop` records
//! the call as cancelled if its future is dropped before it ends (a caller's `timeout`, an
//! aborted batch task), so every index gets exactly one record and a call that was never
//! sent gives its reservation back.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::chat::{ChatRequest, ChatResponse, SamplingParams};
use crate::client::{AnthropicClient, LmClient, OpenAiClient};
use crate::error::BridgeError;
use crate::ledger::{CallEstimate, Ledger, Reservation, SubCallMetadata};
pub use crate::retry::RetryPolicy;
use crate::secret::{self, Secret};

/// The wire protocol of an endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// OpenAI chat completions (also vLLM, SGLang, llama.cpp, Ollama, OpenRouter).
    #[default]
    #[serde(alias = "open_ai", alias = "openai-compatible")]
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

impl FromStr for Provider {
    type Err = BridgeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "openai" | "open_ai" | "openai-compatible" => Ok(Self::OpenAi),
            "anthropic" => Ok(Self::Anthropic),
            other => Err(BridgeError::Config(format!(
                "unknown provider `{other}`; use `openai` or `anthropic`"
            ))),
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        })
    }
}

/// Prices in USD per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Price {
    /// USD per million input tokens.
    pub input_per_mtok: f64,
    /// USD per million output tokens.
    pub output_per_mtok: f64,
}

impl Price {
    /// The cost of `prompt_tokens` in and `completion_tokens` out.
    pub fn cost(&self, prompt_tokens: u64, completion_tokens: u64) -> f64 {
        (prompt_tokens as f64 * self.input_per_mtok
            + completion_tokens as f64 * self.output_per_mtok)
            / 1e6
    }
}

/// Everything needed to reach one model.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EndpointConfig {
    /// The name callers use (`root`, `sub`, …).
    pub name: String,
    /// Wire protocol.
    pub provider: Provider,
    /// OpenAI: includes `/v1` (e.g. `http://127.0.0.1:8000/v1`); Anthropic: without `/v1`.
    pub base_url: String,
    /// Model name sent when a request names none.
    pub model: String,
    /// The API key itself (prefer `api_key_env`).
    #[serde(skip_serializing)]
    pub api_key: Option<Secret>,
    /// The environment variable holding the API key, read when the client is built (through
    /// [`env_secret`](crate::secret::env_secret), so it may be gone from the environment by then).
    pub api_key_env: Option<String>,
    /// Extra HTTP headers sent with every request.
    pub headers: Vec<(String, String)>,
    /// Limit of one HTTP attempt (for streams: of the wait for headers and for each event).
    #[serde(with = "serde_secs")]
    pub timeout: Duration,
    /// Requests in flight at once on this endpoint, across all callers.
    pub max_in_flight: usize,
    /// Retry behaviour.
    pub retry: RetryPolicy,
    /// Price table giving each call's cost.
    pub price: Option<Price>,
    /// Default sampling parameters, overridden field by field by each request.
    pub params: SamplingParams,
    /// Whether calls here count against [`Budget::max_calls`](crate::Budget). Sub-model
    /// endpoints do; a root model's calls are iterations, limited elsewhere, so its endpoint
    /// sets this to `false` and still counts against the token and USD limits.
    pub counts_toward_call_budget: bool,
}

impl fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key itself.
        f.debug_struct("EndpointConfig")
            .field("name", &self.name)
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key)
            .field("api_key_env", &self.api_key_env)
            .field(
                "headers",
                &self.headers.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("timeout", &self.timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("retry", &self.retry)
            .field("price", &self.price)
            .field("params", &self.params)
            .field("counts_toward_call_budget", &self.counts_toward_call_budget)
            .finish()
    }
}

/// The default per-attempt timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The default `max_in_flight`.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 128;

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            provider: Provider::OpenAi,
            base_url: String::new(),
            model: String::new(),
            api_key: None,
            api_key_env: None,
            headers: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            retry: RetryPolicy::default(),
            price: None,
            params: SamplingParams::default(),
            counts_toward_call_budget: true,
        }
    }
}

impl EndpointConfig {
    /// An OpenAI-compatible endpoint with default settings.
    pub fn openai(
        name: impl Into<String>,
        base_url: impl Into<String>,
        model: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            provider: Provider::OpenAi,
            base_url: base_url.into(),
            model: model.into(),
            ..Self::default()
        }
    }

    /// An Anthropic endpoint with default settings.
    pub fn anthropic(
        name: impl Into<String>,
        base_url: impl Into<String>,
        model: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            provider: Provider::Anthropic,
            base_url: base_url.into(),
            model: model.into(),
            ..Self::default()
        }
    }

    fn validate(&self) -> Result<(), BridgeError> {
        if self.name.trim().is_empty() {
            return Err(BridgeError::Config(
                "an endpoint has an empty `name`; give each endpoint a name such as `sub`".into(),
            ));
        }
        if self.base_url.trim().is_empty() {
            return Err(BridgeError::Config(format!(
                "endpoint `{}` has no `base_url`; e.g. `http://127.0.0.1:8000/v1`",
                self.name
            )));
        }
        if self.max_in_flight == 0 {
            return Err(BridgeError::Config(format!(
                "`max_in_flight` of endpoint `{}` must be at least 1",
                self.name
            )));
        }
        if self.retry.max_attempts == 0 {
            return Err(BridgeError::Config(format!(
                "`retry.max_attempts` of endpoint `{}` must be at least 1 (1 = no retries)",
                self.name
            )));
        }
        Ok(())
    }
}

/// Per-call options.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Cancelling it aborts the call wherever it is (queued, in flight or backing off).
    pub cancel: CancellationToken,
    /// Use SSE streaming on the wire.
    pub stream: bool,
}

/// One named model: configuration, client, limiter and ledger.
pub struct Endpoint {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    config: EndpointConfig,
    client: Arc<dyn LmClient>,
    limiter: Semaphore,
    ledger: Arc<Ledger>,
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
        let client: Arc<dyn LmClient> = match config.provider {
            Provider::OpenAi => Arc::new(OpenAiClient::new(&config)?),
            Provider::Anthropic => Arc::new(AnthropicClient::new(&config)?),
        };
        Self::with_client(config, client, ledger)
    }

    /// An endpoint over a client of your own.
    pub fn with_client(
        config: EndpointConfig,
        client: Arc<dyn LmClient>,
        ledger: Arc<Ledger>,
    ) -> Result<Self, BridgeError> {
        config.validate()?;
        let permits = config.max_in_flight.min(Semaphore::MAX_PERMITS);
        Ok(Self {
            shared: Arc::new(Shared {
                limiter: Semaphore::new(permits),
                config,
                client,
                ledger,
            }),
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

    /// Requests in flight right now.
    pub fn in_flight(&self) -> usize {
        let permits = self.shared.config.max_in_flight.min(Semaphore::MAX_PERMITS);
        permits.saturating_sub(self.shared.limiter.available_permits())
    }

    /// One call: limiter, budget reservation, retries and accounting; one
    /// [`SubCallMetadata`] is recorded whatever the outcome.
    pub async fn call(
        &self,
        req: ChatRequest,
        opts: &CallOptions,
    ) -> Result<ChatResponse, BridgeError> {
        self.shared
            .call(req, &opts.cancel, opts.stream, None, None)
            .await
    }

    /// Like [`call`](Self::call) but streamed, passing each piece of text to `on_delta`
    /// as it arrives (a retried attempt streams again from the start).
    pub async fn call_streaming(
        &self,
        req: ChatRequest,
        opts: &CallOptions,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<ChatResponse, BridgeError> {
        self.shared
            .call(req, &opts.cancel, true, Some(on_delta), None)
            .await
    }
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
    fn begin(shared: &'a Shared, req: &'a ChatRequest, batch_size: Option<usize>) -> Self {
        Self {
            shared,
            req,
            index: shared.ledger.begin_call(),
            started_at_ms: unix_ms(),
            batch_size,
            attempts: Attempts::default(),
            reservation: None,
            settled: false,
        }
    }

    /// Record how the call ended.
    fn finish(mut self, result: &Result<ChatResponse, BridgeError>) {
        self.settle(result);
    }

    fn settle(&mut self, result: &Result<ChatResponse, BridgeError>) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        self.shared.record(
            self.index,
            self.started_at_ms,
            self.req,
            result,
            &self.attempts,
            self.batch_size,
        );
        // After the record, so the real usage is counted before the estimate is released.
        if let Some(reservation) = self.reservation.take() {
            self.shared
                .ledger
                .release(reservation, self.attempts.count > 0);
        }
    }
}

impl Drop for CallTicket<'_> {
    fn drop(&mut self) {
        let error = if std::thread::panicking() {
            BridgeError::Internal(format!("call {} panicked", self.index))
        } else {
            BridgeError::Cancelled
        };
        self.settle(&Err(error));
    }
}

impl Shared {
    pub(crate) async fn call(
        &self,
        req: ChatRequest,
        cancel: &CancellationToken,
        stream: bool,
        on_delta: Option<&mut (dyn FnMut(&str) + Send)>,
        batch_size: Option<usize>,
    ) -> Result<ChatResponse, BridgeError> {
        // No model receives a secret the process knows, whoever put it in the prompt.
        let mut req = req;
        req.redact(&secret::redactor());
        let mut ticket = CallTicket::begin(self, &req, batch_size);
        let result = self
            .run(&req, cancel, stream, on_delta, &mut ticket)
            .await
            .map(|mut answer| {
                answer.attempts = ticket.attempts.count;
                if let Some(t0) = ticket.attempts.first_sent {
                    answer.latency = t0.elapsed();
                }
                answer
            });
        ticket.finish(&result);
        result
    }

    /// Record a call that never started (e.g. its batch was cancelled first).
    pub(crate) fn record_unsent(&self, req: &ChatRequest, error: &BridgeError, batch_size: usize) {
        let index = self.ledger.begin_call();
        self.record(
            index,
            unix_ms(),
            req,
            &Err(error.clone()),
            &Attempts::default(),
            Some(batch_size),
        );
    }

    async fn run(
        &self,
        req: &ChatRequest,
        cancel: &CancellationToken,
        stream: bool,
        mut on_delta: Option<&mut (dyn FnMut(&str) + Send)>,
        ticket: &mut CallTicket<'_>,
    ) -> Result<ChatResponse, BridgeError> {
        if cancel.is_cancelled() {
            return Err(BridgeError::Cancelled);
        }
        let estimate =
            CallEstimate::new(req.prompt_chars(), self.max_tokens(req), self.config.price);
        ticket.reservation = Some(
            self.ledger
                .reserve(self.config.counts_toward_call_budget, estimate)?,
        );
        let policy = &self.config.retry;
        let attempts = &mut ticket.attempts;
        loop {
            let permit = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(BridgeError::Cancelled),
                permit = self.limiter.acquire() => permit.map_err(|_| {
                    BridgeError::Config(format!("the limiter of endpoint `{}` was closed", self.config.name))
                })?,
            };
            attempts.count += 1;
            attempts.first_sent.get_or_insert_with(Instant::now);
            let outcome = tokio::select! {
                biased;
                () = cancel.cancelled() => Err(BridgeError::Cancelled),
                r = self.attempt(req, stream, reborrow(&mut on_delta)) => r,
            };
            drop(permit);
            match outcome {
                Err(e) if e.is_retryable() && attempts.count < policy.max_attempts => {
                    let delay = policy.delay_after(attempts.count, e.retry_after());
                    tracing::info!(
                        endpoint = %self.config.name,
                        attempt = attempts.count,
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

    fn record(
        &self,
        call_index: u64,
        started_at_ms: u64,
        req: &ChatRequest,
        result: &Result<ChatResponse, BridgeError>,
        attempts: &Attempts,
        batch_size: Option<usize>,
    ) {
        let (response_chars, usage, error, error_kind) = match result {
            Ok(answer) => (answer.response_chars(), answer.usage, None, None),
            Err(e) => (
                0,
                Default::default(),
                Some(e.to_string()),
                Some(e.kind().to_owned()),
            ),
        };
        let latency_ms = attempts
            .first_sent
            .map_or(0.0, |t0| t0.elapsed().as_secs_f64() * 1000.0);
        let cost_usd = self
            .config
            .price
            .map(|p| p.cost(usage.prompt_tokens, usage.completion_tokens));
        self.ledger.record(SubCallMetadata {
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
        });
    }
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
    ledger: Arc<Ledger>,
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
        for config in configs {
            let name = config.name.clone();
            if by_name.contains_key(&name) {
                return Err(BridgeError::Config(format!(
                    "two endpoints are named `{name}`; endpoint names must be unique"
                )));
            }
            let endpoint = Endpoint::new(config, Arc::clone(&ledger))?;
            by_name.insert(name.clone(), Arc::new(endpoint));
            order.push(name);
        }
        Ok(Self {
            by_name,
            order,
            ledger,
        })
    }

    /// The endpoint called `name`.
    pub fn get(&self, name: &str) -> Result<Arc<Endpoint>, BridgeError> {
        self.by_name
            .get(name)
            .cloned()
            .ok_or_else(|| BridgeError::UnknownEndpoint {
                name: name.to_owned(),
                known: self.order.clone(),
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
}

/// (De)serialize a `Duration` as (fractional) seconds, as config files write it.
pub(crate) mod serde_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}
