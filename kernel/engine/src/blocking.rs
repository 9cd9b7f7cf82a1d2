//! Blocking work called from async code: [`off_worker`] runs it so that the other tasks of
//! the tokio worker it is called on go on meanwhile.
//!
//! The engine's async code calls a few synchronous APIs that wait on the disk: a
//! checkpoint's SQLite commit after every node, and the end-of-run wait for the event log's
//! writer thread. On a multi-threaded runtime they run under
//! [`tokio::task::block_in_place`], which hands the worker's queue to another thread first;
//! elsewhere (a current-thread runtime, a plain thread) they run as they are, since there
//! is no other worker to hand over to. The event log's per-event writes do not come here:
//! they go to the log's own thread ([`crate::jsonl::Background`]), which costs a channel
//! send per line instead of a hand-over.

use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs `work`, which blocks, without holding up the other tasks of the tokio worker it is
/// called on; see the module docs.
pub(crate) fn off_worker<T>(work: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}
