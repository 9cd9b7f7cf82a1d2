//! Sessions closed off the closing thread: while a run keeps workers ready (`pool.rs`), a
//! closed session's worker exit, reap and scratch removal are jobs for one closer thread, so
//! that neither a child nor its parent waits for them; the run's end waits for them all
//! ([`flush`]).

use std::sync::mpsc::{self, Sender};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

/// The most one job takes: a worker is given 2 s to exit, killed, waited for 2 s more, each
/// wait bounded by its reaper's 1 s.
const JOB_BOUND: Duration = Duration::from_secs(5);

/// A closed session's end.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

struct Closer {
    jobs: Sender<Job>,
    /// Jobs handed over and not finished yet.
    pending: usize,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The closer thread's queue, and the signal that it finished a job.
fn closer() -> &'static (Mutex<Closer>, Condvar) {
    static CLOSER: OnceLock<(Mutex<Closer>, Condvar)> = OnceLock::new();
    CLOSER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("rlm-worker-closer".to_owned())
            .spawn(move || {
                for job in queue {
                    job();
                    let (closer, done) = closer();
                    lock(closer).pending -= 1;
                    done.notify_all();
                }
            });
        if let Err(e) = started {
            tracing::error!("cannot start the thread that ends closed workers: {e}");
        }
        (Mutex::new(Closer { jobs, pending: 0 }), Condvar::new())
    })
}

/// Runs `job` on the closer thread; hands it back when that thread is gone.
pub(crate) fn hand_over(job: Job) -> Result<(), Job> {
    let (closer, _) = closer();
    let mut closer = lock(closer);
    closer.pending += 1;
    closer.jobs.send(job).map_err(|mpsc::SendError(job)| {
        closer.pending -= 1;
        job
    })
}

/// Waits until every job handed over has run (bounded by [`JOB_BOUND`] a job).
pub(crate) fn flush() {
    let (closer, done) = closer();
    let pending = lock(closer);
    let wait = JOB_BOUND * u32::try_from(pending.pending.max(1)).unwrap_or(u32::MAX / 8);
    let _ = done
        .wait_timeout_while(pending, wait, |p| p.pending > 0)
        .unwrap_or_else(PoisonError::into_inner);
}
