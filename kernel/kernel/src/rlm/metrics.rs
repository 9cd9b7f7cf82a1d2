//! [`MetricsHook`]: the run's [`SessionMetrics`], counted from hook events.

use std::time::Instant;

use super::hooks::{Hook, HookAction, ModelCall, RunError, RunInfo};
use super::metadata::{BlockRun, RlmResult};
use super::metadata::{IterationRecord, SessionMetrics, TerminationReason};
use bridge::SubCallMetadata;

/// Counts iterations, blocks, calls, tokens, cost and time; fills `RlmResult::metrics` in
/// [`Hook::after_run`]. The runner installs one ahead of the user's hooks.
#[derive(Debug, Default)]
pub struct MetricsHook {
    metrics: SessionMetrics,
    started: Option<Instant>,
}

impl MetricsHook {
    /// Empty metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// The metrics so far (`total_ms` is filled at the end of the run).
    pub fn metrics(&self) -> &SessionMetrics {
        &self.metrics
    }

    fn add_root_call(&mut self, record: Option<&SubCallMetadata>) {
        self.metrics.root_calls += 1;
        if let Some(record) = record {
            self.metrics.root_latency_ms += record.latency_ms;
            self.metrics.add_call(record);
        }
    }
}

impl Hook for MetricsHook {
    fn before_run(&mut self, _run: &RunInfo<'_>) -> HookAction<String> {
        self.started = Some(Instant::now());
        HookAction::Continue
    }

    fn after_model_call(&mut self, call: &mut ModelCall) {
        if call.response.is_some() || call.record.is_some() {
            self.add_root_call(call.record.as_ref());
        }
    }

    fn after_block(&mut self, _iteration: u32, run: &mut BlockRun) {
        let result = &run.result;
        let m = &mut self.metrics;
        m.code_blocks += 1;
        m.llm_query_calls += u64::from(result.llm_query_calls);
        m.llm_query_batched_calls += u64::from(result.llm_query_batched_calls);
        m.sub_call_errors += u64::from(result.sub_call_errors);
        m.execution_ms += result.duration.as_secs_f64() * 1000.0;
        if result.timed_out {
            m.block_timeouts += 1;
        } else if result.error.is_some() {
            m.block_errors += 1;
        }
    }

    fn on_sub_call(&mut self, _iteration: u32, call: &SubCallMetadata) {
        self.metrics.sub_calls += 1;
        self.metrics.sub_call_cache_hits += u64::from(call.cache.is_some());
        self.metrics.add_call(call);
    }

    fn after_iteration(&mut self, record: &mut IterationRecord) {
        self.metrics.iterations += 1;
        for child in record.blocks.iter().flat_map(|b| &b.children) {
            self.metrics.add_child(&child.metrics);
        }
    }

    fn on_error(&mut self, error: &RunError) {
        if let Some(record) = &error.record {
            self.add_root_call(Some(record));
        }
    }

    fn after_run(&mut self, result: &mut RlmResult) {
        let m = &mut self.metrics;
        m.total_ms = self
            .started
            .map_or(0.0, |t| t.elapsed().as_secs_f64() * 1000.0);
        m.termination_reason = Some(result.termination_reason);
        m.final_answer_found = result.termination_reason == TerminationReason::FinalAnswer;
        result.metrics = m.clone();
    }
}
