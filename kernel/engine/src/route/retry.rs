//! Retries of a node that fails transiently, with capped exponential backoff.
//!
//! [`Backoff`] says how often and how long to wait: by default 3 attempts, waiting 1 s, then
//! 2 s, … doubling up to 10 s. [`retry`] runs an async attempt until it succeeds, fails for
//! good (the caller's `transient` test says no), or uses up its attempts; the waits are
//! `tokio::time::sleep`, so tests advance a paused clock instead of sleeping. A node that
//! fails for good sets [`failure_flag`], which the router escalates.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::decide::FAILURE_FLAG;
use crate::flow::{Agent, Callbacks, Control, Event, EventKind, FlowError, InvocationContext};
use crate::state::StateDelta;

/// How a failing node is retried (the `retry:` of a node).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Backoff {
    /// Attempts in all (1 = no retry).
    pub(crate) attempts: u32,
    /// The wait before the first retry.
    #[serde(with = "seconds")]
    pub(crate) initial: Duration,
    /// The longest wait.
    #[serde(with = "seconds")]
    pub(crate) max: Duration,
    /// Each wait is the previous one times this.
    pub(crate) factor: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            attempts: 3,
            initial: Duration::from_secs(1),
            max: Duration::from_secs(10),
            factor: 2.0,
        }
    }
}

impl Backoff {
    /// The wait before retry `n` (1-based): `initial × factor^(n-1)`, at most `max`.
    pub(crate) fn delay(&self, n: u32) -> Duration {
        let exponent = i32::try_from(n.saturating_sub(1)).unwrap_or(i32::MAX);
        let secs = self.initial.as_secs_f64() * self.factor.max(1.0).powi(exponent);
        Duration::try_from_secs_f64(secs)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// An attempt that failed, and how many attempts were made.
#[derive(Debug, Clone, PartialEq)]
pub struct Exhausted<E> {
    /// The last error.
    pub(crate) error: E,
    /// Attempts made.
    pub(crate) attempts: u32,
}

/// Runs `attempt(n)` (n = 1, 2, …) until it succeeds, fails with an error `transient` calls
/// permanent, or `backoff.attempts` attempts failed; waits `Backoff::delay` between.
pub async fn retry<T, E, F, Fut>(
    backoff: &Backoff,
    mut attempt: F,
    transient: impl Fn(&E) -> bool,
) -> Result<T, Exhausted<E>>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let attempts = backoff.attempts.max(1);
    let mut n = 1;
    loop {
        match attempt(n).await {
            Ok(value) => return Ok(value),
            Err(error) if n >= attempts || !transient(&error) => {
                return Err(Exhausted { error, attempts: n });
            }
            Err(_) => {
                tokio::time::sleep(backoff.delay(n)).await;
                n += 1;
            }
        }
    }
}

/// The update that tells the router `node` failed for good after `attempts` attempts.
pub(crate) fn failure_flag(node: &str, error: &str, attempts: u32) -> StateDelta {
    let mut delta = StateDelta::default();
    delta.set(
        FAILURE_FLAG,
        json!({"node": node, "error": error, "attempts": attempts}),
    );
    delta
}

/// A node retried on transient failure; a node that fails for good (attempts used up, or a
/// permanent error at once) sets the failure flag and lets the router decide (escalation)
/// instead of failing the run.
pub struct Retrying {
    inner: Arc<dyn Agent>,
    backoff: Backoff,
}

impl std::fmt::Debug for Retrying {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Retrying({:?}, {:?})", self.inner, self.backoff)
    }
}

impl Retrying {
    /// `inner`, retried by `backoff`.
    pub fn new(inner: Arc<dyn Agent>, backoff: Backoff) -> Self {
        Self { inner, backoff }
    }
}

/// Whether a node error may go away on its own: a model call the bridge calls retryable (a
/// timeout, a lost connection, a 408, 429 or 5xx), or an agent's own failure (a Python step
/// raised, a tool loop ran out of iterations or time). A node set up wrong (a template naming a missing key, a bad
/// tool schema, a bad context file), a hook or callback that stopped it on purpose, a model
/// call refused for good (401, 400, a reply that does not decode), stops (cancel, timeout,
/// budget), a broken event log and graph errors never do.
pub(crate) fn is_transient(error: &FlowError) -> bool {
    match error {
        FlowError::Model { source, .. } => source.is_retryable(),
        // Another try of the same loop may well finish within its limit.
        FlowError::Agent { .. } | FlowError::Limit { .. } => true,
        FlowError::Setup { .. }
        | FlowError::StoppedByHook { .. }
        | FlowError::Cancelled
        | FlowError::TimedOut(_)
        | FlowError::Budget(_)
        | FlowError::UnknownNode { .. }
        | FlowError::StepLimit { .. }
        | FlowError::Sink(_) => false,
    }
}

#[async_trait]
impl Agent for Retrying {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn description(&self) -> &str {
        self.inner.description()
    }

    fn class(&self) -> &str {
        self.inner.class()
    }

