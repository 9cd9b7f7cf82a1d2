//! The RLM loop.

mod blocks;
mod final_answer;
mod prompts;
mod upstream;

pub use blocks::{CodeBlock, extract_code_blocks};
pub use final_answer::{
    CodeAndFinal, Completion, CompletionRules, FinalKind, FinalLines, FinalNote, FinalText,
    FoundAnswer, Protocol, UnknownProtocol, check_completion, scan_final_lines,
};
pub use prompts::{PromptConfig, Prompts, describe_contexts};
