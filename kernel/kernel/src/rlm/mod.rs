//! The RLM loop: a root model writes code, the kernel runs it against the context, until the
//! model gives a final answer.
//!
//! # Pieces
//!
//! - Three stages, each usable on its own (workflow agents reuse them):
//!   [`CodeGenerator`] asks the root model for the next reply over a [`Conversation`];
//!   [`CodeExecutor`] runs the reply's ```` ```repl ```` blocks ([`extract_code_blocks`]) in the
//!   [`ReplSession`](crate::repl::ReplSession); [`CompletionChecker`] decides whether the reply
//!   finished the run ([`check_completion`]: the `answer` dict, `FINAL_VAR`, `FINAL(...)`, under a
//!   [`Protocol`] and a [`CodeAndFinal`] policy).
//! - [`Rlm`] runs them in a loop with limits ([`RlmConfig`]) and returns an [`RlmResult`]: the
//!   answer, a [`TerminationReason`], [`SessionMetrics`] and one [`IterationRecord`] per
//!   iteration ([`IterationMetadata`], [`ExecutionMetadata`], capped block outputs, sub-calls).
//! - What the model reads: [`Prompts`] (texts in `prompts/`, compiled in) and the feedback
//!   message after each reply ([`format_feedback`]). Secrets never get there: block output is
//!   redacted by the session, and every request by the bridge ([`bridge::secret`]); the
//!   [`TrajectoryWriter`] redacts each line it writes.
//! - The run tree (`tree`): when [`RlmConfig::max_depth`] allows, the code's `rlm_query`
//!   starts child runs — each an [`Rlm`] with a session of its own on the same endpoints,
//!   ledger and sub-call record — recorded as [`ChildRun`] nodes on the block that started
//!   them.
//! - [`RlmChat`] asks follow-up questions in the same session (variables persist; the root
//!   model sees a bounded summary of earlier questions and answers).
//! - [`render_trajectory_html`] turns a trajectory into one self-contained HTML page (`rlm
//!   view`, the notebook's result view).
//! - [`Hook`]s see every step and may amend or stop it; [`MetricsHook`], [`TrajectoryWriter`]
//!   (JSONL) and [`ProgressHook`] are hooks.
//!
//! # Data flow of one iteration
//!
//! ```text
//! Conversation ─▶ CodeGenerator ─▶ reply ─▶ extract_code_blocks ─▶ CodeExecutor ─▶ BlockRun*
//!      ▲                                                                              │
//!      └── reply + format_feedback(runs, notes) ◀── CompletionChecker ◀───────────────┘
//!                                                        │ final answer
//!                                                        ▼
//!                                                    RlmResult
//! ```
//!
//! # Final answers
//!
//! The exact rules are on [`check_completion`]; in short, a run ends when:
//!
//! - code sets `answer["ready"] = True`: the answer is `str(answer["content"])`. A block that
//!   rebinds `answer` to a dict (any mapping) makes that mapping the answer slot, read after
//!   every later block (`answer = {"content": "later", "ready": False}`, then
//!   `answer["ready"] = True`); rebinding it to anything else puts back a fresh
//!   `{"content": "", "ready": False}`, with a note in the block's stderr;
//! - code calls `FINAL_VAR(x)`: a str is the name of a variable (trimmed of whitespace and
//!   quotes; a str variable passed itself is its own value); a name that is not defined records
//!   nothing, and the call returns (and prints to stderr) an error naming it and listing the
//!   user variables; any other value is its own answer (`str(x)`);
//! - a reply line outside ```` ```repl ```` blocks starts with `FINAL_VAR(name)`, or starts with
//!   `FINAL(` and ends with the balancing `)` (`FINAL(42) done` is prose);
//! - a reply has code and such a line: the blocks run first, then the line is read, and it
//!   ends the run unless a block of that reply raised ([`CodeAndFinal::AcceptUnlessError`]).
//!
//! The parsers ([`extract_code_blocks`], [`scan_final_lines`]) run in linear time on any reply
//! and never panic; property tests check both.
//!
//! # Cells that would end the process
//!
//! `sys.exit()`, `os._exit()`, `os.abort()` and a terminating signal sent to the session's own
//! process end only the block, with an error in its output (see [`crate::repl`]). A crash in C
//! code cannot be survived in-process: the [`TrajectoryWriter`] writes each reply and each
//! block's code before the block runs, so the last line on disk names the block that killed
//! the process, and a program that called [`crate::fatal::install`] (the `rlm` binary) writes
//! one line naming the signal and the block and exits with its own code. A `SIGKILL` (the OOM
//! killer) cannot be caught; the trajectory still names the block. Running the session in a
//! worker process, so that the loop survives such a crash, is planned.
//!
//! # Defaults worth knowing
//!
//! - 30 iterations, then one "answer now" call; 5 failing iterations in a row stop the run; no
//!   wall-clock limit unless [`RlmConfig::run_timeout`] is set (at the deadline a running block
//!   is interrupted through the session's cancellation token).
//! - Block output shown to the model: 20 000 characters per block, head and tail kept.
//! - A reply with code *and* a `FINAL`/`FINAL_VAR` line ends the run after its blocks ran,
//!   unless one of them raised ([`CodeAndFinal::AcceptUnlessError`]; see [`check_completion`]).
//! - [`Rlm::run`] blocks the calling thread and may be called again; hooks stay registered.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use bridge::{Budget, EndpointConfig, Endpoints, Ledger};
//! use kernel::repl::{ContextSource, ReplSession, SessionConfig};
//! use kernel::rlm::{Rlm, RlmConfig, TrajectoryWriter};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let endpoints = Arc::new(Endpoints::new(
//!     vec![
//!         EndpointConfig::openai("root", "http://127.0.0.1:8000/v1", "big-model"),
//!         EndpointConfig::openai("sub", "http://127.0.0.1:8000/v1", "small-model"),
//!     ],
//!     Arc::new(Ledger::new(Budget::default())),
//! )?);
//! let session = ReplSession::new(
//!     SessionConfig::default(),
//!     Arc::clone(&endpoints),
//!     &[ContextSource::Path("logs.txt".into())],
//! )?;
//! let mut rlm = Rlm::new(RlmConfig::default(), endpoints, Arc::new(session));
//! rlm.add_hook(TrajectoryWriter::create("trajectory.jsonl".as_ref())?);
//! let result = rlm.run("Which service logged the most errors?")?;
//! println!("{:?}: {}", result.termination_reason, result.answer.unwrap_or_default());
//! # Ok(()) }
//! ```

