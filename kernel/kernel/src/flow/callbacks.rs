//! [`PythonCallback`]: a Python callable named in a workflow file as a callback.
//!
//! A callback is named for one point (the `*_callbacks` list of the file it is in) and the
//! engine's registry runs it only there. It follows the convention of every Python function
//! of a workflow (Google ADK's): a parameter named `callback_context` gets the callback's
//! context — `state` (reads; writes, deletes and in-place changes are written back),
//! `actions` (`exit_loop`, `end_turn`, `escalate`), and `point` (`before_agent`,
//! `after_model`, ...), `agent`, `branch`, `args` (the file's `args`) and what the point is
//! about: `request` (the messages `{"role", "content"}` before a model call; changes are
//! sent), `response` (its text, after one), `error`, or `tool` (`{"name", "args"}`, `args`
//! changeable before the call) and `result`. A callable without that parameter (the form
//! documented first) gets the same as one dict, `ctx`, whose `state` it may change (changed,
//! new and removed keys are written back) and whose `actions` it may set to `True`. What it
//! returns:
//!
//! | point | `None` | a value |
//! |---|---|---|
//! | `before_agent` | run the agent | a str: the agent's answer; it does not run |
//! | `after_agent` | nothing | a str: added as the agent's last message |
//! | `before_model` | call the model | a str: the model's reply; no call |
//! | `after_model` | keep the reply | a str: the reply instead |
//! | `on_model_error` | the error stands | a str: the reply instead of the error |
//! | `before_tool` | call the tool | any JSON value: the tool's result; no call |
//! | `after_tool` | keep the result | the result instead |
//! | `on_tool_error` | the error stands | the result instead of the error |
//!
//! Callbacks are synchronous: the call waits for the session (the thread it runs on
//! blocks). A callable that raises is logged as a warning and treated as `None`; a run
//! never stops because a callback failed.

use std::sync::Arc;

use bridge::{BridgeError, CancellationToken, ChatRequest, ChatResponse, Usage};
use engine::HookAction;
use engine::agent::ToolCallError;
use engine::flow::{Callback, CallbackContext, ToolInvocation};
use serde_json::{Map, Value, json};

use super::python::{FunctionKind, PyFunction};
use super::services::FlowKernel;

/// A Python callable as a [`Callback`]; see the module docs.
pub struct PythonCallback {
    function: PyFunction,
    args: Value,
    kernel: Arc<FlowKernel>,
}

impl std::fmt::Debug for PythonCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PythonCallback({})", self.function.display())
    }
}

impl PythonCallback {
    /// `function`, called with `args` under `ctx["args"]`, in `kernel`'s session.
    pub fn new(function: PyFunction, args: Option<Value>, kernel: Arc<FlowKernel>) -> Self {
        Self {
            function,
            args: args.unwrap_or(Value::Null),
            kernel,
        }
    }

    /// Calls the function at `point` with `extra` keys; writes its state changes and
    /// actions back to `cb`; returns what it returned and the `ctx` dict as it left it.
    fn call(&self, cb: &CallbackContext, point: &str, extra: Map<String, Value>) -> (Value, Value) {
        // The state is kept in the session and caught up there (`PyFunction::call`).
        let mut ctx = json!({
            "point": point,
            "agent": cb.agent(),
            "branch": cb.branch(),
            "args": self.args,
            "actions": {"exit_loop": false, "end_turn": false, "escalate": false},
        });
        if let Value::Object(map) = &mut ctx {
            map.extend(extra);
        }
        let called = self
            .kernel
            .session()
            .map_err(|e| e.to_string())
            .and_then(|session| {
                self.function
                    .call(
                        &session,
                        FunctionKind::Callback,
                        &ctx,
                        Some(cb.state()),
                        &Map::new(),
                        &CancellationToken::new(),
                    )
                    .map_err(|e| e.to_string())
            });
        let called = match called {
            Ok(called) => called,
            Err(e) => {
                tracing::warn!(
                    "callback `{}` at {point} of `{}` failed (treated as None): {e}",
                    self.function.display(),
                    cb.agent()
                );
                return (Value::Null, Value::Null);
            }
        };
        cb.apply(called.effects.writes);
        cb.raise(called.effects.actions);
        (called.value, called.arg)
    }

