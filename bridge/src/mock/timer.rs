//! Waiting for a request's deadline as precisely as the kernel's timers allow.
//!
//! tokio's own timer answers late by a phase: it rounds a deadline up to its 1 ms tick, and its
//! driver parks in `epoll_wait`, whose timeout is whole milliseconds rounded up again, so a
//! 50 ms sleep took 51–53 ms on the development machine, by how far into a tick it started.
//! A benchmark that subtracts raw calls from calls made with other gaps before them measured
//! that phase. So each wait has a timer of its own in the kernel: a `timerfd`
//! (`CLOCK_MONOTONIC`, the clock of [`Instant`], no timer slack) registered with the runtime's
//! reactor through [`AsyncFd`]: the reactor wakes when the kernel fires it, on a current-thread
//! or a multi-thread runtime alike, with no thread of its own and no spinning.
//!
//! A timer is a file descriptor for as long as its request waits. When one cannot be made (no
//! descriptors left under thousands of waiting requests, no `timerfd` on the system), the wait
//! falls back to tokio's sleep until the same deadline, never earlier and up to ~2 ms later;
//! the first fallback of a server is logged with its reason, and all are counted
//! ([`super::MockServer::timer_fallbacks`]).
//!
//! A kernel timer runs on real time: it does not follow tokio's paused clock
//! (`start_paused`, `time::pause`), so a test on a paused clock waits the mock's latency for
//! real.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The waits of one server, and how many of them had no kernel timer.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    fallbacks: AtomicU64,
}

impl Timers {
    /// Returns at `deadline` (at once when it has passed); never, for `None`.
    pub(crate) async fn wait_until(&self, deadline: Option<Instant>) {
        let Some(deadline) = deadline else {
            return std::future::pending().await;
        };
        if deadline <= Instant::now() {
            return;
        }
        let failure = match kernel::Timer::at(deadline) {
            Ok(timer) => match timer.expired().await {
                Ok(()) => return,
                Err(e) => e,
            },
            Err(e) => e,
        };
        if self.fallbacks.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                "mock LM server: a request's latency is waited on tokio's timer (up to ~2 ms \
                 late), as no kernel timer could be made: {failure}; later ones are counted, \
                 not logged"
            );
        }
        tokio::time::sleep_until(deadline.into()).await;
    }

    /// Waits that fell back to tokio's timer so far.
    pub(crate) fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
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
    pub(super) struct Timer(AsyncFd<OwnedFd>);

    impl Timer {
        /// Armed to fire at `deadline` or, by the time it takes to arm it, after.
        pub(super) fn at(deadline: Instant) -> io::Result<Timer> {
            let fd = timerfd_create(
                TimerfdClockId::Monotonic,
                TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
            )?;
            // SAFETY: the `AsyncFd` owns the `OwnedFd`, which keeps its descriptor open and the
            // same until it is dropped with it.
            let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
            // Relative to the kernel's clock as it arms the timer, read after `now`: never
            // early. (A zero value would disarm it, so at least a nanosecond.)
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_nanos(1));
            let it_value = Timespec::try_from(left).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a latency of {left:?} is beyond a kernel timer"),
                )
            })?;
            let once = Itimerspec {
                it_interval: Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                it_value,
            };
            timerfd_settime(fd.get_ref(), TimerfdTimerFlags::empty(), &once)?;
            Ok(Timer(fd))
        }

        /// Returns once the timer has fired.
        pub(super) async fn expired(&self) -> io::Result<()> {
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
    pub(super) enum Timer {}

    impl Timer {
        pub(super) fn at(_deadline: Instant) -> io::Result<Timer> {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this system has no `timerfd`",
            ))
        }

        pub(super) async fn expired(&self) -> io::Result<()> {
            match *self {}
        }
    }
}
