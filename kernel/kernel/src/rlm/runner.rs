//! The loop: generator → executor → checker, until a final answer or a limit.
//!
//! [`Rlm::run`] builds the conversation (system prompt, context description and query), then
//! per iteration: asks the root model ([`CodeGenerator`]), runs the reply's blocks
//! ([`CodeExecutor`]), checks for a final answer ([`CompletionChecker`]), records the iteration
//! and answers with the feedback message. Every step goes through the hooks.
//!
//! Stops, each with a [`TerminationReason`] and the best answer there is (a final answer, or the
//! last answer the model gave that was not accepted, such as a `FINAL` line deferred until it
//! saw the output):
//! - a final answer (`final_answer`);
//! - the iteration limit: one more root call asks for the answer now; its text is the answer
//!   (`max_iterations`);
//! - the run's wall-clock limit, checked before every model call and block; a model call in
//!   flight is cancelled at the deadline (`timeout`);
//! - a budget of the bridge's ledger: a sub-call refused inside a block stops the run after that
//!   block, a refused root call stops it at once (`call_budget`, `token_budget`, `cost_budget`);
//! - N iterations in a row with a failing block (`consecutive_failures`);
//! - the root model failing after the bridge's retries (`root_model_error`), or the session
//!   breaking (`kernel_error`): the trajectory so far is kept and the error is in the result;
//! - a hook (`stopped_by_hook`);
//! - a [`StopHandle`] from another thread, e.g. on Ctrl-C (`interrupted`): the root call in
//!   flight is cancelled and a running block interrupted.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::blocks::extract_code_blocks;
use super::checker::CompletionChecker;
use super::config::RlmConfig;
use super::executor::ChildNodes;
use super::executor::{CodeExecutor, ExecutionStop};
use super::feedback::format_feedback;
use super::final_answer::{FinalKind, FinalNote, FinalText, FoundAnswer, scan_final_lines};
use super::generator::{CodeGenerator, Conversation, Generation};
use super::hooks::{EndpointSummary, Hook, HookAction, Hooks, ModelCall, RunError, RunInfo};
use super::metadata::ChildRun;
use super::metadata::{
    BlockRecord, BlockRun, ExecutionMetadata, ExecutionStatus, IterationMetadata, IterationRecord,
    RlmResult, SessionMetrics, TerminationReason,
};
use super::metrics::MetricsHook;
use super::prompts::{KeptSystemPrompt, Prompts};
use super::tree::{NotRun, answer_for_code};
use crate::repl::worker::Shape;
use crate::repl::{
    AheadSession, ChildAnswer, ChildQuery, ChildRunner, ContextMetadata, ContextSource,
    ReplSession, SessionConfig, StopWatch, SubFailure,
};
use bridge::{
    BridgeError, BudgetLimit, CancellationToken, ChatRequest, Endpoints, Message, SubCallMetadata,
};

/// Errors that prevent a run from starting. Once a run started, every failure ends it with a
/// [`TerminationReason`] in the [`RlmResult`] instead.
#[derive(Debug, thiserror::Error)]
pub enum RlmError {
    /// The root endpoint is not configured.
    #[error("Cannot start the run: {0}")]
    Endpoint(#[from] BridgeError),
    /// `run` was called on a thread that drives a tokio runtime.
    #[error(
        "`Rlm::run` blocks and cannot be called from inside a tokio runtime; call it from a plain \
         thread or `tokio::task::spawn_blocking`"
    )]
    InsideRuntime,
    /// The session could not be prepared for the run.
    #[error("Cannot start the run: {0}")]
    Session(#[from] crate::repl::ReplError),
}

/// Runs RLM queries over one session and one endpoint registry.
pub struct Rlm {
    config: RlmConfig,
    endpoints: Arc<Endpoints>,
    session: Arc<ReplSession>,
    hooks: Hooks,
    stop: CancellationToken,
    /// The run's depth in the tree of `rlm_query` runs: 0 for a root.
    depth: u32,
    /// Where the system prompt its runs send is kept, rendered (a child's: shared by its run's
    /// children, [`ChildRuns::start`]); `None`: rendered by each run.
    system_prompt: Option<Arc<KeptSystemPrompt>>,
}

/// Stops a runner's run from another thread (a Ctrl-C handler, a notebook's stop button).
#[derive(Debug, Clone)]
pub struct StopHandle {
    stop: CancellationToken,
    /// Weak: a handle kept by a signal handler must not keep the session (and the processes
    /// its code started) alive after the run.
    session: Weak<ReplSession>,
}

impl StopHandle {
    /// Ends the run in progress as soon as possible: a root-model call in flight is cancelled,
    /// a running block is interrupted (with its sub-calls), and the run returns its best
    /// partial answer with [`TerminationReason::Interrupted`]. Later runs of the same runner
    /// end at once; the session keeps its state for a new runner.
    pub fn stop(&self) {
        self.stop.cancel();
        if let Some(session) = self.session.upgrade() {
            session.interrupt();
        }
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn is_stopped(&self) -> bool {
        self.stop.is_cancelled()
    }
}

/// What an interrupted run says.
const INTERRUPTED: &str = "The run was interrupted; the answer is the best one found so far";

impl std::fmt::Debug for Rlm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rlm")
            .field("config", &self.config)
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}

impl Rlm {
    /// A runner; the session holds the contexts, the registry holds `config.root_endpoint`.
    pub fn new(config: RlmConfig, endpoints: Arc<Endpoints>, session: Arc<ReplSession>) -> Self {
        Self::child(config, endpoints, session, 0)
    }

    /// A runner at `depth` of a run tree (an `rlm_query` child's, see [`super::tree`]).
    pub(crate) fn child(
        config: RlmConfig,
        endpoints: Arc<Endpoints>,
        session: Arc<ReplSession>,
        depth: u32,
    ) -> Self {
        Self {
            config,
            endpoints,
            session,
            hooks: Hooks::new(),
            stop: CancellationToken::new(),
            depth,
            system_prompt: None,
        }
    }

    /// Whether this run's code may start `rlm_query` children (its depth is below
    /// [`RlmConfig::max_depth`] minus one).
    pub fn allows_children(&self) -> bool {
        self.depth.saturating_add(1) < self.config.max_depth
    }

