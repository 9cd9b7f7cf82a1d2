//! Python functions named in a workflow file as an `LlmAgent`'s tools.
//!
//! `tools: [{name: "tools.py:lookup"}]` offers the function `lookup` to the model as a
//! [`PythonFunctionTool`], the agents' Python function tool, in Google ADK's convention:
//! the model's arguments arrive as keyword arguments, the schema and description come from
//! the signature and docstring, and a `tool_context` parameter gets the workflow's `state`
//! (writes are the call's state delta, applied before the next tool) and `actions`
//! (`exit_loop`, `end_turn`, `escalate`). `args` may set `description` and `parameters` (a
//! JSON Schema that must fit the signature) instead of the derived ones.
//!
//! The function is described once, when the file is built (so a function that cannot be a
//! tool fails then, with the file's line), and loaded afresh for each call in the run's
//! current session ([`FlowFunction`]), as every Python function of a workflow is.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::python::PyFunction;
use super::services::FlowKernel;
use crate::repl::{ReplError, ReplSession};
use crate::tools::{FunctionHome, PythonFunctionTool, PythonToolError};

/// What `args` of a Python tool may set.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolArgs {
    description: Option<String>,
    parameters: Option<Value>,
}

/// Why a workflow file's Python tool cannot be built.
#[derive(Debug, thiserror::Error)]
pub(super) enum FlowToolError {
    /// `args` sets something other than `description` and `parameters`.
    #[error("{0}; `args` of a Python tool may set `description` and `parameters`")]
    Args(String),
    /// The function takes one `ctx` dict, the convention workflow tools had before.
    #[error(
        "`{function}` takes one `ctx` dict, the old way of writing a workflow tool; write it as \
         Google ADK does: the model's arguments as typed parameters (the type hints and the \
         docstring make the schema) and a `tool_context` parameter for the state and actions, \
         e.g. `def {name}(region: str, tool_context) -> dict:` with `tool_context.state[\"key\"]` \
         and `tool_context.actions.exit_loop = True`"
    )]
    OldConvention {
        /// The function as the file names it.
        function: String,
        /// Its name.
        name: String,
    },
    /// The function cannot be a tool.
    #[error("Python tool `{function}`: {source}")]
    Tool {
        /// The function as the file names it.
        function: String,
        /// Why.
        source: PythonToolError,
    },
}

/// A function a workflow file names, bound in the run's current session at each use.
#[derive(Debug)]
pub(super) struct FlowFunction {
    function: PyFunction,
    kernel: Arc<FlowKernel>,
}

impl FunctionHome for FlowFunction {
    fn session(&self) -> Result<Arc<ReplSession>, ReplError> {
        self.kernel.session()
    }

    fn binding(&self) -> String {
        self.function.binding()
    }

    fn place(&self) -> String {
        self.function.place()
    }
}

/// `function` as a tool of `kernel`'s session, described by its signature and docstring
/// unless the entry's `args` say otherwise. Blocks: the function is described in the
/// session.
pub(super) fn python_flow_tool(
    function: PyFunction,
    args: &Map<String, Value>,
    kernel: Arc<FlowKernel>,
) -> Result<PythonFunctionTool, FlowToolError> {
    let args: ToolArgs = serde_json::from_value(Value::Object(args.clone()))
        .map_err(|e| FlowToolError::Args(e.to_string()))?;
    let (display, name) = (function.display(), function.name().to_owned());
    let tool_error = |source| FlowToolError::Tool {
        function: display.clone(),
        source,
    };
    let home = Arc::new(FlowFunction { function, kernel });
    let mut tool = PythonFunctionTool::from_home(home, &name).map_err(tool_error)?;
    let derived = engine::Tool::parameters(&tool);
    let only_ctx = derived
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| p.len() == 1 && p.contains_key("ctx"));
    let names_ctx = args
        .parameters
        .as_ref()
        .and_then(|p| p.pointer("/properties/ctx"))
        .is_some();
    if only_ctx && !names_ctx {
        return Err(FlowToolError::OldConvention {
            function: display,
            name,
        });
    }
    if let Some(parameters) = args.parameters {
        tool = tool.with_parameters(parameters).map_err(tool_error)?;
    }
    if let Some(description) = args.description {
        tool = tool.with_description(description);
    }
    Ok(tool)
}
