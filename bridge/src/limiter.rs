//! The per-endpoint concurrency limiter: a fixed number of requests in flight, or an adaptive
//! limit that finds how wide a server can take it.
//!
//! Every HTTP attempt takes a permit from its endpoint's limiter and gives it back with what
//! happened: its round-trip time, or that the server pushed back. A
//! fixed limiter only counts. An adaptive one feeds the outcome to [`AdaptiveLimit`], AIMD
//! with slow start in the style of TCP congestion control and Netflix's concurrency-limits:
//!
//! - **slow start**: +1 per answer, so the limit doubles every round trip, until the first
//!   sign of overload;
//! - **congestion avoidance**: +1/limit per answer, i.e. +1 per round trip; either only while
//!   at least half the limit is in use (an idle limit is no evidence that more would work);
//! - **overload** (HTTP 429, 503, 408, a timed-out attempt): the limit drops to `backoff ×`
//!   the width the server took: the requests in flight at the first refusal, less the
//!   refusals among them. Each attempt remembers the epoch (the number of cuts) it was sent
//!   in: a refusal of an attempt sent before the last cut only refines that cut, so a burst
//!   of 429s costs one cut, not one per 429, and older ones are ignored;
//! - **latency**: each window of `limit` answers compares its mean round trip with a baseline
//!   (the lowest window mean so far, drifting slowly up toward later ones, so that a server that
//!   got slower for good is accepted); a window slower than `latency_tolerance × baseline` counts
//!   as an overload.
//!
//! The limit stays within `1..=ceiling` (the endpoint's `max_in_flight`). The algorithm is a
//! plain state machine over samples ([`AdaptiveLimit::on_answer`],
//! [`AdaptiveLimit::on_overload`]) with no clock of its own, so its tests drive it with
//! synthetic samples. The limiter applies each new limit to a tokio semaphore: growing adds
//! permits; shrinking forgets idle permits and takes the rest out of circulation as they come
//! back.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{AcquireError, Semaphore, SemaphorePermit};

use crate::config::AdaptivePolicy;
use crate::error::{BridgeError, FailureKind};

/// How far the latency baseline moves toward a slower window, per window.
const BASELINE_DRIFT: f64 = 0.05;

/// The adaptive limit itself: a state machine over samples, no clock, no I/O.
#[derive(Debug, Clone)]
pub struct AdaptiveLimit {
    policy: AdaptivePolicy,
    ceiling: f64,
    limit: f64,
    slow_start: bool,
    /// Cuts so far; an attempt remembers the epoch it was sent in.
    epoch: u64,
    window: Window,
    /// The reference mean round trip, seconds.
    baseline: Option<f64>,
    /// Requests in flight when the last cut began, and refusals counted against it since.
    cut_base: f64,
    refused: f64,
}

/// The answers of the current latency window.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    epoch: u64,
    target: usize,
    answers: usize,
    rtt_sum: f64,
}

impl AdaptiveLimit {
    /// A limit starting at `policy.initial`, never above `ceiling` (at least 1).
    pub fn new(policy: AdaptivePolicy, ceiling: usize) -> Self {
        let ceiling = ceiling.max(1) as f64;
        let limit = (policy.initial.max(1) as f64).min(ceiling);
        let mut this = Self {
            policy,
            ceiling,
            limit,
            slow_start: true,
            epoch: 0,
            window: Window::default(),
            baseline: None,
            cut_base: 0.0,
            refused: 0.0,
        };
        this.open_window();
        this
    }

    /// Requests allowed in flight now.
    pub fn limit(&self) -> usize {
        // In 1..=ceiling by construction, so the cast cannot truncate a large value.
        self.limit.floor().clamp(1.0, self.ceiling) as usize
    }

    /// The ceiling the limit never exceeds.
    pub fn ceiling(&self) -> usize {
        self.ceiling as usize
    }

    /// The current epoch: an attempt sent now passes it back with its sample.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the limit still doubles every round trip (no overload seen yet).
    pub fn in_slow_start(&self) -> bool {
        self.slow_start
    }

