//! The settings of a run: [`RlmConfig`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::feedback::FeedbackConfig;
use super::final_answer::CompletionRules;
use super::prompts::PromptConfig;

/// The settings of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RlmConfig {
    /// The endpoint of the root model.
    pub root_endpoint: String,
    /// Iterations (root-model replies) before the "answer now" request.
    pub max_iterations: u32,
    /// Wall-clock limit of the whole run.
    #[serde(with = "bridge::config::serde_secs::option")]
    pub run_timeout: Option<Duration>,
    /// Stop after this many iterations in a row in which a block raised or timed out.
    pub max_consecutive_failures: Option<u32>,
    /// Keep the conversation sent to the root model within this many characters by eliding
    /// the oldest block outputs (see [`Conversation::fit`](super::Conversation::fit)); `None`: never elide.
    pub max_history_chars: Option<usize>,
    /// Which final-answer conventions count, and what to do with code plus a final line.
    pub completion: CompletionRules,
    /// How block output is shown to the model.
    pub feedback: FeedbackConfig,
    /// System prompt override, extension, sub-model window.
    pub prompts: PromptConfig,
    /// Levels of RLM runs in the tree, the root's included: at 1 (the default) `rlm_query`
    /// behaves as `llm_query`; at 2 the root's `rlm_query` starts child runs, whose own
    /// `rlm_query` behaves as `llm_query`; and so on.
    pub max_depth: u32,
}

impl Default for RlmConfig {
    fn default() -> Self {
        Self {
            root_endpoint: "root".to_owned(),
            max_iterations: 30,
            run_timeout: None,
            max_consecutive_failures: Some(5),
            max_history_chars: None,
            completion: CompletionRules::default(),
            feedback: FeedbackConfig::default(),
            prompts: PromptConfig::default(),
            max_depth: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_through_json_with_seconds() {
        let config = RlmConfig {
            run_timeout: Some(Duration::from_millis(1_500)),
            ..RlmConfig::default()
        };
        let json = serde_json::to_value(&config).expect("serialize");
        assert_eq!(json["run_timeout"], 1.5);
        assert_eq!(json["completion"]["protocol"], "auto");
        assert_eq!(json["completion"]["code_and_final"], "accept_unless_error");
        let back: RlmConfig = serde_json::from_value(json).expect("deserialize");
        assert_eq!(back, config);
        let partial: RlmConfig =
            serde_json::from_str(r#"{"max_iterations": 3}"#).expect("defaults fill the rest");
        assert_eq!(partial.max_iterations, 3);
        assert_eq!(partial.root_endpoint, "root");
    }
}
