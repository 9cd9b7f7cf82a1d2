//! When the worker pool's background work runs: while a run of this process waits for a model.
//!
//! While a run keeps workers ready (`pool.rs`), two jobs run in the background for each
//! child: the next worker's fork from the template and its confinement (~10 ms of CPU), and
//! the exit of the worker of the child that closed (three processes and four namespaces torn
//! down, a few ms). Started when they are ordered, both fall on a child's boundary: the
//! closed child's worker exits as the parent's worker gets the answer and asks for the next
//! child, and the next worker is ordered as that child's session starts. There they take the
//! cores from the very hops that make a child's cost (the parent worker's round trip, the
//! next child's start frame and `Ready`, its request to the model), while a moment later
//! the child waits for its model with nothing to do.
//!
//! So both wait here until a run of this process has had a model call in flight for
//! [`SETTLE`] (its request is then on its way: a request's write, even to a server on the
//! same machine, takes less), or a call ended meanwhile ([`ModelCall`], held by the loop
//! around each call to its root model): the time a child spends waiting for its model is the
//! slack they fit in. They never wait for long: not while a session waits for a worker being
//! confined, nor when a run ends (each holds an [`Urgent`] meanwhile), and at most [`HOLD`]
//! in any case (a parent whose code runs for a while between two children has no model call
//! in flight). Measured in the bench guide (`--bench tree`, where a child's cost went).

use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::lock::lock;

/// The longest background work waits for a model call (or an urgent need) to start.
pub(crate) const HOLD: Duration = Duration::from_millis(50);
/// How long a model call has been in flight before background work goes: its request has
/// left by then.
pub(crate) const SETTLE: Duration = Duration::from_millis(2);

#[derive(Debug, Default)]
struct State {
    /// Root-model calls of this process's runs in flight.
    calls: usize,
    /// Since when some call has been in flight without a break (`None`: none is).
    since: Option<Instant>,
    /// Calls ended so far.
    ended: u64,
    /// Callers that need background work done now.
    urgent: usize,
}

fn state() -> &'static (Mutex<State>, Condvar) {
    static STATE: OnceLock<(Mutex<State>, Condvar)> = OnceLock::new();
    STATE.get_or_init(Default::default)
}

/// A model call of a run in flight, until dropped: background work may run meanwhile.
#[derive(Debug)]
pub(crate) struct ModelCall(());

impl ModelCall {
    /// Counts a model call in flight until the returned value is dropped.
    pub(crate) fn begin() -> Self {
        let (mutex, changed) = state();
        let mut state = lock(mutex);
        state.calls += 1;
        state.since.get_or_insert_with(Instant::now);
        changed.notify_all();
        Self(())
    }
}

impl Drop for ModelCall {
    fn drop(&mut self) {
        let (mutex, changed) = state();
        let mut state = lock(mutex);
        state.calls = state.calls.saturating_sub(1);
        state.ended += 1;
        if state.calls == 0 {
            state.since = None;
        }
        changed.notify_all();
    }
}

/// A need for background work done now (a session waiting for a worker, a run's end), until
/// dropped.
#[derive(Debug)]
pub(crate) struct Urgent(());

impl Urgent {
    pub(crate) fn begin() -> Self {
        let (mutex, changed) = state();
        lock(mutex).urgent += 1;
        changed.notify_all();
        Self(())
    }
}

impl Drop for Urgent {
    fn drop(&mut self) {
        let mut state = lock(&state().0);
        state.urgent = state.urgent.saturating_sub(1);
    }
}

/// Waits until background work may run: a model call in flight for [`SETTLE`], one ended
/// since the wait began, an urgent need, or `hold` passed ([`HOLD`] outside tests).
pub(crate) fn wait_for_slack(hold: Duration) {
    let (mutex, changed) = state();
    let deadline = Instant::now() + hold;
    let mut state = lock(mutex);
    let ended = state.ended;
    loop {
        if state.urgent > 0 || state.ended != ended {
            return;
        }
        let now = Instant::now();
        let until = match state.since {
            Some(since) if now >= since + SETTLE => return,
            Some(since) => (since + SETTLE).min(deadline),
            None => deadline,
        };
        if now >= deadline {
            return;
        }
        state = changed
            .wait_timeout(state, until.saturating_duration_since(now))
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state is process-wide: the tests that change it take turns.
    static TURN: Mutex<()> = Mutex::new(());

    /// A thread waiting for slack (up to 20 s), started 50 ms ago; it returns how long it
    /// waited, counted from before it was spawned (a thread that starts late under load
    /// must not make the wait look shorter than it was).
    fn waiter_after_50_ms() -> std::thread::JoinHandle<Duration> {
        let started = Instant::now();
        let waiter = std::thread::spawn(move || {
            wait_for_slack(Duration::from_secs(20));
            started.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        waiter
    }

    #[test]
    fn background_work_waits_for_a_model_call_and_no_longer_than_its_hold() {
        let _turn = lock(&TURN);
        // Nothing in flight: the hold is the bound.
        let started = Instant::now();
        wait_for_slack(Duration::from_millis(60));
        assert!(started.elapsed() >= Duration::from_millis(60));

        // A model call that starts meanwhile releases the waiter at once.
        let waiter = waiter_after_50_ms();
        let call = ModelCall::begin();
        let waited = waiter.join().expect("the waiter ends");
        assert!(waited >= Duration::from_millis(50) + SETTLE, "{waited:?}");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
        // Once it has been in flight for its settling time, nothing waits.
        let started = Instant::now();
        wait_for_slack(Duration::from_secs(20));
        assert!(started.elapsed() < Duration::from_secs(10));
        drop(call);
        assert_eq!(lock(&state().0).calls, 0);
        assert!(lock(&state().0).since.is_none());
    }

    #[test]
    fn a_call_that_ends_before_it_settled_releases_background_work() {
        let _turn = lock(&TURN);
        let waiter = waiter_after_50_ms();
        // A model that answers at once: the call ends before it settled.
        drop(ModelCall::begin());
        let waited = waiter.join().expect("the waiter ends");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
    }

    #[test]
    fn an_urgent_need_releases_background_work() {
        let _turn = lock(&TURN);
        let waiter = waiter_after_50_ms();
        let urgent = Urgent::begin();
        let waited = waiter.join().expect("the waiter ends");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
        drop(urgent);
        assert_eq!(lock(&state().0).urgent, 0);
    }
}
