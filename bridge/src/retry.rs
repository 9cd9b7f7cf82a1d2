//! Retry timing: exponential backoff with jitter, and the server's `Retry-After`.

use std::time::{Duration, SystemTime};

use rand::Rng;
use reqwest::header::HeaderMap;

use crate::config::RetryPolicy;

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
                // Capped first, so the jitter below stays small and finite.
                let wanted = wanted.min(self.max_delay);
                let spread = wanted.as_secs_f64() * 0.1;
                wanted.saturating_add(secs(rng.random_range(0.0..=spread)))
            }
            None => {
                let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(30));
                let exp = self.base_delay.saturating_mul(factor).min(self.max_delay);
                let half = exp / 2;
                half.saturating_add(secs(rng.random_range(0.0..=half.as_secs_f64())))
            }
        };
        delay.min(self.max_delay)
    }
}

/// `secs` as a `Duration`, saturating instead of panicking on values too large to represent.
fn secs(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

/// The delay a response asks for, capped at `cap`: `retry-after-ms` (OpenAI), else
/// `Retry-After` as seconds or as an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap, cap: Duration) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
    {
        return Some(capped_secs(ms / 1000.0, cap));
    }
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(value, SystemTime::now()).map(|d| d.min(cap))
}

/// Parse a `Retry-After` value (delay seconds or HTTP date) relative to `now`. A delay too
/// long to represent becomes `Duration::MAX`; callers cap it.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| capped_secs(secs, Duration::MAX));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A finite, non-negative number of seconds as a `Duration`, at most `cap`.
fn capped_secs(secs: f64, cap: Duration) -> Duration {
    Duration::try_from_secs_f64(secs).map_or(cap, |d| d.min(cap))
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
        assert_eq!(parse_retry_after("1e20", now), Some(Duration::MAX));
        assert_eq!(
            parse_retry_after("18000000000000000000", now),
            Some(Duration::from_secs(18_000_000_000_000_000_000))
        );
        assert_eq!(parse_retry_after("inf", now), None);
    }

    #[test]
    fn huge_server_delays_are_capped_without_overflow() {
        let policy = RetryPolicy::default();
        for wanted in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
            assert_eq!(policy.delay_after(1, Some(wanted)), policy.max_delay);
        }
        let unbounded = RetryPolicy {
            max_attempts: u32::MAX,
            base_delay: Duration::MAX,
            max_delay: Duration::MAX,
            rate_limit_patience: Duration::MAX,
        };
        assert_eq!(unbounded.delay_after(1, Some(Duration::MAX)), Duration::MAX);
        assert!(unbounded.delay_after(u32::MAX, None) >= Duration::MAX / 2);

        let mut headers = HeaderMap::new();
        headers.insert("retry-after-ms", "1e300".parse().expect("header value"));
        let cap = Duration::from_secs(5);
        assert_eq!(retry_after(&headers, cap), Some(cap));
        headers.clear();
        headers.insert(
            reqwest::header::RETRY_AFTER,
            "18000000000000000000".parse().expect("header value"),
        );
        assert_eq!(retry_after(&headers, cap), Some(cap));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let policy = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            rate_limit_patience: Duration::ZERO,
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
