//! Tools: functions a model may call, and what a call may touch.
//!
//! A [`Tool`] describes itself to the model (name, description, JSON-Schema parameters) and
//! runs with already-parsed JSON arguments. It returns a JSON value, or a [`ToolError`] that
//! the agent loop hands back to the model as `{"success": false, "error": "..."}` so the model
//! can act on it: a failing tool never ends a run.
//!
//! A call gets a [`ToolContext`]: its call id, a cancellation token (Ctrl-C, a timeout, a
//! budget stop), the invocation's [`SharedState`], and the [`Actions`] it may raise. State
//! written through the context (replace, append, delete) is visible at once to every later
//! step and is also kept as the call's [`StateDelta`].

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use bridge::{CancellationToken, ToolDefinition};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::state::{SharedState, StateDelta};

/// Why a tool call failed; the loop turns it into the tool result the model sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The arguments do not fit the tool's parameters.
    #[error("Invalid arguments: {0}")]
    InvalidArguments(String),
    /// The tool ran and failed; the text says why and, where it can, what to do.
    #[error("{0}")]
    Failed(String),
    /// The call took longer than its timeout.
    #[error("The tool did not finish within {0:?}")]
    TimedOut(Duration),
    /// The call was cancelled (Ctrl-C, run timeout, budget stop).
    #[error("The tool call was cancelled")]
    Cancelled,
}

/// A function the model may call.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The name the model calls it by (`[a-zA-Z0-9_-]{1,64}`, as the providers require).
    fn name(&self) -> &str;

    /// What it does and when to use it, for the model.
    fn description(&self) -> &str;

    /// The JSON Schema of its arguments (an `object` schema).
    fn parameters(&self) -> Value;

    /// Runs the tool with `args` (JSON that passed the schema check).
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError>;

    /// How long one call may take; `None` uses the loop's default.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// What the model can do to see the part of a result the agent loop cut (results are
    /// capped at [`LoopConfig::max_tool_result_chars`](crate::LoopConfig)), for the note
    /// that replaces it: "print a slice of it". `None`: call again asking for less.
    fn when_cut(&self) -> Option<&str> {
        None
    }

    /// The definition sent to the model.
    fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: self.name().to_owned(),
            description: self.description().to_owned(),
            parameters: self.parameters(),
        }
    }
}

/// Control-flow requests a step raises; the workflow engine acts on them after the step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Actions {
    /// End the nearest enclosing loop.
    pub exit_loop: bool,
    /// End the current agent's turn; its parent moves on to the next sub-agent.
    pub end_turn: bool,
    /// Stop the whole invocation.
    pub escalate: bool,
}

impl Actions {
    /// Whether any action was raised.
    pub(crate) fn any(&self) -> bool {
        self.exit_loop || self.end_turn || self.escalate
    }

    /// Both sets of actions.
    pub fn union(self, other: Actions) -> Actions {
        Actions {
            exit_loop: self.exit_loop || other.exit_loop,
            end_turn: self.end_turn || other.end_turn,
            escalate: self.escalate || other.escalate,
        }
    }
}

/// What one tool call may see and change.
#[derive(Debug)]
pub struct ToolContext {
    call_id: String,
    cancel: CancellationToken,
    state: SharedState,
    written: Mutex<(StateDelta, Actions)>,
}

impl ToolContext {
    /// A context for call `call_id` over `state`, with a fresh cancellation token.
    pub fn new(call_id: impl Into<String>, state: SharedState) -> Self {
        Self::with_cancel(call_id, state, CancellationToken::new())
    }

    /// A context whose call is cancelled with `cancel`.
    pub fn with_cancel(
        call_id: impl Into<String>,
        state: SharedState,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            call_id: call_id.into(),
            cancel,
            state,
            written: Mutex::new((StateDelta::default(), Actions::default())),
        }
    }

    /// The id of the call (echoed in its tool result).
    pub fn call_id(&self) -> &str {
        &self.call_id
    }

    /// Cancelled when the call must stop.
    pub fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The invocation's state.
    pub fn state(&self) -> &SharedState {
        &self.state
    }

    /// A copy of the value of state key `key`.
    pub fn get_state(&self, key: &str) -> Option<Value> {
        self.state.get(key)
    }

    /// Writes state key `key`: visible at once, and recorded in this call's delta.
    pub fn set_state(&self, key: impl Into<String>, value: Value) {
        let mut delta = StateDelta::new();
        delta.set(key, value);
        self.apply(delta);
    }

    /// Applies every write of `delta` (visible at once) and records them in this call's delta.
    pub fn apply(&self, delta: StateDelta) {
        self.state.apply(&delta);
        self.written().0.extend(delta);
    }

    /// Asks to end the nearest enclosing loop.
    pub fn exit_loop(&self) {
        self.written().1.exit_loop = true;
    }

    /// Asks to end the current agent's turn.
    pub fn end_turn(&self) {
        self.written().1.end_turn = true;
    }

    /// Asks to stop the whole invocation.
    pub(crate) fn escalate(&self) {
        self.written().1.escalate = true;
    }

    /// Raises every action of `actions` (with those raised already).
    pub fn raise(&self, actions: Actions) {
        let mut written = self.written();
        written.1 = written.1.union(actions);
    }

    /// The state this call wrote and the actions it raised, leaving both empty.
    pub fn take_effects(&self) -> (StateDelta, Actions) {
        std::mem::take(&mut *self.written())
    }

    /// The actions raised so far, clearing them.
    pub fn take_actions(&self) -> Actions {
        std::mem::take(&mut self.written().1)
    }

    fn written(&self) -> std::sync::MutexGuard<'_, (StateDelta, Actions)> {
        // Each write is one field assignment, so a poisoned lock still holds consistent data.
        self.written
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::State;
    use serde_json::json;

    struct Echo;

    #[async_trait]
    impl Tool for Echo {
        fn name(&self) -> &str {
            "echo"
        }
        fn description(&self) -> &str {
            "Returns its arguments and stores them under `last`."
        }
        fn parameters(&self) -> Value {
            json!({"type": "object", "properties": {"text": {"type": "string"}}})
        }
        async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
            ctx.set_state("last", args.clone());
            ctx.end_turn();
            Ok(args)
        }
    }

    #[tokio::test]
    async fn a_call_writes_through_and_records_its_effects() {
        let state = SharedState::new(State::default());
        let ctx = ToolContext::new("call_0", state.clone());
        let out = Echo.call(json!({"text": "hi"}), &ctx).await;
        assert_eq!(out, Ok(json!({"text": "hi"})));
        assert_eq!(state.get("last"), Some(json!({"text": "hi"})));
        let (delta, actions) = ctx.take_effects();
        assert_eq!(
            delta.last("last"),
            Some(&crate::state::StateWrite::Replace {
                key: "last".into(),
                value: json!({"text": "hi"})
            })
        );
        assert!(actions.end_turn && !actions.exit_loop && !actions.escalate);
        assert!(!ctx.take_actions().any(), "effects are taken once");
        assert_eq!(Echo.definition().name, "echo");
    }
}
