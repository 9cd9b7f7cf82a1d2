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
//! So both wait until a run of this process has had a model call in flight for [`SETTLE`]
//! (its request is then on its way: a request's write, even to a server on the same
//! machine, takes less), or a call ended meanwhile: the time a child spends waiting for its
//! model is the slack they fit in. The call itself says when ([`in_flight`], around each
//! call of a run to its root model): a timer of the call's own task at [`SETTLE`], or its
//! end; its start wakes no thread (it woke those waiting, only for them to wait [`SETTLE`]
//! more, on the request's way out). Two forms:
//! - **A job held here** ([`when_slack`]): the next worker's confinement is not handed to a
//!   pool thread until then, so that its order wakes no thread on the child's path either.
//!   One ordered when no model call follows (a child stopped before its call) waits for the
//!   next call, or for a session that waits for it.
//! - **A thread that waits here** ([`wait_for_slack`]): the closer's, handed the closed
//!   session at once, waits at most [`HOLD`] (a closed worker is a live process: a parent
//!   whose code runs for a while after its last child has no model call in flight).
//!
//! Neither waits while a session waits for a worker being confined, nor when a run ends:
//! each holds an [`Urgent`] meanwhile. Measured in the bench guide (`--bench tree`, where a
//! child's cost went).

use std::future::Future;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::lock::lock;

/// The longest a waiting thread waits for a model call (or an urgent need) to start.
pub(crate) const HOLD: Duration = Duration::from_millis(50);
/// How long a model call has been in flight before background work goes: its request has
/// left by then.
pub(crate) const SETTLE: Duration = Duration::from_millis(2);

/// What hands a held job to its thread.
pub(crate) type Release = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    /// Root-model calls of this process's runs in flight.
    calls: usize,
    /// Since when some call has been in flight without a break (`None`: none is).
    since: Option<Instant>,
    /// Calls ended so far.
    ended: u64,
    /// Callers that need background work done now.
    urgent: usize,
    /// Jobs waiting for slack, in the order they were held.
    held: Vec<Release>,
}

impl State {
    /// Whether background work may go now.
    fn slack(&self) -> bool {
        self.urgent > 0 || self.since.is_some_and(|since| since.elapsed() >= SETTLE)
    }
}

fn state() -> &'static (Mutex<State>, Condvar) {
    static STATE: OnceLock<(Mutex<State>, Condvar)> = OnceLock::new();
    STATE.get_or_init(Default::default)
}

/// Background work may go: the waiting threads go on, and every held job is handed to its
/// thread (outside the lock: a release sends on a channel).
fn release(mut guard: MutexGuard<'_, State>) {
    state().1.notify_all();
    let held = std::mem::take(&mut guard.held);
    drop(guard);
    for job in held {
        job();
    }
}

/// Runs `job` (which hands a background job to its thread) now if background work may go,
/// else holds it until it may (see the [module docs](self)).
pub(crate) fn when_slack(job: Release) {
    let mut state = lock(&state().0);
    if state.slack() {
        drop(state);
        job();
    } else {
        state.held.push(job);
    }
}

/// A model call of a run in flight, until dropped: its end hands over what is held.
struct ModelCall(());

impl ModelCall {
    fn begin() -> Self {
        let mut state = lock(&state().0);
        state.calls += 1;
        state.since.get_or_insert_with(Instant::now);
        Self(())
    }
}

impl Drop for ModelCall {
    fn drop(&mut self) {
        let mut state = lock(&state().0);
        state.calls = state.calls.saturating_sub(1);
        state.ended += 1;
        if state.calls == 0 {
            state.since = None;
        }
        release(state);
    }
}

/// Runs `call`, a run's call to its model: background work held meanwhile goes once it has
/// been in flight for [`SETTLE`] (a timer of the call's own task), or when it ends.
pub(crate) async fn in_flight<F: Future>(call: F) -> F::Output {
    let _in_flight = ModelCall::begin();
    let mut call = std::pin::pin!(call);
    tokio::select! {
        biased;
        out = &mut call => return out,
        () = tokio::time::sleep(SETTLE) => release(lock(&state().0)),
    }
    call.await
}

/// A need for background work done now (a session waiting for a worker, a run's end), until
/// dropped: what is held goes at once, and what is ordered meanwhile is not held.
#[derive(Debug)]
pub(crate) struct Urgent(());

