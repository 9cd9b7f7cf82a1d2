//! Sessions closed off the closing thread: while a run keeps workers ready (`pool.rs`), a
//! closed session's worker exit, reap and scratch removal are jobs for one closer thread, so
//! that neither a child nor its parent waits for them; the run's end waits for them all
//! ([`flush`]). At most [`BACKLOG`] are handed over at once; past that a session is closed on
//! its own thread (its child waits for its worker's end), so that children closed faster
//! than the one closer thread ends their workers (a flood of quick children on a loaded
//! machine) do not leave that many idle workers alive, a Python each, until it catches up.

use std::sync::mpsc::{self, Sender};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use super::lock::lock;
use super::spawn::{SpawnJob, job_threads};

/// Closed sessions handed over and not finished yet, at most (see the [module docs](self)).
const BACKLOG: usize = 4;

/// The most one job takes: a worker is given 2 s to exit, killed, waited for 2 s more, each
/// wait bounded by its reaper's 1 s.
const JOB_BOUND: Duration = Duration::from_secs(5);

/// The closer thread's queue.
fn closer() -> &'static Mutex<Sender<SpawnJob>> {
    static CLOSER: OnceLock<Mutex<Sender<SpawnJob>>> = OnceLock::new();
    CLOSER.get_or_init(|| job_threads("rlm-worker-closer", 1))
}

/// Jobs handed over and not finished yet, and the signal that one finished.
fn pending() -> &'static (Mutex<usize>, Condvar) {
    static PENDING: OnceLock<(Mutex<usize>, Condvar)> = OnceLock::new();
    PENDING.get_or_init(Default::default)
}

/// Runs `job` on the closer thread once a run of this process waits for a model
/// (`quiet.rs`); hands it back, to be run by the caller now, when [`BACKLOG`] jobs are
/// handed over already (not counted), or when that thread is gone (still counted).
pub(crate) fn hand_over(job: SpawnJob) -> Result<(), SpawnJob> {
    let (count, done) = pending();
    {
        let mut left = lock(count);
        if *left >= BACKLOG {
            return Err(job);
        }
        *left += 1;
    }
    let counted: SpawnJob = Box::new(move || {
        super::quiet::wait_for_slack(super::quiet::HOLD);
        job();
        *lock(count) -= 1;
        done.notify_all();
    });
    lock(closer())
        .send(counted)
        .map_err(|mpsc::SendError(job)| job)
}

/// Waits until every job handed over has run (bounded by [`JOB_BOUND`] a job).
pub(crate) fn flush() {
    // The jobs waiting for a model call (`quiet.rs`) go now.
    let _urgent = super::quiet::Urgent::begin();
    let (count, done) = pending();
    let left = lock(count);
    let wait = JOB_BOUND * u32::try_from((*left).max(1)).unwrap_or(u32::MAX / 8);
    let _ = done
        .wait_timeout_while(left, wait, |left| *left > 0)
        .unwrap_or_else(PoisonError::into_inner);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn past_its_backlog_a_close_is_handed_back_and_once_caught_up_handed_over_again() {
        // The closer thread held by its first job, the others waiting behind it.
        let (release, held) = mpsc::channel::<()>();
        let held = Arc::new(Mutex::new(held));
        for _ in 0..BACKLOG {
            let held = Arc::clone(&held);
            let job: SpawnJob = Box::new(move || {
                let _ = lock(&held).recv_timeout(Duration::from_secs(10));
            });
            assert!(hand_over(job).is_ok(), "a close within the backlog");
        }
        let (ran, done) = mpsc::channel();
        let Err(back) = hand_over(Box::new(move || {
            let _ = ran.send(());
        })) else {
            panic!("a close past the backlog was handed over");
        };
        back();
        assert!(
            done.try_recv().is_ok(),
            "the close handed back is the one given"
        );
        for _ in 0..BACKLOG {
            let _ = release.send(());
        }
        flush();
        assert_eq!(*lock(&pending().0), 0, "the backlog was not worked off");
        let (ran, done) = mpsc::channel();
        assert!(
            hand_over(Box::new(move || {
                let _ = ran.send(());
            }))
            .is_ok(),
            "a close once the closer caught up"
        );
        flush();
        assert!(done.try_recv().is_ok(), "the close handed over ran");
    }
}
