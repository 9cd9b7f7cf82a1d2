//! The kernel's workflow agents: the parts of a workflow that need Python.
//!
//! The engine (`engine::flow`) runs agents and knows nothing of Python; this module adds
//! the agents and callbacks that run in the embedded REPL, all sharing one
//! [`FlowKernel`] per run — the endpoints and one REPL session holding the contexts:
//!
//! - [`RlmAgent`]: the RLM loop as an agent (query templated from the state, answer to
//!   `output_key`, iterations and sub-calls as `metadata` events).
//! - [`PythonAgent`]: a deterministic step: a Python function of the step's context (`ctx`:
//!   `state`, `actions`), or of the state as a dict returning a dict of updates.
//! - [`ContextLoader`]: loads the contexts into the session and writes their metadata to
//!   the state.
//! - [`PythonCallback`]: a Python callable named in a workflow file as a callback.
//! - [`PythonStateFunction`]: a Python function named by a `python` test of a condition or
//!   quality gate.
//! - Python functions named in a workflow file as an `LlmAgent`'s tools: the
//!   agents' [`PythonFunctionTool`](crate::tools::PythonFunctionTool)s, bound through the
//!   run's session (keyword arguments, a `tool_context` for the state and actions).
//!
//! Every Python function of a workflow reports state changes and actions one way, Google
//! ADK's: through a context in a parameter named for its kind (`tool_context`,
//! `callback_context`, `ctx`), whose `state` records writes, deletes and in-place changes
//! and whose `actions` takes `exit_loop`, `end_turn` and `escalate`; they come back as
//! [`engine::StateWrite`]s and [`engine::Actions`], applied and reported as any step's.
//! - [`render_event_log_html`]: a run's JSONL event log as one HTML page (`rlm view`).
//!
//! [`register`] teaches the engine's `Registry` to build these from workflow files, and the
//! engine's `RouterAgent` class.
//!
//! Python functions are named `module:function`, `module.function` or
//! `file.py:function` ([`PyFunction`]). The REPL blocks, so each step waits for it on a
//! thread of its own, never on a runtime thread.

mod build;
mod callbacks;
mod contexts;
mod flow_tool;
mod python;
mod python_agent;
mod rlm_agent;
mod services;
mod state_fn;
mod view;

pub use build::{LOAD_CONTEXTS, register, step_writes};
pub use callbacks::PythonCallback;
pub use contexts::{CONTEXTS_KEY, ContextLoader};
pub use python::{Called, FunctionKind, PyCallError, PyFunction};
pub use python_agent::PythonAgent;
pub use rlm_agent::RlmAgent;
pub use services::FlowKernel;
pub use state_fn::PythonStateFunction;
pub use view::{EventLogViewError, is_event_log, render_event_log_html};