    /// A handle that stops this runner's runs from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            stop: self.stop.clone(),
            session: Arc::downgrade(&self.session),
        }
    }

    /// Adds a hook; hooks run in the order they were added, after the built-in metrics.
    pub fn add_hook(&mut self, hook: impl Hook + 'static) -> &mut Self {
        self.hooks.push(hook);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &RlmConfig {
        &self.config
    }

    /// The session.
    pub fn session(&self) -> &Arc<ReplSession> {
        &self.session
    }

    /// The prompts this runner sends.
    pub fn prompts(&self) -> Prompts {
        Prompts::new(
            self.config.prompts.clone(),
            self.config.completion,
            self.config.feedback.block_limit,
            self.config.max_iterations,
        )
        .with_session(self.session.config())
        .with_children(self.allows_children())
        .with_sub_models(
            self.endpoints
                .names()
                .into_iter()
                .filter(|name| *name != self.config.root_endpoint)
                .filter_map(|name| {
                    let model = self.endpoints.get(&name).ok()?.config().model.clone();
                    Some((name, model))
                })
                .collect(),
        )
    }

    /// The messages the first root-model call of [`Rlm::run`] would send for `query`: the
    /// system prompt and the first user message (context description and query). Sends nothing.
    pub fn first_messages(&self, query: &str) -> Vec<Message> {
        let prompts = self.prompts();
        self.conversation(&prompts, self.system_prompt(&prompts), query, None)
            .messages()
            .to_vec()
    }

    /// The system prompt of this runner's runs (rendered once a run, or kept).
    fn system_prompt(&self, prompts: &Prompts) -> String {
        match &self.system_prompt {
            Some(kept) => kept.system_prompt(prompts),
            None => prompts.system_prompt(),
        }
    }

    fn conversation(
        &self,
        prompts: &Prompts,
        system_prompt: String,
        query: &str,
        earlier: Option<&str>,
    ) -> Conversation {
        let contexts = self.session.contexts();
        let first_message = match earlier {
            Some(earlier) => prompts.follow_up_message(contexts, earlier, query),
            None => prompts.first_message(contexts, query),
        };
        Conversation::new(system_prompt, first_message)
    }

    /// Answers `query`: runs the loop to a final answer or a limit. Blocks the calling thread
    /// (root-model calls run on the kernel's shared runtime).
    pub fn run(&mut self, query: &str) -> Result<RlmResult, RlmError> {
        self.run_with_earlier(query, None)
    }

    /// [`Rlm::run`] for a follow-up: the first message carries `earlier`, a summary of the
    /// questions asked before in the same session ([`RlmChat`](super::RlmChat) writes it).
    pub(crate) fn run_with_earlier(
        &mut self,
        query: &str,
        earlier: Option<&str>,
    ) -> Result<RlmResult, RlmError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(RlmError::InsideRuntime);
        }
        let root = self.endpoints.get(&self.config.root_endpoint)?;
        // A finished answer of an earlier run on this session must not end this one.
        self.session.reset_answer()?;
        let prompts = self.prompts();
        let contexts = self.session.contexts().to_vec();
        let system_prompt = self.system_prompt(&prompts);
        let conversation = self.conversation(&prompts, system_prompt.clone(), query, earlier);
        let endpoints = summarize(&self.endpoints);
        let started = Instant::now();
        // A limit too far out to represent is no limit.
        let deadline = self.config.run_timeout.and_then(|t| started.checked_add(t));
        // Workers for the children are confined ahead of need until the run ends (with
        // isolation on): the first while the root model writes the code that starts them.
        let ready_workers = self
            .allows_children()
            .then(|| ReplSession::keep_workers_ready(self.session.config()))
            .flatten();
        let children = self.allows_children().then(|| {
            Arc::new(ChildRuns::new(
                Arc::clone(&self.endpoints),
                self.session.config().clone(),
                self.config.clone(),
                self.depth + 1,
                self.stop.clone(),
                deadline,
                ready_workers
                    .as_ref()
                    .map(|workers| workers.shape().clone()),
            ))
        });
        self.session
            .set_children(children.clone().map(|c| c as Arc<dyn ChildRunner>));
        let mut metrics = MetricsHook::new();
        let mut hooks = Chain {
            first: &mut metrics,
            rest: &mut self.hooks,
            stop: self.stop.clone(),
        };
        let info = RunInfo {
            query,
            config: &self.config,
            endpoints: &endpoints,
            contexts: &contexts,
            system_prompt: &system_prompt,
            started_at_ms: unix_ms(),
            ledger: Some(self.endpoints.ledger()),
        };
        let mut run = Run {
            config: &self.config,
            prompts,
            generator: CodeGenerator::new(root),
            executor: CodeExecutor::with_stop(Arc::clone(&self.session), self.stop.clone())
                .with_children(children.map(|c| c as Arc<dyn ChildNodes>)),
            checker: CompletionChecker::new(self.config.completion),
            conversation,
            started,
            deadline,
            iterations: Vec::new(),
            sub_calls: Vec::new(),
            candidate: None,
            stop: self.stop.clone(),
        };
        let ending = match hooks.before_run(&info) {
            HookAction::Continue => run.drive(&mut hooks),
            HookAction::Replace(answer) => Ending::answer(answer, FinalKind::Hook),
            HookAction::Stop(reason) => run.hook_stop(reason),
        };
        let result = run.finish(ending, contexts, &mut hooks);
        self.session.set_children(None);
        // Processes the run's code started end with the run, however it ended.
        if let Err(e) = self.session.end_processes() {
            tracing::warn!("could not end the run's processes: {e}");
        }
        // The children's workers still idle end, those closed are waited for.
        drop(ready_workers);
        Ok(result)
    }
}

/// The built-in metrics first, then the user's hooks; every before-step also checks the
/// runner's stop token, so a stopped run ends at the next step.
struct Chain<'a> {
    first: &'a mut MetricsHook,
    rest: &'a mut Hooks,
    stop: CancellationToken,
}

impl Chain<'_> {
    fn stopped<T>(&self) -> Option<HookAction<T>> {
        self.stop
            .is_cancelled()
            .then(|| HookAction::Stop(INTERRUPTED.to_owned()))
    }
}

impl Hook for Chain<'_> {
    fn before_run(&mut self, run: &RunInfo<'_>) -> HookAction<String> {
        let _ = self.first.before_run(run);
        if let Some(stop) = self.stopped() {
            return stop;
        }
        self.rest.before_run(run)
    }

    fn before_iteration(
        &mut self,
        iteration: u32,
        messages: &[bridge::Message],
    ) -> HookAction<String> {
        if let Some(stop) = self.stopped() {
            return stop;
        }
        self.rest.before_iteration(iteration, messages)
    }

    fn before_model_call(
        &mut self,
        iteration: u32,
        request: &mut ChatRequest,
    ) -> HookAction<String> {
        if let Some(stop) = self.stopped() {
            return stop;
        }
        self.rest.before_model_call(iteration, request)
    }

    fn after_model_call(&mut self, call: &mut ModelCall) {
        self.first.after_model_call(call);
        self.rest.after_model_call(call);
    }

    fn before_block(
        &mut self,
        iteration: u32,
        block: &mut super::blocks::CodeBlock,
    ) -> HookAction<crate::repl::ExecutionResult> {
        if let Some(stop) = self.stopped() {
            return stop;
        }
        self.rest.before_block(iteration, block)
    }

    fn after_block(&mut self, iteration: u32, run: &mut BlockRun) {
        self.first.after_block(iteration, run);
        self.rest.after_block(iteration, run);
    }

    fn on_sub_call(&mut self, iteration: u32, call: &SubCallMetadata) {
        self.first.on_sub_call(iteration, call);
        self.rest.on_sub_call(iteration, call);
    }

    fn after_iteration(&mut self, record: &mut IterationRecord) {
        self.first.after_iteration(record);
        self.rest.after_iteration(record);
    }

    fn on_error(&mut self, error: &RunError) {
        self.first.on_error(error);
        self.rest.on_error(error);
    }

    fn after_run(&mut self, result: &mut RlmResult) {
        self.first.after_run(result);
        self.rest.after_run(result);
    }
}

