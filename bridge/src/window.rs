//! The context-window check: a sub-call that cannot fit its model's context window is refused
//! before it is sent, with an error the code can act on, instead of a 400 from the server.
//!
//! The window of an endpoint's model comes from, first that says:
//! 1. the endpoint's [`context_window`](crate::EndpointConfig::context_window) setting
//!    (`--sub-context-window`);
//! 2. [`known_window`]: a small table of well-known hosted models;
//! 3. the server's model listing (`GET {base_url}/models`: vLLM's `max_model_len`, llama.cpp's
//!    `meta.n_ctx_train`, `context_length` of OpenRouter and LM Studio), asked once per
//!    endpoint, and only when a call's estimate exceeds [`LOOKUP_FLOOR`] tokens (no model has a
//!    smaller window, so small calls never wait for the listing).
//!
//! An unknown window means no check. The estimate is the ledger's: prompt characters / 4 plus
//! the reply's `max_tokens` when set. Only sub-calls from code are checked
//! ([`CallOptions::sub_call`](crate::CallOptions::sub_call)): the root model's conversation is
//! kept in bounds by the loop.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Estimates at or below this many tokens are not checked against a listed window (no model
/// offers less), so they never wait for a server's listing.
pub const LOOKUP_FLOOR: u64 = 2048;

/// Where an endpoint's window came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowSource {
    /// The endpoint's setting (`--sub-context-window`).
    Setting,
    /// The table of well-known models.
    KnownModel,
    /// The server's model listing.
    Server,
}

impl WindowSource {
    /// How a message names it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Setting => "as configured",
            Self::KnownModel => "as published for the model",
            Self::Server => "as the server lists it",
        }
    }
}

/// Context windows of well-known hosted models, in tokens, by model-name prefix (the longest
/// matching prefix wins). Windows change with model versions: set `--sub-context-window` to
/// be exact.
const KNOWN: &[(&str, u64)] = &[
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("claude-", 200_000),
    ("gemini-1.5", 1_048_576),
    ("gemini-2", 1_048_576),
];

/// The window of a well-known model, by name (a `provider/` prefix, as routers spell it, is
/// ignored).
pub fn known_window(model: &str) -> Option<u64> {
    let name = model.rsplit('/').next().unwrap_or(model);
    KNOWN
        .iter()
        .filter(|(prefix, _)| name.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|&(_, tokens)| tokens)
}

/// The window a model listing (`GET /models`'s JSON) gives `model`: its entry's
/// `max_model_len`, `context_length`, `context_window` or `meta.n_ctx_train`; the only entry's
/// when no id matches and there is one.
pub fn listed_window(listing: &Value, model: &str) -> Option<u64> {
    let entries = listing.get("data")?.as_array()?;
    let entry = entries
        .iter()
        .find(|e| e.get("id").and_then(Value::as_str) == Some(model))
        .or_else(|| (entries.len() == 1).then(|| &entries[0]))?;
    ["max_model_len", "context_length", "context_window"]
        .iter()
        .find_map(|key| entry.get(key).and_then(Value::as_u64))
        .or_else(|| entry.pointer("/meta/n_ctx_train").and_then(Value::as_u64))
        .filter(|&tokens| tokens > 0)
}

/// A count in short, rounded: `180k`, `1.05M`, `900`.
pub(crate) fn short_tokens(tokens: u64) -> String {
    match tokens {
        0..1_000 => tokens.to_string(),
        1_000..999_500 => format!("{}k", (tokens + 500) / 1_000),
        _ => format!("{:.2}M", tokens as f64 / 1e6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn well_known_models_by_longest_prefix() {
        assert_eq!(known_window("gpt-4.1-mini"), Some(1_047_576));
        assert_eq!(known_window("gpt-4o-mini"), Some(128_000));
        assert_eq!(known_window("openai/gpt-4o"), Some(128_000));
        assert_eq!(known_window("claude-sonnet-4-5"), Some(200_000));
        assert_eq!(known_window("qwen3-8b"), None, "unknown means unchecked");
    }

    #[test]
    fn listings_of_vllm_llama_cpp_and_routers() {
        let vllm = json!({"data": [{"id": "a", "max_model_len": 4096}, {"id": "b", "max_model_len": 32768}]});
        assert_eq!(listed_window(&vllm, "b"), Some(32_768));
        assert_eq!(listed_window(&vllm, "c"), None, "two entries, none named");
        let llama = json!({"data": [{"id": "model.gguf", "meta": {"n_ctx_train": 8192}}]});
        assert_eq!(
            listed_window(&llama, "whatever"),
            Some(8192),
            "the only entry"
        );
        let router = json!({"data": [{"id": "x/y", "context_length": 65536}]});
        assert_eq!(listed_window(&router, "x/y"), Some(65_536));
        assert_eq!(listed_window(&json!({"data": [{"id": "m"}]}), "m"), None);
        assert_eq!(listed_window(&json!({"error": "no"}), "m"), None);
    }

    #[test]
    fn short_token_counts() {
        assert_eq!(short_tokens(900), "900");
        assert_eq!(short_tokens(180_000), "180k");
        assert_eq!(short_tokens(4_096), "4k");
        assert_eq!(short_tokens(1_047_576), "1.05M");
    }
}
