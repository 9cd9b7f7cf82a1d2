//! Provider-neutral chat types: what a caller sends and what a model answers.
//!
//! The clients translate these into each provider's wire format; nothing here knows HTTP.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::secret::Redactor;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions for the model.
    System,
    /// The caller's turn.
    User,
    /// The model's turn (may carry tool calls).
    Assistant,
    /// The result of a tool call, answering `tool_call_id`.
    Tool,
}

impl Role {
    /// The wire name shared by OpenAI and Anthropic (`system`, `user`, `assistant`, `tool`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its text (may be empty for an assistant message that only calls tools).
    #[serde(default)]
    pub content: String,
    /// Tool calls requested by the assistant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For `Role::Tool`: the id of the call this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    fn plain(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::plain(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::plain(Role::User, content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::plain(Role::Assistant, content)
    }

    /// The result of the tool call `id`.
    pub fn tool_result(id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(id.into()),
            ..Self::plain(Role::Tool, content)
        }
    }
}

/// A function call requested by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id, echoed back in the tool result.
    pub id: String,
    /// The function name.
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// The function name.
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// Whether and which tools the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (the providers' default when tools are given).
    Auto,
    /// The model must not call tools.
    None,
    /// The model must call at least one tool (Anthropic `any`).
    Required,
    /// The model must call the tool of this name.
    Tool(String),
}

/// Whether `name` is a tool name both OpenAI and Anthropic accept: `[a-zA-Z0-9_-]{1,64}`.
pub fn is_valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Sampling parameters; unset fields fall back to the endpoint's defaults, then the server's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Sampling temperature.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Maximum completion tokens (`max_tokens` on the wire).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Stop sequences.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Sampling seed (OpenAI-compatible servers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Provider-specific fields merged into the request body as they are; they win over
    /// the typed fields above.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
}

/// One chat completion request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The model; `None` uses the endpoint's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Sampling parameters.
    #[serde(default)]
    pub params: SamplingParams,
    /// Functions the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDefinition>,
    /// Whether and which tools the model must call; `None` is the providers' default, `auto`
    /// (sent as `auto` on the OpenAI wire). Sent only with `tools`, as both APIs reject it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// `Some(false)` asks for at most one tool call per reply; sent only with `tools`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
}

impl ChatRequest {
    /// A request of one user message.
    pub fn from_prompt(prompt: impl Into<String>) -> Self {
        Self {
            messages: vec![Message::user(prompt)],
            ..Self::default()
        }
    }

    /// Replaces every value `redactor` knows in the message contents and tool-call arguments.
    pub fn redact(&mut self, redactor: &Redactor) {
        if redactor.is_empty() {
            return;
        }
        for message in &mut self.messages {
            redactor.redact_in_place(&mut message.content);
            for call in &mut message.tool_calls {
                redactor.redact_in_place(&mut call.arguments);
            }
        }
    }

    /// The number of characters of text sent: message contents and tool-call arguments.
    pub fn prompt_chars(&self) -> usize {
        self.messages
            .iter()
            .map(|m| {
                m.content.chars().count()
                    + m.tool_calls
                        .iter()
                        .map(|c| c.arguments.chars().count())
                        .sum::<usize>()
            })
            .sum()
    }
}

/// Token usage of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// `true` when the server reported no usage and the counts are estimated from characters.
    pub estimated: bool,
}

impl Usage {
    /// Estimate usage from character counts (4 characters per token, rounded up).
    pub fn estimate(prompt_chars: usize, completion_chars: usize) -> Self {
        Self {
            prompt_tokens: (prompt_chars as u64).div_ceil(4),
            completion_tokens: (completion_chars as u64).div_ceil(4),
            estimated: true,
        }
    }

    /// Prompt plus completion tokens (saturating: servers report what they like).
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// A model's answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The text of the answer.
    pub content: String,
    /// Tool calls the model requested.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// Tokens used.
    pub usage: Usage,
    /// Why generation stopped (`stop`, `length`, `tool_calls`, `end_turn`, …).
    pub finish_reason: Option<String>,
    /// The model that answered, as reported by the server.
    pub model: String,
    /// Time from sending the first attempt to the end of the answer, retries included.
    pub latency: Duration,
    /// HTTP attempts made (1 without retries).
    pub attempts: u32,
}

impl ChatResponse {
    /// The number of characters received: content and tool-call arguments.
    pub fn response_chars(&self) -> usize {
        self.content.chars().count()
            + self
                .tool_calls
                .iter()
                .map(|c| c.arguments.chars().count())
                .sum::<usize>()
    }
}
