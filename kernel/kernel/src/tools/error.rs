//! Why Python functions could not be made into tools.

use std::path::PathBuf;

use crate::repl::ReplError;

/// Building Python function tools failed.
#[derive(Debug, thiserror::Error)]
pub enum PythonToolError {
    /// The session itself failed (not the Python code).
    #[error("The Python session failed while loading tools: {0}")]
    Session(#[from] ReplError),
    /// The tools file could not be run: missing, a syntax error, an exception at load time.
    #[error("Cannot load tools from `{path}`: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// The Python error.
        message: String,
    },
    /// The function a workflow file names could not be loaded (a missing file or module, a
    /// syntax error, no such function in it).
    #[error("Cannot load a tool from {place}: {message}")]
    Load {
        /// Where the function was looked for.
        place: String,
        /// The Python error.
        message: String,
    },
    /// Parameters given for a function (a workflow file's `args.parameters`) do not fit its
    /// signature.
    #[error("The `parameters` given for tool `{tool}` do not fit its function: {detail}")]
    Parameters {
        /// The tool.
        tool: String,
        /// What does not fit.
        detail: String,
    },
    /// A function cannot be a tool (not defined, not a function, positional-only parameters).
    #[error("{0}")]
    Definition(String),
    /// A function's name is not a valid tool name.
    #[error(
        "The Python function `{0}` cannot be a tool: tool names must match \
         `[a-zA-Z0-9_-]{{1,64}}`; rename it or wrap it in a function with such a name"
    )]
    InvalidName(String),
    /// Loading took longer than the session's cell time limit.
    #[error("Loading tools took longer than the cell time limit")]
    TimedOut,
    /// Something that should not happen (a worker thread failed, a malformed description).
    #[error("Loading Python tools failed unexpectedly: {0}")]
    Internal(String),
}
