//! Waiting for requests' deadlines as precisely as the kernel's timers allow.
//!
//! tokio's own timer answers late by a phase: it rounds a deadline up to its 1 ms tick, and its
//! driver parks in `epoll_wait`, whose timeout is whole milliseconds rounded up again, so a
//! 50 ms sleep took 51–53 ms on the development machine, by where in a millisecond it started.
//! A benchmark that subtracts raw calls from calls made after other gaps measured that phase.
//!
//! So a server has a timer in the kernel: one `timerfd` (`CLOCK_MONOTONIC`, the clock of
//! [`Instant`]; no timer slack) registered with the runtime's reactor through [`AsyncFd`], and
//! a queue of the waiting requests by deadline. The timer is armed for the earliest deadline; a
//! task of the server's reads it when it fires, wakes the requests whose deadlines have passed
//! and arms it for the next. The requests' own tasks answer: on a current-thread or a
//! multi-thread runtime alike, with no thread of its own and no spinning. One descriptor for
//! the server, not one a request: a descriptor a request cost ~15 µs of the mock's CPU in
//! system calls (creating, registering, arming, reading, closing it), and its one thread serves
//! hundreds of requests at once in the benchmarks.
//!
//! When the timer cannot be made at the server's start (no file descriptor left, no `timerfd`
//! on the system) or fails later, requests wait on tokio's sleep until the same deadline, never
//! earlier and up to ~2 ms later; that is logged once, and every such wait is counted
//! ([`super::MockServer::timer_fallbacks`]).
//!
//! A kernel timer runs on real time: it does not follow tokio's paused clock
//! (`start_paused`, `time::pause`), so a test on a paused clock waits the mock's latency for
//! real.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

/// A server's waits for deadlines.
#[derive(Debug)]
pub(crate) struct Timers {
    /// `None` when no kernel timer could be made: every wait sleeps on tokio's.
    kernel: Option<kernel::Timer>,
    queue: Mutex<Queue>,
    /// Set when the kernel timer failed after the start: the waits fall back.
    failed: AtomicBool,
    fallbacks: AtomicU64,
}

/// The requests waiting on the kernel timer.
#[derive(Debug, Default)]
struct Queue {
    /// By deadline, then ticket (two requests may share a deadline): the task to wake.
    waiting: BTreeMap<(Instant, u64), Waker>,
    next_ticket: u64,
    /// The deadline the timer is armed for, if it has not fired since.
    armed: Option<Instant>,
}

impl Timers {
    /// The server's timers, and the task that fires them until `shutdown` (on the current
    /// runtime).
    pub(crate) fn start(shutdown: CancellationToken) -> Arc<Timers> {
        let kernel = kernel::Timer::new()
            .inspect_err(|e| {
                tracing::warn!(
                    "mock LM server: latencies are waited on tokio's timer (whole milliseconds, \
                     up to ~2 ms late), as no kernel timer could be made: {e}"
                );
            })
            .ok();
        let timers = Arc::new(Timers {
            kernel,
            queue: Mutex::new(Queue::default()),
            failed: AtomicBool::new(false),
            fallbacks: AtomicU64::new(0),
        });
        if timers.kernel.is_some() {
            tokio::spawn(Arc::clone(&timers).fire(shutdown));
        }
        timers
    }

    /// Returns at `deadline` (at once when it has passed); never, for `None`.
    pub(crate) async fn wait_until(&self, deadline: Option<Instant>) {
        let Some(deadline) = deadline else {
            return std::future::pending().await;
        };
        if deadline <= Instant::now() {
            return;
        }
        if self.kernel.is_some() && !self.failed.load(Ordering::Acquire) {
            let fired = Wait {
                timers: self,
                deadline,
                ticket: None,
            }
            .await;
            if fired {
                return;
            }
        }
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep_until(deadline.into()).await;
    }

