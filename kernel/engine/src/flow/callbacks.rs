//! Callbacks: code that watches, changes or short-circuits each step of a workflow.
//!
//! In the hook style of the agent and RLM loops: a [`Callback`] has a do-nothing default for
//! every point, before-points return the one [`HookAction`] every hook returns —
//! [`Continue`](HookAction::Continue), [`Replace`](HookAction::Replace) the step's output
//! with the callback's own (a cached answer, a blocked tool's refusal) so the step does not
//! run, or [`Stop`](HookAction::Stop) the agent (it fails with
//! [`FlowError::StoppedByHook`](super::FlowError::StoppedByHook)) — and after-points get the
//! step's output by `&mut` to amend it. Error points may recover with a replacement.
//!
//! Callbacks run in order: the invocation's own (plugins for every agent) first, then the
//! agent's. For a before-point (and an error point) the first that does not continue decides
//! and the rest are not asked; after-points all run, each amending what the last left. A
//! callback sees the state and may write it or raise an action through its
//! [`CallbackContext`]; those effects are applied at once and reported in an event of the
//! agent. Callbacks are plain synchronous functions, so the kernel can implement [`Callback`]
//! for Python callables named in a workflow file.
//!
//! The points of one agent run, in order (as in ADK's `functions.py` and `base_llm_flow.py`):
//!
//! 1. `before_agent` — an answer skips the agent (no other point runs; `after_agent` neither).
//! 2. Per model call: `before_model` (an answer stands in for the call) → the call →
//!    `after_model` on the reply (also on a `before_model` answer). A failed call goes to
//!    `on_model_error`: a replacement is the turn's last reply, else the error stands.
//! 3. Per tool call of a reply: every call's `before_tool` first, in call order (an answer
//!    stands in for the call, which does not run); then, per call in order, the call's
//!    result: a failure goes to `on_tool_error` (a replacement recovers it, else the error is
//!    the model's result), and `after_tool` sees the result however it came — the tool's, a
//!    `before_tool` answer or an `on_tool_error` recovery. A tool that does not exist never
//!    ran: `on_tool_error` may answer it, `after_tool` does not see it.
//! 4. `after_agent` — unless the agent failed or escalated.

use std::sync::Arc;

use bridge::{BridgeError, ChatRequest, ChatResponse};
use serde_json::Value;

use crate::agent::ToolCallError;
use crate::hook::HookAction;
use crate::state::{SharedState, StateDelta};
use crate::tool::{Actions, ToolContext};

/// A tool call as callbacks see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInvocation {
    /// The call id.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// The parsed arguments (a before-callback may change them).
    pub args: Value,
}

/// What a callback may see and change: the agent it runs for, the state, the actions.
#[derive(Debug)]
pub struct CallbackContext {
    agent: String,
    branch: String,
    effects: ToolContext,
}

impl CallbackContext {
    /// A context for a callback of `agent` (at `branch`) over `state`.
    pub(crate) fn new(
        agent: impl Into<String>,
        branch: impl Into<String>,
        state: SharedState,
    ) -> Self {
        let agent = agent.into();
        Self {
            effects: ToolContext::new(format!("callback:{agent}"), state),
            agent,
            branch: branch.into(),
        }
    }

    /// The agent the callback runs for.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The path of agent names from the root to that agent.
    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// A copy of the value of state key `key`.
    pub fn get_state(&self, key: &str) -> Option<Value> {
        self.effects.get_state(key)
    }

    /// The session state (read it here; write through [`set_state`](Self::set_state) and its
    /// kin so the write is reported).
    pub fn state(&self) -> &SharedState {
        self.effects.state()
    }

    /// Writes state key `key` (visible at once; reported in an event of the agent).
    pub fn set_state(&self, key: impl Into<String>, value: Value) {
        self.effects.set_state(key, value);
    }

    /// Applies every write of `delta` (visible at once; reported).
    pub fn apply(&self, delta: StateDelta) {
        self.effects.apply(delta);
    }

