//! Live progress of a run for a progress bar: [`ProgressHook`] feeds a shared [`Progress`]
//! handle that another thread polls with [`Progress::snapshot`].
//!
//! Iteration and phase come from hook events; sub-calls done and in flight, tokens and cost are
//! read from the bridge's ledger at snapshot time, so they move while a block fans out.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bridge::{ChatRequest, Ledger, Message};
use serde::Serialize;

use super::blocks::CodeBlock;
use super::hooks::{Hook, HookAction, ModelCall, RunError, RunInfo};
use super::metadata::{BlockRun, RlmResult};
use crate::repl::ExecutionResult;

/// What the run is doing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "phase")]
pub enum Phase {
    /// Not started.
    #[default]
    Starting,
    /// Waiting for the root model.
    Thinking,
    /// Running block `block` (from 1) of `blocks`.
    Running {
        /// The block, from 1.
        block: usize,
        /// Blocks in the reply.
        blocks: usize,
    },
    /// Finished.
    Done,
}

/// A point-in-time view of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgressSnapshot {
    /// The current iteration, from 1 (0 before the first).
    pub iteration: u32,
    /// The iteration limit.
    pub max_iterations: u32,
    /// What the run is doing.
    pub phase: Phase,
    /// Sub-model calls finished (failed ones included).
    pub sub_calls_done: u64,
    /// Model calls started and not yet finished.
    pub calls_in_flight: u64,
    /// Prompt plus completion tokens of all calls of the run.
    pub tokens: u64,
    /// Cost of all calls of the run, in USD; `None` while no call had a price.
    pub cost_usd: Option<f64>,
    /// Time since the run started.
    pub elapsed: Duration,
    /// Time since the current phase began (the root call was sent, the block started).
    pub phase_elapsed: Duration,
    /// Sub-model calls started in the current phase (a block's fan-out so far).
    pub phase_sub_calls_started: u64,
    /// Of those, the calls finished.
    pub phase_sub_calls_done: u64,
}

#[derive(Debug, Default)]
struct State {
    iteration: u32,
    max_iterations: u32,
    phase: Phase,
    started: Option<Instant>,
    finished: Option<Duration>,
    ledger: Option<Arc<Ledger>>,
    base_index: u64,
    base_recorded: u64,
    base_tokens: u64,
    base_usd: f64,
    root_calls: u64,
    blocks_in_reply: usize,
    phase_started: Option<Instant>,
    phase_base_index: u64,
    phase_base_recorded: u64,
}

impl State {
    /// Enters `phase`, counting its time and sub-calls from now.
    fn enter(&mut self, phase: Phase) {
        self.phase = phase;
        self.phase_started = Some(Instant::now());
        if let Some(ledger) = &self.ledger {
            self.phase_base_index = ledger.next_call_index();
            self.phase_base_recorded = ledger.totals().calls;
        }
    }
}

/// A shared view of a run's progress; clone it freely and poll it from any thread.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    state: Arc<Mutex<State>>,
}

impl Progress {
    /// A handle for a run that has not started.
    pub fn new() -> Self {
        Self::default()
    }

    /// The hook that keeps this handle up to date; add it to the run.
    pub fn hook(&self) -> ProgressHook {
        ProgressHook {
            progress: self.clone(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The progress now.
    pub fn snapshot(&self) -> ProgressSnapshot {
        let state = self.state();
        let (done, in_flight, tokens, cost_usd) = match &state.ledger {
            Some(ledger) => {
                let started = ledger.next_call_index().saturating_sub(state.base_index);
                let recorded = ledger.totals().calls.saturating_sub(state.base_recorded);
                (
                    recorded.saturating_sub(state.root_calls),
                    started.saturating_sub(recorded),
                    ledger.tokens_used().saturating_sub(state.base_tokens),
                    // Known once a priced call is on the ledger: no price is no cost figure.
                    ledger
                        .totals()
                        .cost_usd
                        .map(|_| (ledger.usd_used() - state.base_usd).max(0.0)),
                )
            }
            None => (0, 0, 0, None),
        };
        // Only a block's calls are sub-calls; while thinking, the one call is the root's.
        let (phase_started, phase_done) = match (&state.ledger, state.phase) {
            (Some(ledger), Phase::Running { .. }) => (
                ledger
                    .next_call_index()
                    .saturating_sub(state.phase_base_index),
                ledger
                    .totals()
                    .calls
                    .saturating_sub(state.phase_base_recorded),
            ),
            _ => (0, 0),
        };
        ProgressSnapshot {
            iteration: state.iteration,
            max_iterations: state.max_iterations,
            phase: state.phase,
            sub_calls_done: done,
            calls_in_flight: in_flight,
            tokens,
            cost_usd,
            elapsed: state
                .finished
                .or_else(|| state.started.map(|t| t.elapsed()))
                .unwrap_or_default(),
            phase_elapsed: state
                .phase_started
                .filter(|_| state.finished.is_none())
                .map(|t| t.elapsed())
                .unwrap_or_default(),
            phase_sub_calls_started: phase_started,
            phase_sub_calls_done: phase_done.min(phase_started),
        }
    }
}

/// Updates a [`Progress`] from the run's events.
#[derive(Debug, Clone)]
pub struct ProgressHook {
    progress: Progress,
}

impl Hook for ProgressHook {
    fn before_run(&mut self, run: &RunInfo<'_>) -> HookAction<String> {
        let mut state = self.progress.state();
        *state = State {
            max_iterations: run.config.max_iterations,
            started: Some(Instant::now()),
            ..State::default()
        };
        if let Some(ledger) = run.ledger {
            state.base_index = ledger.next_call_index();
            state.base_recorded = ledger.totals().calls;
            state.base_tokens = ledger.tokens_used();
            state.base_usd = ledger.usd_used();
            state.ledger = Some(Arc::clone(ledger));
        }
        HookAction::Continue
    }

    fn before_iteration(&mut self, iteration: u32, _messages: &[Message]) -> HookAction<String> {
        self.progress.state().iteration = iteration;
        HookAction::Continue
    }

    fn before_model_call(
        &mut self,
        _iteration: u32,
        _request: &mut ChatRequest,
    ) -> HookAction<String> {
        self.progress.state().enter(Phase::Thinking);
        HookAction::Continue
    }

    fn after_model_call(&mut self, call: &mut ModelCall) {
        let mut state = self.progress.state();
        if call.record.is_some() {
            state.root_calls += 1;
        }
        state.blocks_in_reply = super::blocks::extract_code_blocks(&call.reply).len();
    }

    fn before_block(
        &mut self,
        _iteration: u32,
        block: &mut CodeBlock,
    ) -> HookAction<ExecutionResult> {
        let mut state = self.progress.state();
        let blocks = state.blocks_in_reply.max(block.index + 1);
        state.enter(Phase::Running {
            block: block.index + 1,
            blocks,
        });
        HookAction::Continue
    }

    fn after_block(&mut self, _iteration: u32, _run: &mut BlockRun) {}

    fn on_error(&mut self, error: &RunError) {
        if error.record.is_some() {
            self.progress.state().root_calls += 1;
        }
    }

    fn after_run(&mut self, _result: &mut RlmResult) {
        let mut state = self.progress.state();
        state.phase = Phase::Done;
        state.finished = state.started.map(|t| t.elapsed());
    }
}
