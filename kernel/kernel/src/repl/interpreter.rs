//! The process-wide embedded interpreter: initialised once, patched once (routed stdio, no
//! stdin, interruptible `time.sleep`, spawn workers that find the session modules), shared
//! by every session through the GIL.
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
