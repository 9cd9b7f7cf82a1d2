//! Server configuration: latency model, fault injection and the CLI-friendly options.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::MockError;
use super::latency::Latency;
use super::script::Script;

/// Everything [`super::MockServer::start`] needs. `Default`: echo every prompt, no latency,
/// no faults, no API key, a free port on 127.0.0.1, an unbounded request log without headers
/// or bodies.
#[derive(Debug, Clone, Default)]
pub struct MockConfig {
    /// Where to listen; must be a loopback address. `None` = `127.0.0.1:0` (a free port).
    pub addr: Option<SocketAddr>,
    /// How each model replies.
    pub script: Script,
    /// Delay applied to every chat request before it is answered (scripts may override it per
    /// model), and to `GET /v1/models`.
    pub latency: Latency,
    /// Injected failures.
    pub faults: Faults,
    /// Seed of the per-request random draws (latency samples, random faults).
    pub seed: u64,
    /// When set, chat and model requests must carry `Authorization: Bearer KEY` or `x-api-key: KEY`.
    pub api_key: Option<String>,
    /// Keep at most this many request records, dropping the oldest; `None` keeps all (tests).
    pub log_limit: Option<usize>,
    /// Keep each request's headers and body in its [`RequestRecord`](super::RequestRecord)
    /// (for tests that check what was sent; off by default, as bodies can be large).
    pub record_requests: bool,
    /// Serve at most this many chat requests at once, as a rate-limited API does: one more
    /// is answered `429 Too Many Requests` at once, with `Retry-After` from
    /// [`Faults::retry_after`]. `None`: no limit.
    pub capacity: Option<usize>,
}

/// One kind of injected failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// `429 Too Many Requests` with a `Retry-After` header (seconds).
    #[serde(alias = "429")]
    RateLimit,
    /// `500 Internal Server Error` with a provider-shaped error body.
    #[serde(alias = "500")]
    ServerError,
    /// `503 Service Unavailable` with a provider-shaped error body.
    #[serde(alias = "503")]
    Unavailable,
    /// Wait [`Faults::hang`] more after the latency (ended at once on shutdown), then answer
    /// normally.
    Hang,
    /// Drop the connection without a response: the client sees a transport error.
    Reset,
    /// `200 OK` whose body is not valid JSON (for streams: an invalid `data:` event).
    #[serde(alias = "malformed")]
    MalformedJson,
    /// `200 OK` announcing a `Content-Length` larger than what is sent before the connection
    /// closes (streams: cut halfway): the client sees an incomplete body.
    #[serde(alias = "truncated")]
    TruncatedBody,
}

impl FaultKind {
    /// Every kind, in a stable order.
    pub const ALL: [FaultKind; 7] = [
        Self::RateLimit,
        Self::ServerError,
        Self::Unavailable,
        Self::Hang,
        Self::Reset,
        Self::MalformedJson,
        Self::TruncatedBody,
    ];

    /// The stable name used in logs, JSON and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::RateLimit => "rate_limit",
            Self::ServerError => "server_error",
            Self::Unavailable => "unavailable",
            Self::Hang => "hang",
            Self::Reset => "reset",
            Self::MalformedJson => "malformed_json",
            Self::TruncatedBody => "truncated_body",
        }
    }

    /// Parses a comma-separated list such as `429,500,reset`.
    pub fn parse_list(list: &str) -> Result<Vec<FaultKind>, MockError> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect()
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FaultKind {
    type Err = MockError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "429" | "rate_limit" => Self::RateLimit,
            "500" | "server_error" => Self::ServerError,
            "503" | "unavailable" => Self::Unavailable,
            "hang" => Self::Hang,
            "reset" => Self::Reset,
            "malformed" | "malformed_json" => Self::MalformedJson,
            "truncated" | "truncated_body" => Self::TruncatedBody,
            other => {
                return Err(MockError::InvalidConfig(format!(
                    "Unknown fault `{other}`; use one of `429`, `500`, `503`, `hang`, `reset`, \
                     `malformed`, `truncated`"
                )));
            }
        })
    }
}

