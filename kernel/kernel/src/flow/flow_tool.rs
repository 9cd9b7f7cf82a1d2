//! [`PythonFlowTool`]: a Python function named in a workflow file as an `LlmAgent`'s tool.
//!
//! `tools: [{name: "tools.py:lookup", args: {description: ..., parameters: {...}}}]`: the
//! model calls it by the function's name (`lookup`); `args` may set its `description` and
//! the JSON Schema of its `parameters` (absent: no parameters). The function gets one dict,
//! `ctx`, as a callback does: `args` (the model's arguments), `state` (a copy it may change:
//! changed and new keys are written back) and `actions` (`exit_loop`, `end_turn`,
//! `escalate`, to set to `True`). What it returns (JSON) is the tool's result; an exception
//! is the call's error (the model sees it, `on_tool_error` callbacks may recover).
//!
//! Unlike `kernel::tools::PythonFunctionTool` (the agents issue's tools: keyword arguments,
//! schema from the signature, no state), a workflow tool works on the workflow's state, in
//! the calling convention of the workflow's Python callbacks and steps.

use std::sync::Arc;

use async_trait::async_trait;
use engine::{Tool, ToolContext, ToolError};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::callbacks::write_back;
use super::python::PyFunction;
use super::services::{FlowKernel, off_runtime};

/// What `args` of a Python tool may set.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolArgs {
    #[serde(default)]
    description: String,
    parameters: Option<Value>,
}

/// A Python function as a [`Tool`]; see the module docs.
pub struct PythonFlowTool {
    function: PyFunction,
    description: String,
    parameters: Value,
    kernel: Arc<FlowKernel>,
}

impl std::fmt::Debug for PythonFlowTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PythonFlowTool({})", self.function.display())
    }
}

impl PythonFlowTool {
    /// `function` as a tool, described by the entry's `args`, in `kernel`'s session; the
    /// error says what is wrong with `args`.
    pub fn new(
        function: PyFunction,
        args: &Map<String, Value>,
        kernel: Arc<FlowKernel>,
    ) -> Result<Self, String> {
        let args: ToolArgs = serde_json::from_value(Value::Object(args.clone())).map_err(|e| {
            format!("{e}; `args` of a Python tool may set `description` and `parameters`")
        })?;
        let parameters = args
            .parameters
            .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        if parameters.get("type") != Some(&json!("object")) {
            return Err(format!(
                "`parameters` of Python tool `{}` must be a JSON Schema of `type: object`",
                function.name()
            ));
        }
        Ok(Self {
            function,
            description: args.description,
            parameters,
            kernel,
        })
    }
}

#[async_trait]
impl Tool for PythonFlowTool {
    fn name(&self) -> &str {
        self.function.name()
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        self.parameters.clone()
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let state = Value::Object(ctx.state().with(|s| s.values().clone()));
        let call_ctx = json!({
            "args": args,
            "state": state,
            "actions": {"exit_loop": false, "end_turn": false, "escalate": false},
        });
        let (kernel, function, stop) = (
            Arc::clone(&self.kernel),
            self.function.clone(),
            ctx.cancel().clone(),
        );
        let called = off_runtime(
            self.name(),
            move || {
                let session = kernel.session().map_err(|e| e.to_string())?;
                function
                    .call(&session, &call_ctx, &Map::new(), &stop)
                    .map_err(|e| e.to_string())
            },
            || self.kernel.interrupt(),
        )
        .await
        .map_err(|e| ToolError::Failed(e.to_string()))?;
        if ctx.cancel().is_cancelled() {
            return Err(ToolError::Cancelled);
        }
        let (out, after) = called.map_err(|e| {
            ToolError::Failed(format!(
                "Python tool `{}` failed: {e}",
                self.function.display()
            ))
        })?;
        let actions = write_back(&after, &state, |key, value| ctx.set_state(key, value));
        if actions.exit_loop {
            ctx.exit_loop();
        }
        if actions.end_turn {
            ctx.end_turn();
        }
        if actions.escalate {
            ctx.escalate();
        }
        Ok(out)
    }
}
