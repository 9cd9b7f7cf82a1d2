//! How a command ends, as the process reports it: the exit codes, the two kinds of error
//! that have codes of their own ([`UsageError`], [`LimitError`]), how a run's ending maps to
//! a code ([`RunOutcome`]), and whether a failure is also printed as a JSON document.
//!
//! The bottom of the CLI: every command uses it and it uses none. The codes (also in the
//! README and `rlm run --help`): 0 done, 1 an error, 2 a usage error, 3 a limit,
//! 4 a crash in a cell, 5 a workflow waits for a human, 6 another process drives the run,
//! 130 Ctrl-C.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use kernel::rlm::TerminationReason;

/// Exit code of a mistake in how `rlm` was called.
pub(crate) const EXIT_USAGE: u8 = 2;

/// Exit code of a run that stopped at a limit (iterations, time, budget) or without an answer.
pub(crate) const EXIT_LIMIT: u8 = 3;

/// Exit code after a fatal signal (a crash in C code a cell called), see `kernel::fatal`.
pub(crate) const EXIT_CRASHED: u8 = 4;

/// Exit code of a workflow run that stopped to ask a human (`awaiting_human`).
pub(crate) const EXIT_AWAITING_HUMAN: u8 = 5;

/// Exit code of a workflow run that another process drives (a refused claim, a lost lease).
pub(crate) const EXIT_RUN_DRIVEN: u8 = 6;

/// Exit code after Ctrl-C, as shells report a SIGINT death (128 + 2).
pub(crate) const EXIT_INTERRUPTED: u8 = 130;

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

/// A limit refused the work before it started (exit code 3, as for a run a limit stopped).
#[derive(Debug)]
pub(crate) struct LimitError(String);

impl LimitError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl std::fmt::Display for LimitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LimitError {}

/// How a run ended, as the process sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunOutcome {
    /// The model gave a final answer: exit 0.
    Answered,
    /// A limit stopped the run (a partial or fallback answer may be printed): exit 3.
    Limited,
    /// The run could not go on (model unreachable, kernel broke): exit 1.
    Failed,
    /// Ctrl-C stopped the run (its best partial answer may be printed): exit 130.
    Interrupted,
}

impl RunOutcome {
    pub(crate) fn of(reason: TerminationReason) -> Self {
        if reason == TerminationReason::Interrupted {
            Self::Interrupted
        } else if reason == TerminationReason::StoppedByHook {
            // The CLI's own hooks stop a run only when they fail (the trajectory cannot be
            // written): an error, not a limit.
            Self::Failed
        } else if reason.is_success() {
            Self::Answered
        } else if reason.is_limit() {
            Self::Limited
        } else {
            Self::Failed
        }
    }

    pub(crate) fn exit_code(self) -> ExitCode {
        match self {
            Self::Answered => ExitCode::SUCCESS,
            Self::Limited => ExitCode::from(EXIT_LIMIT),
            Self::Failed => ExitCode::FAILURE,
            Self::Interrupted => ExitCode::from(EXIT_INTERRUPTED),
        }
    }
}

/// Set once `--json` is known to be on (flag or `rlm.toml`): a run that fails before it
/// starts still gives a JSON reader a document.
static JSON_ERRORS: AtomicBool = AtomicBool::new(false);

/// Whether a failure prints a JSON error document on stdout: `--json` of `rlm run`, `rlm
/// bench` and `rlm eval`, given as a flag or in `rlm.toml`.
pub(crate) fn json_errors(on: bool) {
    JSON_ERRORS.store(on, Ordering::Relaxed);
}

/// Whether [`json_errors`] was turned on.
pub(crate) fn json_errors_on() -> bool {
    JSON_ERRORS.load(Ordering::Relaxed)
}

/// The exit code of a failed command: 2 for a [`UsageError`], 3 for a [`LimitError`], else
/// `other` (a code a subsystem knows for its own errors) or 1.
pub(crate) fn code_of(err: &anyhow::Error, other: Option<u8>) -> u8 {
    if err.downcast_ref::<UsageError>().is_some() {
        EXIT_USAGE
    } else if err.downcast_ref::<LimitError>().is_some() {
        EXIT_LIMIT
    } else {
        other.unwrap_or(1)
    }
}