    fn text(&self, cb: &CallbackContext, point: &str, extra: Map<String, Value>) -> Option<String> {
        match self.call(cb, point, extra).0 {
            Value::String(text) => Some(text),
            _ => None,
        }
    }
}

fn extra(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> Map<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

fn reply(content: String) -> ChatResponse {
    ChatResponse {
        content,
        tool_calls: Vec::new(),
        usage: Usage::default(),
        finish_reason: Some("stop".to_owned()),
        model: "callback".to_owned(),
        latency: std::time::Duration::ZERO,
        attempts: 0,
    }
}

fn tool_json(call: &ToolInvocation) -> Value {
    json!({"name": call.name, "call_id": call.call_id, "args": call.args})
}

impl Callback for PythonCallback {
    fn before_agent(&self, cb: &CallbackContext) -> HookAction<String> {
        HookAction::replace_with(self.text(cb, "before_agent", Map::new()))
    }

    fn after_agent(&self, cb: &CallbackContext) -> HookAction<String> {
        HookAction::replace_with(self.text(cb, "after_agent", Map::new()))
    }

    fn before_model(
        &self,
        cb: &CallbackContext,
        request: &mut ChatRequest,
    ) -> HookAction<ChatResponse> {
        let messages = serde_json::to_value(&request.messages).unwrap_or(Value::Null);
        let (out, after) = self.call(cb, "before_model", extra([("request", messages.clone())]));
        if let Some(changed) = after.get("request").filter(|m| **m != messages) {
            match serde_json::from_value(changed.clone()) {
                Ok(changed) => request.messages = changed,
                Err(e) => tracing::warn!(
                    "callback `{}` left `request` in a shape that is not a list of messages \
                     (kept the original): {e}",
                    self.function.display()
                ),
            }
        }
        HookAction::replace_with(out.as_str().map(|text| reply(text.to_owned())))
    }

    fn after_model(&self, cb: &CallbackContext, response: &mut ChatResponse) {
        let text = Value::String(response.content.clone());
        if let Some(new) = self.text(cb, "after_model", extra([("response", text)])) {
            response.content = new;
        }
    }

    fn on_model_error(
        &self,
        cb: &CallbackContext,
        error: &BridgeError,
    ) -> HookAction<ChatResponse> {
        let error = Value::String(error.to_string());
        HookAction::replace_with(
            self.text(cb, "on_model_error", extra([("error", error)]))
                .map(reply),
        )
    }

    fn before_tool(&self, cb: &CallbackContext, call: &mut ToolInvocation) -> HookAction<Value> {
        let (out, after) = self.call(cb, "before_tool", extra([("tool", tool_json(call))]));
        if let Some(args) = after.pointer("/tool/args") {
            call.args = args.clone();
        }
        HookAction::replace_with((!out.is_null()).then_some(out))
    }

    fn after_tool(&self, cb: &CallbackContext, call: &ToolInvocation, result: &mut Value) {
        let pairs = extra([("tool", tool_json(call)), ("result", result.clone())]);
        let out = self.call(cb, "after_tool", pairs).0;
        if !out.is_null() {
            *result = out;
        }
    }

    fn on_tool_error(
        &self,
        cb: &CallbackContext,
        call: &ToolInvocation,
        error: &ToolCallError,
    ) -> HookAction<Value> {
        let pairs = extra([
            ("tool", tool_json(call)),
            ("error", Value::String(error.to_string())),
        ]);
        let out = self.call(cb, "on_tool_error", pairs).0;
        HookAction::replace_with((!out.is_null()).then_some(out))
    }
}
