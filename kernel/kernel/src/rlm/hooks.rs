//! Hooks: code that watches, amends or stops a run at every step.
//!
//! The loop calls a [`Hook`] before and after the run, each iteration, each root-model call and
//! each block, for every sub-call a block made, and on errors. Before-hooks return a
//! [`HookAction`]: [`Continue`](HookAction::Continue), [`Replace`](HookAction::Replace) the step's
//! output (skip the step), or [`Stop`](HookAction::Stop) the run (termination reason
//! `stopped_by_hook`). After-hooks get the step's output by `&mut` and may amend it.
//!
//! Hooks run in registration order. For before-hooks the first one that does not continue
//! decides and the rest are not asked; after-hooks all run. Metrics
//! ([`MetricsHook`](super::MetricsHook)), the trajectory
//! ([`TrajectoryWriter`](super::TrajectoryWriter)) and progress
//! ([`ProgressHook`](super::ProgressHook)) are hooks like any other.
//!
//! Sub-calls are made by Python code through the bridge while the block runs, on the runtime's
//! threads; the loop sees them only when the block returns, so there is an after-hook
//! ([`Hook::on_sub_call`]) but no before-hook. To veto or rewrite a sub-call, give the session an
//! endpoint that does so.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::blocks::CodeBlock;
use super::config::RlmConfig;
use super::metadata::{BlockRun, IterationRecord, RlmResult};
use crate::repl::{ContextMetadata, ExecutionResult};
use bridge::{ChatRequest, ChatResponse, Ledger, Message, SubCallMetadata};

/// What a before-hook wants the loop to do: the engine's, the one answer of every hook (the
/// agent loop's and the workflow callbacks' too). `Stop` ends the run with the termination
/// reason `stopped_by_hook`.
pub use engine::HookAction;

/// What a run starts with, for [`Hook::before_run`].
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo<'a> {
    /// The user's query.
    pub query: &'a str,
    /// The loop's configuration (holds no secrets).
    pub config: &'a RlmConfig,
    /// The models of the run, without keys or headers.
    pub endpoints: &'a [EndpointSummary],
    /// The loaded contexts (their metadata; never the data).
    pub contexts: &'a [ContextMetadata],
    /// The system prompt as sent.
    pub system_prompt: &'a str,
    /// When the run started, in unix milliseconds.
    pub started_at_ms: u64,
    /// The ledger every model call of the run is recorded in.
    #[serde(skip)]
    pub ledger: Option<&'a Arc<Ledger>>,
}

/// A model endpoint as the trajectory records it: no API key, no headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSummary {
    /// Endpoint name (`root`, `sub`, ...).
    pub name: String,
    /// `openai` or `anthropic`.
    pub provider: String,
    /// Model name.
    pub model: String,
    /// Base URL.
    pub base_url: String,
}

/// One root-model call, for [`Hook::after_model_call`].
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCall {
    /// The iteration (the "answer now" call has `max_iterations + 1`).
    pub iteration: u32,
    /// Whether this is the "answer now" call after the last iteration.
    pub answer_now: bool,
    /// The reply text; amend it to change what the loop parses and keeps in the history.
    pub reply: String,
    /// The model's response (`None` when a hook replaced the call).
    pub response: Option<ChatResponse>,
    /// The bridge's record of the call (`None` when a hook replaced the call).
    pub record: Option<SubCallMetadata>,
}

/// What went wrong, for [`Hook::on_error`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunError {
    /// The iteration it happened in (0 before the first).
    pub iteration: u32,
    /// A short stable tag (`root_model`, `kernel`, `budget`, ...).
    pub kind: String,
    /// The message.
    pub message: String,
    /// The bridge's record of a failed root-model call.
    pub record: Option<SubCallMetadata>,
}

/// Watches, amends or stops a run. Every method has a do-nothing default.
pub trait Hook: Send {
    /// Before anything runs. `Replace(answer)` ends the run at once with that answer.
    fn before_run(&mut self, _run: &RunInfo<'_>) -> HookAction<String> {
        HookAction::Continue
    }

    /// Before an iteration's root-model call. `Replace(answer)` ends the run with that answer.
    fn before_iteration(&mut self, _iteration: u32, _messages: &[Message]) -> HookAction<String> {
        HookAction::Continue
    }

    /// Before a root-model call; may amend the request. `Replace(reply)` skips the call and uses
    /// the text as the model's reply.
    fn before_model_call(
        &mut self,
        _iteration: u32,
        _request: &mut ChatRequest,
    ) -> HookAction<String> {
        HookAction::Continue
    }

    /// After a root-model call.
    fn after_model_call(&mut self, _call: &mut ModelCall) {}

    /// Before a block runs; may amend the code. `Replace(result)` skips running it.
    fn before_block(
        &mut self,
        _iteration: u32,
        _block: &mut CodeBlock,
    ) -> HookAction<ExecutionResult> {
        HookAction::Continue
    }

