//! Events: what an agent reports while it runs, one record per step.
//!
//! An agent's run yields a stream of [`Event`]s through its
//! [`InvocationContext`](super::InvocationContext): when it starts and ends, what the model
//! said, which tools it called and what they returned, each loop iteration, and the state
//! each step wrote. The executor stamps every event with its author, its branch (the path of
//! agent names from the root) and a sequence number, then hands it to the sinks (the JSONL
//! event log, a live display, a test's memory) in the order they were emitted.

use bridge::ToolCall;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::state::StateDelta;
use crate::tool::Actions;

/// How an agent run ended, as its [`EventKind::End`] event reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndStatus {
    /// It ran to its end.
    Completed,
    /// A loop ended because a step asked it to (`exit_loop`).
    ExitedLoop,
    /// A loop ended at its `max_iterations`.
    IterationLimit,
    /// A step asked to stop the whole invocation (`escalate`).
    Escalated,
    /// A callback answered in its place; it did not run.
    Skipped,
    /// It failed (the error is the event's content).
    Failed,
    /// It was cancelled (Ctrl-C, timeout, budget).
    Cancelled,
}

/// What an event records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// The agent started.
    Start,
    /// The agent said something (a model reply, a callback's answer, a note).
    Message,
    /// The model asked for tool calls (in [`Event::tool_calls`]).
    ToolCalls,
    /// Tool calls returned (in [`Event::tool_results`]).
    ToolResults,
    /// The agent wrote state without saying anything else.
    StateUpdate,
    /// What the agent records about its own work (an RLM iteration, a sub-call), in
    /// [`Event::metadata`]; `topic` says which record it is.
    Metadata {
        /// Which record (`rlm_iteration`, `rlm_sub_call`, `rlm_result`, ...).
        topic: String,
    },
    /// A loop began iteration `iteration` (1-based).
    Iteration {
        /// The iteration number.
        iteration: u32,
    },
    /// The agent ended.
    End {
        /// How.
        status: EndStatus,
    },
}

/// The result of one tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The id of the call it answers.
    pub(crate) call_id: String,
    /// The tool's name.
    pub name: String,
    /// What the tool returned (or `{"success": false, "error": ...}`).
    pub result: Value,
    /// Whether the call failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

/// One step of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the invocation's stream (0-based, in emission order).
    #[serde(default)]
    pub seq: u64,
    /// The agent that emitted it.
    pub author: String,
    /// The path of agent names from the root to the author, joined by `/`.
    pub branch: String,
    /// What it records.
    #[serde(flatten)]
    pub kind: EventKind,
    /// Text: a model reply, a callback's answer, an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool calls the model asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Results of tool calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_results: Vec<ToolResult>,
    /// The state this step wrote (already applied when the event is emitted).
    #[serde(default, skip_serializing_if = "StateDelta::is_empty")]
    pub delta: StateDelta,
    /// A [`EventKind::Metadata`] record (never context data).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub metadata: Value,
    /// The control-flow actions this step raised.
    #[serde(default, skip_serializing_if = "is_no_action")]
    pub actions: Actions,
    /// When it was emitted, in unix milliseconds.
    #[serde(default)]
    pub at_ms: u64,
}

fn is_no_action(actions: &Actions) -> bool {
    !actions.any()
}

impl Event {
    /// An event of `kind`; the context fills in author, branch, sequence and time.
    pub fn new(kind: EventKind) -> Self {
        Self {
            seq: 0,
            author: String::new(),
            branch: String::new(),
            kind,
            content: None,
            tool_calls: Vec::new(),
            tool_results: Vec::new(),
            delta: StateDelta::default(),
            metadata: Value::Null,
            actions: Actions::default(),
            at_ms: 0,
        }
    }

    /// A [`EventKind::Metadata`] event of `topic` recording `metadata`.
    pub fn metadata(topic: impl Into<String>, metadata: Value) -> Self {
        let mut event = Self::new(EventKind::Metadata {
            topic: topic.into(),
        });
        event.metadata = metadata;
        event
    }

    /// A [`EventKind::Message`] with `content`.
    pub fn message(content: impl Into<String>) -> Self {
        Self::new(EventKind::Message).with_content(content)
    }

    /// This event with `content`.
    pub fn with_content(mut self, content: impl Into<String>) -> Self {
        self.content = Some(content.into());
        self
    }

    /// This event carrying the writes of `delta`.
    pub(crate) fn with_delta(mut self, delta: StateDelta) -> Self {
        self.delta.extend(delta);
        self
    }

    /// This event raising `actions`.
    pub fn with_actions(mut self, actions: Actions) -> Self {
        self.actions = self.actions.union(actions);
        self
    }

    /// The end status, if this is an [`EventKind::End`] event.
    pub fn end_status(&self) -> Option<EndStatus> {
        match self.kind {
            EventKind::End { status } => Some(status),
            _ => None,
        }
    }
}
