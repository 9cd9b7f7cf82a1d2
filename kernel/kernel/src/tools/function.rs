//! Python functions as tools: described once from their signature and docstring, called
//! with keyword arguments as blocks of the session.

use std::ffi::CString;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bridge::CancellationToken;
use engine::{Tool, ToolContext, ToolError};
use pyo3::prelude::*;
use pyo3::types::PyModule;
use serde::Deserialize;
use serde_json::Value;

use super::{CALL_SLACK, PythonToolError, block_failure, failure_text, on_session};
use crate::repl::{ExecutionResult, ReplError, ReplSession};

/// The support module's name in `sys.modules`.
const HELPER: &str = "_rlm_agent_tools";
const HELPER_SOURCE: &str = include_str!("support.py");

/// Tokens naming each entry point's result in the support module, unique in the process.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(0);

/// A Python function the model may call (see the [module docs](super)).
#[derive(Debug)]
pub struct PythonFunctionTool {
    session: Arc<ReplSession>,
    name: String,
    description: String,
    parameters: Value,
}

/// A function as the support module describes it.
#[derive(Debug, Deserialize)]
struct Described {
    name: String,
    description: String,
    parameters: Value,
}

/// What a call left in the support module.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum CallOutcome {
    /// The return value, as JSON.
    Value(Value),
    /// The arguments did not fit the signature.
    Invalid(String),
    /// The function raised.
    Raised {
        /// The exception's class name.
        #[serde(rename = "type")]
        type_name: String,
        /// `str()` of the exception.
        message: String,
        /// The traceback, from the function down.
        traceback: String,
    },
}

impl PythonFunctionTool {
    /// One tool per public function of the Python file at `path` (its `__all__`, else its
    /// top-level `def`s not starting with `_`), after running the file in `session` like
    /// `%run`: what it defines joins the session's namespace.
    pub async fn from_file(
        session: &Arc<ReplSession>,
        path: &Path,
    ) -> Result<Vec<Arc<dyn Tool>>, PythonToolError> {
        let file_error = |message: String| PythonToolError::File {
            path: path.to_owned(),
            message,
        };
        let absolute = std::path::absolute(path).map_err(|e| file_error(e.to_string()))?;
        let text = absolute
            .to_str()
            .ok_or_else(|| file_error("the path is not valid UTF-8".to_owned()))?;
        let path_literal = python_str(text);
        let (result, out) = Self::load(session, move |token| {
            format!(
                "__import__({helper}).load_file(globals(), {path_literal}, {token})",
                helper = python_str(HELPER)
            )
        })
        .await?;
        let described = described(&result, out, file_error)?;
        Self::tools(session, described)
    }

    /// One tool per function of `session` named in `names` (defined by earlier code).
    pub async fn from_session(
        session: &Arc<ReplSession>,
        names: &[&str],
    ) -> Result<Vec<Arc<dyn Tool>>, PythonToolError> {
        let names_literal =
            serde_json::to_string(names).map_err(|e| PythonToolError::Internal(e.to_string()))?;
        let (result, out) = Self::load(session, move |token| {
            format!(
                "__import__({helper}).describe(globals(), {names_literal}, {token})",
                helper = python_str(HELPER)
            )
        })
        .await?;
        let described = described(&result, out, PythonToolError::Definition)?;
        Self::tools(session, described)
    }

    async fn load(
        session: &Arc<ReplSession>,
        code: impl FnOnce(u64) -> String + Send + 'static,
    ) -> Result<(ExecutionResult, Option<String>), PythonToolError> {
        on_session(session, &CancellationToken::new(), move |session, stop| {
            run_entry(session, stop, code)
        })
        .await
        .map_err(|e| PythonToolError::Internal(e.to_string()))?
        .map_err(PythonToolError::Session)
    }

    fn tools(
        session: &Arc<ReplSession>,
        described: Vec<Described>,
    ) -> Result<Vec<Arc<dyn Tool>>, PythonToolError> {
        described
            .into_iter()
            .map(|d| {
                if !bridge::chat::is_valid_tool_name(&d.name) {
                    return Err(PythonToolError::InvalidName(d.name));
                }
                Ok(Arc::new(Self {
                    session: Arc::clone(session),
                    name: d.name,
                    description: d.description,
                    parameters: d.parameters,
                }) as Arc<dyn Tool>)
            })
            .collect()
    }
}

