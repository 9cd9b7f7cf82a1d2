//! `ReplError`: what can go wrong with the kernel itself (a Python exception in a cell is not
//! one of these: it is reported in [`ExecutionResult::error`](super::ExecutionResult)).
//!
//! Errors cross the process boundary of an isolated session (a context that fails to load in
//! the worker is the same error in the parent), so they serialize: `std::io::Error` as its OS
//! code (or kind and text), `&'static str` fields through a small bounded interning table.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::metadata::BinaryKind;

/// Who runs the Python interpreter the kernel works in: it decides where a missing package
/// is installed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PythonHost {
    /// The kernel started CPython itself (the `rlm` binary): the packages of `.ci/setup`.
    Embedded,
    /// A Python program imported the kernel (the `rlm_kernel` package): its pip extras.
    Package,
}

impl PythonHost {
    /// How to install `package` (a literal to paste, in backticks).
    pub fn install_advice(self, package: &str) -> String {
        match self {
            Self::Embedded => {
                "`bash .ci/setup` (or `pip install -r .ci/requirements.txt`)".to_owned()
            }
            Self::Package => {
                let extra = match package {
                    "fastexcel" => "excel",
                    other => other,
                };
                format!("`pip install 'rlm-kernel[{extra}]'`")
            }
        }
    }
}

/// A `&'static str` field (named so that serde reads it through [`static_text`], not by
/// borrowing from the input).
type StaticText = &'static str;

/// Failures of the REPL kernel: starting the interpreter, loading contexts, a broken session.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
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
        "Python package `{package}` is needed to load `{path}` but could not be imported ({message}); install it with {}",
        host.install_advice(package)
    )]
    MissingPackage {
        /// The package, e.g. `polars`.
        package: String,
        /// The context file that needed it.
        path: PathBuf,
        /// The import error.
        message: String,
        /// Whose interpreter it is, which says how to install the package.
        host: PythonHost,
    },

    /// A context file or directory could not be read.
    #[error("Cannot read context `{path}`: {error}; check that the path exists and is readable")]
    ContextRead {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error, in the message (not a `source`, or error chains would say it twice).
        #[serde(with = "io_error")]
        error: std::io::Error,
    },

    /// A context file is not valid UTF-8.
    #[error(
        "Context file `{path}` is not valid UTF-8 (first bad byte at offset {offset}, line {line}); if it is legacy text, name its encoding (e.g. `--encoding latin-1` or `--encoding cp1252`), or convert it to UTF-8{hint}"
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
        #[serde(with = "static_text")]
        format: StaticText,
        /// Where and what, e.g. `line 3, column 7: expected value`.
        detail: String,
        /// What the user can do.
        fix: String,
    },

    /// A context file is a kind of file that cannot be a context (an image, an archive, …).
    #[error("Context file `{path}` is {}, which cannot be a context; {}", kind.label(), kind.advice())]
    ContextBinary {
        /// The file.
        path: PathBuf,
        /// What it is.
        kind: BinaryKind,
    },

    /// A CSV row that does not fit the table.
    #[error(
        "Context file `{path}` has a malformed CSV row at line {line} ({problem}, reading with separator `{separator}`); fix or remove that row, pass `--csv-sep` if the separator is wrong, or `--csv-skip-bad-rows` to leave such rows out"
    )]
    ContextBadRow {
        /// The file.
        path: PathBuf,
        /// 1-based line where the row starts.
        line: u64,
        /// What is wrong with it.
        problem: RowProblem,
        /// The separator it was read with, as written (`\t` for tab).
        separator: String,
    },

    /// `LoadOptions::encoding` names no Python codec.
    #[error(
        "Unknown text encoding `{encoding}`; use a Python codec name such as `latin-1`, `cp1252`, `utf-16` or `shift_jis`"
    )]
    UnknownEncoding {
        /// The name given.
        encoding: String,
    },

    /// A live Python object given as a context is of a type the kernel cannot describe.
    #[error(
        "Context `{label}` is a `{type_name}`; pass a `str`, `dict`, `list`, `polars.DataFrame` or `pandas.DataFrame`, or a path (`pathlib.Path`) to a file"
    )]
    ContextType {
        /// What the caller called it (a variable name, or `<object>`).
        label: String,
        /// Its Python type, e.g. `numpy.ndarray`.
        type_name: String,
    },

    /// A context name that cannot be a variable.
    #[error("Context name `{name}` {problem}; pick another, e.g. `-c sales=sales.csv`")]
    ContextName {
        /// The name given.
        name: String,
        /// Why it is refused.
        problem: NameProblem,
    },

    /// Reading standard input for the `-` context failed.
    #[error("Cannot read the `-` context from standard input: {source}")]
    ContextStdin {
        /// The I/O error.
        #[serde(with = "io_error")]
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

    /// The session's worker process could not be started or broke its protocol.
    #[error("The REPL's worker process {problem}")]
    Worker {
        /// What went wrong, as a sentence after "The REPL's worker process".
        problem: String,
    },

    /// The worker could not be confined: `isolation = strict` and a layer is not in force
    /// here, or a step of confinement failed.
    #[error("{message}")]
    NotConfined {
        /// The sandbox's message (which layer, and what to do).
        message: String,
    },

    /// An isolated session was asked for in a program that cannot start worker processes.
    #[error(
        "This program cannot start REPL worker processes (it registered no worker program); use `isolation = none`, or call `kernel::repl::set_worker_program` at start"
    )]
    NoWorkerProgram,

    /// A Ctrl-C (`KeyboardInterrupt` in the host's Python code) stopped the session's set-up;
    /// nothing was started, and a new session can be made at once.
    #[error("Interrupted while {action}; nothing was started")]
    Interrupted {
        /// What the kernel was doing, e.g. handing a context to the worker process.
        action: String,
    },

    /// The kernel's own Python support code failed (a bug in the kernel).
    #[error("Kernel error while {action}: {message}; please report this as a bug")]
    Internal {
        /// What the kernel was doing.
        #[serde(with = "static_text")]
        action: StaticText,
        /// The Python error.
        message: String,
    },
}

