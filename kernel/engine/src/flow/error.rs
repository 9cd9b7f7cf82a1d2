//! What can stop a workflow run, as one error type with a kind per cause.

use std::time::Duration;

use bridge::{BridgeError, BudgetExceeded};

/// Why a workflow run (or one agent of it) failed or stopped early.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FlowError {
    /// The run was cancelled (Ctrl-C, or a caller's token).
    #[error("The run was cancelled; the state and the event log written so far are kept")]
    Cancelled,
    /// The whole run took longer than its timeout.
    #[error(
        "The run did not finish within {}s; raise the run timeout or lower `max_iterations`",
        .0.as_secs_f64()
    )]
    TimedOut(Duration),
    /// A token, USD or call budget of the ledger is spent.
    #[error("{0}")]
    Budget(BudgetExceeded),
    /// A model call failed.
    #[error("Agent `{agent}`: {source}")]
    Model {
        /// The agent that called the model.
        agent: String,
        /// What the bridge reported.
        #[source]
        source: Box<BridgeError>,
    },
    /// An agent failed in its own way (a Python step raised, a tool loop ran out, ...).
    #[error("Agent `{agent}` failed: {message}")]
    Agent {
        /// The agent.
        agent: String,
        /// What went wrong and, where it can, what to do.
        message: String,
    },
    /// An agent stopped at one of its own limits (its tool loop's iterations or time) without
    /// an answer.
    #[error("Agent `{agent}` stopped at a limit: {message}")]
    Limit {
        /// The agent.
        agent: String,
        /// Which limit, and what to raise.
        message: String,
    },
    /// A hook or callback stopped the agent on purpose: running it again would stop it again.
    #[error("Agent `{agent}` was stopped by a hook: {reason}")]
    StoppedByHook {
        /// The agent.
        agent: String,
        /// Why the hook stopped it.
        reason: String,
    },
    /// An agent is set up wrong (its instruction names a state key that is not set, a tool's
    /// schema is bad, a file it reads is missing): running it again cannot help.
    #[error("Agent `{agent}` is set up wrong: {message}")]
    Setup {
        /// The agent.
        agent: String,
        /// What is wrong and what to change.
        message: String,
    },
    /// A graph edge chose a node the graph does not have.
    #[error("Graph `{graph}`: the edge after `{from}` chose `{to}`, which is not a node of it")]
    UnknownNode {
        /// The graph.
        graph: String,
        /// The node whose edge chose.
        from: String,
        /// The name it chose.
        to: String,
    },
    /// A graph ran more node steps than it allows.
    #[error(
        "Graph `{graph}` ran {max_steps} node steps without reaching its end; raise its \
         `max_steps` or check its edges for a cycle"
    )]
    StepLimit {
        /// The graph.
        graph: String,
        /// Its limit.
        max_steps: u64,
    },
    /// An event sink (the event log) could not record an event.
    #[error("Could not record an event: {0}")]
    Sink(String),
}

impl FlowError {
    /// The error for a failed model call by `agent`: a budget refusal stays a budget stop and
    /// a cancelled call stays a cancellation, so the run reports why it really stopped.
    pub(crate) fn from_model(agent: &str, source: BridgeError) -> Self {
        match source {
            BridgeError::Budget(exceeded) => Self::Budget(exceeded),
            BridgeError::Cancelled => Self::Cancelled,
            source => Self::Model {
                agent: agent.to_owned(),
                source: Box::new(source),
            },
        }
    }

    /// Whether this is a stop of the whole run (cancel, timeout, budget) rather than a
    /// failure of one agent: branch failure policies never swallow it.
    pub(crate) fn is_stop(&self) -> bool {
        matches!(self, Self::Cancelled | Self::TimedOut(_) | Self::Budget(_))
    }

    /// Whether a limit stopped the run rather than a failure: the whole run's time or
    /// budget, an agent's own limit, a graph's step limit.
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            Self::TimedOut(_) | Self::Budget(_) | Self::Limit { .. } | Self::StepLimit { .. }
        )
    }
}
