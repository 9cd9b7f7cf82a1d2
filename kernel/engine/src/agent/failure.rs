//! How one tool call fails: [`ToolCallError`], whose text the model gets as
//! `{"success": false, "error": "..."}` and which says what to do instead.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::tool::ToolError;

/// Why one tool call produced no result; its text goes to the model as
/// `{"success": false, "error": "..."}` and says what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolCallError {
    /// The model called a tool that is not in the toolbox.
    #[error("There is no tool `{name}`; call one of: {}", list_names(.known))]
    UnknownTool {
        /// The name the model used.
        name: String,
        /// The tools it may call.
        known: Vec<String>,
    },
    /// The arguments are not a JSON object.
    #[error(
        "The arguments of `{tool}` are not a valid JSON object ({detail}); send one JSON object \
         that fits the tool's parameters"
    )]
    MalformedArguments {
        /// The tool called.
        tool: String,
        /// What the JSON parser said.
        detail: String,
    },
    /// The arguments do not fit the tool's JSON Schema.
    #[error(
        "The arguments of `{tool}` do not fit its parameters: {}; fix them and call `{tool}` again",
        .problems.join("; ")
    )]
    SchemaMismatch {
        /// The tool called.
        tool: String,
        /// Each problem, with the JSON Pointer of the argument it concerns.
        problems: Vec<String>,
    },
    /// The tool ran and returned an error.
    #[error("{0}")]
    Tool(ToolError),
    /// The tool did not finish in time and was stopped.
    #[error(
        "The tool `{tool}` did not finish within {} s and was stopped; call it with less work \
         (a smaller input or a narrower request) or try another way",
        .timeout.as_secs_f64()
    )]
    TimedOut {
        /// The tool called.
        tool: String,
        /// Its time limit.
        timeout: Duration,
    },
    /// The tool panicked (a bug in the tool).
    #[error(
        "The tool `{tool}` crashed ({detail}); do not call it with the same arguments again, \
         try another way"
    )]
    Panicked {
        /// The tool called.
        tool: String,
        /// The panic message.
        detail: String,
    },
    /// The run stopped (Ctrl-C, run timeout, budget, a hook) before the call finished.
    #[error("The tool call was cancelled because the run stopped before it finished")]
    Cancelled,
}

impl ToolCallError {
    /// The kind of failure, for metrics and logs.
    pub fn kind(&self) -> ToolFailureKind {
        match self {
            Self::UnknownTool { .. } => ToolFailureKind::UnknownTool,
            Self::MalformedArguments { .. } => ToolFailureKind::MalformedArguments,
            Self::SchemaMismatch { .. } => ToolFailureKind::SchemaMismatch,
            Self::Tool(ToolError::InvalidArguments(_)) => ToolFailureKind::InvalidArguments,
            Self::Tool(ToolError::Failed(_)) => ToolFailureKind::Failed,
            Self::Tool(ToolError::TimedOut(_)) | Self::TimedOut { .. } => ToolFailureKind::TimedOut,
            Self::Tool(ToolError::Cancelled) | Self::Cancelled => ToolFailureKind::Cancelled,
            Self::Panicked { .. } => ToolFailureKind::Panicked,
        }
    }
}

impl From<ToolError> for ToolCallError {
    fn from(error: ToolError) -> Self {
        Self::Tool(error)
    }
}

/// The kind of a failed tool call (serialised in snake_case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFailureKind {
    /// No tool of that name.
    UnknownTool,
    /// The arguments were not a JSON object.
    MalformedArguments,
    /// The arguments failed the tool's JSON Schema.
    SchemaMismatch,
    /// The tool itself refused the arguments.
    InvalidArguments,
    /// The tool ran and failed.
    Failed,
    /// The call took too long.
    TimedOut,
    /// The run stopped first.
    Cancelled,
    /// The tool panicked.
    Panicked,
}

fn list_names(names: &[String]) -> String {
    if names.is_empty() {
        return "none (this agent has no tools; answer without calling one)".into();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
