//! Retry timing: exponential backoff with jitter, and the server's `Retry-After`.

use std::time::{Duration, SystemTime};

use rand::Rng;
use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};

/// How often and how patiently a call is retried.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RetryPolicy {
    /// Total attempts, the first included (1 = no retries).
    pub max_attempts: u32,
    /// Backoff before the first retry; doubles with each retry.
    #[serde(with = "crate::endpoint::serde_secs")]
    pub base_delay: Duration,
    /// No wait is longer than this, `Retry-After` included.
    #[serde(with = "crate::endpoint::serde_secs")]
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// How long to wait after failed attempt number `attempt` (1-based).
    ///
    /// With `retry_after` the server's wish is honoured (plus up to 10% jitter so that a
    /// burst of throttled calls does not come back at once); otherwise the delay is
    /// `base_delay * 2^(attempt-1)` with "equal jitter" (half fixed, half random). Both are
    /// capped by `max_delay`.
    pub fn delay_after(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let mut rng = rand::rng();
        let delay = match retry_after {
            Some(wanted) => {
                let spread = wanted.as_secs_f64() * 0.1;
                wanted + Duration::from_secs_f64(rng.random_range(0.0..=spread))
            }
            None => {
                let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(30));
                let exp = self.base_delay.saturating_mul(factor).min(self.max_delay);
                let half = exp / 2;
                half + Duration::from_secs_f64(rng.random_range(0.0..=half.as_secs_f64()))
            }
        };
        delay.min(self.max_delay)
    }
}

/// The delay a response asks for: `retry-after-ms` (OpenAI), else `Retry-After` as seconds
/// or as an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(value, SystemTime::now())
}

/// Parse a `Retry-After` value (delay seconds or HTTP date) relative to `now`.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_accepts_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("3", now), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_retry_after(" 0.5 ", now),
            Some(Duration::from_millis(500))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        assert_eq!(parse_retry_after(&later, now), Some(Duration::from_secs(7)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(7));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let policy = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for attempt in 1..=8 {
            let exp = (Duration::from_millis(100) * 2u32.pow(attempt - 1)).min(policy.max_delay);
            let d = policy.delay_after(attempt, None);
            assert!(
                d >= exp / 2 && d <= exp,
                "attempt {attempt}: {d:?} vs {exp:?}"
            );
        }
        let d = policy.delay_after(1, Some(Duration::from_millis(300)));
        assert!(d >= Duration::from_millis(300) && d <= Duration::from_millis(330));
        assert_eq!(
            policy.delay_after(1, Some(Duration::from_secs(60))),
            Duration::from_secs(1)
        );
    }
}