    /// Asks to stop the whole invocation.
    pub fn escalate(&self) {
        self.effects.escalate();
    }

    /// Raises every action of `actions`.
    pub fn raise(&self, actions: Actions) {
        self.effects.raise(actions);
    }

    /// The state written and the actions raised, leaving both empty.
    pub(crate) fn take_effects(&self) -> (StateDelta, Actions) {
        self.effects.take_effects()
    }
}

/// Watches, changes or short-circuits steps. Every method has a do-nothing default.
pub trait Callback: Send + Sync {
    /// Before an agent runs. `Replace(text)` skips the agent; `text` is its answer.
    fn before_agent(&self, _ctx: &CallbackContext) -> HookAction<String> {
        HookAction::Continue
    }

    /// After an agent ran. `Replace(text)` adds `text` as the agent's last message.
    fn after_agent(&self, _ctx: &CallbackContext) -> HookAction<String> {
        HookAction::Continue
    }

    /// Before a model call; may change the request. `Replace(response)` skips the call.
    fn before_model(
        &self,
        _ctx: &CallbackContext,
        _request: &mut ChatRequest,
    ) -> HookAction<ChatResponse> {
        HookAction::Continue
    }

    /// After a model call; may change the response.
    fn after_model(&self, _ctx: &CallbackContext, _response: &mut ChatResponse) {}

    /// When a model call failed. `Replace(response)` recovers with that response.
    fn on_model_error(
        &self,
        _ctx: &CallbackContext,
        _error: &BridgeError,
    ) -> HookAction<ChatResponse> {
        HookAction::Continue
    }

    /// Before a tool call; may change the arguments. `Replace(result)` skips the call.
    fn before_tool(&self, _ctx: &CallbackContext, _call: &mut ToolInvocation) -> HookAction<Value> {
        HookAction::Continue
    }

    /// After a tool call's result is known (the tool's, a `before_tool` answer, an
    /// `on_tool_error` recovery); may change it.
    fn after_tool(&self, _ctx: &CallbackContext, _call: &ToolInvocation, _result: &mut Value) {}

    /// When a tool call failed. `Replace(result)` recovers with that result.
    fn on_tool_error(
        &self,
        _ctx: &CallbackContext,
        _call: &ToolInvocation,
        _error: &ToolCallError,
    ) -> HookAction<Value> {
        HookAction::Continue
    }
}

/// An ordered list of callbacks.
#[derive(Clone, Default)]
pub struct Callbacks {
    list: Vec<Arc<dyn Callback>>,
}

impl std::fmt::Debug for Callbacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Callbacks({})", self.list.len())
    }
}

impl Callbacks {
    /// No callbacks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `callback` after the others.
    pub fn push(&mut self, callback: Arc<dyn Callback>) {
        self.list.push(callback);
    }

    /// These callbacks, then `later`.
    pub(crate) fn chain(&self, later: &Callbacks) -> Callbacks {
        let mut list = self.list.clone();
        list.extend(later.list.iter().cloned());
        Callbacks { list }
    }

    /// The callbacks, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<dyn Callback>> {
        self.list.iter()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The first before-point answer that does not continue (the rest are not asked).
    pub fn first<T>(&self, mut ask: impl FnMut(&dyn Callback) -> HookAction<T>) -> HookAction<T> {
        HookAction::first(self.list.iter().map(|c| ask(c.as_ref())))
    }

    /// Runs an after-point on every callback, in order.
    pub fn each(&self, mut run: impl FnMut(&dyn Callback)) {
        for callback in &self.list {
            run(callback.as_ref());
        }
    }
}

impl FromIterator<Arc<dyn Callback>> for Callbacks {
    fn from_iter<I: IntoIterator<Item = Arc<dyn Callback>>>(iter: I) -> Self {
        Self {
            list: iter.into_iter().collect(),
        }
    }
}
