//! The function-calling agent loop: a model with tools, the tools it calls, and the results
//! fed back until it answers.
//!
//! ```text
//! messages ─► model (tools) ─┬─ no tool calls ───────────────► LoopOutcome { answer, run }
//!     ▲                      └─ tool calls ─► check ─► run (concurrently, bounded)
//!     └──── tool results, in call order ◄────────────┘   └─ an action raised ─► LoopOutcome
//! ```
//!
//! The pieces, bottom up:
//!
//! - [`LoopConfig`] (`config.rs`): iteration cap (50), per-tool and whole-run timeouts,
//!   concurrency of one reply's calls, streaming, model and sampling parameters, and the one
//!   cap on a tool result (100,000 characters): whatever the tool, a longer result reaches
//!   the model as its head and tail around a note saying how much was cut and how to see
//!   the rest ([`Tool::when_cut`](crate::Tool::when_cut)).
//! - [`ToolCallError`] (`failure.rs`): how one call fails. Bad tool traffic never ends a
//!   run: an unknown tool, arguments that are not a JSON object or fail the tool's schema, a
//!   tool that errors, panics or times out — each becomes the tool result
//!   `{"success": false, "error": "..."}`, whose text tells the model what to do instead.
//! - [`Toolbox`] (`toolbox.rs`): tools by unique name, each schema compiled once on `add`.
//! - `dispatch.rs`: runs one reply's calls, each on a task of its own (a slow or CPU-bound
//!   tool does not hold up the others), at most `max_concurrent_tools` at once, under its
//!   timeout; a panic is caught as a failure. Results join the transcript in call order.
//! - [`AgentHook`] (`hooks.rs`): before/after every model call and tool call, in the RLM
//!   loop's style ([`HookAction`](crate::HookAction): continue, replace the output, stop the run), plus each
//!   message as it joins the transcript and the end of the run.
//! - [`LoopOutcome`] / [`AgentRun`] (`outcome.rs`) and [`LoopMetrics`] (`metrics.rs`): the
//!   answer, how the run ended ([`Termination`]), the transcript, the tools' merged
//!   [`StateDelta`](crate::StateDelta) and [`Actions`](crate::Actions), and the metrics
//!   (iterations, tokens per iteration, each call's duration and bytes of context added).
//! - [`LoopError`] (`error.rs`): a run that ended without an answer ([`LoopErrorKind`]:
//!   iteration cap, run timeout, budget, Ctrl-C, model failure, a hook) keeps its
//!   [`AgentRun`]; calls cut short get a "cancelled" result, so the transcript stays valid.
//! - [`TranscriptWriter`] (`transcript.rs`): a hook writing the run as JSONL, one flushed,
//!   redacted line per message, then the result or the error.
//! - [`AgentLoop`] (`run.rs`): the loop itself.
//!
//! A tool that raises an action (`exit_loop`, `end_turn`, `escalate`) ends the turn once the
//! results of its reply are in the transcript; the workflow engine acts on the actions.
//! Budgets are the ledger's ([`bridge::Budget`]): a refused model call ends the run with
//! [`LoopErrorKind::Budget`].
//!
//! ```
//! use std::sync::Arc;
//! use async_trait::async_trait;
//! use bridge::mock::{MockConfig, MockServer, Script};
//! use bridge::{Budget, CancellationToken, Endpoint, EndpointConfig, Ledger, Message};
//! use engine::agent::{AgentLoop, LoopConfig, Termination, Toolbox};
//! use engine::{SharedState, Tool, ToolContext, ToolError};
//! use serde_json::{Value, json};
//!
//! struct Add;
//!
//! #[async_trait]
//! impl Tool for Add {
//!     fn name(&self) -> &str { "add" }
//!     fn description(&self) -> &str { "Adds two integers." }
//!     fn parameters(&self) -> Value {
//!         json!({"type": "object", "required": ["a", "b"],
//!                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})
//!     }
//!     async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
//!         Ok(json!(args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The model asks for `add(2, 3)`, then answers.
//! let script = Script::from_json_value(json!({"models": {"*": {"replies": [
//!     {"tool_call": {"name": "add", "arguments": {"a": 2, "b": 3}}},
//!     "2 + 3 = 5",
//! ]}}}))?;
//! let server = MockServer::start(MockConfig { script, ..MockConfig::default() }).await?;
//! let config = EndpointConfig::openai("root", server.openai_base_url(), "mock");
//! let endpoint = Endpoint::new(config, Arc::new(Ledger::new(Budget::default())))?;
//!
//! let agent = AgentLoop::new(Arc::new(endpoint), Toolbox::new().with(Arc::new(Add))?,
//!                            LoopConfig::default());
//! let messages = vec![Message::user("What is 2 + 3?")];
//! let outcome = agent.run(messages, SharedState::default(), CancellationToken::new()).await?;
//! assert_eq!(outcome.answer, "2 + 3 = 5");
//! assert_eq!(outcome.termination, Termination::Answered);
//! assert_eq!(outcome.run.transcript[2].content, "5"); // the tool result
//! assert_eq!(outcome.run.metrics.tools["add"].calls, 1);
//! server.shutdown().await;
//! # Ok(()) }
//! ```

mod config;
mod dispatch;
mod error;
mod failure;
mod hooks;
mod metrics;
mod outcome;
mod run;
mod toolbox;
mod transcript;

pub use config::LoopConfig;
pub use error::{LoopError, LoopErrorKind};
pub use failure::{ToolCallError, ToolFailureKind};
pub use hooks::{AgentHook, ToolCallRecord};
pub use metrics::{LoopMetrics, ModelCallMetrics, ToolCallMetrics, ToolStats};
pub use outcome::{AgentRun, LoopOutcome, Termination};
pub use run::AgentLoop;
pub use toolbox::{Toolbox, ToolboxError};
pub use transcript::TranscriptWriter;
