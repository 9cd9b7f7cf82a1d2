//! The process-wide embedded interpreter: initialised once, patched once (routed stdio, no
//! stdin, interruptible `time.sleep`, spawn workers that find the session modules), shared
//! by every session through the GIL; and, for a worker, its allocator's free pools written
//! once ahead of its first block ([`touch_free_pools`]).
//!
//! The support module is set up under a [`PyOnceLock`], never a plain `OnceLock`: its
//! initialiser runs Python code, so it holds the GIL, and a second thread that holds the GIL
//! (a Python thread of a host interpreter that imports the kernel) while it waits for the
//! first would deadlock. `PyOnceLock` releases the GIL while it waits.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::error::{PythonHost, ReplError};

const SUPPORT_SOURCE: &str = include_str!("support.py");

/// Handles into the support module (`support.py`), valid for the life of the process.
#[derive(Debug)]
pub(crate) struct Interpreter {
    pub(crate) support: Py<PyModule>,
}

static INTERPRETER: PyOnceLock<Result<Interpreter, String>> = PyOnceLock::new();

/// Whether the kernel started CPython (the `rlm` binary) rather than a host that embeds it.
static OWNS_INTERPRETER: AtomicBool = AtomicBool::new(false);

/// Starts CPython if this process does not run it yet, and sets up the support module.
pub(crate) fn start() -> Result<&'static Interpreter, ReplError> {
    // SAFETY: `Py_IsInitialized` may be called at any time, even before initialisation.
    if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
        OWNS_INTERPRETER.store(true, Ordering::Relaxed);
    }
    Python::initialize();
    Python::attach(interpreter)
}

/// Whose interpreter this is: the kernel's own, or a host program's that imported it.
pub(crate) fn host() -> PythonHost {
    if OWNS_INTERPRETER.load(Ordering::Relaxed) {
        PythonHost::Embedded
    } else {
        PythonHost::Package
    }
}

/// The interpreter, setting up the support module on first use.
pub(crate) fn interpreter(py: Python<'_>) -> Result<&'static Interpreter, ReplError> {
    INTERPRETER
        .get_or_init(py, || init(py))
        .as_ref()
        .map_err(|message| ReplError::Interpreter {
            message: message.clone(),
        })
}

fn init(py: Python<'_>) -> Result<Interpreter, String> {
    let source = CString::new(SUPPORT_SOURCE).map_err(|e| e.to_string())?;
    let support = PyModule::from_code(py, &source, c"<rlm-kernel>", c"_rlm_kernel")
        .map_err(|e| format!("loading the kernel support module failed: {e}"))?;
    let sys = py.import("sys").map_err(|e| e.to_string())?;
    sys.getattr("modules")
        .and_then(|m| m.set_item("_rlm_kernel", &support))
        .map_err(|e| e.to_string())?;
    support
        .call_method1("install", (sys, OWNS_INTERPRETER.load(Ordering::Relaxed)))
        .map_err(|e| format!("patching the interpreter failed: {e}"))?;
    Ok(Interpreter {
        support: support.unbind(),
    })
}

impl Interpreter {
    pub(crate) fn support<'py>(&self, py: Python<'py>) -> &Bound<'py, PyModule> {
        self.support.bind(py)
    }
}

/// Runs `wait` with the GIL released if the calling thread holds it (e.g. a Python extension
/// calling into the kernel): the session thread needs the GIL to answer. A process that never
/// started Python (the parent of isolated sessions) just waits.
#[cfg(not(Py_LIMITED_API))]
pub(crate) fn without_gil<T: Send>(wait: impl FnOnce() -> T + Send) -> T {
    // SAFETY: both may be called at any time; `PyGILState_Check` only once initialised.
    let attached =
        unsafe { pyo3::ffi::Py_IsInitialized() != 0 && pyo3::ffi::PyGILState_Check() == 1 };
    if attached {
        Python::attach(|py| py.detach(wait))
    } else {
        wait()
    }
}

/// Under the stable ABI (the Python package) there is no `PyGILState_Check`: attach (a no-op
/// on a thread that holds the GIL) and release. The package's process always runs Python.
#[cfg(Py_LIMITED_API)]
pub(crate) fn without_gil<T: Send>(wait: impl FnOnce() -> T + Send) -> T {
    Python::attach(|py| py.detach(wait))
}

/// How much of the small-object allocator's free memory [`touch_free_pools`] writes to once:
/// one arena's worth (pymalloc's arenas are 1 MiB on 64-bit builds), about what a block makes
/// of a 100 KB piece of text split into words.
const POOLS_TOUCHED: usize = 1 << 20;

/// pymalloc's largest block: the fewest allocations that reach every page of a pool.
const LARGEST_SMALL_BLOCK: usize = 512;

/// Writes once to [`POOLS_TOUCHED`] of the small-object allocator's free pools, and leaves
/// them free: the pools a worker's next block takes first for its new objects.
///
/// A worker is a fresh fork of the template, and the free pools of the arenas it inherited
/// are pages this process never wrote: the first write to each is a page fault (a zeroed page,
/// or a copy of the template's). A child's block over its 100 KB piece of text
/// (`len(context.split())`: 14 000 strings) took ~250 of them, ~0.4 ms of its path, where
/// the same block in a process that had written that memory before took none (in the bench
/// guide, "Session 19"). Allocating blocks of [`LARGEST_SMALL_BLOCK`] bytes takes pools the
/// way any size does (the arena most in use first, its most recently freed pool first), and
/// freeing them writes to every one (a freed block holds the link of its pool's free list):
/// the pools go back to their arenas' free lists, written, where the next block's new pools
/// come from. A worker built ahead does it while it waits for its session, once none came at
/// once after it said it is confined (a session that comes meanwhile waits for it to end), at
/// the cost of ~0.5 ms of its CPU and up to [`POOLS_TOUCHED`] of resident memory it would
/// otherwise take only when a block asks.
pub(crate) fn touch_free_pools(_py: Python<'_>) {
    let mut blocks = Vec::with_capacity(POOLS_TOUCHED / LARGEST_SMALL_BLOCK);
    for _ in 0..blocks.capacity() {
        // SAFETY: the GIL is held (`_py`), as the object allocator requires.
        let block = unsafe { pyo3::ffi::PyObject_Malloc(LARGEST_SMALL_BLOCK) };
        if block.is_null() {
            break;
        }
        blocks.push(block);
    }
    for block in blocks {
        // SAFETY: each was allocated above by the same allocator, under the same GIL, and is
        // freed once.
        unsafe { pyo3::ffi::PyObject_Free(block) };
    }
}
