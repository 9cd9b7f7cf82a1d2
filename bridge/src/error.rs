//! The one error type of the bridge, with messages that say what to do.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Everything that can go wrong talking to a language model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BridgeError {
    /// No TCP/TLS connection could be made (refused, unreachable, DNS).
    #[error(
        "Could not connect to `{url}` ({detail}); check that the model server is running and that \
         {base_url_setting} is right"
    )]
    Connect {
        /// Endpoint name.
        endpoint: String,
        /// What sets the endpoint's base URL ([`SettingNames`](crate::SettingNames)).
        base_url_setting: String,
        /// The URL that was requested.
        url: String,
        /// The underlying cause.
        detail: String,
    },
    /// The connection broke while sending or receiving (reset, truncated body).
    #[error("The connection to `{url}` broke mid-request ({detail}); the call may be retried")]
    Network {
        /// The URL that was requested.
        url: String,
        /// The underlying cause.
        detail: String,
    },
    /// One HTTP attempt took longer than the endpoint's `timeout`.
    #[error(
        "Request to `{url}` timed out after {}s; raise {timeout_setting} or check the server",
        .timeout.as_secs_f64()
    )]
    Timeout {
        /// Endpoint name.
        endpoint: String,
        /// What sets the endpoint's timeout ([`SettingNames`](crate::SettingNames)).
        timeout_setting: String,
        /// The URL that was requested.
        url: String,
        /// The per-attempt timeout that expired.
        timeout: Duration,
    },
    /// The server answered with an error status (other than 401/403).
    #[error("{}", http_message(*.status, .url, .base_url_setting, .message))]
    Http {
        /// Endpoint name.
        endpoint: String,
        /// What sets the endpoint's base URL ([`SettingNames`](crate::SettingNames)).
        base_url_setting: String,
        /// The URL that was requested.
        url: String,
        /// HTTP status code.
        status: u16,
        /// The server's error message.
        message: String,
        /// The server's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// The server rejected the credentials (401/403).
    #[error("The server at `{url}` rejected the API key (HTTP {status}: {message}); {hint}")]
    Unauthorized {
        /// Endpoint name.
        endpoint: String,
        /// The URL that was requested.
        url: String,
        /// 401 or 403.
        status: u16,
        /// The server's error message.
        message: String,
        /// Where the key comes from and how to fix it.
        hint: String,
    },
    /// The server answered 2xx but the body was not what the protocol promises (a garbled
    /// reply). Retried once: a garbled reply is often a one-off of an overloaded server.
    #[error(
        "The server at `{url}` answered badly ({detail}); a garbled reply is retried once. If it \
         keeps happening, check that endpoint `{endpoint}` speaks the configured `provider` protocol"
    )]
    Decode {
        /// Endpoint name.
        endpoint: String,
        /// The URL that was requested.
        url: String,
        /// What was wrong.
        detail: String,
    },
    /// A budget limit was reached; the call was not sent.
    #[error(transparent)]
    Budget(#[from] BudgetExceeded),
    /// The call was cancelled (by its token) before it finished.
    #[error("The call was cancelled before it finished")]
    Cancelled,
    /// The prompt plus the reply's `max_tokens` cannot fit the model's context window; the
    /// call was not sent.
    #[error(
        "Prompt of ~{} tokens{} does not fit `{model}`'s {} window ({}); split it into pieces \
         of under ~{} characters",
        crate::window::short_tokens(*.prompt_tokens),
        .max_tokens.map(|m| format!(" plus {} for the reply", crate::window::short_tokens(m))).unwrap_or_default(),
        crate::window::short_tokens(*.window),
        .known_from.describe(),
        crate::window::short_tokens(.window.saturating_sub(.max_tokens.unwrap_or(0)).saturating_mul(4) * 9 / 10)
    )]
    ContextWindow {
        /// Endpoint name.
        endpoint: String,
        /// The model.
        model: String,
        /// The prompt's estimated tokens.
        prompt_tokens: u64,
        /// The reply's `max_tokens`, if set.
        max_tokens: Option<u64>,
        /// The model's window, in tokens.
        window: u64,
        /// Where the window came from.
        known_from: crate::window::WindowSource,
    },
    /// No endpoint has this name.
    #[error("Unknown endpoint `{name}`; known endpoints: {}", list_names(.known))]
    UnknownEndpoint {
        /// The requested name.
        name: String,
        /// The configured names.
        known: Vec<String>,
    },
    /// No model is configured at all (a run that was expected to call none), so no endpoint
    /// has this name; `hint` says how the front end names a model.
    #[error(
        "No model is configured for this run, so there is no endpoint `{name}` to call; {hint}"
    )]
    NoModel {
        /// The requested name.
        name: String,
        /// How to configure a model, in the front end's words.
        hint: String,
    },
    /// The endpoint configuration is unusable.
    #[error("Invalid endpoint configuration: {0}")]
    Config(String),
    /// The request cannot be expressed in the provider's format.
    #[error("Invalid request: {0}")]
    InvalidRequest(String),
    /// A bug in the bridge (e.g. a call task panicked); the message says where.
    #[error("Internal error in the bridge: {0}; please report this bug")]
    Internal(String),
}

