//! The `rlm` command line: argument parsing, configuration and the subcommands.

pub(crate) mod args;
pub(crate) mod demo;
pub(crate) mod mock_lm;
pub(crate) mod outputs;
pub(crate) mod run;
pub(crate) mod trace;

/// A mistake in how `rlm` was called (exit code 2), as opposed to a failure while running.
#[derive(Debug)]
pub(crate) struct UsageError(String);

impl UsageError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}
