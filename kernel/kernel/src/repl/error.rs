//! `ReplError`: what can go wrong with the kernel itself (a Python exception in a cell is not
//! one of these: it is reported in [`ExecutionResult::error`](super::ExecutionResult)).

use std::path::PathBuf;
use std::time::Duration;

/// Failures of the REPL kernel: starting the interpreter, loading contexts, a broken session.
#[derive(Debug, thiserror::Error)]
pub enum ReplError {
    /// The embedded interpreter could not be set up.
    #[error(
        "Could not start the embedded Python interpreter: {message}; check that CPython 3.11 with a shared `libpython` is installed and `bash .ci/setup` has run"
    )]
    Interpreter {
        /// What failed.
        message: String,
    },

    /// A Python package the kernel needs is missing.
    #[error(
        "Python package `{package}` is needed to load `{path}` but could not be imported ({message}); install it with `bash .ci/setup` (or `pip install -r .ci/requirements.txt`)"
    )]
    MissingPackage {
        /// The package, e.g. `polars`.
        package: String,
        /// The context file that needed it.
        path: PathBuf,
        /// The import error.
        message: String,
    },

    /// A context file or directory could not be read.
    #[error("Cannot read context `{path}`: {source}; check that the path exists and is readable")]
    ContextRead {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A context file is not valid UTF-8.
    #[error(
        "Context file `{path}` is not valid UTF-8 (first bad byte at offset {offset}, line {line}); convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`){hint}"
    )]
    ContextNotUtf8 {
        /// The file.
        path: PathBuf,
        /// Byte offset of the first invalid byte.
        offset: usize,
        /// 1-based line of the first invalid byte.
        line: usize,
        /// Extra advice (e.g. for a file inside a directory context).
        hint: String,
    },

    /// A context file does not parse in the format its extension names.
    #[error("Context file `{path}` is not valid {format}: {detail}; {fix}")]
    ContextMalformed {
        /// The file.
        path: PathBuf,
        /// The expected format, e.g. `JSON`.
        format: &'static str,
        /// Where and what, e.g. `line 3, column 7: expected value`.
        detail: String,
        /// What the user can do.
        fix: String,
    },

    /// Reading standard input for the `-` context failed.
    #[error("Cannot read the `-` context from standard input: {source}")]
    ContextStdin {
        /// The I/O error.
        source: std::io::Error,
    },

    /// The session's Python thread is gone (it failed to start or was shut down).
    #[error("The REPL session has stopped ({reason}); create a new session")]
    SessionClosed {
        /// Why, when known.
        reason: String,
    },

    /// A cell kept running after its time limit, blocked in native code that cannot be
    /// interrupted; the session stays busy until that code returns.
    #[error(
        "The cell did not stop within {waited:?} of its time limit (it is blocked in native code that cannot be interrupted); the session is busy until it returns: wait, or start a new session"
    )]
    Unresponsive {
        /// How long exec waited in total.
        waited: Duration,
    },

    /// The kernel's own Python support code failed (a bug in the kernel).
    #[error("Kernel error while {action}: {message}; please report this as a bug")]
    Internal {
        /// What the kernel was doing.
        action: &'static str,
        /// The Python error.
        message: String,
    },
}

impl ReplError {
    pub(crate) fn internal(action: &'static str, err: impl std::fmt::Display) -> Self {
        Self::Internal {
            action,
            message: err.to_string(),
        }
    }
}
