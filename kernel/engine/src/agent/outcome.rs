//! What a run returns: the answer and how it ended ([`LoopOutcome`]), and what every run
//! leaves behind, answered or not ([`AgentRun`]).

use bridge::Message;
use serde::{Deserialize, Serialize};

use super::metrics::LoopMetrics;
use crate::state::StateDelta;
use crate::tool::Actions;

/// How a run that produced an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Termination {
    /// The model replied without tool calls.
    Answered,
    /// A tool raised an action (`exit_loop`, `end_turn`, `escalate`); the turn ended after
    /// that reply's tool results, and the caller acts on [`AgentRun::actions`].
    Action,
}

/// Everything a run did: kept on success and on failure alike.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentRun {
    /// Every message: the caller's, then each reply and its tool results, in order.
    pub transcript: Vec<Message>,
    /// The actions raised by the tools (their union).
    pub actions: Actions,
    /// The state the tools wrote, merged in transcript order (already applied to the
    /// shared state as they were written).
    pub delta: StateDelta,
    /// What the run measured.
    pub metrics: LoopMetrics,
}

/// A run that ended well.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopOutcome {
    /// The text of the last reply (may be empty when the turn ended by an action).
    pub answer: String,
    /// How the run ended.
    pub termination: Termination,
    /// What it did.
    pub run: AgentRun,
}
