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
//! call of a run to its root model): its end, or a timer at [`SETTLE`] after the calls in
//! flight began. Its start wakes no thread (it woke those waiting, only for them to wait
//! [`SETTLE`] more, on the request's way out). Two forms:
//! - **A job held here** ([`when_slack`]): the next worker's confinement is not handed to a
//!   pool thread until then, so that its order wakes no thread on the child's path either.
//!   One ordered when no model call follows (a child stopped before its call) waits for the
//!   next call, or for a session that waits for it.
//! - **A thread that waits here** ([`wait_for_slack`]): the closer's, handed the closed
//!   session at once, waits at most [`HOLD`] (a closed worker is a live process: a parent
//!   whose code runs for a while after its last child has no model call in flight).
//!
//! **The timer is armed only when something waits for it**, since arming it is a wake-up
//! of its own: tokio's time driver unparks the thread parked in it for a timer earlier than
//! its next one (~10 µs of an in-process child, whose run holds no job and has no closer). A
//! call that starts while a job is held or a thread waits arms it in its own task, to fire
//! [`SETTLE`] after the calls in flight began (the common case: the next worker is ordered
//! as a child's session starts, before its call); a job held while calls are already in
//! flight and no timer is armed (children in parallel, one's session starting while
//! another's call is out) arms one in a task of the shared runtime; a thread that starts to
//! wait then times its own wait. At most one timer is armed at a time; the last call's end
//! lets everything go, armed or not.
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
    /// Threads waiting for slack.
    waiting: usize,
    /// The timer armed, by its number, if one is.
    timer: Option<u64>,
    /// Timers armed so far (each one's number).
    timers: u64,
}

impl State {
    /// Whether background work may go now.
    fn slack(&self) -> bool {
        self.urgent > 0 || self.since.is_some_and(|since| since.elapsed() >= SETTLE)
    }

    /// Whether something waits for the calls in flight to settle with no timer armed to
    /// let it go.
    fn needs_timer(&self) -> bool {
        self.timer.is_none() && (!self.held.is_empty() || self.waiting > 0) && !self.slack()
    }

    fn arm(&mut self) -> Armed {
        self.timers += 1;
        self.timer = Some(self.timers);
        Armed(self.timers)
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
        return;
    }
    state.held.push(job);
    // Calls in flight already, none of them timing: the shared runtime times them.
    if state.since.is_some() && state.needs_timer() {
        let armed = state.arm();
        drop(state);
        crate::runtime::shared().spawn(settle(armed));
    }
}

/// The armed timer, by its number: disarmed when dropped (a call that ended first).
struct Armed(u64);

impl Armed {
    /// Disarms it in `state`, the lock already held.
    fn disarm(&self, state: &mut State) {
        if state.timer == Some(self.0) {
            state.timer = None;
        }
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        self.disarm(&mut lock(&state().0));
    }
}

/// The timer: lets what waits go once the calls in flight have been in flight for
/// [`SETTLE`]; ends without a release when none is in flight any more (the last one's end let
/// it all go, and the next call's start arms another if something waits again).
async fn settle(armed: Armed) {
    loop {
        let at = {
            let mut state = lock(&state().0);
            match state.since {
                Some(since) if since.elapsed() < SETTLE => since + SETTLE,
                Some(_) => {
                    armed.disarm(&mut state);
                    release(state);
                    return;
                }
                None => {
                    armed.disarm(&mut state);
                    return;
                }
            }
        };
        tokio::time::sleep_until(at.into()).await;
    }
}

/// A model call of a run in flight, until dropped: its end hands over what is held.
struct ModelCall(());

