//! Stopping something when a cancellation token is cancelled, without a thread or a task to
//! watch the token: [`StopWatch`].
//!
//! Two things stop on tokens they do not own: an isolated session's block (its stop token or
//! the session's, `worker/parent.rs`: the block's caller is told to interrupt its worker)
//! and an `rlm_query` child (the block that started it, or its parent's run: the child's run
//! is stopped, its block interrupted, `rlm/runner.rs`). A tokio task watching the tokens did
//! both, a thread of the runtime woken when it was spawned and again when it was ended, on
//! every block's and every child's path (~10-20 µs of the caller's each). Here each token's
//! wait list holds a waker, and the thread that cancels a token runs the stop: nothing is
//! woken unless a token is cancelled. Dropped, the watch leaves the wait lists, and from then
//! on nothing is stopped by it: a stop running on another thread is waited for.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Wake, Waker};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// What a watch does when one of its tokens is cancelled.
type Stop = Box<dyn FnOnce() + Send>;

/// Runs a stop once one of its tokens is cancelled, on the thread that cancels it (see the
/// [module docs](self)).
pub(crate) struct StopWatch(Arc<Watch>);

struct Watch {
    /// One wait per token, each registered with the watch's waker; emptied by the first stop
    /// and when the watch is dropped (a registered wait holds the waker, which holds this).
    waits: Mutex<Vec<Pin<Box<WaitForCancellationFutureOwned>>>>,
    /// Taken by the first stop, which runs it holding this lock, or by the drop.
    stop: Mutex<Option<Stop>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl StopWatch {
    /// Watches `tokens`; `stop` runs once, on the thread that cancels the first of them, or
    /// here if one is cancelled already.
    pub(crate) fn arm(
        tokens: impl IntoIterator<Item = CancellationToken>,
        stop: impl FnOnce() + Send + 'static,
    ) -> Self {
        let watch = Arc::new(Watch {
            waits: Mutex::new(
                tokens
                    .into_iter()
                    .map(|token| Box::pin(token.cancelled_owned()))
                    .collect(),
            ),
            stop: Mutex::new(Some(Box::new(stop))),
        });
        // Registers the waker, or finds a token cancelled already.
        watch.poll();
        Self(watch)
    }
}

impl Drop for StopWatch {
    fn drop(&mut self) {
        lock(&self.0.waits).clear();
        // Waits for a stop running on another thread; none runs after this.
        drop(lock(&self.0.stop).take());
    }
}

impl Watch {
    /// Polls the waits (a token's cancellation wakes the watch, and the waits are polled
    /// again): the first that is cancelled runs the stop.
    fn poll(self: &Arc<Self>) {
        let waker = Waker::from(Arc::clone(self));
        let mut context = Context::from_waker(&waker);
        let mut waits = lock(&self.waits);
        if waits
            .iter_mut()
            .any(|wait| wait.as_mut().poll(&mut context).is_ready())
        {
            // Emptied first: a stop that cancels another of the tokens wakes a poll that
            // finds nothing to do.
            waits.clear();
            drop(waits);
            let mut stop = lock(&self.stop);
            if let Some(stop) = stop.take() {
                stop();
            }
        }
    }
}

impl Wake for Watch {
    fn wake(self: Arc<Self>) {
        self.poll();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.poll();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// A stop that says so on `stops`.
    fn told(stops: &mpsc::Sender<()>) -> impl FnOnce() + Send + 'static {
        let stops = stops.clone();
        move || {
            let _ = stops.send(());
        }
    }

    #[test]
    fn a_stop_watch_stops_once_from_the_cancelling_thread_and_dropped_leaves_nothing_behind() {
        let (stops, stopped) = mpsc::channel();
        let (stop, session) = (CancellationToken::new(), CancellationToken::new());
        let (on, ran_on) = mpsc::channel();
        let watch = StopWatch::arm([stop.clone(), session.clone()], move || {
            let _ = on.send(std::thread::current().id());
        });
        assert!(
            ran_on.try_recv().is_err(),
            "stopped before any token was cancelled"
        );
        let canceller = std::thread::spawn(move || {
            session.cancel();
            std::thread::current().id()
        })
        .join()
        .expect("cancelled");
        let thread = ran_on.try_recv().expect("stopped by the cancel");
        assert_eq!(thread, canceller, "not run by the thread that cancelled");
        stop.cancel();
        assert!(ran_on.try_recv().is_err(), "stopped twice");
        drop(watch);

        // A token cancelled before the watch is armed stops at once.
        let watch = StopWatch::arm([stop.clone()], told(&stops));
        assert!(stopped.try_recv().is_ok());
        drop(watch);

        // Dropped, a watch leaves the tokens' wait lists (its waits hold it: not a leak).
        let later = CancellationToken::new();
        let watch = StopWatch::arm([later.clone()], told(&stops));
        let kept = Arc::downgrade(&watch.0);
        drop(watch);
        assert!(
            kept.upgrade().is_none(),
            "the dropped watch is still referenced"
        );
        later.cancel();
        assert!(stopped.try_recv().is_err(), "a dropped watch stopped");
    }

    #[test]
    fn a_watch_dropped_while_its_stop_runs_returns_once_it_has_run() {
        let token = CancellationToken::new();
        let (entered, running) = mpsc::channel();
        let (finish, finishing) = mpsc::channel::<()>();
        let (done, finished) = mpsc::channel();
        let watch = StopWatch::arm([token.clone()], move || {
            let _ = entered.send(());
            let _ = finishing.recv_timeout(Duration::from_secs(10));
            let _ = done.send(());
        });
        let canceller = std::thread::spawn(move || token.cancel());
        running
            .recv_timeout(Duration::from_secs(10))
            .expect("the stop runs");
        let dropper = std::thread::spawn(move || {
            drop(watch);
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !dropper.is_finished(),
            "the drop returned while the stop ran"
        );
        let _ = finish.send(());
        dropper.join().expect("dropped");
        assert!(finished.try_recv().is_ok(), "the stop had not ended");
        canceller.join().expect("cancelled");
    }
}