impl Urgent {
    pub(crate) fn begin() -> Self {
        let mut state = lock(&state().0);
        state.urgent += 1;
        release(state);
        Self(())
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
            // A call's start wakes no one: its timer does, at `SETTLE`.
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

impl Drop for Urgent {
    fn drop(&mut self) {
        let mut state = lock(&state().0);
        state.urgent = state.urgent.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// The state is process-wide: the tests that change it take turns.
    static TURN: Mutex<()> = Mutex::new(());

    /// A job that counts its runs in `ran`.
    fn counted(ran: &Arc<AtomicUsize>) -> Release {
        let ran = Arc::clone(ran);
        Box::new(move || {
            ran.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[test]
    fn a_job_is_held_until_a_model_call_has_been_in_flight_for_its_settling_time() {
        let _turn = lock(&TURN);
        let ran = Arc::new(AtomicUsize::new(0));
        // No call in flight: held, however long.
        when_slack(counted(&ran));
        std::thread::sleep(SETTLE * 10);
        assert_eq!(ran.load(Ordering::SeqCst), 0, "ran with no call in flight");
        // A call of 200 ms hands it over after SETTLE, while it is still in flight.
        let rt = crate::runtime::shared();
        let started = Instant::now();
        let seen = rt.block_on(in_flight(async {
            let deadline = Instant::now() + Duration::from_secs(10);
            while ran.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (ran.load(Ordering::SeqCst), started.elapsed())
        }));
        assert_eq!(seen.0, 1, "not handed over during the call");
        assert!(seen.1 >= SETTLE, "handed over after {:?}", seen.1);
        // One ordered while a call has been in flight that long runs at once.
        let call = ModelCall::begin();
        lock(&state().0).since = Some(Instant::now() - SETTLE);
        when_slack(counted(&ran));
        assert_eq!(ran.load(Ordering::SeqCst), 2);
        drop(call);
        assert_eq!(lock(&state().0).calls, 0);
        assert!(lock(&state().0).since.is_none());
    }

    #[test]
    fn a_waiting_thread_goes_once_a_call_settled_or_its_hold_passed() {
        let _turn = lock(&TURN);
        // Nothing in flight: the hold is the bound.
        let started = Instant::now();
        wait_for_slack(Duration::from_millis(60));
        assert!(started.elapsed() >= Duration::from_millis(60));
        // A thread waiting (up to 20 s) goes once a call of 200 ms has been in flight for
        // its settling time, while it is still in flight.
        let waiter = std::thread::spawn(|| {
            wait_for_slack(Duration::from_secs(20));
            Instant::now()
        });
        std::thread::sleep(Duration::from_millis(50));
        let (sent, ended) = crate::runtime::shared().block_on(in_flight(async {
            let sent = Instant::now();
            tokio::time::sleep(Duration::from_millis(200)).await;
            (sent, Instant::now())
        }));
        let went = waiter.join().expect("the waiter ends");
        assert!(
            went >= sent + SETTLE,
            "went {:?} after the call",
            went - sent
        );
        assert!(
            went < ended,
            "went only {:?} after the call ended",
            went - ended
        );
        // A call that ends before it settled lets a waiting thread go too.
        let waiter = std::thread::spawn(|| {
            let started = Instant::now();
            wait_for_slack(Duration::from_secs(20));
            started.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        crate::runtime::shared().block_on(in_flight(async {}));
        let waited = waiter.join().expect("the waiter ends");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
    }

    #[test]
    fn a_call_that_ends_before_it_settled_hands_over_what_is_held() {
        let _turn = lock(&TURN);
        let ran = Arc::new(AtomicUsize::new(0));
        when_slack(counted(&ran));
        // A model that answers at once: the call ends before it settled.
        crate::runtime::shared().block_on(in_flight(async {}));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert!(lock(&state().0).held.is_empty());
    }

    #[test]
    fn an_urgent_need_lets_everything_go_and_holds_nothing_meanwhile() {
        let _turn = lock(&TURN);
        let ran = Arc::new(AtomicUsize::new(0));
        when_slack(counted(&ran));
        let waiter = std::thread::spawn(|| {
            let started = Instant::now();
            wait_for_slack(Duration::from_secs(20));
            started.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        let urgent = Urgent::begin();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        let waited = waiter.join().expect("the waiter ends");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
        when_slack(counted(&ran));
        assert_eq!(ran.load(Ordering::SeqCst), 2, "held while urgent");
        drop(urgent);
        assert_eq!(lock(&state().0).urgent, 0);
        when_slack(counted(&ran));
        assert_eq!(
            ran.load(Ordering::SeqCst),
            2,
            "not held once no longer urgent"
        );
        drop(Urgent::begin());
        assert_eq!(ran.load(Ordering::SeqCst), 3);
    }
}
