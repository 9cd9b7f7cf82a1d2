//! Hooks: code that watches, amends or short-circuits a run's model and tool calls.
//!
//! A before-hook returns the [`HookAction`] every hook of the codebase returns (the RLM
//! loop's, the workflow callbacks') — [`Continue`](HookAction::Continue),
//! [`Replace`](HookAction::Replace) the step's output (the step is skipped), or
//! [`Stop`](HookAction::Stop) the run
//! ([`LoopErrorKind::StoppedByHook`](super::LoopErrorKind::StoppedByHook)); an after-hook
//! gets the output by `&mut` and may amend it. Hooks run in registration order; for a
//! before-hook the first that does not continue decides and the rest are not asked.
//!
//! Unlike the RLM loop's, these hooks take `&self` and are `Sync`: one loop may serve several
//! runs at once, and a hook that keeps state holds it behind its own lock. They are called
//! from the run's own task, never from inside a tool call, in transcript order.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bridge::{ChatRequest, ChatResponse, Message, ToolCall};
use serde_json::Value;

use super::error::LoopError;
use super::failure::ToolCallError;
use super::outcome::LoopOutcome;
use crate::hook::HookAction;
use crate::tool::ToolError;

/// One finished tool call, for [`AgentHook::after_tool_call`].
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallRecord {
    /// The iteration whose reply asked for it.
    pub(crate) iteration: u32,
    /// The call as the model made it (after any before-hook's amendment).
    pub call: ToolCall,
    /// Its result; amend it to change what the model is told.
    pub output: Result<Value, ToolCallError>,
    /// How long it ran (zero when it never ran).
    pub duration: Duration,
}

/// Watches, amends or stops a run. Every method has a do-nothing default.
pub trait AgentHook: Send + Sync {
    /// Before a model call; may amend the request. `Replace(response)` skips the call.
    fn before_model_call(
        &self,
        _iteration: u32,
        _request: &mut ChatRequest,
    ) -> HookAction<ChatResponse> {
        HookAction::Continue
    }

    /// After a model call (or its replacement); may amend the reply.
    fn after_model_call(&self, _iteration: u32, _response: &mut ChatResponse) {}

    /// Before a tool call runs; may amend it. `Replace(result)` skips running the tool.
    fn before_tool_call(
        &self,
        _iteration: u32,
        _call: &mut ToolCall,
    ) -> HookAction<Result<Value, ToolError>> {
        HookAction::Continue
    }

    /// After a tool call, in call order; may amend its result.
    fn after_tool_call(&self, _record: &mut ToolCallRecord) {}

    /// Each message as it joins the transcript (the caller's first, with iteration 0).
    fn on_message(&self, _iteration: u32, _message: &Message) {}

    /// When the run ends, answered or not.
    fn on_finish(&self, _result: Result<&LoopOutcome, &LoopError>) {}
}

/// The hooks of a loop, called in order.
#[derive(Clone, Default)]
pub(crate) struct Hooks {
    list: Vec<Arc<dyn AgentHook>>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("len", &self.list.len())
            .finish()
    }
}

impl Hooks {
    pub(crate) fn push(&mut self, hook: Arc<dyn AgentHook>) {
        self.list.push(hook);
    }

    fn first_action<T>(
        &self,
        mut ask: impl FnMut(&dyn AgentHook) -> HookAction<T>,
    ) -> HookAction<T> {
        HookAction::first(self.list.iter().map(|hook| ask(hook.as_ref())))
    }
}

impl AgentHook for Hooks {
    fn before_model_call(
        &self,
        iteration: u32,
        request: &mut ChatRequest,
    ) -> HookAction<ChatResponse> {
        self.first_action(|h| h.before_model_call(iteration, request))
    }

    fn after_model_call(&self, iteration: u32, response: &mut ChatResponse) {
        for hook in &self.list {
            hook.after_model_call(iteration, response);
        }
    }

    fn before_tool_call(
        &self,
        iteration: u32,
        call: &mut ToolCall,
    ) -> HookAction<Result<Value, ToolError>> {
        self.first_action(|h| h.before_tool_call(iteration, call))
    }

    fn after_tool_call(&self, record: &mut ToolCallRecord) {
        for hook in &self.list {
            hook.after_tool_call(record);
        }
    }

    fn on_message(&self, iteration: u32, message: &Message) {
        for hook in &self.list {
            hook.on_message(iteration, message);
        }
    }

    fn on_finish(&self, result: Result<&LoopOutcome, &LoopError>) {
        for hook in &self.list {
            hook.on_finish(result);
        }
    }
}