/// A deterministic fault: requests matching every given condition fail with `fault`
/// (only the first `times` matching requests when `times` is set).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// Regex over the last user message; `None` matches every request.
    #[serde(default)]
    pub last_user: Option<String>,
    /// Regex over the requested model name; `None` matches every model.
    #[serde(default)]
    pub model: Option<String>,
    /// The failure to inject.
    pub fault: FaultKind,
    /// Fail only the first `times` matching requests (counted per rule, across the server's life).
    #[serde(default)]
    pub times: Option<u64>,
}

impl FaultRule {
    /// Fail every request whose last user message matches `regex`.
    pub fn matching(regex: impl Into<String>, fault: FaultKind) -> Self {
        Self {
            last_user: Some(regex.into()),
            model: None,
            fault,
            times: None,
        }
    }

    /// Limit the rule to the first `n` matching requests.
    pub fn times(mut self, n: u64) -> Self {
        self.times = Some(n);
        self
    }
}

/// Fault injection. Rules are checked first, in order (first match wins); otherwise each chat
/// request fails with probability `rate`, the kind drawn uniformly from `kinds` using the
/// server's seeded generator (reproducible for a given arrival order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Probability in `[0, 1]` that a chat request fails at random.
    pub rate: f64,
    /// Kinds drawn from when a random fault fires.
    pub kinds: Vec<FaultKind>,
    /// Delay advertised by 429 responses: `Retry-After` in whole seconds (rounded up) and
    /// `retry-after-ms` exactly.
    #[serde(rename = "retry_after_secs", with = "secs")]
    pub retry_after: Duration,
    /// How long a [`FaultKind::Hang`] sleeps before answering (shutdown ends it early).
    #[serde(rename = "hang_secs", with = "secs")]
    pub hang: Duration,
    /// Deterministic faults, checked before the random ones.
    pub rules: Vec<FaultRule>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            rate: 0.0,
            kinds: Vec::new(),
            retry_after: Duration::from_secs(1),
            hang: Duration::from_secs(3600),
            rules: Vec::new(),
        }
    }
}

impl Faults {
    /// No faults at all.
    pub fn none() -> Self {
        Self::default()
    }

    /// Random faults: each chat request fails with probability `rate`, kind drawn from `kinds`.
    pub fn random(rate: f64, kinds: impl Into<Vec<FaultKind>>) -> Self {
        Self {
            rate,
            kinds: kinds.into(),
            ..Self::default()
        }
    }

    /// The first `n` chat requests fail with `fault`, later ones succeed.
    pub fn fail_first(n: u64, fault: FaultKind) -> Self {
        Self::default().with_rule(FaultRule {
            last_user: None,
            model: None,
            fault,
            times: Some(n),
        })
    }

