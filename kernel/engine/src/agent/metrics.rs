//! What a run measured: per iteration (model call, tokens), per tool call (duration, bytes of
//! context its result added) and per tool (totals).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::failure::ToolFailureKind;

/// The measurements of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoopMetrics {
    /// Model calls made (or replaced by a hook).
    pub iterations: u32,
    /// One entry per iteration, in order.
    pub model_calls: Vec<ModelCallMetrics>,
    /// One entry per tool call, in transcript order.
    pub tool_calls: Vec<ToolCallMetrics>,
    /// Totals per tool name.
    pub tools: BTreeMap<String, ToolStats>,
    /// Wall time of the whole run, in milliseconds.
    pub wall_ms: f64,
}

impl LoopMetrics {
    /// Prompt plus completion tokens over all model calls.
    pub fn total_tokens(&self) -> u64 {
        self.model_calls
            .iter()
            .map(|m| m.prompt_tokens.saturating_add(m.completion_tokens))
            .sum()
    }

    pub(crate) fn record_tool(&mut self, call: ToolCallMetrics) {
        let stats = self.tools.entry(call.name.clone()).or_default();
        stats.calls += 1;
        stats.failures += u64::from(call.failure.is_some());
        stats.total_ms += call.duration_ms;
        stats.result_bytes += call.result_bytes as u64;
        self.tool_calls.push(call);
    }
}

/// One iteration's model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCallMetrics {
    /// The iteration, from 1.
    pub(crate) iteration: u32,
    /// Input tokens (as the server reported, or estimated).
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// Whether the counts are estimates.
    pub(crate) tokens_estimated: bool,
    /// Time of the call as the loop saw it, in milliseconds (0 when a hook replaced it).
    pub(crate) latency_ms: f64,
    /// Tool calls the reply asked for.
    pub tool_calls: usize,
    /// Whether a hook supplied the reply instead of the model.
    pub replaced: bool,
}

/// One tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallMetrics {
    /// The iteration whose reply asked for it.
    pub(crate) iteration: u32,
    /// The call id.
    pub call_id: String,
    /// The tool name as the model wrote it.
    pub(crate) name: String,
    /// Why it failed (`None`: it succeeded).
    pub failure: Option<ToolFailureKind>,
    /// Time it ran, in milliseconds (waiting for a concurrency slot not counted).
    pub(crate) duration_ms: f64,
    /// Bytes of the tool-result message it added to the context.
    pub result_bytes: usize,
}

/// Totals of one tool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolStats {
    /// Calls.
    pub calls: u64,
    /// Calls that failed.
    pub failures: u64,
    /// Time spent, in milliseconds.
    pub total_ms: f64,
    /// Bytes of context its results added.
    pub(crate) result_bytes: u64,
}
