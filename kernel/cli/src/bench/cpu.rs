//! Client CPU time: the process's (`getrusage`) less that of the in-process mock's threads,
//! read per thread from `/proc/self/task/TID/schedstat` (Linux; elsewhere the mock's share
//! cannot be told apart and is counted as the client's).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// User plus system CPU time of this process so far.
pub(crate) fn process() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` writes a `rusage` into the pointer it is given, which points at
    // memory of that type; on failure it writes nothing and the zeroed value stays.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The threads of one side (the in-process mock), for their CPU time.
#[derive(Debug, Clone, Default)]
pub(crate) struct Threads(Arc<Mutex<Vec<i64>>>);

impl Threads {
    /// Count the calling thread in (a runtime's `on_thread_start`).
    pub(crate) fn add_current(&self) {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `gettid` has no preconditions and cannot fail.
            let tid = i64::from(unsafe { libc::gettid() });
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(tid);
        }
    }

    /// CPU time of the threads so far (zero where it cannot be read).
    pub(crate) fn cpu(&self) -> Duration {
        let tids = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let nanos: u64 = tids
            .iter()
            .filter_map(|tid| {
                let text =
                    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
                text.split_whitespace().next()?.parse::<u64>().ok()
            })
            .sum();
        Duration::from_nanos(nanos)
    }
}
