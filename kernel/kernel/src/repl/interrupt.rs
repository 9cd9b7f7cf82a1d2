//! Cell interrupts: a watchdog thread per session stops a block that outlives its time limit,
//! whose session token is cancelled, or that a caller interrupts
//! ([`Watchdog::interrupt_running`], a notebook's stop button).
//!
//! Firing does three things: cancels the block's [`CancellationToken`] (in-flight
//! `llm_query` calls return at once), raises `CellTimeout`/`CellCancelled` asynchronously in
//! the session's Python thread with `PyThreadState_SetAsyncExc` (stops pure-Python loops),
//! and sets the block's stop event (wakes the patched `time.sleep` in any of the session's
//! threads). The interrupt classes derive from `BaseException`, and the watchdog raises again
//! every [`REFIRE_INTERVAL`] until the block ends, so `except Exception:` or even a bare
//! `except:` inside a loop cannot keep a cell alive.
//!
//! A caller's stop is latched: [`ReplSession::exec_until_stopped`](super::ReplSession::exec_until_stopped)
//! hands the watchdog the caller's token, and arming checks it, so a stop (a `StopHandle`, the
//! run deadline) that lands after the loop's last check but before the block is armed stops
//! the block as soon as it starts instead of being dropped. The token belongs to one block,
//! so a stop never leaks into a later block or run of the session.
//!
//! Arming wakes the watchdog thread only when it must: not when it already waits for an
//! earlier block's deadline that comes before the new one's (it then finds the new block when
//! that wait ends, and waits on), which spares a block the wake-up of another thread on its
//! path; a block stopped before it was armed, or due sooner, wakes it.
//!
//! Races are closed by the GIL: the session thread arms and disarms while holding it, the
//! watchdog checks "still armed for this block?" and raises while holding it, and disarming
//! clears any raise still pending, so an interrupt never lands outside the user's code.

use std::os::raw::c_long;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

/// How often a fired interrupt is raised again while the block keeps running.
pub(crate) const REFIRE_INTERVAL: Duration = Duration::from_millis(20);

/// What a worker's parent is told about the running block (see [`super::local::Embedding`]).
pub(crate) trait BlockEvents: Send + Sync + std::fmt::Debug {
    /// The user code of an interrupted block has returned: the block is winding down (its
    /// processes are being ended) and will report soon. Called on the session thread.
    fn interrupted_code_returned(&self);
}

/// Why a block was interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InterruptReason {
    Timeout,
    Cancelled,
}

#[derive(Debug)]
struct Armed {
    block: u64,
    deadline: Instant,
    thread_id: c_long,
    session: Py<PyAny>,
    timeout_class: Py<PyAny>,
    cancelled_class: Py<PyAny>,
    cell_token: CancellationToken,
    session_token: CancellationToken,
    /// The session token was already cancelled when the block started: not a reason to stop it.
    cancelled_at_start: bool,
    /// The caller's stop for this block: cancelled before or while it runs, it stops it.
    stop: Option<CancellationToken>,
    /// A caller asked to stop this block (and only this block).
    interrupt_requested: bool,
    fired: Option<InterruptReason>,
}

#[derive(Debug, Default)]
struct WatchState {
    armed: Option<Armed>,
    shutdown: bool,
    /// When the watchdog thread's timed wait ends, while it waits with a timeout.
    waiting_until: Option<Instant>,
}

/// One session's watchdog (shared by the session thread and the watchdog thread).
#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    state: Mutex<WatchState>,
    wake: Condvar,
}

/// What the session thread hands the watchdog when a block starts.
#[derive(Debug)]
pub(crate) struct ArmRequest {
    pub(crate) block: u64,
    pub(crate) timeout: Duration,
    pub(crate) thread_id: c_long,
    /// The support module's `Session` (its `killing` and `stop` are set on firing).
    pub(crate) session: Py<PyAny>,
    pub(crate) timeout_class: Py<PyAny>,
    pub(crate) cancelled_class: Py<PyAny>,
    pub(crate) cell_token: CancellationToken,
    pub(crate) session_token: CancellationToken,
    /// Stops the block when cancelled, even if that happened before it was armed.
    pub(crate) stop: Option<CancellationToken>,
}

