//! Threads kept for the next job: what runs a worker's `rlm_query` children in the parent,
//! and reads the worker's link meanwhile (`parent.rs`: a call's children run on the kept
//! thread that read it, and the next one reads on).
//!
//! A child's loop blocks its thread until the child ends, and the worker's code may ask for
//! children from several of its threads at once, so each call needs a thread of its own; but
//! starting one per call put a thread's start (a stack mapped, the thread scheduled for the
//! first time: ~0.2 ms median on the 2-core development machine, ~1.5 ms at p75 under load)
//! between one child's end and the next child's start. So a job runs on an idle thread when
//! there is one, else on a thread started for it, and a thread that finished its job waits
//! for the next. The threads end when their [`Threads`] is dropped (the worker's link
//! closed): idle ones at once, busy ones after their job; jobs already queued still run.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use super::lock::lock;
use super::spawn::SpawnJob;

/// Threads that run jobs concurrently, kept for the next job (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct Threads {
    /// The name each thread gets.
    name: &'static str,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a job is queued or the threads are told to end.
    wake: Condvar,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<SpawnJob>,
    /// Threads waiting for a job.
    idle: usize,
    closed: bool,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("jobs", &self.jobs.len())
            .field("idle", &self.idle)
            .field("closed", &self.closed)
            .finish()
    }
}

impl Threads {
    /// No thread yet: the first job starts one.
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            name,
            shared: Arc::default(),
        }
    }

    /// Runs `job` on a thread that is idle, else on one started for it; `Err` when none
    /// could be started (the job is dropped unrun).
    pub(crate) fn run(&self, job: SpawnJob) -> std::io::Result<()> {
        {
            let mut queue = lock(&self.shared.queue);
            // Each queued job has an idle thread woken for it already.
            if queue.idle > queue.jobs.len() {
                queue.jobs.push_back(job);
                self.shared.wake.notify_one();
                return Ok(());
            }
        }
        let shared = Arc::clone(&self.shared);
        std::thread::Builder::new()
            .name(self.name.to_owned())
            .spawn(move || {
                job();
                serve(&shared);
            })
            .map(drop)
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        lock(&self.shared.queue).closed = true;
        self.shared.wake.notify_all();
    }
}

/// A thread's life after its first job: the next queued job, until the threads are closed.
fn serve(shared: &Shared) {
    loop {
        let job = {
            let mut queue = lock(&shared.queue);
            loop {
                if let Some(job) = queue.jobs.pop_front() {
                    break job;
                }
                if queue.closed {
                    return;
                }
                queue.idle += 1;
                queue = shared
                    .wake
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
                queue.idle -= 1;
            }
        };
        job();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(10);

    /// The thread a job ran on.
    fn where_it_runs(threads: &Threads) -> std::thread::ThreadId {
        let (tx, rx) = mpsc::channel();
        threads
            .run(Box::new(move || {
                let _ = tx.send(std::thread::current().id());
            }))
            .unwrap();
        rx.recv_timeout(WAIT).unwrap()
    }

    #[test]
    fn a_job_after_another_runs_on_the_same_thread() {
        let threads = Threads::new("rlm-test-threads");
        let first = where_it_runs(&threads);
        assert_ne!(first, std::thread::current().id());
        for _ in 0..5 {
            // The thread goes back to waiting after its job (the next job would otherwise,
            // rightly, get a thread of its own).
            wait_until_idle(&threads);
            assert_eq!(where_it_runs(&threads), first);
        }
    }

    fn wait_until_idle(threads: &Threads) {
        let deadline = std::time::Instant::now() + WAIT;
        while lock(&threads.shared.queue).idle == 0 {
            assert!(std::time::Instant::now() < deadline, "no thread went idle");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn jobs_at_once_each_get_a_thread_and_every_thread_ends_with_the_threads() {
        const JOBS: usize = 4;
        let threads = Threads::new("rlm-test-threads");
        // Every job waits until all have started: they only can if each has a thread.
        let started = Arc::new(std::sync::Barrier::new(JOBS));
        let (done_tx, done) = mpsc::channel();
        for _ in 0..JOBS {
            let (started, done_tx) = (Arc::clone(&started), done_tx.clone());
            threads
                .run(Box::new(move || {
                    started.wait();
                    let _ = done_tx.send(());
                }))
                .unwrap();
        }
        for _ in 0..JOBS {
            done.recv_timeout(WAIT).unwrap();
        }
        // Each thread holds the shared state while it lives.
        let shared = Arc::downgrade(&threads.shared);
        drop(threads);
        let deadline = std::time::Instant::now() + WAIT;
        while shared.strong_count() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{} threads outlived their `Threads`",
                shared.strong_count()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