impl ModelCall {
    /// The call counted, and the timer it arms if something waits (see the
    /// [module docs](self)).
    fn begin() -> (Self, Option<Armed>) {
        let mut state = lock(&state().0);
        state.calls += 1;
        state.since.get_or_insert_with(Instant::now);
        let armed = state.needs_timer().then(|| state.arm());
        (Self(()), armed)
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

/// Runs `call`, a run's call to its model: background work held meanwhile goes once the
/// calls in flight have been for [`SETTLE`] (a timer of the call's own task, armed only if
/// something waits), or when it ends.
pub(crate) async fn in_flight<F: Future>(call: F) -> F::Output {
    let (_in_flight, armed) = ModelCall::begin();
    let Some(armed) = armed else {
        return call.await;
    };
    let mut call = std::pin::pin!(call);
    tokio::select! {
        biased;
        out = &mut call => return out,
        () = settle(armed) => {}
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
    // Counted, so that a call that starts while it waits arms the timer.
    state.waiting += 1;
    loop {
        if state.urgent > 0 || state.ended != ended {
            break;
        }
        let now = Instant::now();
        let until = match state.since {
            Some(since) if now >= since + SETTLE => break,
            // A call's start wakes no one: its timer does, at `SETTLE`; one in flight
            // before the wait began may have none, and the wait ends then by itself.
            Some(since) => (since + SETTLE).min(deadline),
            None => deadline,
        };
        if now >= deadline {
            break;
        }
        state = changed
            .wait_timeout(state, until.saturating_duration_since(now))
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    state.waiting -= 1;
}

/// Timers armed so far in this process (see the [module docs](self)).
#[cfg(test)]
pub(crate) fn timers_armed() -> u64 {
    lock(&state().0).timers
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
        let (call, armed) = ModelCall::begin();
        assert!(armed.is_none(), "a timer armed with nothing waiting");
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
    fn a_call_arms_a_timer_only_when_something_waits_for_it() {
        let _turn = lock(&TURN);
        let rt = crate::runtime::shared();
        let armed = timers_armed();
        // Nothing held, no thread waiting (a run without a pool): no timer, during the call
        // or after it.
        rt.block_on(in_flight(async {
            tokio::time::sleep(SETTLE * 3).await;
            assert!(lock(&state().0).timer.is_none(), "a timer armed");
        }));
        assert_eq!(
            timers_armed(),
            armed,
            "a call with nothing waiting armed a timer"
        );
        // A job held before the call: the call arms one, and it is disarmed by its end.
        let ran = Arc::new(AtomicUsize::new(0));
        when_slack(counted(&ran));
        assert_eq!(
            timers_armed(),
            armed,
            "a held job armed a timer with no call in flight"
        );
        rt.block_on(in_flight(async {
            assert!(
                lock(&state().0).timer.is_some(),
                "no timer armed for the held job"
            );
        }));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(timers_armed(), armed + 1);
        let state = lock(&state().0);
        assert!(state.timer.is_none() && state.held.is_empty() && state.calls == 0);
    }

    /// That what waited went (`went`) once the calls in flight since `since` had been for
    /// [`SETTLE`], before the call that ended at `ended` did.
    fn went_at_its_settling_time(went: Instant, since: Instant, ended: Instant) {
        assert!(
            went >= since + SETTLE,
            "went {:?} after the call began",
            went - since
        );
        assert!(
            went < ended,
            "went only {:?} after the call ended",
            went - ended
        );
    }

    #[test]
    fn a_job_held_after_the_call_began_goes_at_its_settling_time() {
        let _turn = lock(&TURN);
        let armed = timers_armed();
        let went = Arc::new(Mutex::new(None));
        let job: Release = {
            let went = Arc::clone(&went);
            Box::new(move || *lock(&went) = Some(Instant::now()))
        };
        // A call of 300 ms that armed no timer (nothing waited as it began) gets the job a
        // moment after it began.
        let (since, ended) = crate::runtime::shared().block_on(in_flight(async {
            let since = lock(&state().0).since.expect("the call is counted");
            assert!(lock(&state().0).timer.is_none());
            when_slack(job);
            tokio::time::sleep(Duration::from_millis(300)).await;
            (since, Instant::now())
        }));
        let went = lock(&went).expect("the job went");
        went_at_its_settling_time(went, since, ended);
        assert_eq!(timers_armed(), armed + 1, "one timer armed for it");
        assert!(lock(&state().0).timer.is_none(), "the timer still armed");
    }

    #[test]
    fn a_thread_that_starts_waiting_while_a_call_is_in_flight_goes_at_its_settling_time() {
        let _turn = lock(&TURN);
        let (since, went, ended) = crate::runtime::shared().block_on(in_flight(async {
            let since = lock(&state().0).since.expect("the call is counted");
            let waiter = std::thread::spawn(|| {
                wait_for_slack(Duration::from_secs(20));
                Instant::now()
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
            (since, waiter, Instant::now())
        }));
        let went = went.join().expect("the waiter ends");
        went_at_its_settling_time(went, since, ended);
        assert_eq!(lock(&state().0).waiting, 0);
    }

    #[test]
    fn children_in_parallel_get_their_jobs_held_before_or_after_their_calls_began_going() {
        let _turn = lock(&TURN);
        let rt = crate::runtime::shared();
        let ran = Arc::new(AtomicUsize::new(0));
        // One job held before any call, as the first child's session starts.
        when_slack(counted(&ran));
        // 100 children's calls of 100 ms each, started 0-3 ms apart; a job held as each
        // starts, half of them after their call began.
        let calls: Vec<_> = (0..100u64)
            .map(|i| {
                let ran = Arc::clone(&ran);
                rt.spawn(async move {
                    tokio::time::sleep(Duration::from_micros(30 * i)).await;
                    if i % 2 == 0 {
                        when_slack(counted(&ran));
                    }
                    in_flight(async {
                        if i % 2 == 1 {
                            when_slack(counted(&ran));
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        ran.load(Ordering::SeqCst)
                    })
                    .await
                })
            })
            .collect();
        let seen: Vec<usize> = rt.block_on(async {
            let mut seen = Vec::new();
            for call in calls {
                seen.push(call.await.expect("a call"));
            }
            seen
        });
        assert_eq!(ran.load(Ordering::SeqCst), 101, "every job went");
        // Every call saw every job gone before it ended: none waited for a call's end.
        assert!(seen.iter().all(|&n| n == 101), "{seen:?}");
        let state = lock(&state().0);
        assert!(state.timer.is_none(), "a timer left armed");
        assert!(state.held.is_empty() && state.calls == 0 && state.since.is_none());
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