impl BridgeError {
    /// Whether another attempt may succeed: 408/429/5xx, timeouts and connection errors.
    /// Whether the reply arrived but was garbled ([`BridgeError::Decode`]): retried once,
    /// apart from [`is_retryable`](Self::is_retryable) failures.
    pub fn is_garbled(&self) -> bool {
        matches!(self, Self::Decode { .. })
    }

    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Network { .. } | Self::Timeout { .. } => true,
            Self::Http { status, .. } => matches!(status, 408 | 429 | 500..=599),
            _ => false,
        }
    }

    /// What kind of failure this is, for metadata, logs and Python's `LlmQueryError.kind`.
    pub fn kind(&self) -> FailureKind {
        match self {
            Self::Connect { .. } => FailureKind::Connect,
            Self::Network { .. } => FailureKind::Network,
            Self::Timeout { .. } => FailureKind::Timeout,
            Self::Http { status, .. } => match status {
                400 => FailureKind::BadRequest,
                404 => FailureKind::NotFound,
                408 => FailureKind::RequestTimeout,
                413 => FailureKind::PayloadTooLarge,
                422 => FailureKind::Unprocessable,
                429 => FailureKind::RateLimited,
                500..=599 => FailureKind::ServerError,
                _ => FailureKind::OtherStatus,
            },
            Self::Unauthorized { .. } => FailureKind::Unauthorized,
            Self::Decode { .. } => FailureKind::Decode,
            Self::Budget(exceeded) => FailureKind::Budget(exceeded.limit),
            Self::Cancelled => FailureKind::Cancelled,
            Self::ContextWindow { .. } => FailureKind::ContextWindow,
            Self::UnknownEndpoint { .. } | Self::NoModel { .. } => FailureKind::UnknownEndpoint,
            Self::Config(_) => FailureKind::Config,
            Self::InvalidRequest(_) => FailureKind::InvalidRequest,
            Self::Internal(_) => FailureKind::Internal,
        }
    }

    /// The delay the server asked for with `Retry-After`, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Http { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

fn http_message(status: u16, url: &str, base_url_setting: &str, message: &str) -> String {
    let hint = match status {
        404 => format!(
            "; check {base_url_setting} (OpenAI-compatible servers usually need it to end in \
             `/v1`, Anthropic's must not) and the model name"
        ),
        408 | 429 | 500..=599 => {
            "; the server is overloaded or failing, retries were exhausted".into()
        }
        _ => String::new(),
    };
    format!("The server at `{url}` answered HTTP {status}: {message}{hint}")
}

