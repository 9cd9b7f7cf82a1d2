//! The latency model: a delay per request, fixed or drawn from a seeded distribution.

use std::time::Duration;

use rand::Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use super::error::MockError;

/// Per-request delay before the server answers, counted from the request's arrival (see
/// *Latency* in the [module docs](super)).
///
/// JSON form (also used for per-model overrides in scripts):
/// `{"kind": "fixed", "ms": 50}`, `{"kind": "uniform", "min_ms": 10, "max_ms": 90}`,
/// `{"kind": "normal", "mean_ms": 50, "sd_ms": 10}` (clipped at 0), `{"kind": "none"}`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Latency {
    /// Answer immediately.
    #[default]
    None,
    /// Always the same delay.
    Fixed {
        /// The delay.
        #[serde(rename = "ms", with = "millis")]
        delay: Duration,
    },
    /// Uniformly distributed in `[min, max]`.
    Uniform {
        /// Smallest delay.
        #[serde(rename = "min_ms", with = "millis")]
        min: Duration,
        /// Largest delay.
        #[serde(rename = "max_ms", with = "millis")]
        max: Duration,
    },
    /// Normally distributed, negative samples clipped to zero.
    Normal {
        /// Mean delay.
        #[serde(rename = "mean_ms", with = "millis")]
        mean: Duration,
        /// Standard deviation.
        #[serde(rename = "sd_ms", with = "millis")]
        sd: Duration,
    },
}

impl Latency {
    /// A fixed delay.
    pub fn fixed(delay: Duration) -> Self {
        Self::Fixed { delay }
    }

    /// A delay drawn uniformly from `[min, max]`.
    pub fn uniform(min: Duration, max: Duration) -> Self {
        Self::Uniform { min, max }
    }

    /// A normally distributed delay (clipped at zero).
    pub fn normal(mean: Duration, sd: Duration) -> Self {
        Self::Normal { mean, sd }
    }

    /// Checks that the bounds make sense.
    pub fn validate(&self) -> Result<(), MockError> {
        match *self {
            Self::Uniform { min, max } if min > max => Err(MockError::InvalidConfig(format!(
                "Uniform latency has `min_ms` {} above `max_ms` {}",
                min.as_secs_f64() * 1e3,
                max.as_secs_f64() * 1e3
            ))),
            _ => Ok(()),
        }
    }

    /// Draws one delay.
    pub(crate) fn sample(&self, rng: &mut impl Rng) -> Duration {
        match *self {
            Self::None => Duration::ZERO,
            Self::Fixed { delay } => delay,
            Self::Uniform { min, max } => {
                let span = max.saturating_sub(min).as_secs_f64();
                min + Duration::from_secs_f64(span * rng.random::<f64>())
            }
            Self::Normal { mean, sd } => {
                // A `Duration` is finite and non-negative, so `Normal::new` cannot refuse it.
                let secs = Normal::new(mean.as_secs_f64(), sd.as_secs_f64())
                    .map_or(mean.as_secs_f64(), |normal| normal.sample(rng));
                Duration::try_from_secs_f64(secs.max(0.0)).unwrap_or(Duration::ZERO)
            }
        }
    }
}

/// `Duration` as (fractional) milliseconds.
mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1e3)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms = f64::deserialize(d)?;
        Duration::try_from_secs_f64(ms / 1e3)
            .map_err(|_| serde::de::Error::custom(format!("expected milliseconds >= 0, got {ms}")))
    }
}