/// How the loop ended.
#[derive(Debug)]
struct Ending {
    reason: TerminationReason,
    answer: Option<FoundAnswer>,
    error: Option<String>,
}

impl Ending {
    fn answer(value: String, kind: FinalKind) -> Self {
        Self {
            reason: TerminationReason::FinalAnswer,
            answer: Some(FoundAnswer { value, kind }),
            error: None,
        }
    }

    fn stop(reason: TerminationReason, error: impl Into<String>) -> Self {
        Self {
            reason,
            answer: None,
            error: Some(error.into()),
        }
    }
}

/// The state of one run.
struct Run<'a> {
    config: &'a RlmConfig,
    prompts: Prompts,
    generator: CodeGenerator,
    executor: CodeExecutor,
    checker: CompletionChecker,
    conversation: Conversation,
    started: Instant,
    deadline: Option<Instant>,
    iterations: Vec<IterationRecord>,
    sub_calls: Vec<SubCallMetadata>,
    candidate: Option<FoundAnswer>,
    stop: CancellationToken,
}

/// What asking the root model gave.
enum Reply {
    Text {
        text: String,
        model_ms: f64,
        record: Option<SubCallMetadata>,
        /// The reply stopped at the output token limit.
        cut_off: bool,
    },
    Stopped(Ending),
}