    /// After a block ran (before its sub-calls are reported), with the `rlm_query` children
    /// it started: the run is what the block's record is made from.
    fn after_block(&mut self, _iteration: u32, _run: &mut BlockRun) {}

    /// For each sub-model call a block made, in call order, after the block.
    fn on_sub_call(&mut self, _iteration: u32, _call: &SubCallMetadata) {}

    /// After an iteration: its record as the result keeps it.
    fn after_iteration(&mut self, _record: &mut IterationRecord) {}

    /// When a step fails (root model unreachable, kernel broken, budget spent, ...).
    fn on_error(&mut self, _error: &RunError) {}

    /// After the run, before the result is returned.
    fn after_run(&mut self, _result: &mut RlmResult) {}
}

/// The hooks of a run, called in order.
#[derive(Default)]
pub struct Hooks {
    list: Vec<Box<dyn Hook>>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("len", &self.list.len())
            .finish()
    }
}

impl Hooks {
    /// No hooks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a hook after the existing ones.
    pub fn push(&mut self, hook: impl Hook + 'static) {
        self.list.push(Box::new(hook));
    }

    /// The number of hooks.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn first_action<T>(
        &mut self,
        mut ask: impl FnMut(&mut dyn Hook) -> HookAction<T>,
    ) -> HookAction<T> {
        for hook in &mut self.list {
            match ask(hook.as_mut()) {
                HookAction::Continue => {}
                other => return other,
            }
        }
        HookAction::Continue
    }
}

impl Hook for Hooks {
    fn before_run(&mut self, run: &RunInfo<'_>) -> HookAction<String> {
        self.first_action(|h| h.before_run(run))
    }

    fn before_iteration(&mut self, iteration: u32, messages: &[Message]) -> HookAction<String> {
        self.first_action(|h| h.before_iteration(iteration, messages))
    }

    fn before_model_call(
        &mut self,
        iteration: u32,
        request: &mut ChatRequest,
    ) -> HookAction<String> {
        self.first_action(|h| h.before_model_call(iteration, request))
    }

    fn after_model_call(&mut self, call: &mut ModelCall) {
        self.list.iter_mut().for_each(|h| h.after_model_call(call));
    }

    fn before_block(
        &mut self,
        iteration: u32,
        block: &mut CodeBlock,
    ) -> HookAction<ExecutionResult> {
        self.first_action(|h| h.before_block(iteration, block))
    }

    fn after_block(&mut self, iteration: u32, run: &mut BlockRun) {
        self.list
            .iter_mut()
            .for_each(|h| h.after_block(iteration, run));
    }

    fn on_sub_call(&mut self, iteration: u32, call: &SubCallMetadata) {
        self.list
            .iter_mut()
            .for_each(|h| h.on_sub_call(iteration, call));
    }

    fn after_iteration(&mut self, record: &mut IterationRecord) {
        self.list.iter_mut().for_each(|h| h.after_iteration(record));
    }

    fn on_error(&mut self, error: &RunError) {
        self.list.iter_mut().for_each(|h| h.on_error(error));
    }

    fn after_run(&mut self, result: &mut RlmResult) {
        self.list.iter_mut().for_each(|h| h.after_run(result));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records calls into a shared log and answers with a fixed action.
    struct Probe {
        name: &'static str,
        action: HookAction<String>,
        log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl Hook for Probe {
        fn before_model_call(
            &mut self,
            _iteration: u32,
            request: &mut ChatRequest,
        ) -> HookAction<String> {
            self.log
                .lock()
                .expect("log")
                .push(format!("{} before", self.name));
            request.messages.push(Message::user(self.name));
            self.action.clone()
        }

        fn after_model_call(&mut self, call: &mut ModelCall) {
            self.log
                .lock()
                .expect("log")
                .push(format!("{} after", self.name));
            call.reply.push_str(self.name);
        }
    }

    #[test]
    fn first_non_continue_action_wins_and_after_hooks_all_run() {
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut hooks = Hooks::new();
        for (name, action) in [
            ("a", HookAction::Continue),
            ("b", HookAction::Replace("cached".to_owned())),
            ("c", HookAction::Stop("never asked".to_owned())),
        ] {
            hooks.push(Probe {
                name,
                action,
                log: log.clone(),
            });
        }
        let mut request = ChatRequest::default();
        assert_eq!(
            hooks.before_model_call(1, &mut request),
            HookAction::Replace("cached".into())
        );
        assert_eq!(
            request.messages.len(),
            2,
            "a and b amended the request, c was not asked"
        );

        let mut call = ModelCall {
            iteration: 1,
            answer_now: false,
            reply: String::new(),
            response: None,
            record: None,
        };
        hooks.after_model_call(&mut call);
        assert_eq!(call.reply, "abc");
        assert_eq!(
            *log.lock().expect("log"),
            ["a before", "b before", "a after", "b after", "c after"]
        );
    }

    #[test]
    fn no_hooks_continue() {
        let mut hooks = Hooks::new();
        assert!(hooks.is_empty());
        assert_eq!(hooks.before_iteration(1, &[]), HookAction::Continue);
    }
}
