//! TEMPORARY: the REPL and bridge types of the team contract, mirrored until the `repl` and
//! `bridge` branches land in `main`; then this file becomes plain re-exports.
#![allow(unreachable_pub, dead_code, missing_docs)]

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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
    pub error_kind: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExecError {
    pub type_name: String,
    pub message: String,
    pub traceback: String,
    pub line: Option<u32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum FinalSource {
    AnswerDict,
    FinalVar,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FinalAnswer {
    pub value: String,
    pub source: FinalSource,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VariableInfo {
    pub name: String,
    pub type_name: String,
    pub size: Option<usize>,
    pub preview: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExecutionResult {
    pub stdout: String,
    pub stderr: String,
    pub stdout_omitted_chars: usize,
    pub stderr_omitted_chars: usize,
    pub error: Option<ExecError>,
    pub timed_out: bool,
    pub duration: Duration,
    pub sub_calls: Vec<SubCallMetadata>,
    pub llm_query_calls: u32,
    pub llm_query_batched_calls: u32,
    pub final_answer: Option<FinalAnswer>,
    pub variables: Vec<VariableInfo>,
    pub new_variables: Vec<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ContextKind {
    Text,
    Json,
    JsonLines,
    Table,
    Directory,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ItemSizes {
    pub min: u64,
    pub max: u64,
    pub mean: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContextMetadata {
    pub index: usize,
    pub name: String,
    pub kind: ContextKind,
    pub source: String,
    pub bytes: u64,
    pub chars: Option<u64>,
    pub rows: Option<u64>,
    pub columns: Option<Vec<(String, String)>>,
    pub items: Option<u64>,
    pub item_sizes: Option<ItemSizes>,
    pub load_ms: f64,
}

// --- bridge::chat (mirrored) ---

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self {
            role: Role::System,
            content: content.into(),
        }
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            content: content.into(),
        }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self {
            role: Role::Assistant,
            content: content.into(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<Message>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub estimated: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    pub content: String,
    pub usage: Usage,
    pub finish_reason: Option<String>,
    pub model: String,
    pub latency: Duration,
    pub attempts: u32,
}