impl Run<'_> {
    fn drive(&mut self, hooks: &mut dyn Hook) -> Ending {
        let mut failures_in_a_row = 0u32;
        for iteration in 1..=self.config.max_iterations {
            if let Some(ending) = self.past_deadline() {
                return ending;
            }
            match hooks.before_iteration(iteration, self.conversation.messages()) {
                HookAction::Continue => {}
                HookAction::Replace(answer) => return Ending::answer(answer, FinalKind::Hook),
                HookAction::Stop(reason) => return self.hook_stop(reason),
            }
            let started_ms = self.elapsed_ms();
            let (reply, model_ms, root_call, cut_off) = match self.ask(iteration, false, hooks) {
                Reply::Text {
                    text,
                    model_ms,
                    record,
                    cut_off,
                } => (text, model_ms, record, cut_off),
                Reply::Stopped(ending) => return ending,
            };

            let blocks = extract_code_blocks(&reply);
            let block_count = blocks.len();
            let executed = self
                .executor
                .execute_all(iteration, blocks, hooks, self.deadline);
            let runs = executed.runs;
            let session = Arc::clone(self.executor.session());
            let mut completion = self.checker.check(&reply, &runs, &mut |name| {
                session.variable_as_string(name).ok().flatten()
            });
            if cut_off && completion.answer.is_none() {
                completion.notes.insert(0, FinalNote::CutOff);
            }

            let mut record = self.record(
                IterationMetadata {
                    iteration,
                    code_blocks: block_count,
                    llm_query_calls: runs.iter().map(|r| r.result.llm_query_calls).sum(),
                    llm_query_batched_calls: runs
                        .iter()
                        .map(|r| r.result.llm_query_batched_calls)
                        .sum(),
                    sub_call_errors: runs.iter().map(|r| r.result.sub_call_errors).sum(),
                    final_answer_found: completion.answer.is_some(),
                    final_answer_type: completion.answer.as_ref().map(|a| a.kind),
                },
                &reply,
                &runs,
                root_call,
                &completion.notes,
                (started_ms, model_ms),
            );
            hooks.after_iteration(&mut record);
            let failed = record.execution.status == ExecutionStatus::Error;
            let error_type = record.execution.error_type.clone();
            self.iterations.push(record);

            if let Some(answer) = completion.answer {
                return Ending {
                    reason: TerminationReason::FinalAnswer,
                    answer: Some(answer),
                    error: None,
                };
            }
            if completion.candidate.is_some() {
                self.candidate = completion.candidate;
            }
            if let Some(stop) = executed.stop {
                return self.execution_stopped(iteration, stop, hooks);
            }
            failures_in_a_row = if failed { failures_in_a_row + 1 } else { 0 };
            if let Some(limit) = self.config.max_consecutive_failures
                && failures_in_a_row >= limit
            {
                return Ending::stop(
                    TerminationReason::ConsecutiveFailures,
                    format!(
                        "{failures_in_a_row} iterations in a row had a failing block (last: `{}`); \
                         raise `max_consecutive_failures` or check the model and the context",
                        error_type.unwrap_or_default()
                    ),
                );
            }
            let feedback = format_feedback(
                &runs,
                &completion.notes,
                &self.prompts,
                &self.config.feedback,
                iteration,
            );
            self.conversation.push_turn(reply, feedback);
            if let Some(max) = self.config.max_history_chars {
                self.conversation.fit(max);
            }
        }
        self.answer_now(hooks)
    }

    /// The record of one iteration; its sub-calls are also added to the run's.
    fn record(
        &mut self,
        metadata: IterationMetadata,
        reply: &str,
        runs: &[BlockRun],
        root_call: Option<SubCallMetadata>,
        notes: &[FinalNote],
        (started_ms, model_ms): (f64, f64),
    ) -> IterationRecord {
        let execution = ExecutionMetadata::from_runs(runs);
        let sub_calls: Vec<SubCallMetadata> = runs
            .iter()
            .flat_map(|r| r.result.sub_calls.iter().cloned())
            .collect();
        self.sub_calls.extend(sub_calls.iter().cloned());
        IterationRecord {
            metadata,
            execution_ms: execution.execution_ms,
            execution,
            reply: reply.to_owned(),
            blocks: runs
                .iter()
                .map(|r| BlockRecord::from_run(r, self.config.feedback.block_limit))
                .collect(),
            root_call,
            sub_calls,
            notes: notes.to_vec(),
            started_ms,
            model_ms,
        }
    }

    /// One root-model call, with hooks, the deadline and error handling.
    fn ask(&mut self, iteration: u32, answer_now: bool, hooks: &mut dyn Hook) -> Reply {
        let mut request = self.generator.request(self.conversation.messages());
        let (mut call, model_ms) = match hooks.before_model_call(iteration, &mut request) {
            HookAction::Continue => {
                let sent = Instant::now();
                let generation = match self.call_root(request) {
                    Ok(generation) => generation,
                    Err(ending) => return Reply::Stopped(ending),
                };
                let model_ms = sent.elapsed().as_secs_f64() * 1000.0;
                match generation.result {
                    Ok(response) => (
                        ModelCall {
                            iteration,
                            answer_now,
                            reply: response.content.clone(),
                            response: Some(response),
                            record: Some(generation.record),
                        },
                        model_ms,
                    ),
                    Err(error) => {
                        return Reply::Stopped(self.root_failed(
                            iteration,
                            error,
                            Some(generation.record),
                            hooks,
                        ));
                    }
                }
            }
            HookAction::Replace(text) => (
                ModelCall {
                    iteration,
                    answer_now,
                    reply: text,
                    response: None,
                    record: None,
                },
                0.0,
            ),
            HookAction::Stop(reason) => return Reply::Stopped(self.hook_stop(reason)),
        };
        hooks.after_model_call(&mut call);
        let cut_off = call
            .response
            .as_ref()
            .and_then(|r| r.finish_reason.as_deref())
            .is_some_and(|reason| matches!(reason, "length" | "max_tokens"));
        Reply::Text {
            text: call.reply,
            model_ms,
            record: call.record,
            cut_off,
        }
    }

    /// Sends the request on the shared runtime, cancelled at the run's deadline or when the
    /// run is stopped.
    fn call_root(&self, request: ChatRequest) -> Result<Generation, Ending> {
        let cancel = self.stop.child_token();
        let generator = &self.generator;
        let deadline = self.deadline;
        let generation = crate::runtime::shared().block_on(async {
            // While the model works, the worker pool's background work may run (`quiet.rs`).
            let call = crate::repl::worker::in_flight(generator.generate(request, &cancel));
            tokio::pin!(call);
            if let Some(deadline) = deadline {
                tokio::select! {
                    generation = &mut call => return generation,
                    () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {
                        cancel.cancel();
                    }
                }
            }
            // Cancelled, not dropped: the call ends at once and the ledger records it.
            call.await
        });
        if self.stop.is_cancelled() {
            return Err(self.hook_stop(INTERRUPTED.to_owned()));
        }
        if self.deadline_passed() && matches!(generation.result, Err(BridgeError::Cancelled)) {
            return Err(self.timeout_ending());
        }
        Ok(generation)
    }

    /// A before-hook said stop: the runner's own stop token, or a user hook.
    fn hook_stop(&self, reason: String) -> Ending {
        let why = if self.stop.is_cancelled() {
            TerminationReason::Interrupted
        } else {
            TerminationReason::StoppedByHook
        };
        Ending::stop(why, reason)
    }

    fn root_failed(
        &self,
        iteration: u32,
        error: BridgeError,
        record: Option<SubCallMetadata>,
        hooks: &mut dyn Hook,
    ) -> Ending {
        let (kind, reason) = match &error {
            BridgeError::Budget(exceeded) => {
                ("budget", TerminationReason::for_budget(exceeded.limit))
            }
            BridgeError::Cancelled if self.deadline_passed() => {
                return self.timeout_ending();
            }
            _ => ("root_model", TerminationReason::RootModelError),
        };
        let message = error.to_string();
        hooks.on_error(&RunError {
            iteration,
            kind: kind.to_owned(),
            message: message.clone(),
            record,
        });
        Ending::stop(reason, message)
    }

    fn execution_stopped(
        &self,
        iteration: u32,
        stop: ExecutionStop,
        hooks: &mut dyn Hook,
    ) -> Ending {
        match stop {
            ExecutionStop::Hook(reason) => self.hook_stop(reason),
            ExecutionStop::Deadline => self.timeout_ending(),
            ExecutionStop::Budget { limit, message } => {
                hooks.on_error(&RunError {
                    iteration,
                    kind: "budget".to_owned(),
                    message: message.clone(),
                    record: None,
                });
                Ending::stop(TerminationReason::for_budget(limit), message)
            }
            ExecutionStop::Kernel(error) => {
                let message = format!("The REPL session failed: {error}");
                hooks.on_error(&RunError {
                    iteration,
                    kind: "kernel".to_owned(),
                    message: message.clone(),
                    record: None,
                });
                Ending::stop(TerminationReason::KernelError, message)
            }
        }
    }

    /// After the last iteration: one more call asking for the answer as text.
    fn answer_now(&mut self, hooks: &mut dyn Hook) -> Ending {
        if let Some(ending) = self.past_deadline() {
            return ending;
        }
        self.conversation
            .append_to_last_user(self.prompts.answer_now().trim_end());
        let iteration = self.config.max_iterations + 1;
        let text = match self.ask(iteration, true, hooks) {
            Reply::Text { text, .. } => text,
            Reply::Stopped(ending) => return ending,
        };
        let session = Arc::clone(self.executor.session());
        let answer = answer_from_text(&text, &mut |name| {
            session.variable_as_string(name).ok().flatten()
        });
        Ending {
            reason: TerminationReason::MaxIterations,
            answer: answer.map(|value| FoundAnswer {
                value,
                kind: FinalKind::AnswerNow,
            }),
            error: Some(format!(
                "Reached the limit of {} iterations; the answer is the model's reply to a last \
                 request to answer now. Raise `max_iterations` to give it more room",
                self.config.max_iterations
            )),
        }
    }

    fn finish(
        self,
        ending: Ending,
        contexts: Vec<ContextMetadata>,
        hooks: &mut dyn Hook,
    ) -> RlmResult {
        // A run stopped early keeps what the code put in `answer["content"]` without setting
        // `ready`, when nothing better was found.
        let partial = || {
            let content = self.executor.session().answer_content().ok().flatten()?;
            Some(FoundAnswer {
                value: content,
                kind: FinalKind::AnswerDict,
            })
        };
        let answer = ending
            .answer
            .or_else(|| self.candidate.clone())
            .or_else(|| {
                (ending.reason != TerminationReason::FinalAnswer)
                    .then(partial)
                    .flatten()
            });
        let mut result = RlmResult {
            answer: answer.as_ref().map(|a| a.value.clone()),
            answer_kind: answer.as_ref().map(|a| a.kind),
            termination_reason: ending.reason,
            error: ending.error,
            metrics: SessionMetrics::default(),
            iterations: self.iterations,
            sub_calls: self.sub_calls,
            contexts,
        };
        hooks.after_run(&mut result);
        result
    }

    fn elapsed_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    fn deadline_passed(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    fn past_deadline(&self) -> Option<Ending> {
        self.deadline_passed().then(|| self.timeout_ending())
    }

    fn timeout_ending(&self) -> Ending {
        let limit = self.config.run_timeout.unwrap_or_default();
        Ending::stop(
            TerminationReason::Timeout,
            format!(
                "The run reached its time limit of {:.1} s; raise the run timeout to give it more time",
                limit.as_secs_f64()
            ),
        )
    }
}

