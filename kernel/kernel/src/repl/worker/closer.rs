//! Sessions closed off the closing thread: while a run keeps workers ready (`pool.rs`), a
//! closed session's worker exit, reap and scratch removal are jobs for one closer thread, so
//! that neither a child nor its parent waits for them; the run's end waits for them all
//! ([`flush`]).

use std::sync::mpsc::{self, Sender};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use super::lock::lock;
use super::spawn::{SpawnJob, job_threads};

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

/// Runs `job` on the closer thread; hands it back (to be run by the caller, still counted)
/// when that thread is gone.
pub(crate) fn hand_over(job: SpawnJob) -> Result<(), SpawnJob> {
    let (count, done) = pending();
    *lock(count) += 1;
    let counted: SpawnJob = Box::new(move || {
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
