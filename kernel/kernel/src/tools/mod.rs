//! Python-backed agent tools: the [`engine::Tool`]s that need the embedded REPL, which the
//! engine crate (no Python) cannot provide itself.
//!
//! - [`PythonTool`] (`python`): runs code in the agent's [`ReplSession`], where the loaded
//!   contexts, `llm_query` and the variables of earlier calls are; returns its stdout and
//!   stderr as JSON. An exception is a tool error (the model reads the traceback), the cell
//!   time limit is the call's limit, and the session goes on either way.
//! - [`PythonFunctionTool`]: a function of a Python file (run in the session like `%run`),
//!   of the session itself, or wherever a [`FunctionHome`] binds it (a workflow file's
//!   `tools.py:lookup`), called with the model's arguments as keyword arguments. Its
//!   schema is derived from the signature and its description from the docstring
//!   (`support.py` documents the mapping); its return value goes back as JSON. A parameter
//!   named `tool_context` (Google ADK's convention) is left out of the schema and gets the
//!   call's `state` (reads see the state, writes become the call's state delta) and
//!   `actions` (`exit_loop`, `end_turn`, `escalate`) — the one convention of every Python
//!   function of a workflow (`support.py` describes it): what the call wrote and raised
//!   comes back as `Effects`-shaped JSON, `{"writes": [...], "actions": {...}}`.
//!
//! # Execution path
//! A call never runs Python on a tokio worker thread, and holds the GIL only to convert:
//! each call is a block of the session, sent from a blocking-pool thread
//! (`tokio::task::spawn_blocking`) to the session's own Python thread, exactly as the RLM
//! loop's blocks are, so time limits, interrupts, output capture and redaction apply. A
//! function's result travels as JSON text in the support module (`_rlm_agent_tools`),
//! popped with the GIL held for that one conversion; nothing is written into the session's
//! namespace. Cancelling the call's token, or dropping its future (the agent loop's own
//! timeout), stops the block and only that block.
//!
//! ```no_run
//! use std::sync::Arc;
//! use bridge::{Budget, Endpoints, Ledger};
//! use kernel::repl::{ReplSession, SessionConfig};
//! use kernel::tools::{PythonFunctionTool, PythonTool};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let endpoints = Arc::new(Endpoints::new(Vec::new(), Arc::new(Ledger::new(Budget::default())))?);
//! let session = Arc::new(ReplSession::new(SessionConfig::default(), endpoints, &[])?);
//! let mut tools: Vec<Arc<dyn engine::Tool>> = vec![Arc::new(PythonTool::new(Arc::clone(&session)))];
//! tools.extend(PythonFunctionTool::from_file(&session, "tools.py".as_ref()).await?);
//! # Ok(()) }
//! ```

mod error;
mod function;
mod python;

use std::sync::Arc;

use bridge::CancellationToken;
use engine::{Actions, StateDelta, ToolContext, ToolError};
use serde::Deserialize;
use serde_json::Value;

use crate::repl::{ExecutionResult, ReplSession};

pub use error::PythonToolError;
pub use function::{FunctionHome, PythonFunctionTool};
pub(crate) use function::{function_block, python_str, run_entry};
pub use python::PythonTool;

/// What a Python function reported through its context: its state writes, in order, and
/// the actions it raised. Tools, callbacks and steps all report this way.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Effects {
    /// Its writes (replace, append, delete).
    #[serde(default)]
    pub(crate) writes: StateDelta,
    /// Its actions.
    #[serde(default)]
    pub(crate) actions: Actions,
}

impl Effects {
    /// Applies the writes and raises the actions through a tool call's context.
    pub(crate) fn report_to(self, ctx: &ToolContext) {
        ctx.apply(self.writes);
        ctx.raise(self.actions);
    }
}