/// The answer in an "answer now" reply: a `FINAL_VAR(name)` line with a value, else a
/// `FINAL(...)` line, else the whole reply; `None` when that is empty.
pub(crate) fn answer_from_text(
    text: &str,
    resolve: &mut dyn FnMut(&str) -> Option<String>,
) -> Option<String> {
    let lines = scan_final_lines(text);
    if let Some(value) = lines
        .final_var
        .filter(|name| !name.is_empty())
        .and_then(|name| resolve(&name))
        .filter(|v| !v.trim().is_empty())
    {
        return Some(value);
    }
    if let Some(FinalText::Closed(value)) = lines.final_text
        && !value.is_empty()
    {
        return Some(value);
    }
    let trimmed = text.trim();
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}

fn summarize(endpoints: &Endpoints) -> Vec<EndpointSummary> {
    endpoints
        .names()
        .into_iter()
        .filter_map(|name| endpoints.get(&name).ok())
        .map(|endpoint| {
            let config = endpoint.config();
            EndpointSummary {
                name: config.name.clone(),
                provider: config.provider.to_string(),
                model: config.model.clone(),
                base_url: config.base_url.clone(),
            }
        })
        .collect()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bridge::mock::{MockConfig, MockServer, Script};
    use bridge::{Budget, EndpointConfig, Ledger};

    /// A prompt that makes its child's thread panic at `stage` (`run`: in its loop; `finish`:
    /// as its node is made), as a bug in rlm would.
    pub(super) fn panic_if_told(prompt: &str, stage: &str) {
        if prompt.strip_prefix("panic in ") == Some(stage) {
            panic!("a test's panic in a child's {stage}");
        }
    }

    /// A runner of in-process children whose root model (the mock's `sub`) answers `FINAL(ok)`.
    /// A mock whose model `sub` gives a child (an RLM loop) `reply`, and its endpoints.
    fn children_answered(reply: &str) -> (MockServer, Arc<Endpoints>) {
        let script = Script::from_json_value(serde_json::json!({"models": {
            "sub": {"rules": [{"system": "recursive language model", "reply": reply}]}
        }}))
        .expect("a script");
        let server = crate::runtime::shared()
            .block_on(MockServer::start(MockConfig {
                script,
                ..MockConfig::default()
            }))
            .expect("the mock starts");
        let endpoints = Arc::new(
            Endpoints::new(
                vec![EndpointConfig::openai(
                    "sub",
                    server.openai_base_url(),
                    "sub",
                )],
                Arc::new(Ledger::new(Budget::default())),
            )
            .expect("endpoints"),
        );
        (server, endpoints)
    }

    fn children_answering_ok() -> (MockServer, ChildRuns) {
        let (server, endpoints) = children_answered("FINAL(ok)");
        let runs = ChildRuns::new(
            endpoints,
            SessionConfig::default(),
            RlmConfig::default(),
            1,
            CancellationToken::new(),
            None,
            None,
        );
        (server, runs)
    }

    fn query(prompt: &str) -> ChildQuery {
        ChildQuery {
            prompt: prompt.to_owned(),
            context: None,
            model: None,
            max_iterations: None,
        }
    }

    #[test]
    fn a_childs_answer_is_handed_over_before_its_node_is_added_and_the_node_is_kept() {
        let (server, runs) = children_answering_ok();
        // In-process children: no worker pool, so nothing for their model calls to time.
        let armed = crate::repl::worker::timers_armed();
        for queries in [vec![query("one")], vec![query("a"), query("b"), query("c")]] {
            let n = queries.len();
            let mut handed = Vec::new();
            runs.run(queries, &CancellationToken::new(), &mut |answers| {
                // The code has every answer while the last child's node is still to come.
                let unrecorded = runs
                    .finished
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .unrecorded;
                handed.push((answers, unrecorded));
            });
            assert_eq!(handed.len(), 1, "the answers are handed over once");
            let (answers, unrecorded) = handed.pop().expect("handed over");
            assert_eq!(answers.len(), n);
            assert!(
                answers.iter().all(|a| a.as_deref() == Ok("ok")),
                "{answers:?}"
            );
            assert!(
                unrecorded >= 1,
                "the answers came after every node ({n} children)"
            );
            let nodes = runs.take();
            assert_eq!(
                nodes.iter().map(|node| node.index).collect::<Vec<_>>(),
                (0..n).collect::<Vec<_>>(),
                "every child's node, in order"
            );
            assert!(
                nodes
                    .iter()
                    .all(|node| node.answer.as_deref() == Some("ok"))
            );
        }
        assert_eq!(
            crate::repl::worker::timers_armed(),
            armed,
            "in-process children's model calls armed a timer"
        );
        crate::runtime::shared().block_on(server.shutdown());
    }

    /// A panic on a child's thread, in its run or as its node is made, ends that child only:
    /// the code that asked gets an error for it (or its answer, when the panic came after),
    /// the others their answers, the block's end every node at once (no wait for a node that
    /// would never come), and the panicking child's node says what happened.
    #[test]
    fn a_child_whose_thread_panics_gets_an_error_and_a_node_at_once() {
        let (server, runs) = children_answering_ok();
        let batches = [
            vec![query("panic in run")],
            vec![query("a"), query("panic in run"), query("panic in finish")],
        ];
        for queries in batches {
            let prompts: Vec<String> = queries.iter().map(|q| q.prompt.clone()).collect();
            let mut handed = Vec::new();
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                runs.run(queries, &CancellationToken::new(), &mut |answers| {
                    handed.push(answers);
                });
            }));
            let started = Instant::now();
            let nodes = runs.take();
            let waited = started.elapsed();
            assert!(
                ran.is_ok() && waited < Duration::from_secs(5),
                "{prompts:?}: the panic reached the code that asked: {}; the block's end waited {waited:?} for the nodes",
                ran.is_err()
            );
            assert_eq!(
                handed.len(),
                1,
                "{prompts:?}: the answers are handed over once"
            );
            for (prompt, answer) in prompts.iter().zip(&handed[0]) {
                match prompt.as_str() {
                    "panic in run" => {
                        let failure = answer.as_ref().expect_err("no answer");
                        assert_eq!(failure.kind, "child_error");
                        assert!(
                            failure.message.contains("rlm panicked in it")
                                && failure.message.contains("a test's panic in a child's run"),
                            "{failure:?}"
                        );
                    }
                    _ => assert_eq!(answer.as_deref(), Ok("ok"), "{prompt}"),
                }
            }
            assert_eq!(
                nodes.iter().map(|node| node.index).collect::<Vec<_>>(),
                (0..prompts.len()).collect::<Vec<_>>(),
                "every child's node, in order"
            );
            for (prompt, node) in prompts.iter().zip(&nodes) {
                assert_eq!(&node.prompt, prompt);
                if let Some(stage) = prompt.strip_prefix("panic in ") {
                    let error = node.error.as_deref().unwrap_or_default();
                    assert!(
                        error.contains(&format!("a test's panic in a child's {stage}")),
                        "{node:?}"
                    );
                    assert_eq!(node.termination_reason, TerminationReason::KernelError);
                } else {
                    assert_eq!(node.answer.as_deref(), Some("ok"), "{node:?}");
                }
            }
        }
        crate::runtime::shared().block_on(server.shutdown());
    }

    #[test]
    fn a_child_is_stopped_by_its_blocks_stop_its_parents_run_or_its_deadline_mid_block() {
        // The child's one reply runs a block that says it started, then sleeps for a minute.
        let dir = tempfile::tempdir().expect("a scratch dir");
        let started_file = dir.path().join("started");
        let reply = format!(
            "```repl\nimport pathlib, time\npathlib.Path(r'{}').touch()\ntime.sleep(60)\n```",
            started_file.display()
        );
        let (server, endpoints) = children_answered(&reply);
        for stop in ["block", "parent", "deadline"] {
            let _ = std::fs::remove_file(&started_file);
            let (parent, block) = (CancellationToken::new(), CancellationToken::new());
            let deadline = (stop == "deadline").then(|| Instant::now() + Duration::from_secs(3));
            // One iteration, and the block's own limit 40 s: a stop not passed on ends the
            // test within a minute, failed.
            let session = SessionConfig {
                cell_timeout: Duration::from_secs(40),
                ..SessionConfig::default()
            };
            let runs = ChildRuns::new(
                Arc::clone(&endpoints),
                session,
                RlmConfig::default(),
                1,
                parent.clone(),
                deadline,
                None,
            );
            // Stopped once its block runs, from a thread of its own.
            let stopper = {
                let (started_file, parent, block) =
                    (started_file.clone(), parent.clone(), block.clone());
                std::thread::spawn(move || {
                    let waited = Instant::now();
                    while !started_file.exists() && waited.elapsed() < Duration::from_secs(20) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    match stop {
                        "block" => block.cancel(),
                        "parent" => parent.cancel(),
                        _ => {}
                    }
                })
            };
            let began = Instant::now();
            let mut answers = Vec::new();
            let query = ChildQuery {
                prompt: "q".to_owned(),
                context: None,
                model: None,
                max_iterations: Some(1),
            };
            runs.run(vec![query], &block, &mut |given| answers = given);
            stopper.join().expect("the stopper ends");
            assert!(started_file.exists(), "{stop}: the child's block never ran");
            // Well under the block's 40 s: interrupted, not waited out (not a speed check).
            assert!(
                began.elapsed() < Duration::from_secs(30),
                "{stop}: {:?}",
                began.elapsed()
            );
            let nodes = runs.take();
            let want = if stop == "deadline" {
                TerminationReason::Timeout
            } else {
                TerminationReason::Interrupted
            };
            assert_eq!(nodes.len(), 1, "{stop}");
            assert_eq!(nodes[0].termination_reason, want, "{stop}");
            assert!(
                answers.len() == 1 && answers[0].is_err(),
                "{stop}: {answers:?}"
            );
        }
        crate::runtime::shared().block_on(server.shutdown());
    }

    #[test]
    fn children_like_the_last_send_its_system_prompt_and_others_their_own() {
        let endpoints = Arc::new(
            Endpoints::new(
                vec![
                    EndpointConfig::openai("root", "http://127.0.0.1:9/v1", "big"),
                    EndpointConfig::openai("sub", "http://127.0.0.1:9/v1", "small"),
                ],
                Arc::new(Ledger::new(Budget::default())),
            )
            .expect("endpoints"),
        );
        // A prompt that states both things a child's may differ by.
        let mut base = RlmConfig::default();
        base.prompts.system_override = Some("{{max_iterations}} iterations; {{sub_models}}".into());
        let runs = ChildRuns::new(
            Arc::clone(&endpoints),
            SessionConfig::default(),
            base.clone(),
            1,
            CancellationToken::new(),
            None,
            None,
        );
        let session = Arc::new(
            ReplSession::new(SessionConfig::default(), Arc::clone(&endpoints), &[])
                .expect("a session"),
        );
        // A child of `runs`, as `ChildRuns::start` makes it: its system prompt kept by `runs`.
        let child = |root: &str, iterations: u32, extension: Option<&str>| {
            let mut config = base.clone();
            root.clone_into(&mut config.root_endpoint);
            config.max_iterations = iterations;
            config.prompts.extension = extension.map(str::to_owned);
            let mut rlm = Rlm::child(config, Arc::clone(&endpoints), Arc::clone(&session), 1);
            rlm.system_prompt = Some(Arc::clone(&runs.system_prompt));
            rlm
        };
        // The iteration limit and the root (left out of the models `model=` names) differ,
        // and a third input, which no child of today's runs changes: a child's own
        // extension stands for whatever a child may one day get of its own.
        let mut seen = std::collections::HashSet::new();
        let children = [
            ("sub", 7, None),
            ("sub", 7, None),
            ("sub", 3, None),
            ("root", 3, None),
            ("sub", 7, None),
            ("sub", 7, Some("Dates are ISO 8601.")),
            ("sub", 7, None),
        ];
        for (root, iterations, extension) in children {
            let rlm = child(root, iterations, extension);
            let own = rlm.prompts().system_prompt();
            assert_eq!(
                rlm.first_messages("q")[0].content,
                own,
                "{root}, {iterations} iterations, extension {extension:?}"
            );
            seen.insert(own);
        }
        assert_eq!(seen.len(), 4, "four different prompts: {seen:?}");
    }

    #[test]
    fn answer_now_text_table() {
        let mut resolve = |name: &str| (name == "x").then(|| "from x".to_owned());
        let cases: &[(&str, Option<&str>)] = &[
            ("My best estimate is 2.", Some("My best estimate is 2.")),
            ("  padded  \n", Some("padded")),
            ("", None),
            (" \n ", None),
            ("Reasoning...\nFINAL(7)", Some("7")),
            ("FINAL_VAR(x)", Some("from x")),
            ("FINAL_VAR(missing)\nFINAL(8)", Some("8")),
            ("FINAL_VAR(missing)", Some("FINAL_VAR(missing)")),
            ("FINAL()", Some("FINAL()")),
        ];
        for (text, want) in cases {
            assert_eq!(
                answer_from_text(text, &mut resolve).as_deref(),
                *want,
                "{text:?}"
            );
        }
    }
}