    fn sub_agents(&self) -> Vec<Arc<dyn Agent>> {
        self.inner.sub_agents()
    }

    fn callbacks(&self) -> &Callbacks {
        self.inner.callbacks()
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        let result = retry(&self.backoff, |_| self.inner.run(ctx), is_transient).await;
        match result {
            Ok(control) => Ok(control),
            // A stop is the whole run's, and a broken event log loses the record: neither
            // is this node's failure for the router to route around.
            Err(Exhausted { error, .. })
                if error.is_stop() || matches!(error, FlowError::Sink(_)) =>
            {
                Err(error)
            }
            Err(Exhausted { error, attempts }) => {
                let flag = failure_flag(self.inner.name(), &error.to_string(), attempts);
                ctx.apply(&flag);
                ctx.emit(Event::new(EventKind::StateUpdate).with_content(format!(
                    "failed for good after {attempts} attempts: {error}"
                )))?;
                Ok(Control::Continue)
            }
        }
    }
}

/// Durations in a workflow file are seconds (`1.5`).
mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs)
            .map_err(|_| D::Error::custom(format!("`{secs}` is not a duration in seconds (≥ 0)")))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::time::Instant;

    #[test]
    fn delays_double_up_to_the_cap() {
        let b = Backoff {
            attempts: 8,
            ..Backoff::default()
        };
        let delays: Vec<u64> = (1..=6).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 10, 10]);
        let parsed: Backoff =
            serde_json::from_value(json!({"attempts": 5, "initial": 0.5, "max": 3})).unwrap();
        assert_eq!(parsed.delay(1), Duration::from_millis(500));
        assert_eq!(parsed.delay(4), Duration::from_secs(3));
        assert!(serde_json::from_value::<Backoff>(json!({"initial": -1})).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_failure_is_retried_with_backoff_on_the_paused_clock() {
        let calls = AtomicU32::new(0);
        let start = Instant::now();
        let result = retry(
            &Backoff::default(),
            |n| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move { if n < 3 { Err("busy") } else { Ok(n) } }
            },
            |_| true,
        )
        .await;
        assert_eq!(result, Ok(3));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Waited 1 s + 2 s of virtual time, none of it real.
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_run_out_and_permanent_errors_stop_at_once() {
        let start = Instant::now();
        let backoff = Backoff {
            attempts: 6,
            ..Backoff::default()
        };
        let out: Result<(), _> = retry(&backoff, |_| async { Err("down") }, |_| true).await;
        assert_eq!(
            out,
            Err(Exhausted {
                error: "down",
                attempts: 6
            })
        );
        assert_eq!(start.elapsed(), Duration::from_secs(1 + 2 + 4 + 8 + 10));

        let start = Instant::now();
        let out: Result<(), _> = retry(
            &backoff,
            |_| async { Err("bad input") },
            |e| *e != "bad input",
        )
        .await;
        assert_eq!(
            out,
            Err(Exhausted {
                error: "bad input",
                attempts: 1
            })
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
        let flag = failure_flag("dev", "down", 6);
        assert_eq!(
            flag.last(FAILURE_FLAG),
            Some(&crate::state::StateWrite::Replace {
                key: FAILURE_FLAG.into(),
                value: json!({"node": "dev", "error": "down", "attempts": 6})
            })
        );
    }

    #[test]
    fn only_errors_that_may_pass_are_transient() {
        use bridge::BridgeError;
        let http = |status| FlowError::Model {
            agent: "dev".into(),
            source: Box::new(BridgeError::Http {
                endpoint: "dev".into(),
                base_url_setting: "RLM_BASE_URL".into(),
                url: "http://127.0.0.1/v1".into(),
                status,
                message: "no".into(),
                retry_after: None,
            }),
        };
        let timeout = FlowError::Model {
            agent: "dev".into(),
            source: Box::new(BridgeError::Timeout {
                endpoint: "dev".into(),
                timeout_setting: "RLM_TIMEOUT".into(),
                url: "http://127.0.0.1/v1".into(),
                timeout: Duration::from_secs(1),
            }),
        };
        let setup = FlowError::Setup {
            agent: "dev".into(),
            message: "The template names `{plan}`, which is not in the state".into(),
        };
        let own = FlowError::Agent {
            agent: "dev".into(),
            message: "the Python step raised".into(),
        };
        for (error, transient) in [
            (http(500), true),
            (http(503), true),
            (http(429), true),
            (http(408), true),
            (timeout, true),
            (own, true),
            (http(400), false),
            (
                FlowError::StoppedByHook {
                    agent: "dev".into(),
                    reason: "a callback blocked it".into(),
                },
                false,
            ),
            (http(404), false),
            (setup, false),
            (FlowError::Cancelled, false),
            (FlowError::TimedOut(Duration::from_secs(1)), false),
            (FlowError::Sink("disk full".into()), false),
            (
                FlowError::StepLimit {
                    graph: "team".into(),
                    max_steps: 3,
                },
                false,
            ),
        ] {
            assert_eq!(is_transient(&error), transient, "{error}");
        }
    }
}
