//! Python functions as tools: described once from their signature and docstring, called
//! with keyword arguments as blocks of the session.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bridge::CancellationToken;
use engine::{State, Tool, ToolContext, ToolError};
use serde::Deserialize;
use serde_json::Value;

use super::{CALL_SLACK, Outcome, PythonToolError, block_failure, failure_text, on_session};
use crate::repl::{ExecutionResult, ReplError, ReplSession};

/// The support module's name in `sys.modules`.
const HELPER: &str = "_rlm_agent_tools";
const HELPER_SOURCE: &str = include_str!("support.py");

/// Tokens naming each entry point's result in the support module, unique in the process.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(0);

/// Where a [`PythonFunctionTool`]'s function lives: the session that runs it and the Python
/// statements that bind it there (a function of the session, or one a workflow file names).
pub trait FunctionHome: Send + Sync + std::fmt::Debug {
    /// The session the function runs in; may block while the session starts.
    fn session(&self) -> Result<Arc<ReplSession>, ReplError>;

    /// Python statements, each indented by four spaces, that bind the function to `_fn`;
    /// they run inside a function of the block, so their names stay local to it.
    fn binding(&self) -> String;

    /// Where the function is, for messages: `` `tools.py` ``, `the session`.
    fn place(&self) -> String;
}

/// A function of a session's namespace, by name.
#[derive(Debug)]
struct SessionFunction {
    session: Arc<ReplSession>,
    name: String,
}

impl FunctionHome for SessionFunction {
    fn session(&self) -> Result<Arc<ReplSession>, ReplError> {
        Ok(Arc::clone(&self.session))
    }

    fn binding(&self) -> String {
        format!("    _fn = globals().get({})\n", python_str(&self.name))
    }

    fn place(&self) -> String {
        "the session".to_owned()
    }
}

/// A Python function the model may call (see the [module docs](super)).
#[derive(Debug)]
pub struct PythonFunctionTool {
    home: Arc<dyn FunctionHome>,
    name: String,
    description: String,
    parameters: Value,
    /// The function takes a `tool_context` parameter.
    takes_context: bool,
    /// The function takes `**kwargs`: any argument fits.
    takes_any: bool,
    /// How long a call may take.
    timeout: Duration,
}

/// A function as the support module describes it.
#[derive(Debug, Deserialize)]
struct Described {
    name: String,
    description: String,
    parameters: Value,
    takes_context: bool,
    takes_any: bool,
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

    /// The function `home` binds, offered as tool `name` with the schema and description
    /// its signature and docstring give. Blocks: the binding runs in the session.
    pub fn from_home(home: Arc<dyn FunctionHome>, name: &str) -> Result<Self, PythonToolError> {
        let session = home.session()?;
        let (binding, name_literal) = (home.binding(), python_str(name));
        let place = python_str(&format!(" in {}", home.place()));
        let (result, out) = run_entry(&session, &CancellationToken::new(), |token| {
            function_block(
                token,
                &binding,
                &format!("describe_function(_fn, {name_literal}, {place}, {token})"),
            )
        })?;
        let load_error = |message| PythonToolError::Load {
            place: home.place(),
            message,
        };
        let mut described: Described = described(&result, out, load_error)?;
        described.name = name.to_owned();
        Self::tool(home, described, session.config().cell_timeout)
    }