/// What one call of a Python function left in the support module (`support.py`'s
/// `_store`): the one format of a tool's, a callback's, a step's and a condition's result.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// The function returned.
    Returned {
        /// The return value, as JSON (`null` when it returned nothing).
        #[serde(default)]
        value: Value,
        /// The argument as the function left it (a callback's `ctx`; `null` for a tool).
        #[serde(default)]
        arg: Value,
        /// The writes and actions it reported through its context.
        #[serde(flatten)]
        effects: Effects,
    },
    /// A workflow function was not called: the session's copy of the state is not the one
    /// the writes it was sent follow (`flow::python` sends the whole state then).
    Stale,
    /// It could not be called as its kind says: the arguments did not fit its signature,
    /// or its form or result did not fit; the text says how to write it.
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

impl Outcome {
    /// Reads the JSON text the support module left under a call's token.
    pub(crate) fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// How much longer than the cell time limit a call may take: the limit is enforced by the
/// session, which reports it; this only covers the report's way back.
const CALL_SLACK: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `work` with `session` on a blocking-pool thread, passing it the stop token of the
/// block it runs: cancelling `cancel`, or dropping the returned future, stops that block.
async fn on_session<T: Send + 'static>(
    session: &Arc<ReplSession>,
    cancel: &CancellationToken,
    work: impl FnOnce(&ReplSession, &CancellationToken) -> T + Send + 'static,
) -> Result<T, ToolError> {
    let stop = cancel.child_token();
    let guard = StopOnDrop {
        stop: stop.clone(),
        session: Arc::clone(session),
        armed: true,
    };
    let mut task = {
        let session = Arc::clone(session);
        tokio::task::spawn_blocking(move || work(&session, &stop))
    };
    let finished = tokio::select! {
        joined = &mut task => Some(joined),
        () = cancel.cancelled() => None,
    };
    let joined = match finished {
        Some(joined) => joined,
        None => {
            // The stop token is a child of `cancel`: the watchdog only needs waking.
            session.check_stop();
            task.await
        }
    };
    guard.disarm();
    joined.map_err(|e| ToolError::Failed(format!("The Python call failed unexpectedly: {e}")))
}

/// Stops the block of a call whose future is dropped before the block returned.
struct StopOnDrop {
    stop: CancellationToken,
    session: Arc<ReplSession>,
    armed: bool,
}

impl StopOnDrop {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.stop.cancel();
            self.session.check_stop();
        }
    }
}

/// The tool error for a block that did not succeed: cancelled, timed out, or an exception
/// (its type, message and traceback, then whatever the block printed).
fn block_failure(
    result: &ExecutionResult,
    cancel: &CancellationToken,
    session: &ReplSession,
) -> ToolError {
    if cancel.is_cancelled() {
        return ToolError::Cancelled;
    }
    if result.timed_out {
        return ToolError::TimedOut(session.config().cell_timeout);
    }
    match &result.error {
        Some(e) => ToolError::Failed(failure_text(
            &e.type_name,
            &e.message,
            &e.traceback,
            &result.stdout,
            &result.stderr,
        )),
        None => ToolError::Failed(failure_text(
            "Error",
            "the Python code failed",
            "",
            &result.stdout,
            &result.stderr,
        )),
    }
}

/// What the model reads of an exception: the traceback (or `Type: message` without one),
/// then what the code printed besides it.
fn failure_text(
    type_name: &str,
    message: &str,
    traceback: &str,
    stdout: &str,
    stderr: &str,
) -> String {
    let traceback = traceback.trim_end();
    let mut text = if traceback.trim().is_empty() {
        format!("{type_name}: {message}")
    } else {
        traceback.to_owned()
    };
    // The session also writes the traceback to stderr; show only what else is there.
    let stderr = if traceback.is_empty() {
        stderr.to_owned()
    } else {
        stderr.replace(traceback, "")
    };
    for (name, output) in [("stdout", stdout), ("stderr", stderr.as_str())] {
        if !output.trim().is_empty() {
            text.push_str(&format!("\n\n{name}:\n{}", output.trim_end()));
        }
    }
    text
}