/// Runs a session's `rlm_query` children (see [`super::tree`]).
#[derive(Debug)]
pub(crate) struct ChildRuns {
    endpoints: Arc<Endpoints>,
    /// The parent's session settings: each child's session gets the same.
    session: SessionConfig,
    /// The parent's loop settings: each child runs with them (its own root model).
    config: RlmConfig,
    /// The depth of the children this runner starts.
    depth: u32,
    /// The parent run's stop: stopping it stops the children.
    stop: CancellationToken,
    /// The parent run's deadline: children end by it too.
    deadline: Option<Instant>,
    /// Nodes of the children that ended since the last [`take`](Self::take), and how many
    /// children started are still to add theirs.
    finished: Mutex<Finished>,
    /// Signalled when a child's node is added.
    recorded: Condvar,
    /// The index of the next child of the current block.
    next: AtomicUsize,
    /// In-process, the next child's session, made while the previous child runs.
    ahead: Mutex<Option<AheadSession>>,
    /// With isolation on, the shape of the workers the parent run keeps ready for its
    /// children: each child's session takes its worker by it.
    workers: Option<Shape>,
    /// The system prompt of the last child started, kept with all it was rendered from: the
    /// next child like it sends the same, not rendered again.
    system_prompt: Arc<KeptSystemPrompt>,
}

