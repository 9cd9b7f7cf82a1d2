//! The kernel's workflow agents: the parts of a workflow that need Python.
//!
//! The engine (`engine::flow`) runs agents and knows nothing of Python; this module adds
//! the agents and callbacks that run in the embedded REPL, all sharing one
//! [`FlowKernel`] per run — the endpoints and one REPL session holding the contexts:
//!
//! - [`RlmAgent`]: the RLM loop as an agent (query templated from the state, answer to
//!   `output_key`, iterations and sub-calls as `metadata` events).
//! - [`PythonAgent`]: a deterministic step `(state) -> dict of updates`.
//! - [`ContextLoader`]: loads the contexts into the session and writes their metadata to
//!   the state.
//! - [`PythonCallback`]: a Python callable named in a workflow file as a callback.
//!
//! [`build_kernel_agent`] makes these agents from workflow-file specs and
//! [`python_callbacks`] the callbacks any agent's file names.
//!
//! Python functions are named `module:function`, `module.function` or
//! `file.py:function` ([`PyFunction`]). The REPL blocks, so each step waits for it on a
//! thread of its own, never on a runtime thread.

mod build;
mod callbacks;
mod contexts;
mod python;
mod python_agent;
mod rlm_agent;
mod services;

pub use build::{LOAD_CONTEXTS, build_kernel_agent, python_callbacks};
pub use callbacks::{CallbackPoint, PythonCallback};
pub use contexts::{CONTEXTS_KEY, ContextLoader};
pub use python::{PyCallError, PyFunction};
pub use python_agent::{ACTIONS_KEY, MESSAGE_KEY, PythonAgent};
pub use rlm_agent::RlmAgent;
pub use services::FlowKernel;
