//! The RLM loop.

mod blocks;
mod checker;
mod executor;
mod feedback;
mod final_answer;
mod hooks;
mod metadata;
mod metrics;
mod prompts;
mod runner;
mod trajectory;
mod upstream;

pub use blocks::{CodeBlock, extract_code_blocks};
pub use checker::CompletionChecker;
pub use executor::BlockRun;
pub use feedback::{FeedbackConfig, format_block, format_feedback, truncate_middle};
pub use final_answer::{
    CodeAndFinal, Completion, CompletionRules, FinalKind, FinalLines, FinalNote, FinalText,
    FoundAnswer, Protocol, UnknownProtocol, check_completion, scan_final_lines,
};
pub use hooks::{EndpointSummary, Hook, HookAction, Hooks, ModelCall, RunError, RunInfo};
pub use metadata::{
    BlockRecord, ExecutionMetadata, ExecutionStatus, IterationMetadata, IterationRecord,
    ModelMetrics, SessionMetrics, TerminationReason,
};
pub use metrics::MetricsHook;
pub use prompts::{PromptConfig, Prompts, describe_contexts};
pub use runner::{RlmConfig, RlmResult};
pub use trajectory::{TRAJECTORY_VERSION, TrajectoryWriter};