    /// Adds a deterministic rule (checked after the rules added before it).
    pub fn with_rule(mut self, rule: FaultRule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Checks rates and that every regex compiles.
    pub fn validate(&self) -> Result<(), MockError> {
        if !(0.0..=1.0).contains(&self.rate) {
            return Err(MockError::InvalidConfig(format!(
                "Fault rate {} is outside [0, 1]",
                self.rate
            )));
        }
        if self.rate > 0.0 && self.kinds.is_empty() {
            return Err(MockError::InvalidConfig(format!(
                "Fault rate is {} but no fault kinds are listed; pass e.g. `--faults 429,500`",
                self.rate
            )));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            for (field, pattern) in [("last_user", &rule.last_user), ("model", &rule.model)] {
                if let Some(p) = pattern {
                    regex::Regex::new(p).map_err(|e| {
                        MockError::InvalidConfig(format!("Fault rule {i}: `{field}` regex: {e}"))
                    })?;
                }
            }
        }
        Ok(())
    }
}

/// Plain-valued options for a command line such as
/// `rlm mock-lm --script FILE --latency-ms 50 --fault-rate 0.1 --faults 429,500 --port 8000`;
/// also deserialisable from TOML/JSON. Turn into a [`MockConfig`] with [`MockOptions::into_config`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MockOptions {
    /// Script file (JSON); `None` = echo every prompt.
    pub script: Option<PathBuf>,
    /// Loopback port; `None` or `0` = a free port.
    pub port: Option<u16>,
    /// Fixed latency, or the mean for `latency_sd_ms`, or the minimum for `latency_max_ms`.
    pub latency_ms: Option<f64>,
    /// With `latency_ms`: uniform latency in `[latency_ms, latency_max_ms]`.
    pub latency_max_ms: Option<f64>,
    /// With `latency_ms`: normal latency with this standard deviation.
    pub latency_sd_ms: Option<f64>,
    /// Random fault probability per chat request.
    pub fault_rate: f64,
    /// Fault kinds, e.g. `["429", "500"]` (see [`FaultKind::from_str`]).
    pub faults: Vec<FaultKind>,
    /// `Retry-After` seconds on 429 (default 1).
    pub retry_after_secs: Option<f64>,
    /// Hang duration in seconds (default 3600).
    pub hang_secs: Option<f64>,
    /// Seed for the random draws.
    pub seed: u64,
    /// Require this API key.
    pub api_key: Option<String>,
    /// Request-log size limit (default 100 000 records: a long-running server stays bounded).
    pub log_limit: Option<usize>,
    /// Chat requests served at once; more get 429 (see [`MockConfig::capacity`]).
    pub capacity: Option<usize>,
}

impl MockOptions {
    /// Builds and validates the server configuration (reads the script file).
    pub fn into_config(self) -> Result<MockConfig, MockError> {
        let script = match &self.script {
            Some(path) => Script::from_path(path)?,
            None => Script::default(),
        };
        let ms = |name: &str, v: f64| -> Result<Duration, MockError> {
            Duration::try_from_secs_f64(v / 1e3).map_err(|_| {
                MockError::InvalidConfig(format!("`{name}` must be a non-negative number, got {v}"))
            })
        };
        let latency = match (self.latency_ms, self.latency_max_ms, self.latency_sd_ms) {
            (None, None, None) => Latency::None,
            (Some(l), None, None) => Latency::fixed(ms("latency_ms", l)?),
            (Some(l), Some(max), None) => {
                Latency::uniform(ms("latency_ms", l)?, ms("latency_max_ms", max)?)
            }
            (Some(l), None, Some(sd)) => {
                Latency::normal(ms("latency_ms", l)?, ms("latency_sd_ms", sd)?)
            }
            _ => {
                return Err(MockError::InvalidConfig(
                    "Give `latency_ms` alone, with `latency_max_ms` (uniform) or with \
                     `latency_sd_ms` (normal), not both"
                        .into(),
                ));
            }
        };
        latency.validate()?;
        let mut faults = Faults::random(self.fault_rate, self.faults);
        if let Some(s) = self.retry_after_secs {
            faults.retry_after = ms("retry_after_secs", s * 1e3)?;
        }
        if let Some(s) = self.hang_secs {
            faults.hang = ms("hang_secs", s * 1e3)?;
        }
        faults.validate()?;
        if self.capacity == Some(0) {
            return Err(MockError::InvalidConfig(
                "`capacity` must be at least 1 (or unset for no limit)".into(),
            ));
        }
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port.unwrap_or(0)));
        Ok(MockConfig {
            addr: Some(addr),
            script,
            latency,
            faults,
            seed: self.seed,
            api_key: self.api_key,
            log_limit: Some(self.log_limit.unwrap_or(100_000)),
            record_requests: false,
            capacity: self.capacity,
        })
    }
}

/// `Duration` as (fractional) seconds.
mod secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs)
            .map_err(|_| serde::de::Error::custom(format!("expected seconds >= 0, got {secs}")))
    }
}
