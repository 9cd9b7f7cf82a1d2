//! Workflows: agents that run agents, over one shared state.
//!
//! The pieces, bottom up (each module imports only those above it):
//!
//! - `event`: the [`Event`] every step reports (author, branch, content, tool calls and
//!   results, state delta, actions).
//! - `error`: [`FlowError`], why a run stopped.
//! - `control`: [`Control`], how control goes on after an agent ran.
//! - `position`: a node's [`Position`] in nested graphs, its path, and the
//!   [`ResumePoint`] a resumed run descends.
//! - `sink`: where events go — the JSONL [`EventLog`] (flushed per event), [`MemorySink`].
//! - `callbacks`: the [`Callback`] points (before/after agent, model and tool; model and
//!   tool errors) that observe, change or short-circuit a step.
//! - `context`: the [`InvocationContext`] — the run's shared state, cancellation, ledger,
//!   sinks, callbacks and node observers, plus the current agent's frame.
//! - `agent`: the [`Agent`] trait and `run_agent`, the one protocol every
//!   agent run follows (start event, callbacks, run, end event).
//! - `graph`: the executor — a [`Graph`] of nodes with plain, conditional and fan-out
//!   edges. Sequential, Loop and Parallel agents are graphs of a fixed shape. A run can
//!   resume at any depth of nested graphs.
//! - `template`: `{key}` / `{key?}` instruction templates over the state.
//! - `step`: [`FnAgent`], a deterministic step written as a Rust function.
//! - [`file`](mod@file): workflow files (ADK Agent Config YAML) read into agent specs, and their
//!   Mermaid rendering.
//! - `llm`: [`LlmAgent`], the function-calling loop ([`crate::agent`]) as an agent, and the
//!   built-in tools `exit_loop`, `end_turn`, `escalate`.
//! - `build`: the [`Registry`] that turns workflow files into agents (models, tools,
//!   callbacks, and the kernel's factories for the Python-backed classes).
//! - `discovery`: the plan-and-discover tools (`request_discovery`,
//!   `write_discovery_results_and_exit`, `write_planning_artifact`) over namespaced
//!   `temp:discovery:*` keys.
//! - `runner`: [`run_workflow`], one bounded invocation of a root agent.
//!
//! Data flows down the tree: a parent runs each child through `run_agent` in a child
//! context; the child writes state through its context (applied at once, so the next step
//! sees it) and emits events carrying those writes; the graph hands each node's writes to
//! the observers (checkpoints) and follows the node's edge; [`Control`] travels back up.
//!
//! Three actions, three scopes: `end_turn` ends the current agent's turn (its parent moves
//! on), `exit_loop` ends the **nearest** enclosing loop only (unlike ADK, where it ends every
//! enclosing loop), `escalate` stops the whole invocation.
//!
//! ```
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! # rt.block_on(async {
//! use std::num::NonZeroU32;
//! use std::sync::Arc;
//! use async_trait::async_trait;
//! use engine::flow::{Agent, Control, Graph, Invocation, InvocationContext, FlowError, run_workflow};
//! use engine::{SharedState, State};
//! use serde_json::json;
//!
//! /// Counts up; asks to leave the loop at 3.
//! struct Counter;
//!
//! #[async_trait]
//! impl Agent for Counter {
//!     fn name(&self) -> &str { "counter" }
//!     fn class(&self) -> &str { "Counter" }
//!     async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
//!         let n = ctx.get_state("n").and_then(|v| v.as_u64()).unwrap_or(0) + 1;
//!         ctx.set_state("n", json!(n));
//!         Ok(if n == 3 { Control::ExitLoop } else { Control::Continue })
//!     }
//! }
//!
//! let max = NonZeroU32::new(10).expect("10 is not zero");
//! let flow = Graph::looping("count", vec![Arc::new(Counter)], max).expect("one node");
//! let report = run_workflow(&flow, Invocation::new(SharedState::new(State::default())), None).await;
//! assert_eq!(report.result, Ok(Control::Continue));
//! assert_eq!(report.state.get("n"), Some(&json!(3)));
//! # });
//! ```

pub(crate) mod agent;
pub(crate) mod build;
pub(crate) mod callbacks;
pub(crate) mod context;
pub(crate) mod control;
pub(crate) mod discovery;
pub(crate) mod error;
pub(crate) mod event;
pub mod file;
pub(crate) mod graph;
pub(crate) mod llm;
pub(crate) mod position;
pub(crate) mod runner;
pub(crate) mod sink;
pub(crate) mod step;
pub(crate) mod template;

pub use agent::{Agent, AgentOutcome, Control, class, run_in};
pub use build::Registry;
pub use callbacks::{Callback, CallbackContext, Callbacks, ToolInvocation};
pub use context::{Invocation, InvocationContext, NodeObserver, NodeRecord, Turn, WindingDown};
pub use discovery::with_discovery;
pub use error::FlowError;
pub use event::{EndStatus, Event, EventKind, ToolResult};
pub use graph::{BranchPolicy, Graph, GraphBuilder, GraphError, Router, StateRouter, Target};
pub(crate) use graph::{DEFAULT_MAX_STEPS, Edge};
pub use llm::{
    EndTurn, Escalate, ExitLoop, LlmAgent, LlmAgentBuilder, MessageRecord, builtin_tool,
};
pub use position::{Position, ResumeAction, ResumePoint, path_text};
pub use runner::{RunOutcome, RunReport, run_workflow};
pub use sink::{EventLog, EventSink, MemorySink};
pub use step::FnAgent;
pub use template::{MissingKey, render_template};