    /// This tool described by `description` instead of the docstring.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// This tool with `parameters` (a JSON Schema) instead of the schema derived from the
    /// signature; refused unless it is an `object` schema the signature can take: every
    /// property a parameter of the function, every parameter without a default required.
    pub fn with_parameters(mut self, parameters: Value) -> Result<Self, PythonToolError> {
        let mismatch = |detail: String| PythonToolError::Parameters {
            tool: self.name.clone(),
            detail,
        };
        if parameters.get("type") != Some(&Value::from("object")) {
            return Err(mismatch(
                "they must be a JSON Schema of `type: object`".into(),
            ));
        }
        let names = |schema: &Value, key: &str| -> Vec<String> {
            match schema.get(key) {
                Some(Value::Object(map)) => map.keys().cloned().collect(),
                Some(Value::Array(items)) => items
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
                _ => Vec::new(),
            }
        };
        let takes = names(&self.parameters, "properties");
        let listed = |names: &[String]| {
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let foreign: Vec<String> = names(&parameters, "properties")
            .into_iter()
            .filter(|p| !takes.contains(p))
            .collect();
        if !self.takes_any && !foreign.is_empty() {
            return Err(mismatch(format!(
                "the function takes no {} (it takes {})",
                listed(&foreign),
                if takes.is_empty() {
                    "no arguments".to_owned()
                } else {
                    listed(&takes)
                }
            )));
        }
        let required = names(&parameters, "required");
        let unasked: Vec<String> = names(&self.parameters, "required")
            .into_iter()
            .filter(|p| !required.contains(p))
            .collect();
        if !unasked.is_empty() {
            return Err(mismatch(format!(
                "the function needs {} but `required` does not list it; list it there or give \
                 the parameter a default",
                listed(&unasked)
            )));
        }
        self.parameters = parameters;
        Ok(self)
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
        let timeout = session.config().cell_timeout;
        described
            .into_iter()
            .map(|d| {
                let home = Arc::new(SessionFunction {
                    session: Arc::clone(session),
                    name: d.name.clone(),
                });
                Self::tool(home, d, timeout).map(|t| Arc::new(t) as Arc<dyn Tool>)
            })
            .collect()
    }

    fn tool(
        home: Arc<dyn FunctionHome>,
        d: Described,
        cell_timeout: Duration,
    ) -> Result<Self, PythonToolError> {
        if !bridge::chat::is_valid_tool_name(&d.name) {
            return Err(PythonToolError::InvalidName(d.name));
        }
        Ok(Self {
            home,
            name: d.name,
            description: d.description,
            parameters: d.parameters,
            takes_context: d.takes_context,
            takes_any: d.takes_any,
            timeout: cell_timeout + CALL_SLACK,
        })
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
        // The state travels only to a function that asks for it.
        let context = if self.takes_context {
            let state = Value::Object(ctx.state().with(State::to_map));
            python_str(
                &serde_json::json!({"state": state, "function_call_id": ctx.call_id()}).to_string(),
            )
        } else {
            "None".to_owned()
        };
        let home = Arc::clone(&self.home);
        let session = tokio::task::spawn_blocking(move || home.session())
            .await
            .map_err(|e| ToolError::Failed(format!("The Python call failed unexpectedly: {e}")))?
            .map_err(|e| ToolError::Failed(format!("The Python session failed: {e}")))?;
        let (binding, name) = (self.home.binding(), python_str(&self.name));
        let arguments = python_str(&args.to_string());
        let (result, out) = on_session(&session, ctx.cancel(), move |session, stop| {
            run_entry(session, stop, |token| {
                function_block(
                    token,
                    &binding,
                    &format!("call_function(_fn, {name}, {token}, {arguments}, {context})"),
                )
            })
        })
        .await?
        .map_err(|e| ToolError::Failed(format!("The Python session failed: {e}")))?;
        if !result.is_success() {
            return Err(block_failure(&result, ctx.cancel(), &session));
        }
        let Some(mut out) = out else {
            return Err(ToolError::Failed(format!(
                "The Python function `{}` returned no result",
                self.name
            )));
        };
        bridge::secret::redactor().redact_in_place(&mut out);
        match Outcome::parse(&out) {
            Ok(Outcome::Returned { value, effects, .. }) => {
                effects.report_to(ctx);
                Ok(value)
            }
            Ok(Outcome::Invalid(message)) => Err(ToolError::InvalidArguments(message)),
            // A tool's call is sent its state whole: it is never stale.
            Ok(Outcome::Stale) => Err(ToolError::Failed(format!(
                "The Python function `{}` was not called (a stale state)",
                self.name
            ))),
            Ok(Outcome::Raised {
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
        Some(self.timeout)
    }
}

/// A block that binds the function (`binding`) inside a function of its own, numbered by
/// `token`, and calls the support module's `entry` there; the function is gone afterwards,
/// and so is the block's source (`forget_block`): its arguments are literals in it — a
/// step's or tool's whole state — which the session would otherwise keep for every call
/// (in `linecache` and its definitions for spawn workers), a run's memory growing with the
/// square of its steps.
pub(crate) fn function_block(token: u64, binding: &str, entry: &str) -> String {
    format!(
        "def __rlm_tool_{token}():\n{binding}    __import__({helper}).{entry}\n\
         try:\n    __rlm_tool_{token}()\nfinally:\n    del __rlm_tool_{token}\n    \
         __import__({helper}).forget_block()\n",
        helper = python_str(HELPER)
    )
}

/// The description(s) an entry point left, or the error its block ended with (`on_error`
/// wraps the Python error's text).
fn described<T: serde::de::DeserializeOwned>(
    result: &ExecutionResult,
    out: Option<String>,
    on_error: impl FnOnce(String) -> PythonToolError,
) -> Result<T, PythonToolError> {
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
    let out = out.ok_or_else(|| PythonToolError::Internal("no description came back".into()))?;
    serde_json::from_str(&out).map_err(|e| PythonToolError::Internal(e.to_string()))
}

/// Runs the support module's entry point written by `code(token)` as a block of `session`,
/// then pops what it left under `token` (both in the session's interpreter, which may be a
/// worker's).
pub(crate) fn run_entry(
    session: &ReplSession,
    stop: &CancellationToken,
    code: impl FnOnce(u64) -> String,
) -> Result<(ExecutionResult, Option<String>), ReplError> {
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    session.ensure_module(HELPER, HELPER_SOURCE)?;
    let result = session.exec_until_stopped(&code(token), stop)?;
    let out = session.pop_result(HELPER, token)?;
    Ok((result, out))
}

/// `text` as a Python string literal (JSON's string syntax is a subset of Python's).
pub(crate) fn python_str(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}
