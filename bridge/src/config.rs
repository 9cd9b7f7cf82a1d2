//! Configuration types: how to reach a model ([`EndpointConfig`], [`Provider`]), what its
//! tokens cost ([`Price`]), how patiently it is retried ([`RetryPolicy`]) and how many
//! requests it takes at once ([`Concurrency`], [`AdaptivePolicy`]).
//!
//! They sit at the bottom of the crate: plain data with serde forms and validation, imported
//! by the clients, the endpoints and the ledger, importing none of them.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::chat::SamplingParams;
use crate::error::BridgeError;
use crate::secret::Secret;

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

impl Provider {
    /// The provider's own API, for an endpoint with no base URL of its own.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Self::OpenAi => "https://api.openai.com/v1",
            Self::Anthropic => "https://api.anthropic.com",
        }
    }

    /// The environment variable that conventionally holds the provider's API key.
    pub fn default_api_key_env(self) -> &'static str {
        match self {
            Self::OpenAi => "OPENAI_API_KEY",
            Self::Anthropic => "ANTHROPIC_API_KEY",
        }
    }
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
    /// Requests in flight at once on this endpoint, across all callers; with `adaptive`, the
    /// ceiling of the adaptive limit.
    pub max_in_flight: usize,
    /// Adapt the limit to the server below `max_in_flight` (see [`crate::limiter`]);
    /// `None` keeps it fixed at `max_in_flight`.
    pub adaptive: Option<AdaptivePolicy>,
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
    /// The model's context window in tokens, when known better than the bridge's table of
    /// well-known models and the server's listing ([`crate::window`]); sub-calls that cannot
    /// fit it are refused before sending.
    pub context_window: Option<u64>,
    /// How error messages name this endpoint's settings (default: its own field names).
    pub settings: SettingNames,
}

/// The names error messages use for an endpoint's settings, so a front end can name what its
/// users type (`--base-url`) instead of the configuration's fields. Unset names fall back to
/// "`base_url` of endpoint `NAME`" and the like.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SettingNames {
    /// What sets the base URL, e.g. `` `--base-url` ``.
    pub base_url: Option<String>,
    /// What sets the per-attempt timeout, e.g. `` `--sub-timeout` ``.
    pub timeout: Option<String>,
    /// What names the API key variable, e.g. `` `--api-key-env` ``.
    pub api_key_env: Option<String>,
}

impl SettingNames {
    pub(crate) fn base_url(&self, endpoint: &str) -> String {
        self.base_url
            .clone()
            .unwrap_or_else(|| format!("`base_url` of endpoint `{endpoint}`"))
    }

    pub(crate) fn timeout(&self, endpoint: &str) -> String {
        self.timeout
            .clone()
            .unwrap_or_else(|| format!("`timeout` of endpoint `{endpoint}`"))
    }

    pub(crate) fn api_key_env(&self, endpoint: &str) -> String {
        self.api_key_env
            .clone()
            .unwrap_or_else(|| format!("`api_key_env` of endpoint `{endpoint}`"))
    }
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
            .field("adaptive", &self.adaptive)
            .field("retry", &self.retry)
            .field("price", &self.price)
            .field("params", &self.params)
            .field("counts_toward_call_budget", &self.counts_toward_call_budget)
            .field("settings", &self.settings)
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
            adaptive: None,
            retry: RetryPolicy::default(),
            price: None,
            params: SamplingParams::default(),
            counts_toward_call_budget: true,
            context_window: None,
            settings: SettingNames::default(),
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

    pub(crate) fn validate(&self) -> Result<(), BridgeError> {
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

/// Settings of an adaptive concurrency limit (see [`crate::limiter`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdaptivePolicy {
    /// The limit before any sample.
    pub initial: usize,
    /// An overload cuts the limit to this share of the requests then in flight.
    pub backoff: f64,
    /// A window of answers whose mean round trip exceeds this multiple of the baseline is an
    /// overload.
    pub latency_tolerance: f64,
}

impl Default for AdaptivePolicy {
    fn default() -> Self {
        Self {
            initial: 16,
            backoff: 0.9,
            latency_tolerance: 2.0,
        }
    }
}

/// The ceiling of an adaptive limit ([`Concurrency::Auto`]).
pub const AUTO_CEILING: usize = 256;

/// How many sub-model requests run at once: a fixed width, or `auto`, an adaptive limit
/// (AIMD, see [`crate::limiter`]) below [`AUTO_CEILING`]. Written as a number or `auto` on
/// command lines and in configuration files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concurrency {
    /// At most this many at once (at least 1).
    Fixed(usize),
    /// As many as the server takes: the limit grows while latency stays flat and backs off on
    /// 429s, timeouts and rising latency.
    Auto,
}

