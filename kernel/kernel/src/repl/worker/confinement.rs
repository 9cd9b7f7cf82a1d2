//! The worker's one call into confinement: [`confine`] extends the parent's policy with what
//! the worker's Python needs to read and run, and enters it through the `sandbox` crate
//! (where every layer lives) while the worker is still single-threaded.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::repl::error::ReplError;

/// What of the interpreter's own files the worker needs.
#[derive(Debug, Default, Clone)]
pub(crate) struct PythonPaths {
    /// Read and executed (the prefixes).
    pub(crate) exec: Vec<PathBuf>,
    /// Read only (the rest of `sys.path`).
    pub(crate) read: Vec<PathBuf>,
}

/// Confines the calling process (single-threaded, interpreter started) by `policy` with
/// `python`'s files reachable; returns what is in force. In the confined process only:
/// `sandbox::enter` forks, and the interpreter is told so.
pub(crate) fn confine(
    mut policy: sandbox::Policy,
    level: sandbox::Level,
    python: PythonPaths,
) -> Result<sandbox::Report, ReplError> {
    for path in python.exec {
        policy = policy.allow_exec(path);
    }
    for path in python.read {
        policy = policy.allow_read(path);
    }
    let report = sandbox::enter(&policy, level).map_err(|e| ReplError::NotConfined {
        message: e.to_string(),
    })?;
    // `enter` forked (twice; a worker forked by the template was forked once more before it,
    // and ran no Python since): CPython resets its thread state and runs its at-fork hooks
    // (`random` reseeds) here, once, as after `os.fork()`.
    // SAFETY: the GIL is held, and this is the child of forks of single-threaded processes
    // whose one thread held no lock of the interpreter's, which is what
    // `PyOS_AfterFork_Child` is for.
    Python::attach(|_| unsafe { pyo3::ffi::PyOS_AfterFork_Child() });
    Ok(report)
}
