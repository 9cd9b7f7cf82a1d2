//! The rlm-kernel workflow engine: everything about agents that needs no Python.
//!
//! Dependencies point one way: `bridge` (models over HTTP) ← `engine` ← the kernel library
//! (which adds Python-backed tools and agents) ← the `rlm` binary. This crate never links
//! CPython, so workflows, the agent loop and bundles build and test without it.
//!
//! The pieces, bottom up:
//!
//! - [`text`]: text cut to size for a model (head and tail around what was left out).
//! - [`document`]: YAML and TOML parsed within a size and a nesting limit, so a hostile
//!   workflow, bundle or config file is refused at once.
//! - [`date`]: UTC dates as text (`YYYY-MM-DD`, RFC 3339) for bundles and decision records.
//! - [`jsonl`]: the redacted, flushed-per-line [`JsonlWriter`](jsonl::JsonlWriter) under
//!   every log the engine and the kernel write (transcript, trajectory, events, decisions).
//! - `decisions`: the router's decision record and the `decisions` channel as the state
//!   keeps it (typed records, each the size of its fields, written as the same JSON).
//! - [`state`]: the session [`State`] (JSON values under scoped keys), the [`StateWrite`]
//!   — replace, append, delete — that is the one unit of state change from a tool to a
//!   checkpoint, and the [`StateDelta`] (the writes of a step, shared rather than copied).
//!   A write is applied as it is made, so the next tool, callback, sibling or iteration
//!   sees it.
//! - [`hook`]: [`HookAction`], the one answer of every before-hook and callback (continue,
//!   replace the step's output, stop the run) — the agent loop's, the workflow callbacks'
//!   and the kernel's RLM loop's.
//! - [`condition`]: [`Condition`](condition::Condition), the state tests (or named Python
//!   functions) of graph edges, router successors and quality gates.
//! - [`tool`]: the [`Tool`] trait (name, description, JSON-Schema parameters, `async call`)
//!   and the [`ToolContext`] a call gets: its id, a cancellation token, the shared state and
//!   the [`Actions`] (`exit_loop`, `end_turn`, `escalate`) it may raise.
//! - [`agent`]: the function-calling loop ([`AgentLoop`]): model with tools → tool calls
//!   run concurrently → results → … → answer, with limits, hooks and metrics.
//! - [`flow`]: workflows — the [`Agent`](flow::Agent) trait, events, the invocation
//!   context, and the graph executor under the Sequential, Loop and Parallel agents.
//! - [`bundle`]: agent bundles — persona agents in files, their path variables, the path
//!   sandbox, and the file tools (`read_file`, `execute_workflow`, `save_output`).
//! - [`reducer`]: per-key reducers: an update of `messages` or `decisions` is an append,
//!   of any other key a replace.
//! - [`durable`]: the SQLite checkpoint store — per run a chain of checkpoints holding each
//!   step's writes, snapshots only as needed, run status, retention.
//! - [`route`]: the routing control plane — the router's pure decision, decision records,
//!   quality gates, retry backoff, health metrics, and `RouterAgent` workflow files.
//! - [`inputs`]: the state keys a workflow file needs from whoever starts it, found before
//!   it runs (an instruction's `{key}` that nothing in the workflow writes).
//!
//! ```
//! use engine::{SharedState, State, ToolContext};
//! use serde_json::json;
//!
//! let state = SharedState::new(State::default());
//! let ctx = ToolContext::new("call_1", state.clone());
//! ctx.set_state("temp:query", json!("Which regions grew?"));
//! ctx.exit_loop();
//! assert_eq!(state.get("temp:query"), Some(json!("Which regions grew?")));
//! assert!(ctx.take_actions().exit_loop);
//! ```

// Every public item says what it is (`clippy -D warnings` makes this an error).
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![warn(unnameable_types)]

pub mod agent;
mod blocking;
pub mod bundle;
pub mod condition;
pub mod date;
mod decisions;
pub mod document;
pub mod durable;
pub mod flow;
pub mod hook;
pub mod inputs;
pub mod jsonl;
pub mod reducer;
pub mod route;
pub mod state;
pub mod text;
pub mod tool;

pub use agent::{AgentLoop, LoopConfig, LoopError, LoopOutcome, Toolbox};
pub use hook::HookAction;

pub use state::{CatchUp, Mirror, Scope, SharedState, State, StateDelta, StateWrite};
pub use tool::{Actions, Tool, ToolContext, ToolError};