impl ChildRuns {
    pub(crate) fn new(
        endpoints: Arc<Endpoints>,
        session: SessionConfig,
        config: RlmConfig,
        depth: u32,
        stop: CancellationToken,
        deadline: Option<Instant>,
        workers: Option<Shape>,
    ) -> Self {
        // Nothing is made ahead for a first child the run may never start: with isolation
        // on, the run keeps workers ready (the first confined while the parent asks its
        // model for the code), and the template that forks them runs since the parent's own
        // worker was forked; in-process, a first child's session is made when it starts.
        Self {
            endpoints,
            session,
            config,
            depth,
            stop,
            deadline,
            finished: Mutex::new(Finished::default()),
            recorded: Condvar::new(),
            next: AtomicUsize::new(0),
            ahead: Mutex::new(None),
            workers,
            system_prompt: Arc::default(),
        }
    }

    /// The nodes of the children that ended since the last call, in the order they were
    /// started; the next child is numbered 0 again (call it after each block). Waits for the
    /// nodes of children whose answers were handed over before their nodes were added (see
    /// [`ChildRunner::run`]): by the time the block that started them has ended, that is a
    /// few microseconds at most.
    fn take(&self) -> Vec<ChildRun> {
        let finished = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut finished, waited) = self
            .recorded
            .wait_timeout_while(finished, RECORD_WAIT, |f| f.unrecorded > 0)
            .unwrap_or_else(PoisonError::into_inner);
        if waited.timed_out() {
            tracing::warn!(
                "{} rlm_query children still had no node after {RECORD_WAIT:?}; they are left out of this block's record",
                finished.unrecorded
            );
        }
        let mut nodes = std::mem::take(&mut finished.nodes);
        drop(finished);
        self.next.store(0, Ordering::Relaxed);
        nodes.sort_by_key(|node| node.index);
        nodes
    }

    /// Runs one child until it has its answer; returns what its code gets, and the child to
    /// [`finish`](Self::finish) (its node made, its session closed).
    fn run_one(
        &self,
        index: usize,
        query: ChildQuery,
        cancel: &CancellationToken,
    ) -> (ChildAnswer, Ended) {
        let ChildQuery {
            prompt,
            context,
            model,
            max_iterations,
        } = query;
        let model = model.unwrap_or_else(|| self.session.sub_endpoint.clone());
        // A panic (a bug) ends this child only, as an error: its loop, if it started, is kept
        // to be closed like any other.
        let mut rlm = None;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let (child, _) = rlm.insert(self.start(&model, context, max_iterations, cancel)?);
            #[cfg(test)]
            tests::panic_if_told(&prompt, "run");
            child
                .run(&prompt)
                .map_err(|e| NotRun::kernel(e.to_string()))
        }))
        .unwrap_or_else(|panic| Err(NotRun::kernel(panicked(panic.as_ref(), "in it"))));
        let answer = match &outcome {
            Ok(result) => answer_for_code(result),
            Err(why) => why.answer_for_code(),
        };
        let ended = Ended {
            index,
            model,
            prompt,
            outcome,
            rlm,
        };
        (answer, ended)
    }

    /// Adds the node of a child that has its answer, after closing its session; a panic
    /// meanwhile (a bug) still adds one, which says so.
    fn finish(&self, ended: Ended) {
        let Ended {
            index,
            model,
            prompt,
            outcome,
            rlm,
        } = ended;
        let chars = self.session.sub_call_text_chars;
        let node = catch_unwind(AssertUnwindSafe(|| {
            // Its stop watch ends (stopping a child that ended meanwhile changes nothing),
            // and its worker (with isolation on) is handed to the closer, or ended here past
            // its backlog: before the node is added, so that the end of the parent's block,
            // which waits for the node, finds it closed (`take`).
            if let Some((rlm, stop_watch)) = rlm {
                drop(stop_watch);
                drop(rlm);
            }
            #[cfg(test)]
            tests::panic_if_told(&prompt, "finish");
            let model = model.clone();
            match outcome {
                Ok(result) => {
                    ChildRun::from_result(index, self.depth, model, &prompt, result, chars)
                }
                Err(why) => ChildRun::not_run(index, self.depth, model, &prompt, why, chars),
            }
        }))
        .unwrap_or_else(|panic| {
            let message = panicked(panic.as_ref(), "as it was closed and recorded");
            ChildRun::not_run(
                index,
                self.depth,
                model,
                &prompt,
                NotRun::kernel(message),
                chars,
            )
        });
        let mut finished = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
        finished.nodes.push(node);
        finished.unrecorded = finished.unrecorded.saturating_sub(1);
        drop(finished);
        self.recorded.notify_all();
    }

    /// A child's session (its `context` moved into it, not copied: it may be large) and loop,
    /// ready to run, and the watch that stops it when its block (or the parent run) stops,
    /// run by the thread that stops them (no task watches them).
    fn start(
        &self,
        model: &str,
        context: Option<ContextSource>,
        max_iterations: Option<u32>,
        cancel: &CancellationToken,
    ) -> Result<(Rlm, StopWatch), NotRun> {
        let endpoint = self.endpoints.get(model).map_err(|e| NotRun {
            reason: TerminationReason::RootModelError,
            message: e.to_string(),
        })?;
        // No session (with isolation on, no worker process) for a child that could not send
        // its first model call: code that starts children in a loop past the budget, or after
        // the run stopped, starts none.
        if self.stop.is_cancelled() || cancel.is_cancelled() {
            return Err(NotRun {
                reason: TerminationReason::Interrupted,
                message: "the run was stopped before it started".to_owned(),
            });
        }
        if let Some((limit, spent)) = spent(
            endpoint.ledger(),
            endpoint.config().counts_toward_call_budget,
        ) {
            return Err(NotRun {
                reason: TerminationReason::for_budget(limit),
                message: format!("the tree's budget is spent ({spent})"),
            });
        }
        let contexts: Vec<_> = context.into_iter().collect();
        // With isolation on, its worker starts the session while the child asks its model
        // (unless only the worker can describe its context: a frame): the first block waits
        // for it. In-process, it takes the session made while the previous child
        // ran, if there is one.
        let ahead = self
            .ahead
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let (config, endpoints) = (self.session.clone(), Arc::clone(&self.endpoints));
        let session = match ahead {
            Some(ahead) => ReplSession::start_ahead(ahead, config, endpoints, contexts),
            None => ReplSession::for_child(config, endpoints, contexts, self.workers.as_ref()),
        }
        .map_err(|e| NotRun::kernel(e.to_string()))?;
        // The next child's session is made ready while this one runs (in-process, one at a
        // time; with isolation on, a run that keeps workers ready had its pool order the
        // next worker as this session started).
        let mut next = self.ahead.lock().unwrap_or_else(PoisonError::into_inner);
        if next.is_none() {
            *next = ReplSession::ahead(&self.session, &self.endpoints);
        }
        drop(next);
        let mut config = self.config.clone();
        model.clone_into(&mut config.root_endpoint);
        if let Some(n) = max_iterations {
            config.max_iterations = n;
        }
        if let Some(deadline) = self.deadline {
            // A deadline already passed leaves the child the least time there is: it stops
            // at its first check.
            let left = deadline.saturating_duration_since(Instant::now());
            config.run_timeout = Some(left.max(std::time::Duration::from_millis(1)));
        }
        let mut rlm = Rlm::child(
            config,
            Arc::clone(&self.endpoints),
            Arc::new(session),
            self.depth,
        );
        rlm.system_prompt = Some(Arc::clone(&self.system_prompt));
        let handle = rlm.stop_handle();
        let watch = StopWatch::arm([cancel.clone(), self.stop.clone()], move || handle.stop());
        Ok((rlm, watch))
    }
}

