//! The worker module's one way to take a lock: a thread that panicked while holding one
//! leaves data that is still whole here (lists of pids, buffers, slots), so a poisoned lock
//! is taken as it is rather than spreading the panic to the threads that end and reap
//! workers.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `mutex`'s guard, poisoned or not.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
