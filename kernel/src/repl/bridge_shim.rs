//! TEMPORARY stand-in for the `bridge` crate's contract API until branch `bridge` lands in
//! `main`; replaced by `bridge::…` imports then. Calls always fail.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::sync::{Arc, Mutex};

pub use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SubCallMetadata {
    pub call_index: u64,
    pub endpoint: String,
    pub model: String,
    pub prompt_chars: usize,
    pub response_chars: usize,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub tokens_estimated: bool,
    pub latency_ms: f64,
    pub attempts: u32,
    pub batched: bool,
    pub batch_size: usize,
    pub started_at_ms: u64,
    pub cost_usd: Option<f64>,
    pub error: Option<String>,
}

#[derive(Debug, Default, Clone)]
pub struct Budget {
    pub max_calls: Option<u64>,
    pub max_tokens: Option<u64>,
    pub max_usd: Option<f64>,
}

#[derive(Debug, Default)]
pub struct Ledger {
    records: Mutex<Vec<SubCallMetadata>>,
}
impl Ledger {
    pub fn new(_budget: Budget) -> Self {
        Self::default()
    }
    pub fn records_since(&self, call_index: u64) -> Vec<SubCallMetadata> {
        self.records
            .lock()
            .map(|r| {
                r.iter()
                    .filter(|m| m.call_index >= call_index)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
    pub fn next_call_index(&self) -> u64 {
        self.records.lock().map(|r| r.len() as u64).unwrap_or(0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("Unknown endpoint `{name}`; known: {known:?}")]
    UnknownEndpoint { name: String, known: Vec<String> },
    #[error("Cancelled")]
    Cancelled,
    #[error("No bridge yet")]
    NotYet,
}
impl BridgeError {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::UnknownEndpoint { .. } => "unknown_endpoint",
            Self::Cancelled => "cancelled",
            Self::NotYet => "config",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub prompt: String,
}
impl ChatRequest {
    pub fn from_prompt(prompt: impl Into<String>) -> Self {
        Self {
            prompt: prompt.into(),
        }
    }
}
#[derive(Debug, Clone)]
pub struct ChatResponse {
    pub content: String,
}
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    pub cancel: CancellationToken,
    pub stream: bool,
}
#[derive(Debug, Clone, Default)]
pub struct BatchPolicy {
    pub concurrency: Option<usize>,
}
#[derive(Debug)]
pub struct Endpoint;
impl Endpoint {
    pub async fn call(
        &self,
        _req: ChatRequest,
        _opts: &CallOptions,
    ) -> Result<ChatResponse, BridgeError> {
        Err(BridgeError::NotYet)
    }
    pub async fn batch(
        &self,
        reqs: Vec<ChatRequest>,
        _policy: BatchPolicy,
        _cancel: &CancellationToken,
    ) -> Vec<Result<ChatResponse, BridgeError>> {
        reqs.iter().map(|_| Err(BridgeError::NotYet)).collect()
    }
}
#[derive(Debug, Default)]
pub struct Endpoints {
    ledger: Arc<Ledger>,
}
impl Endpoints {
    pub fn new(_configs: Vec<()>, ledger: Arc<Ledger>) -> Result<Self, BridgeError> {
        Ok(Self { ledger })
    }
    pub fn get(&self, name: &str) -> Result<Arc<Endpoint>, BridgeError> {
        Err(BridgeError::UnknownEndpoint {
            name: name.to_owned(),
            known: vec![],
        })
    }
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }
}