    /// Waits that fell back to tokio's timer so far.
    pub(crate) fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }

    /// Wakes the requests whose deadlines passed each time the timer fires, and arms it for
    /// the next; until `shutdown`, or until the timer fails (then every wait falls back).
    async fn fire(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(kernel) = &self.kernel else {
            return;
        };
        loop {
            tokio::select! {
                fired = kernel.fired() => {
                    if let Err(e) = fired {
                        tracing::warn!(
                            "mock LM server: its kernel timer failed ({e}); latencies are \
                             waited on tokio's timer from now on (whole milliseconds)"
                        );
                        self.failed.store(true, Ordering::Release);
                        self.queue().waiting.values().for_each(Waker::wake_by_ref);
                        return;
                    }
                }
                () = shutdown.cancelled() => return,
            }
            let now = Instant::now();
            let mut queue = self.queue();
            queue.armed = None;
            while let Some(entry) = queue.waiting.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                entry.remove().wake();
            }
            if let Some(&(next, _)) = queue.waiting.keys().next() {
                self.arm(&mut queue, next);
            }
        }
    }

    /// Arms the timer for `deadline` (under the queue's lock, so that it stays the earliest).
    fn arm(&self, queue: &mut Queue, deadline: Instant) {
        let Some(kernel) = &self.kernel else {
            return;
        };
        match kernel.arm(deadline) {
            Ok(()) => queue.armed = Some(deadline),
            Err(e) => {
                tracing::warn!(
                    "mock LM server: its kernel timer could not be armed ({e}); latencies are \
                     waited on tokio's timer from now on (whole milliseconds)"
                );
                self.failed.store(true, Ordering::Release);
                queue.waiting.values().for_each(Waker::wake_by_ref);
            }
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One request's place in the queue: `true` once its deadline has passed, `false` when the
/// kernel timer failed (the caller falls back). Leaves the queue when dropped.
struct Wait<'a> {
    timers: &'a Timers,
    deadline: Instant,
    ticket: Option<u64>,
}

impl Future for Wait<'_> {
    type Output = bool;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let timers = self.timers;
        if timers.failed.load(Ordering::Acquire) {
            self.leave();
            return Poll::Ready(false);
        }
        if self.deadline <= Instant::now() {
            self.leave();
            return Poll::Ready(true);
        }
        let mut queue = timers.queue();
        let ticket = *self.ticket.get_or_insert_with(|| {
            queue.next_ticket += 1;
            queue.next_ticket
        });
        queue
            .waiting
            .insert((self.deadline, ticket), cx.waker().clone());
        if queue.armed.is_none_or(|armed| self.deadline < armed) {
            timers.arm(&mut queue, self.deadline);
        }
        Poll::Pending
    }
}

impl Wait<'_> {
    fn leave(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.timers.queue().waiting.remove(&(self.deadline, ticket));
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(target_os = "linux")]
mod kernel {
    use std::io;
    use std::os::fd::OwnedFd;
    use std::time::{Duration, Instant};

    use rustix::time::{
        Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
        timerfd_settime,
    };
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;

    /// A one-shot `timerfd` on the runtime's reactor.
    #[derive(Debug)]
    pub(super) struct Timer(AsyncFd<OwnedFd>);

    impl Timer {
        /// A disarmed timer.
        pub(super) fn new() -> io::Result<Timer> {
            let fd = timerfd_create(
                TimerfdClockId::Monotonic,
                TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
            )?;
            // SAFETY: the `AsyncFd` owns the `OwnedFd`, which keeps its descriptor open and the
            // same until it is dropped with it.
            let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
            Ok(Timer(fd))
        }

        /// Armed to fire at `deadline` or, by the time it takes to arm it, after (never
        /// before): relative to the kernel's clock as it arms it, read after `now`.
        pub(super) fn arm(&self, deadline: Instant) -> io::Result<()> {
            // A zero value would disarm it: at least a nanosecond.
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_nanos(1));
            let it_value = Timespec::try_from(left).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a deadline {left:?} away is beyond a kernel timer"),
                )
            })?;
            let once = Itimerspec {
                it_interval: Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                it_value,
            };
            timerfd_settime(self.0.get_ref(), TimerfdTimerFlags::empty(), &once)?;
            Ok(())
        }

        /// Returns once the timer has fired.
        pub(super) async fn fired(&self) -> io::Result<()> {
            loop {
                let mut ready = self.0.readable().await?;
                let mut expirations = [0u8; 8];
                match ready.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut expirations)?)) {
                    Ok(read) => return read.map(drop),
                    // Not fired yet (a spurious wake-up): readiness cleared, wait again.
                    Err(_would_block) => {}
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod kernel {
    use std::io;
    use std::time::Instant;

    /// No kernel timer here: every wait falls back to tokio's.
    #[derive(Debug)]
    pub(super) enum Timer {}

    impl Timer {
        pub(super) fn new() -> io::Result<Timer> {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this system has no `timerfd`",
            ))
        }

        pub(super) fn arm(&self, _deadline: Instant) -> io::Result<()> {
            match *self {}
        }

        pub(super) async fn fired(&self) -> io::Result<()> {
            match *self {}
        }
    }
}
