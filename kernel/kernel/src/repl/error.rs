//! `ReplError`: what can go wrong with the kernel itself (a Python exception in a cell is not
//! one of these: it is reported in [`ExecutionResult::error`](super::ExecutionResult)).

use std::path::PathBuf;
use std::time::Duration;

use super::metadata::BinaryKind;

/// Who runs the Python interpreter the kernel works in: it decides where a missing package
/// is installed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
        format: &'static str,
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

/// Why a name cannot name a context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