fn list_names(names: &[String]) -> String {
    if names.is_empty() {
        return "none; add one to the configuration".into();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kind of a failed call: a closed set with stable snake_case names (its serialised form),
/// so code matches on the kind instead of reading an error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// `connect`: no connection could be made.
    Connect,
    /// `network`: the connection broke mid-request.
    Network,
    /// `timeout`: an attempt took longer than the endpoint's `timeout`.
    Timeout,
    /// `http_400`.
    BadRequest,
    /// `http_404`.
    NotFound,
    /// `http_408`.
    RequestTimeout,
    /// `http_413`.
    PayloadTooLarge,
    /// `http_422`.
    Unprocessable,
    /// `http_429`.
    RateLimited,
    /// `http_5xx`: any server error status.
    ServerError,
    /// `http`: another error status.
    OtherStatus,
    /// `unauthorized`: HTTP 401 or 403.
    Unauthorized,
    /// `decode`: the answer was not what the protocol promises.
    Decode,
    /// `budget_max_calls`, `budget_max_tokens`, `budget_max_usd` or `budget_max_iterations`:
    /// refused by that limit.
    Budget(BudgetLimit),
    /// `cancelled`.
    Cancelled,
    /// `context_window`: the prompt cannot fit the model's context window; not sent.
    ContextWindow,
    /// `unknown_endpoint`.
    UnknownEndpoint,
    /// `config`: the endpoint configuration is unusable.
    Config,
    /// `invalid_request`: the request cannot be expressed in the provider's format.
    InvalidRequest,
    /// `internal`: a bug in the bridge.
    Internal,
}

impl FailureKind {
    /// Every kind, in a stable order.
    pub const ALL: [FailureKind; 23] = [
        Self::Connect,
        Self::Network,
        Self::Timeout,
        Self::BadRequest,
        Self::NotFound,
        Self::RequestTimeout,
        Self::PayloadTooLarge,
        Self::Unprocessable,
        Self::RateLimited,
        Self::ServerError,
        Self::OtherStatus,
        Self::Unauthorized,
        Self::Decode,
        Self::Budget(BudgetLimit::Calls),
        Self::Budget(BudgetLimit::Tokens),
        Self::Budget(BudgetLimit::Usd),
        Self::Budget(BudgetLimit::Iterations),
        Self::Cancelled,
        Self::ContextWindow,
        Self::UnknownEndpoint,
        Self::Config,
        Self::InvalidRequest,
        Self::Internal,
    ];

    /// The stable name, as serialised (`connect`, `http_429`, `budget_max_calls`, …).
    pub fn name(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Network => "network",
            Self::Timeout => "timeout",
            Self::BadRequest => "http_400",
            Self::NotFound => "http_404",
            Self::RequestTimeout => "http_408",
            Self::PayloadTooLarge => "http_413",
            Self::Unprocessable => "http_422",
            Self::RateLimited => "http_429",
            Self::ServerError => "http_5xx",
            Self::OtherStatus => "http",
            Self::Unauthorized => "unauthorized",
            Self::Decode => "decode",
            Self::Budget(BudgetLimit::Calls) => "budget_max_calls",
            Self::Budget(BudgetLimit::Tokens) => "budget_max_tokens",
            Self::Budget(BudgetLimit::Usd) => "budget_max_usd",
            Self::Budget(BudgetLimit::Iterations) => "budget_max_iterations",
            Self::Cancelled => "cancelled",
            Self::ContextWindow => "context_window",
            Self::UnknownEndpoint => "unknown_endpoint",
            Self::Config => "config",
            Self::InvalidRequest => "invalid_request",
            Self::Internal => "internal",
        }
    }

    /// The kind called `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// The budget limit that refused the call, if that is what happened.
    pub fn budget_limit(self) -> Option<BudgetLimit> {
        match self {
            Self::Budget(limit) => Some(limit),
            _ => None,
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for FailureKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for FailureKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown failure kind `{name}`")))
    }
}

/// Which budget limit refused a call; serialised as its [`Budget`](crate::Budget) field name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BudgetLimit {
    /// `Budget::max_calls`.
    #[serde(rename = "max_calls")]
    Calls,
    /// `Budget::max_tokens`.
    #[serde(rename = "max_tokens")]
    Tokens,
    /// `Budget::max_usd`.
    #[serde(rename = "max_usd")]
    Usd,
    /// `Budget::max_iterations`.
    #[serde(rename = "max_iterations")]
    Iterations,
}