    /// An answer after `rtt`, from an attempt sent in `sent_epoch`, with `in_flight` attempts
    /// (this one included) holding permits when it arrived.
    pub fn on_answer(&mut self, rtt: Duration, sent_epoch: u64, in_flight: usize) {
        if in_flight as f64 * 2.0 >= self.limit {
            let step = if self.slow_start {
                1.0
            } else {
                1.0 / self.limit
            };
            self.limit = (self.limit + step).min(self.ceiling);
        }
        if sent_epoch < self.window.epoch {
            // Sent before the last cut: it says nothing about the width now in force.
            return;
        }
        self.window.answers += 1;
        self.window.rtt_sum += rtt.as_secs_f64();
        if self.window.answers < self.window.target {
            return;
        }
        let mean = self.window.rtt_sum / self.window.answers as f64;
        match self.baseline {
            None => self.baseline = Some(mean),
            Some(base) if mean > base * self.policy.latency_tolerance => {
                self.baseline = Some(base + (mean - base) * BASELINE_DRIFT);
                self.cut(self.limit, 0.0);
                return;
            }
            Some(base) if mean < base => self.baseline = Some(mean),
            Some(base) => self.baseline = Some(base + (mean - base) * BASELINE_DRIFT),
        }
        self.open_window();
    }

    /// The server pushed back (429, 503, a timeout) on an attempt sent in `sent_epoch`, with
    /// `in_flight` attempts (this one included) holding permits.
    pub fn on_overload(&mut self, sent_epoch: u64, in_flight: usize) {
        if sent_epoch == self.epoch {
            self.cut(in_flight as f64, 1.0);
        } else if sent_epoch + 1 == self.epoch {
            // One more refusal among the requests in flight at the last cut: the server took
            // fewer than it seemed.
            self.refused += 1.0;
            let took = self.cut_base - self.refused;
            self.limit = self.limit.min(took * self.policy.backoff).max(1.0);
        }
    }

    /// Cut to `backoff × (width − refused)` and start a new epoch and window.
    fn cut(&mut self, width: f64, refused: f64) {
        self.cut_base = width;
        self.refused = refused;
        self.limit = ((width - refused) * self.policy.backoff).clamp(1.0, self.ceiling);
        self.slow_start = false;
        self.epoch += 1;
        self.open_window();
    }

    fn open_window(&mut self) {
        self.window = Window {
            epoch: self.epoch,
            target: self.limit(),
            answers: 0,
            rtt_sum: 0.0,
        };
    }
}

/// What one attempt tells the limiter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Outcome {
    /// An answer (any answer from the model, even an error of the request's own making) after
    /// this round trip.
    Answered(Duration),
    /// The server is overloaded: 429, 503, 408 or the attempt timed out.
    Overloaded,
    /// Nothing about the server's load: a connection failure, a cancellation.
    Silent,
}

impl Outcome {
    /// The outcome of an attempt that took `rtt` and ended with `result`.
    pub(crate) fn of<T>(result: &Result<T, BridgeError>, rtt: Duration) -> Self {
        let Err(error) = result else {
            return Self::Answered(rtt);
        };
        match error.kind() {
            FailureKind::RateLimited | FailureKind::RequestTimeout | FailureKind::Timeout => {
                Self::Overloaded
            }
            FailureKind::ServerError if matches!(error, BridgeError::Http { status: 503, .. }) => {
                Self::Overloaded
            }
            FailureKind::Connect | FailureKind::Network | FailureKind::Cancelled => Self::Silent,
            _ => Self::Answered(rtt),
        }
    }
}

/// What an endpoint's limiter has seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimiterStats {
    /// Requests allowed in flight now (the fixed `max_in_flight`, or the adaptive limit).
    pub limit: usize,
    /// The highest limit so far.
    pub peak_limit: usize,
    /// Attempts holding a permit now.
    pub in_flight: usize,
    /// HTTP attempts made.
    pub attempts: u64,
    /// Attempts answered with HTTP 429.
    pub rate_limited: u64,
    /// Attempts that signalled overload (429, 503, 408, a timeout).
    pub overloads: u64,
    /// Whether the limit adapts.
    pub adaptive: bool,
}

/// The limiter of one endpoint, shared by all its callers.
#[derive(Debug)]
pub(crate) struct Limiter {
    semaphore: Semaphore,
    ceiling: usize,
    in_flight: AtomicUsize,
    attempts: AtomicU64,
    rate_limited: AtomicU64,
    overloads: AtomicU64,
    adaptive: Option<Mutex<Gate>>,
}