#[async_trait]
impl Tool for PythonFunctionTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        self.parameters.clone()
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        if !args.is_object() {
            return Err(ToolError::InvalidArguments(
                "the arguments must be a JSON object".to_owned(),
            ));
        }
        let name = python_str(&self.name);
        let arguments = python_str(&args.to_string());
        let (result, out) = on_session(&self.session, ctx.cancel(), move |session, stop| {
            run_entry(session, stop, |token| {
                format!(
                    "__import__({helper}).call(globals(), {name}, {token}, {arguments})",
                    helper = python_str(HELPER)
                )
            })
        })
        .await?
        .map_err(|e| ToolError::Failed(format!("The Python session failed: {e}")))?;
        if !result.is_success() {
            return Err(block_failure(&result, ctx.cancel(), &self.session));
        }
        let Some(mut out) = out else {
            return Err(ToolError::Failed(format!(
                "The Python function `{}` returned no result",
                self.name
            )));
        };
        bridge::secret::redactor().redact_in_place(&mut out);
        match serde_json::from_str(&out) {
            Ok(CallOutcome::Value(value)) => Ok(value),
            Ok(CallOutcome::Invalid(message)) => Err(ToolError::InvalidArguments(message)),
            Ok(CallOutcome::Raised {
                type_name,
                message,
                traceback,
            }) => Err(ToolError::Failed(failure_text(
                &type_name,
                &message,
                &traceback,
                &result.stdout,
                &result.stderr,
            ))),
            Err(e) => Err(ToolError::Failed(format!(
                "The result of `{}` could not be read: {e}",
                self.name
            ))),
        }
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.session.config().cell_timeout + CALL_SLACK)
    }
}

/// The descriptions an entry point left, or the error its block ended with (`on_error`
/// wraps the Python error's text).
fn described(
    result: &ExecutionResult,
    out: Option<String>,
    on_error: impl FnOnce(String) -> PythonToolError,
) -> Result<Vec<Described>, PythonToolError> {
    if result.timed_out {
        return Err(PythonToolError::TimedOut);
    }
    if let Some(e) = &result.error {
        if e.type_name == "ToolDefinitionError" {
            return Err(PythonToolError::Definition(e.message.clone()));
        }
        return Err(on_error(failure_text(
            &e.type_name,
            &e.message,
            &e.traceback,
            "",
            "",
        )));
    }
    let out = out.ok_or_else(|| PythonToolError::Internal("no descriptions came back".into()))?;
    serde_json::from_str(&out).map_err(|e| PythonToolError::Internal(e.to_string()))
}

/// Runs the support module's entry point written by `code(token)` as a block of `session`,
/// then pops what it left under `token`. Holds the GIL only to install the module and to
/// take the result.
fn run_entry(
    session: &ReplSession,
    stop: &CancellationToken,
    code: impl FnOnce(u64) -> String,
) -> Result<(ExecutionResult, Option<String>), ReplError> {
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    Python::attach(|py| helper(py).map(drop))
        .map_err(|e| ReplError::internal("loading the tools support module", e))?;
    let result = session.exec_until_stopped(&code(token), stop)?;
    let out = Python::attach(|py| -> PyResult<Option<String>> {
        helper(py)?
            .getattr("results")?
            .call_method1("pop", (token, py.None()))?
            .extract()
    })
    .map_err(|e| ReplError::internal("reading a tool's result", e))?;
    Ok((result, out))
}

/// The support module, loaded into `sys.modules` on first use.
fn helper(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    let modules = py.import("sys")?.getattr("modules")?;
    if let Ok(module) = modules.get_item(HELPER)
        && let Ok(module) = module.cast_into::<PyModule>()
    {
        return Ok(module);
    }
    let source = CString::new(HELPER_SOURCE)?;
    let name = CString::new(HELPER)?;
    // Named like the kernel's support module, so its frames are cut from user tracebacks.
    let module = PyModule::from_code(py, &source, c"<rlm-kernel>", &name)?;
    modules.set_item(HELPER, &module)?;
    Ok(module)
}

/// `text` as a Python string literal (JSON's string syntax is a subset of Python's).
fn python_str(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}