impl Watchdog {
    fn lock(&self) -> MutexGuard<'_, WatchState> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Start watching a block (call with the GIL held, just before running user code).
    pub(crate) fn arm(&self, _py: Python<'_>, req: ArmRequest) {
        let cancelled_at_start = req.session_token.is_cancelled();
        // A limit too far out to represent is, in practice, none: a century.
        let deadline = Instant::now()
            .checked_add(req.timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 86_400));
        let mut state = self.lock();
        let wakes_in_time = state.waiting_until.is_some_and(|until| until <= deadline);
        let stopped = req
            .stop
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled);
        state.armed = Some(Armed {
            block: req.block,
            deadline,
            thread_id: req.thread_id,
            session: req.session,
            timeout_class: req.timeout_class,
            cancelled_class: req.cancelled_class,
            cell_token: req.cell_token,
            session_token: req.session_token,
            cancelled_at_start,
            stop: req.stop,
            interrupt_requested: false,
            fired: None,
        });
        drop(state);
        if !wakes_in_time || stopped {
            self.wake.notify_all();
        }
    }

    /// Stop watching (call with the GIL held, right after user code returned); clears an
    /// interrupt still pending for the thread. Returns why the block was interrupted, if it was.
    pub(crate) fn disarm(&self, py: Python<'_>) -> Option<InterruptReason> {
        let armed = self.lock().armed.take();
        let armed = armed?;
        if armed.fired.is_some() {
            // SAFETY: we hold the GIL; a NULL exception clears the thread's pending one.
            unsafe {
                pyo3::ffi::PyThreadState_SetAsyncExc(armed.thread_id, std::ptr::null_mut());
            }
            // Member assignment and a builtin call: no Python frames run, nothing is traced.
            let stopped = armed.session.bind(py).setattr("killing", py.None());
            let untraced = py
                .import("sys")
                .and_then(|sys| sys.call_method1("settrace", (py.None(),)));
            if let Err(e) = stopped.and(untraced) {
                tracing::warn!("could not reset a stopped block's interrupt state: {e}");
            }
        }
        armed.fired
    }

    /// Stop the block running now, if any, as if cancelled; later blocks are unaffected.
    /// Returns whether a block was running.
    pub(crate) fn interrupt_running(&self) -> bool {
        let mut state = self.lock();
        let Some(armed) = state.armed.as_mut() else {
            return false;
        };
        armed.interrupt_requested = true;
        drop(state);
        self.wake.notify_all();
        true
    }

    /// Wake the watchdog to re-check (e.g. the session token was cancelled).
    pub(crate) fn notify(&self) {
        self.wake.notify_all();
    }

    /// Stop the watchdog thread.
    pub(crate) fn shutdown(&self) {
        self.lock().shutdown = true;
        self.wake.notify_all();
    }

    /// The watchdog thread's loop (returns after [`Watchdog::shutdown`]).
    pub(crate) fn run(self: Arc<Self>) {
        let mut state = self.lock();
        loop {
            if state.shutdown {
                return;
            }
            let Some(armed) = state.armed.as_mut() else {
                state = self.wait(state, None);
                continue;
            };
            let now = Instant::now();
            let cancelled = armed.interrupt_requested
                || armed
                    .stop
                    .as_ref()
                    .is_some_and(CancellationToken::is_cancelled)
                || (!armed.cancelled_at_start && armed.session_token.is_cancelled());
            let reason = match armed.fired {
                Some(reason) => reason,
                None if cancelled => InterruptReason::Cancelled,
                None if now >= armed.deadline => InterruptReason::Timeout,
                None => {
                    let wait = armed.deadline - now;
                    state = self.wait(state, Some(wait));
                    continue;
                }
            };
            if armed.fired.is_none() {
                // Decided now, so the block counts as interrupted even if it finishes before
                // the exception lands; then wake in-flight sub-calls (they hold no GIL).
                armed.fired = Some(reason);
                armed.cell_token.cancel();
                tracing::info!(block = armed.block, ?reason, "interrupting a running block");
            }
            let block = armed.block;
            drop(state);
            Python::attach(|py| self.fire(py, block, reason));
            state = self.lock();
            if state.armed.as_ref().is_some_and(|a| a.block == block) {
                state = self.wait(state, Some(REFIRE_INTERVAL));
            }
        }
    }

    fn wait<'a>(
        &self,
        mut state: MutexGuard<'a, WatchState>,
        timeout: Option<Duration>,
    ) -> MutexGuard<'a, WatchState> {
        state.waiting_until = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut state = match timeout {
            Some(t) => match self.wake.wait_timeout(state, t) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            },
            None => match self.wake.wait(state) {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            },
        };
        state.waiting_until = None;
        state
    }

    /// Raise the interrupt in the session thread if `block` is still running (GIL held, so
    /// the session thread cannot disarm in between).
    fn fire(&self, py: Python<'_>, block: u64, reason: InterruptReason) {
        let session = {
            let mut state = self.lock();
            let Some(armed) = state.armed.as_mut().filter(|a| a.block == block) else {
                return;
            };
            armed.fired = Some(reason);
            let class = match reason {
                InterruptReason::Timeout => &armed.timeout_class,
                InterruptReason::Cancelled => &armed.cancelled_class,
            };
            // A member assignment (no Python code runs, the GIL stays ours): interrupts
            // created from now on arm the kill tracer.
            if let Err(e) = armed.session.bind(py).setattr("killing", class) {
                tracing::warn!("could not mark a block as being stopped: {e}");
            }
            // SAFETY: we hold the GIL; `class` is a live exception class.
            unsafe {
                pyo3::ffi::PyThreadState_SetAsyncExc(armed.thread_id, class.as_ptr());
            }
            armed.session.clone_ref(py)
        };
        // Outside our lock: setting the event runs Python code that may release the GIL.
        if let Err(e) = session
            .bind(py)
            .getattr("stop")
            .and_then(|stop| stop.call_method0("set"))
        {
            tracing::warn!("could not set a block's stop event: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block's arming as the session thread makes it, for a session object with `stop`
    /// (which firing sets) and no thread to raise into.
    fn request(py: Python<'_>, block: u64, timeout: Duration, session: &Py<PyAny>) -> ArmRequest {
        let class = py
            .get_type::<pyo3::exceptions::PyTimeoutError>()
            .into_any()
            .unbind();
        ArmRequest {
            block,
            timeout,
            thread_id: 0,
            session: session.clone_ref(py),
            timeout_class: class.clone_ref(py),
            cancelled_class: class,
            cell_token: CancellationToken::new(),
            session_token: CancellationToken::new(),
            stop: None,
        }
    }

    /// Waits (bounded) until `session.stop` is set; how long that took.
    fn stopped_within(session: &Py<PyAny>, bound: Duration) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < bound {
            let set = Python::attach(|py| {
                session
                    .bind(py)
                    .getattr("stop")
                    .and_then(|stop| stop.call_method0("is_set"))
                    .and_then(|set| set.is_truthy())
            });
            if set.expect("reads the event") {
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    #[test]
    fn a_block_is_stopped_at_its_own_deadline_whether_the_watchdog_waits_for_an_earlier_or_a_later_one()
     {
        Python::initialize();
        let watchdog = Arc::new(Watchdog::default());
        let runner = Arc::clone(&watchdog);
        let thread = std::thread::spawn(move || runner.run());
        let session = |py: Python<'_>| -> Py<PyAny> {
            py.eval(
                c"__import__('types').SimpleNamespace(killing=None, stop=__import__('threading').Event())",
                None,
                None,
            )
            .expect("a session object")
            .unbind()
        };
        // The watchdog waits for a block due in a minute, which ends at once; the next block
        // is due sooner: arming it must wake the watchdog, or it is stopped a minute late.
        let (long, short) = Python::attach(|py| (session(py), session(py)));
        Python::attach(|py| watchdog.arm(py, request(py, 1, Duration::from_secs(60), &long)));
        std::thread::sleep(Duration::from_millis(50));
        Python::attach(|py| watchdog.disarm(py));
        Python::attach(|py| watchdog.arm(py, request(py, 2, Duration::from_millis(100), &short)));
        assert!(
            stopped_within(&short, Duration::from_secs(20)).is_some(),
            "a block due sooner than the watchdog's wait was not stopped"
        );
        Python::attach(|py| watchdog.disarm(py));
        // The watchdog waits for a block due in 300 ms, which ends at once; the next block is
        // due later: it is not woken, and finds the block when its wait ends.
        let (first, second) = Python::attach(|py| (session(py), session(py)));
        Python::attach(|py| watchdog.arm(py, request(py, 3, Duration::from_millis(300), &first)));
        std::thread::sleep(Duration::from_millis(50));
        Python::attach(|py| watchdog.disarm(py));
        Python::attach(|py| watchdog.arm(py, request(py, 4, Duration::from_millis(600), &second)));
        let took = stopped_within(&second, Duration::from_secs(20))
            .expect("a block due after the watchdog's wait was not stopped");
        // Not a speed check: only that it was not stopped at the earlier block's deadline.
        assert!(took >= Duration::from_millis(500), "stopped after {took:?}");
        assert!(
            stopped_within(&first, Duration::from_millis(1)).is_none(),
            "the ended block was stopped"
        );
        Python::attach(|py| watchdog.disarm(py));
        watchdog.shutdown();
        thread.join().expect("the watchdog ends");
    }
}