impl Concurrency {
    /// Set `config` up for this width: a fixed width raises its `max_in_flight` to at least
    /// the width; `auto` makes its limit adaptive with a ceiling of at least [`AUTO_CEILING`].
    pub fn apply(self, config: &mut EndpointConfig) {
        match self {
            Self::Fixed(width) => config.max_in_flight = config.max_in_flight.max(width),
            Self::Auto => {
                config.max_in_flight = config.max_in_flight.max(AUTO_CEILING);
                config.adaptive = Some(AdaptivePolicy::default());
            }
        }
    }

    /// The width of one batch: fixed, or for `auto` the ceiling (the adaptive limiter decides
    /// below it; more tasks than the ceiling would only wait).
    pub fn batch_width(self) -> Option<usize> {
        match self {
            Self::Fixed(width) => Some(width),
            Self::Auto => Some(AUTO_CEILING),
        }
    }
}

/// A concurrency that is neither a whole number ≥ 1 nor `auto`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be a whole number ≥ 1 or `auto`, got `{0}`")]
pub struct InvalidConcurrency(pub String);

impl FromStr for Concurrency {
    type Err = InvalidConcurrency;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Self::Auto);
        }
        match s.parse::<usize>() {
            Ok(width) if width >= 1 => Ok(Self::Fixed(width)),
            _ => Err(InvalidConcurrency(s.to_owned())),
        }
    }
}

impl fmt::Display for Concurrency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(width) => write!(f, "{width}"),
            Self::Auto => f.write_str("auto"),
        }
    }
}

impl Serialize for Concurrency {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Fixed(width) => s.serialize_u64(*width as u64),
            Self::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for Concurrency {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Number(i64),
            Text(String),
        }
        let text = match Written::deserialize(d)? {
            Written::Number(n) => n.to_string(),
            Written::Text(text) => text,
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// How often and how patiently a call is retried.
///
/// A failure worth another attempt (a connection error, a timeout, 408, 429, 5xx, a garbled
/// reply once) uses up one of `max_attempts`, except a 429 that says when to come back
/// (`Retry-After` or `retry-after-ms`): a busy server, not a failing one. That is waited out
/// and sent again without using up an attempt while the retry would still leave within
/// `rate_limit_patience` of the call's first attempt; past it, such a 429 is an attempt like
/// any other failure. A caller's cancellation (a run's deadline, a block's time limit) ends
/// the wait at once.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RetryPolicy {
    /// Total attempts, the first included (1 = no retries), 429s waited out within
    /// `rate_limit_patience` not counted.
    pub max_attempts: u32,
    /// Backoff before the first retry; doubles with each retry.
    #[serde(with = "serde_secs")]
    pub base_delay: Duration,
    /// No wait is longer than this, `Retry-After` included.
    #[serde(with = "serde_secs")]
    pub max_delay: Duration,
    /// How long after its first attempt a call still waits out a 429 with `Retry-After`
    /// without using up an attempt (zero: every 429 uses one).
    #[serde(with = "serde_secs")]
    pub rate_limit_patience: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            rate_limit_patience: Duration::from_secs(60),
        }
    }
}

/// (De)serialize a `Duration` as (fractional) seconds, as config files write it
/// (`#[serde(with = "bridge::config::serde_secs")]`; `serde_secs::option` for an
/// `Option<Duration>`).
pub mod serde_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `d` as seconds.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    /// Reads seconds (a negative or non-finite number is an error).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }

    /// `Option<Duration>` as seconds or `null`.
    pub mod option {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer, Serializer};

        /// Writes `value` as seconds, or `null`.
        pub fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            match value {
                Some(d) => s.serialize_some(&d.as_secs_f64()),
                None => s.serialize_none(),
            }
        }

        /// Reads seconds or `null`.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            let secs = Option::<f64>::deserialize(d)?;
            secs.map(|s| Duration::try_from_secs_f64(s).map_err(serde::de::Error::custom))
                .transpose()
        }
    }
}