/// The adaptive state and how many permits the semaphore was given for it.
#[derive(Debug)]
struct Gate {
    limit: AdaptiveLimit,
    /// Permits in circulation or owed: the limit last applied.
    granted: usize,
    /// Permits still to take out of circulation as they come back.
    debt: usize,
    peak: usize,
}

/// One attempt's right to be in flight; give it back with [`Permit::release`] (dropped
/// unreleased, e.g. when its call is cancelled, it says nothing about the server).
#[derive(Debug)]
pub(crate) struct Permit<'a> {
    limiter: &'a Limiter,
    permit: Option<SemaphorePermit<'a>>,
    epoch: u64,
}

impl Permit<'_> {
    /// Give the permit back with what its attempt found.
    pub(crate) fn release(mut self, outcome: Outcome, rate_limited: bool) {
        if let Some(permit) = self.permit.take() {
            self.limiter
                .give_back(permit, self.epoch, outcome, rate_limited);
        }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.limiter
                .give_back(permit, self.epoch, Outcome::Silent, false);
        }
    }
}

impl Limiter {
    /// At most `ceiling` in flight; with `adaptive`, an adaptive limit below it.
    pub(crate) fn new(ceiling: usize, adaptive: Option<AdaptivePolicy>) -> Self {
        let ceiling = ceiling.clamp(1, Semaphore::MAX_PERMITS);
        let gate = adaptive.map(|policy| {
            let limit = AdaptiveLimit::new(policy, ceiling);
            let granted = limit.limit();
            Gate {
                limit,
                granted,
                debt: 0,
                peak: granted,
            }
        });
        let permits = gate.as_ref().map_or(ceiling, |g| g.granted);
        Self {
            semaphore: Semaphore::new(permits),
            ceiling,
            in_flight: AtomicUsize::new(0),
            attempts: AtomicU64::new(0),
            rate_limited: AtomicU64::new(0),
            overloads: AtomicU64::new(0),
            adaptive: gate.map(Mutex::new),
        }
    }

    fn gate(mutex: &Mutex<Gate>) -> MutexGuard<'_, Gate> {
        // Every section leaves the gate consistent, so a poisoned lock is still usable.
        mutex.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait for a permit.
    pub(crate) async fn acquire(&self) -> Result<Permit<'_>, AcquireError> {
        let permit = self.semaphore.acquire().await?;
        let epoch = self
            .adaptive
            .as_ref()
            .map_or(0, |gate| Self::gate(gate).limit.epoch());
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.attempts.fetch_add(1, Ordering::Relaxed);
        Ok(Permit {
            limiter: self,
            permit: Some(permit),
            epoch,
        })
    }

    fn give_back(
        &self,
        permit: SemaphorePermit<'_>,
        epoch: u64,
        outcome: Outcome,
        rate_limited: bool,
    ) {
        if rate_limited {
            self.rate_limited.fetch_add(1, Ordering::Relaxed);
        }
        if outcome == Outcome::Overloaded {
            self.overloads.fetch_add(1, Ordering::Relaxed);
        }
        let in_flight = self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let Some(gate) = &self.adaptive else {
            return;
        };
        let mut gate = Self::gate(gate);
        match outcome {
            Outcome::Answered(rtt) => gate.limit.on_answer(rtt, epoch, in_flight),
            Outcome::Overloaded => gate.limit.on_overload(epoch, in_flight),
            Outcome::Silent => {}
        }
        let target = gate.limit.limit();
        gate.resize(&self.semaphore, target);
        if gate.debt > 0 {
            gate.debt -= 1;
            permit.forget();
        }
    }

    /// Attempts holding a permit now.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// What the limiter has seen so far.
    pub(crate) fn stats(&self) -> LimiterStats {
        let (limit, peak_limit) = match &self.adaptive {
            Some(gate) => {
                let gate = Self::gate(gate);
                (gate.limit.limit(), gate.peak)
            }
            None => (self.ceiling, self.ceiling),
        };
        LimiterStats {
            limit,
            peak_limit,
            in_flight: self.in_flight(),
            attempts: self.attempts.load(Ordering::Relaxed),
            rate_limited: self.rate_limited.load(Ordering::Relaxed),
            overloads: self.overloads.load(Ordering::Relaxed),
            adaptive: self.adaptive.is_some(),
        }
    }
}

