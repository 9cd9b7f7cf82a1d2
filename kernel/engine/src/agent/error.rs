//! A run that ends without an answer: [`LoopError`] keeps everything the run did.

use std::fmt;
use std::time::Duration;

use bridge::{BridgeError, BudgetExceeded, Message};

use super::outcome::AgentRun;

/// Why a run ended without an answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoopErrorKind {
    /// The model was still calling tools when the iteration cap was reached.
    #[error(
        "The agent was still calling tools after {max} iterations (`max_iterations`); raise the \
         limit or give it a narrower task"
    )]
    MaxIterations {
        /// The cap.
        max: u32,
    },
    /// The whole run took longer than `run_timeout`.
    #[error(
        "The agent run did not finish within {} s (`run_timeout`); raise the limit or give it a \
         narrower task",
        .timeout.as_secs_f64()
    )]
    RunTimeout {
        /// The limit.
        timeout: Duration,
    },
    /// A budget of the ledger refused the next model call.
    #[error("{0}")]
    Budget(BudgetExceeded),
    /// The caller cancelled the run (Ctrl-C).
    #[error("The agent run was cancelled")]
    Cancelled,
    /// A model call failed (after the endpoint's retries).
    #[error("The model call failed: {0}")]
    Model(BridgeError),
    /// A hook stopped the run.
    #[error("A hook stopped the agent run: {0}")]
    StoppedByHook(String),
}

impl LoopErrorKind {
    /// A stable snake_case tag: `max_iterations`, `run_timeout`, `budget`, `cancelled`,
    /// `model`, `stopped_by_hook`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::MaxIterations { .. } => "max_iterations",
            Self::RunTimeout { .. } => "run_timeout",
            Self::Budget(_) => "budget",
            Self::Cancelled => "cancelled",
            Self::Model(_) => "model",
            Self::StoppedByHook(_) => "stopped_by_hook",
        }
    }
}

impl From<BridgeError> for LoopErrorKind {
    fn from(error: BridgeError) -> Self {
        match error {
            BridgeError::Budget(exceeded) => Self::Budget(exceeded),
            BridgeError::Cancelled => Self::Cancelled,
            other => Self::Model(other),
        }
    }
}

/// A run that ended without an answer; it keeps the transcript, the state it wrote, the
/// actions raised and the metrics, so nothing done is lost.
pub struct LoopError {
    inner: Box<(LoopErrorKind, AgentRun)>,
}

impl LoopError {
    pub(crate) fn new(kind: LoopErrorKind, run: AgentRun) -> Self {
        Self {
            inner: Box::new((kind, run)),
        }
    }

    /// Why the run ended.
    pub fn kind(&self) -> &LoopErrorKind {
        &self.inner.0
    }

    /// What the run did before it ended.
    pub fn run(&self) -> &AgentRun {
        &self.inner.1
    }

    /// Every message of the run, the caller's first.
    pub fn transcript(&self) -> &[Message] {
        &self.inner.1.transcript
    }

    /// The reason and the run.
    pub fn into_parts(self) -> (LoopErrorKind, AgentRun) {
        *self.inner
    }
}

impl fmt::Debug for LoopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoopError")
            .field("kind", self.kind())
            .field("messages", &self.transcript().len())
            .field("iterations", &self.run().metrics.iterations)
            .finish()
    }
}

impl fmt::Display for LoopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.kind().fmt(f)
    }
}

impl std::error::Error for LoopError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self.kind() {
            LoopErrorKind::Model(e) => Some(e),
            _ => None,
        }
    }
}