/// Why a name cannot name a context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NameProblem {
    /// Not a Python identifier.
    NotIdentifier,
    /// A Python keyword such as `class`.
    Keyword,
    /// A Python builtin such as `len`, which the model's code needs.
    Builtin,
    /// A name the kernel defines (`context`, `context_3`, `llm_query`, …).
    Reserved,
    /// Given to two contexts.
    Duplicate,
}

impl std::fmt::Display for NameProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NotIdentifier => {
                "is not a valid Python name (letters, digits and `_`, not starting with a digit)"
            }
            Self::Keyword => "is a Python keyword",
            Self::Builtin => "would hide the Python builtin of that name",
            Self::Reserved => "is a name the kernel defines",
            Self::Duplicate => "is given to two contexts",
        })
    }
}

/// What is wrong with a malformed CSV row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RowProblem {
    /// More fields than the header.
    ExtraFields {
        /// Fields in the row.
        found: u64,
        /// Fields in the header.
        expected: u64,
    },
    /// A quoted field that never closes, or a quote inside an unquoted field.
    Quoting,
}

impl std::fmt::Display for RowProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ExtraFields { found, expected } => {
                write!(f, "{found} fields where the header has {expected}")
            }
            Self::Quoting => f.write_str("a quoted field is not closed properly"),
        }
    }
}

impl ReplError {
    pub(crate) fn internal(action: &'static str, err: impl std::fmt::Display) -> Self {
        Self::Internal {
            action,
            message: err.to_string(),
        }
    }
}

/// `std::io::Error` as its OS error code when it has one (rebuilt exactly), else its kind's
/// name and its text.
mod io_error {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    enum Wire {
        Os(i32),
        Other(String),
    }

    pub(super) fn serialize<S: Serializer>(
        error: &std::io::Error,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match error.raw_os_error() {
            Some(code) => Wire::Os(code),
            None => Wire::Other(error.to_string()),
        }
        .serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<std::io::Error, D::Error> {
        Ok(match Wire::deserialize(deserializer)? {
            Wire::Os(code) => std::io::Error::from_raw_os_error(code),
            Wire::Other(text) => std::io::Error::other(text),
        })
    }
}

/// `&'static str` fields (an action, a format name: a small fixed set in practice) read back
/// through an interning table with a bound, so a misbehaving peer cannot grow it without end.
mod static_text {
    use std::collections::HashSet;
    use std::sync::{Mutex, PoisonError};

    use serde::{Deserialize, Deserializer, Serializer};

    /// Distinct texts kept; beyond, an unknown text reads as [`UNKNOWN`].
    const CAP: usize = 256;
    const UNKNOWN: &str = "(unknown)";

    pub(super) fn serialize<S: Serializer>(text: &&'static str, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(text)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
        let text = String::deserialize(d)?;
        static TABLE: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
        let mut table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
        let table = table.get_or_insert_with(HashSet::new);
        if let Some(known) = table.get(text.as_str()) {
            return Ok(known);
        }
        if table.len() >= CAP {
            return Ok(UNKNOWN);
        }
        let leaked: &'static str = Box::leak(text.into_boxed_str());
        table.insert(leaked);
        Ok(leaked)
    }
}