/// Which limit of `ledger`'s budget leaves no room for one more model call (`counted`: one
/// that counts toward the call budget), if any, and its name in a message.
fn spent(ledger: &bridge::Ledger, counted: bool) -> Option<(BudgetLimit, &'static str)> {
    let budget = ledger.budget();
    let reached = |max: Option<u64>, so_far: u64| max.is_some_and(|max| so_far >= max);
    if counted && reached(budget.max_calls, ledger.calls_reserved()) {
        Some((BudgetLimit::Calls, "calls"))
    } else if reached(budget.max_iterations, ledger.iterations_reserved()) {
        Some((BudgetLimit::Iterations, "iterations"))
    } else if reached(
        budget.max_tokens,
        ledger.tokens_used() + ledger.tokens_reserved(),
    ) {
        Some((BudgetLimit::Tokens, "tokens"))
    } else if budget.max_usd.is_some_and(|max| ledger.usd_used() >= max) {
        Some((BudgetLimit::Usd, "cost"))
    } else {
        None
    }
}

impl ChildNodes for ChildRuns {
    fn take(&self) -> Vec<ChildRun> {
        ChildRuns::take(self)
    }
}

impl ChildRunner for ChildRuns {
    fn run(
        &self,
        queries: Vec<ChildQuery>,
        cancel: &CancellationToken,
        answered: &mut (dyn FnMut(Vec<ChildAnswer>) + Send),
    ) {
        let n = queries.len();
        let first = self.next.fetch_add(n, Ordering::Relaxed);
        let width = self
            .session
            .batch_concurrency
            .unwrap_or(n)
            .clamp(1, n.max(1));
        self.finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unrecorded += n;
        let answers: Vec<Mutex<Option<ChildAnswer>>> = (0..n).map(|_| Mutex::new(None)).collect();
        // Each query is taken by the thread that runs it: its context moves on, uncopied.
        let queries: Vec<Mutex<Option<ChildQuery>>> =
            queries.into_iter().map(|q| Mutex::new(Some(q))).collect();
        let cursor = AtomicUsize::new(0);
        let (queries, answers) = (&queries, &answers);
        let unanswered = AtomicUsize::new(n);
        // `None` once called.
        let answered = Mutex::new(Some(answered));
        let hand_over = || {
            let answered = answered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(answered) = answered {
                answered(answers.iter().map(take_answer).collect());
            }
        };
        let work = || {
            loop {
                let i = cursor.fetch_add(1, Ordering::Relaxed);
                let Some(slot) = queries.get(i) else { break };
                let taken = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
                let Some(query) = taken else { continue };
                let (answer, ended) = self.run_one(first + i, query, cancel);
                *answers[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
                // The last answer in: the code that asked goes on while this child is
                // finished (the others of a batch were, each by its thread, meanwhile).
                if unanswered.fetch_sub(1, Ordering::AcqRel) == 1 {
                    hand_over();
                }
                self.finish(ended);
            }
        };
        if width.min(n) <= 1 {
            // One at a time (one `rlm_query`, or a width of 1): on this thread, which has
            // nothing else to do meanwhile, rather than on a thread started for it.
            work();
        } else {
            std::thread::scope(|scope| {
                for _ in 0..width.min(n) {
                    scope.spawn(work);
                }
            });
        }
        // No query (nothing to wait for), or a child that never answered: what there is.
        hand_over();
    }
}

/// How long the end of a block waits for the nodes of the children it started
/// ([`ChildRuns::take`]): each is made once its session was closed or handed to the closer,
/// itself bounded by a worker's exit (see `closer.rs`).
const RECORD_WAIT: Duration = Duration::from_secs(30);

/// The children of a run that ended since its last block, and how many started ones have
/// no node yet.
#[derive(Debug, Default)]
struct Finished {
    nodes: Vec<ChildRun>,
    unrecorded: usize,
}

/// A child that has its answer, still to be [finished](ChildRuns::finish).
struct Ended {
    index: usize,
    model: String,
    prompt: String,
    /// Its result, or why it could not run.
    outcome: Result<RlmResult, NotRun>,
    /// Its loop and session, and the watch that stops it (`None`: it could not start).
    rlm: Option<(Rlm, StopWatch)>,
}

/// Why a child has no result or no node of its own: rlm panicked `when`, with `panic`'s
/// message.
fn panicked(panic: &(dyn std::any::Any + Send), when: &str) -> String {
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message");
    format!("rlm panicked {when} ({message}); a bug in rlm, please report it")
}

/// A child's answer from its slot: a child that never put one there did not finish.
fn take_answer(slot: &Mutex<Option<ChildAnswer>>) -> ChildAnswer {
    slot.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .unwrap_or_else(|| {
            Err(SubFailure {
                kind: "child_error".to_owned(),
                message: "the rlm_query child run did not finish".to_owned(),
            })
        })
}
