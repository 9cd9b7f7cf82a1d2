//! The one error type of the bridge, with messages that say what to do.

use std::fmt;
use std::time::Duration;

/// Everything that can go wrong talking to a language model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BridgeError {
    /// No TCP/TLS connection could be made (refused, unreachable, DNS).
    #[error(
        "Could not connect to `{url}` ({detail}); check that the model server is running and that \
         `base_url` of endpoint `{endpoint}` is right"
    )]
    Connect {
        /// Endpoint name.
        endpoint: String,
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
        "Request to `{url}` timed out after {}s; raise `timeout` of endpoint `{endpoint}` or check the server",
        .timeout.as_secs_f64()
    )]
    Timeout {
        /// Endpoint name.
        endpoint: String,
        /// The URL that was requested.
        url: String,
        /// The per-attempt timeout that expired.
        timeout: Duration,
    },
    /// The server answered with an error status (other than 401/403).
    #[error("{}", http_message(*.status, .url, .endpoint, .message))]
    Http {
        /// Endpoint name.
        endpoint: String,
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
    /// The server answered 2xx but the body was not what the protocol promises.
    #[error(
        "Could not decode the answer from `{url}` ({detail}); check that endpoint `{endpoint}` \
         speaks the configured `provider` protocol"
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
    /// No endpoint has this name.
    #[error("Unknown endpoint `{name}`; known endpoints: {}", list_names(.known))]
    UnknownEndpoint {
        /// The requested name.
        name: String,
        /// The configured names.
        known: Vec<String>,
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
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Network { .. } | Self::Timeout { .. } => true,
            Self::Http { status, .. } => matches!(status, 408 | 429 | 500..=599),
            _ => false,
        }
    }

    /// A short stable tag for logs and metadata (`connect`, `timeout`, `http_429`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Connect { .. } => "connect",
            Self::Network { .. } => "network",
            Self::Timeout { .. } => "timeout",
            Self::Http { status, .. } => match status {
                400 => "http_400",
                404 => "http_404",
                408 => "http_408",
                413 => "http_413",
                422 => "http_422",
                429 => "http_429",
                500..=599 => "http_5xx",
                _ => "http",
            },
            Self::Unauthorized { .. } => "unauthorized",
            Self::Decode { .. } => "decode",
            Self::Budget(_) => "budget",
            Self::Cancelled => "cancelled",
            Self::UnknownEndpoint { .. } => "unknown_endpoint",
            Self::Config(_) => "config",
            Self::InvalidRequest(_) => "invalid_request",
            Self::Internal(_) => "internal",
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

fn http_message(status: u16, url: &str, endpoint: &str, message: &str) -> String {
    let hint = match status {
        404 => format!(
            "; check `base_url` of endpoint `{endpoint}` (OpenAI-compatible servers usually need it \
             to end in `/v1`, Anthropic's must not) and the model name"
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

/// Which budget limit refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetLimit {
    /// `Budget::max_calls`.
    Calls,
    /// `Budget::max_tokens`.
    Tokens,
    /// `Budget::max_usd`.
    Usd,
}

impl BudgetLimit {
    /// The `Budget` field name.
    pub fn field(self) -> &'static str {
        match self {
            Self::Calls => "max_calls",
            Self::Tokens => "max_tokens",
            Self::Usd => "max_usd",
        }
    }

    /// The command-line flag that raises it.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Calls => "--max-sub-calls",
            Self::Tokens => "--max-tokens",
            Self::Usd => "--max-usd",
        }
    }

    /// The limit a [`BudgetExceeded`] message names (its field, in backticks): how a caller
    /// that only kept the text of a refusal, such as a sub-call record, tells which it was.
    pub fn named_in(message: &str) -> Option<Self> {
        [Self::Calls, Self::Tokens, Self::Usd]
            .into_iter()
            .find(|limit| message.contains(&format!("`{}`", limit.field())))
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
}

impl fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let amount = |x: f64| match self.limit {
            BudgetLimit::Calls | BudgetLimit::Tokens => fmt_count(x),
            BudgetLimit::Usd => format!("{x:.4}"),
        };
        let what = match self.limit {
            BudgetLimit::Calls => "sub-calls",
            BudgetLimit::Tokens => "tokens",
            BudgetLimit::Usd => "USD",
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
        write!(
            f,
            " (`{}`); the call was not sent. Raise the limit with `{}` to allow more",
            self.limit.field(),
            self.limit.flag()
        )
    }
}

fn fmt_count(x: f64) -> String {
    format!("{}", x as u64)
}
