//! The heap a run takes, counted on the test's own thread.
//!
//! The binary's allocator is the system's with a count kept per thread: bytes allocated
//! now and their peak. A `#[tokio::test]` runs its whole run on its one thread (a
//! current-thread runtime), so [`peak`] measures that run's heap alone, whatever the other
//! tests of the binary do meanwhile on theirs. Sizes, not times: the same run always
//! allocates the same bytes, so a ratio of two runs' peaks is a deterministic assertion.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    /// Bytes allocated minus bytes freed on this thread (a block freed on another thread
    /// than its own counts there).
    static NOW: Cell<isize> = const { Cell::new(0) };
    /// The highest `NOW` since the last [`peak`] started.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// The system allocator, counting per thread.
struct Counting;

fn count(grown: isize) {
    // `try_with`: a thread's last frees may come after its locals are gone.
    let _ = NOW.try_with(|now| {
        let bytes = now.get() + grown;
        now.set(bytes);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(bytes)));
    });
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            count(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `run` returns and the peak of heap bytes it added on this thread while it ran.
pub(crate) async fn peak<T>(run: impl Future<Output = T>) -> (T, usize) {
    let start = NOW.with(Cell::get);
    PEAK.with(|peak| peak.set(start));
    let out = run.await;
    let top = PEAK.with(Cell::get);
    (out, (top - start).max(0) as usize)
}