impl Gate {
    /// Make `target` permits the semaphore's total: add permits (paying debt first), or
    /// forget idle ones and owe the rest.
    fn resize(&mut self, semaphore: &Semaphore, target: usize) {
        if target > self.granted {
            let grow = target - self.granted;
            let paid = grow.min(self.debt);
            self.debt -= paid;
            semaphore.add_permits(grow - paid);
        } else if target < self.granted {
            let shrink = self.granted - target;
            let forgotten = semaphore.forget_permits(shrink);
            self.debt += shrink - forgotten;
        }
        self.granted = target;
        self.peak = self.peak.max(target);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RTT: Duration = Duration::from_millis(50);

    /// One round trip at full width against a server that takes `capacity` at once and
    /// answers 429 beyond it: every attempt of the round is sent at the current limit.
    fn round(limit: &mut AdaptiveLimit, capacity: usize, rtt: Duration) -> (usize, usize) {
        let width = limit.limit();
        let epoch = limit.epoch();
        let (served, rejected) = (width.min(capacity), width.saturating_sub(capacity));
        // The 429s come back at once, the answers after the round trip; a full pipeline
        // refills each freed slot, so `width` stay in flight.
        for _ in 0..rejected {
            limit.on_overload(epoch, width);
        }
        for _ in 0..served {
            limit.on_answer(rtt, epoch, width);
        }
        (served, rejected)
    }

    #[test]
    fn flat_latency_grows_the_limit_to_the_ceiling_and_no_further() {
        let mut limit = AdaptiveLimit::new(AdaptivePolicy::default(), 200);
        assert_eq!(limit.limit(), 16);
        round(&mut limit, usize::MAX, RTT);
        assert_eq!(limit.limit(), 32, "slow start doubles per round trip");
        for _ in 0..10 {
            round(&mut limit, usize::MAX, RTT);
        }
        assert_eq!(limit.limit(), 200);
        assert!(limit.in_slow_start());
    }

    #[test]
    fn an_idle_limit_does_not_grow() {
        let mut limit = AdaptiveLimit::new(AdaptivePolicy::default(), 1000);
        for _ in 0..100 {
            // One request at a time: far below half the limit.
            limit.on_answer(RTT, limit.epoch(), 1);
        }
        assert_eq!(limit.limit(), 16);
    }

    #[test]
    fn a_burst_of_429s_cuts_once_to_what_the_server_took() {
        let policy = AdaptivePolicy {
            initial: 100,
            ..AdaptivePolicy::default()
        };
        let mut limit = AdaptiveLimit::new(policy, 256);
        let epoch = limit.epoch();
        // 100 in flight, the server takes 64: 36 refusals arrive, all sent in one epoch.
        limit.on_overload(epoch, 100);
        assert_eq!(limit.limit(), 89, "0.9 × (100 in flight − 1 refused)");
        for _ in 1..36 {
            limit.on_overload(epoch, 99);
        }
        assert_eq!(limit.limit(), 57, "0.9 × the 64 the server took");
        assert_eq!(limit.epoch(), epoch + 1, "one cut");
        assert!(!limit.in_slow_start());
        // Refusals from before that cut are ignored once a newer cut happened.
        limit.on_overload(limit.epoch(), 58);
        assert_eq!(limit.limit(), 51, "a refusal sent after the cut cuts again");
        limit.on_overload(epoch, 100);
        assert_eq!(limit.limit(), 51);
    }

    #[test]
    fn against_a_capacity_the_limit_settles_near_it_with_few_rejections() {
        let capacity = 64;
        let mut limit = AdaptiveLimit::new(AdaptivePolicy::default(), 256);
        let (mut served, mut rejected) = (0, 0);
        let mut widths = Vec::new();
        for _ in 0..100 {
            let (s, r) = round(&mut limit, capacity, RTT);
            served += s;
            rejected += r;
            widths.push(limit.limit());
            assert!(limit.limit() <= 256);
        }
        let late = &widths[50..];
        let (low, high) = (
            late.iter().copied().min().unwrap_or(0),
            late.iter().copied().max().unwrap_or(0),
        );
        assert!(
            low >= capacity * 8 / 10 && high <= capacity + 1,
            "settles at 80–100 % of the capacity: {low}..={high}"
        );
        assert!(
            served as f64 >= 0.9 * (100 * capacity) as f64,
            "{served} served in 100 round trips of at most {capacity}"
        );
        // Rejections: the slow-start overshoot once, then one attempt past the capacity every
        // few round trips.
        assert!(rejected < 100, "{rejected} rejections");
    }

    #[test]
    fn rising_latency_backs_off_and_a_lasting_shift_is_accepted() {
        let mut limit = AdaptiveLimit::new(AdaptivePolicy::default(), 64);
        for _ in 0..3 {
            round(&mut limit, usize::MAX, RTT);
        }
        let before = limit.limit();
        assert_eq!(before, 64);
        // The server queues: three times slower.
        round(&mut limit, usize::MAX, RTT * 3);
        assert!(limit.limit() < before, "{} vs {before}", limit.limit());
        // It stays three times slower: the baseline drifts up until the width grows again.
        let mut lowest = limit.limit();
        for _ in 0..400 {
            round(&mut limit, usize::MAX, RTT * 3);
            lowest = lowest.min(limit.limit());
        }
        assert!(lowest >= 16, "the backoff stops: {lowest}");
        assert_eq!(limit.limit(), 64, "a lasting shift is accepted in the end");
    }

    #[test]
    fn the_limit_never_leaves_one_to_the_ceiling() {
        let mut limit = AdaptiveLimit::new(
            AdaptivePolicy {
                initial: 10_000,
                ..AdaptivePolicy::default()
            },
            8,
        );
        assert_eq!(limit.limit(), 8);
        for _ in 0..50 {
            limit.on_overload(limit.epoch(), 1);
        }
        assert_eq!(limit.limit(), 1);
        assert_eq!(limit.ceiling(), 8);
    }

    #[test]
    fn outcomes_sort_failures_by_what_they_say_about_load() {
        let http = |status| BridgeError::Http {
            endpoint: "sub".into(),
            base_url_setting: String::new(),
            url: String::new(),
            status,
            message: String::new(),
            retry_after: None,
        };
        let of = |e: BridgeError| Outcome::of::<()>(&Err(e), RTT);
        assert_eq!(of(http(429)), Outcome::Overloaded);
        assert_eq!(of(http(503)), Outcome::Overloaded);
        assert_eq!(of(http(408)), Outcome::Overloaded);
        assert_eq!(of(http(500)), Outcome::Answered(RTT));
        assert_eq!(of(http(400)), Outcome::Answered(RTT));
        assert_eq!(of(BridgeError::Cancelled), Outcome::Silent);
        assert_eq!(Outcome::of(&Ok(()), RTT), Outcome::Answered(RTT));
    }

    #[tokio::test]
    async fn the_semaphore_follows_the_limit_down_and_up() {
        let limiter = Limiter::new(
            64,
            Some(AdaptivePolicy {
                initial: 4,
                ..AdaptivePolicy::default()
            }),
        );
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(limiter.acquire().await.expect("open"));
        }
        assert!(limiter.semaphore.try_acquire().is_err(), "4 of 4 in use");
        // One 429 with 4 in flight: the limit becomes 2 (0.9 × the 3 the server took); the
        // permits in use beyond it are owed and taken out as they come back.
        let first = held.pop().expect("held");
        first.release(Outcome::Overloaded, true);
        let stats = limiter.stats();
        assert_eq!(
            (stats.limit, stats.in_flight, stats.rate_limited),
            (2, 3, 1)
        );
        assert!(
            limiter.semaphore.try_acquire().is_err(),
            "3 in use, limit 2"
        );
        // Answers grow it again: each frees its permit and adds to the limit.
        for permit in held.drain(..) {
            permit.release(Outcome::Answered(RTT), false);
        }
        let stats = limiter.stats();
        assert_eq!(stats.in_flight, 0);
        assert_eq!(limiter.semaphore.available_permits(), stats.limit);
        assert_eq!(stats.peak_limit, 4);
        // A permit dropped unreleased (its call was cancelled) is given back too.
        drop(limiter.acquire().await.expect("open"));
        assert_eq!(limiter.in_flight(), 0);
    }
}
