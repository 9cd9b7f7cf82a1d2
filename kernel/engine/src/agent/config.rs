//! How an agent loop runs: limits, concurrency and what every model call carries.

use std::time::Duration;

use bridge::config::serde_secs;
use bridge::{SamplingParams, ToolChoice};
use serde::{Deserialize, Serialize};

/// The settings of an [`AgentLoop`](super::AgentLoop); every field has a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoopConfig {
    /// Model calls a run may make before it ends with
    /// [`LoopErrorKind::MaxIterations`](super::LoopErrorKind::MaxIterations) (default 50).
    pub max_iterations: u32,
    /// How long one tool call may take unless the tool sets its own
    /// [`Tool::timeout`](crate::Tool::timeout) (seconds in files; default 300 s).
    #[serde(with = "serde_secs")]
    pub tool_timeout: Duration,
    /// How long a whole run may take (`None`, the default: no limit).
    #[serde(with = "serde_secs::option")]
    pub run_timeout: Option<Duration>,
    /// Tool calls of one reply that run at once, at most (default 8; 0 counts as 1).
    pub max_concurrent_tools: usize,
    /// Ask for the replies as SSE streams (always on when a text sink is set).
    pub stream: bool,
    /// The model to ask (`None`: the endpoint's).
    pub model: Option<String>,
    /// Sampling parameters of every model call.
    pub params: SamplingParams,
    /// Whether and which tools the model must call (`None`, the default: the server's
    /// choice, which is `auto`). `required` or a named tool on every call means the model
    /// can never answer: the run ends at `max_iterations` unless a tool raises an action.
    pub tool_choice: Option<ToolChoice>,
    /// `Some(false)` asks for at most one tool call per reply (`None`: the server's default).
    pub parallel_tool_calls: Option<bool>,
    /// Characters of one tool result the model gets, at most (default 100,000): a longer
    /// result keeps its head and tail around a note saying how much was cut and how to see
    /// it. The one cap for every tool's result.
    pub max_tool_result_chars: usize,
}

/// The default of [`LoopConfig::max_tool_result_chars`].
pub(crate) const DEFAULT_MAX_TOOL_RESULT_CHARS: usize = 100_000;

impl Default for LoopConfig {
    fn default() -> Self {
        Self {
            max_iterations: 50,
            tool_timeout: Duration::from_secs(300),
            run_timeout: None,
            max_concurrent_tools: 8,
            stream: false,
            model: None,
            params: SamplingParams::default(),
            tool_choice: None,
            parallel_tool_calls: None,
            max_tool_result_chars: DEFAULT_MAX_TOOL_RESULT_CHARS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_seconds_and_fills_defaults() {
        let config: LoopConfig =
            serde_json::from_str(r#"{"max_iterations": 3, "run_timeout": 1.5}"#)
                .unwrap_or_default();
        assert_eq!(config.max_iterations, 3);
        assert_eq!(config.run_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(config.tool_timeout, LoopConfig::default().tool_timeout);
        let back: Result<LoopConfig, _> =
            serde_json::from_value(serde_json::to_value(&config).unwrap_or_default());
        assert_eq!(back.ok(), Some(config));
        assert!(serde_json::from_str::<LoopConfig>(r#"{"max_iteration": 3}"#).is_err());
    }
}