impl BudgetLimit {
    /// The `Budget` field name.
    pub fn field(self) -> &'static str {
        match self {
            Self::Calls => "max_calls",
            Self::Tokens => "max_tokens",
            Self::Usd => "max_usd",
            Self::Iterations => "max_iterations",
        }
    }
}

/// A call refused because a budget limit was reached.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct BudgetExceeded {
    /// The limit that was hit.
    pub limit: BudgetLimit,
    /// Its configured value.
    pub max: f64,
    /// What was used when the call was refused.
    pub used: f64,
    /// What calls in flight had reserved on top of `used` (0 for `max_calls`).
    pub reserved: f64,
    /// The refused call's own estimate (0 for `max_calls`).
    pub needed: f64,
    /// What sets the limit, as the front end's users write it (see
    /// [`BudgetNames`](crate::ledger::BudgetNames)); `None` names the budget's field.
    pub setting: Option<String>,
}

impl fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let amount = |x: f64| match self.limit {
            BudgetLimit::Calls | BudgetLimit::Tokens | BudgetLimit::Iterations => fmt_count(x),
            BudgetLimit::Usd => format!("{x:.4}"),
        };
        let what = match self.limit {
            BudgetLimit::Calls => "sub-calls",
            BudgetLimit::Tokens => "tokens",
            BudgetLimit::Usd => "USD",
            BudgetLimit::Iterations => "iterations",
        };
        write!(
            f,
            "Budget exhausted: {} of {} {what} used",
            amount(self.used),
            amount(self.max)
        )?;
        if self.reserved > 0.0 {
            write!(
                f,
                ", {} more reserved by calls in flight",
                amount(self.reserved)
            )?;
        }
        if self.needed > 0.0 {
            write!(f, ", and this call may need {}", amount(self.needed))?;
        }
        match &self.setting {
            Some(setting) => write!(
                f,
                " ({setting} {}); the call was not sent. Raise the budget with {setting} to \
                 allow more",
                amount(self.max)
            ),
            None => write!(
                f,
                " (`{}`); the call was not sent. Raise `{}` of the budget to allow more",
                self.limit.field(),
                self.limit.field()
            ),
        }
    }
}

fn fmt_count(x: f64) -> String {
    format!("{}", x as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_kinds_round_trip_through_their_names() {
        for kind in FailureKind::ALL {
            let json = serde_json::to_string(&kind).expect("serialises");
            assert_eq!(json, format!("\"{}\"", kind.name()));
            assert_eq!(serde_json::from_str::<FailureKind>(&json).ok(), Some(kind));
        }
        let names: std::collections::HashSet<_> =
            FailureKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), FailureKind::ALL.len(), "names are unique");
        assert!(serde_json::from_str::<FailureKind>("\"budget\"").is_err());
    }

    #[test]
    fn a_budget_refusal_carries_its_limit_and_names_no_flag() {
        let exceeded = BudgetExceeded {
            limit: BudgetLimit::Tokens,
            max: 10.0,
            used: 8.0,
            reserved: 0.0,
            needed: 5.0,
            setting: None,
        };
        let error = BridgeError::Budget(exceeded.clone());
        assert_eq!(error.kind(), FailureKind::Budget(BudgetLimit::Tokens));
        assert_eq!(error.kind().budget_limit(), Some(BudgetLimit::Tokens));
        assert_eq!(
            error.to_string(),
            "Budget exhausted: 8 of 10 tokens used, and this call may need 5 (`max_tokens`); \
             the call was not sent. Raise `max_tokens` of the budget to allow more"
        );
        let named = BudgetExceeded {
            setting: Some("`--max-tokens`".into()),
            ..exceeded
        };
        assert_eq!(
            named.to_string(),
            "Budget exhausted: 8 of 10 tokens used, and this call may need 5 (`--max-tokens` \
             10); the call was not sent. Raise the budget with `--max-tokens` to allow more"
        );
    }
}