mod blocks;
mod chat;
mod checker;
mod config;
mod executor;
mod feedback;
mod final_answer;
mod generator;
mod hooks;
mod metadata;
mod metrics;
#[cfg(test)]
mod parser_properties;
mod progress;
mod prompts;
mod runner;
#[cfg(test)]
pub(crate) mod test_support;
pub mod trace;
mod trajectory;
mod tree;
mod view;

pub use blocks::{CodeBlock, extract_code_blocks};
pub use chat::{DEFAULT_SUMMARY_CHARS, Exchange, RlmChat};
pub use checker::CompletionChecker;
pub use config::RlmConfig;
pub use executor::{CodeExecutor, ExecutedReply, ExecutionStop};
pub use feedback::{FeedbackConfig, format_block, format_feedback, truncate_middle};
pub use final_answer::{
    CodeAndFinal, Completion, CompletionRules, FinalKind, FinalLines, FinalNote, FinalText,
    FoundAnswer, Protocol, ReplyCode, UnknownCodeAndFinal, UnknownProtocol, check_completion,
    scan_final_lines,
};
pub use generator::{CodeGenerator, Conversation, Generation};
pub use hooks::{EndpointSummary, Hook, HookAction, Hooks, ModelCall, RunError, RunInfo};
pub use metadata::{
    BlockRecord, BlockRun, ChildRun, ExecutionMetadata, ExecutionStatus, IterationMetadata,
    IterationRecord, ModelMetrics, RlmResult, SessionMetrics, TerminationReason,
};
pub use metrics::MetricsHook;
pub use progress::{Phase, Progress, ProgressHook, ProgressSnapshot};
pub use prompts::{PromptConfig, Prompts, describe_contexts};
pub use runner::{Rlm, RlmError, StopHandle};
pub use trajectory::{TRAJECTORY_VERSION, TrajectoryWriter};
pub(crate) use view::escape as escape_html;
pub use view::{ViewError, render_trajectory_html};
