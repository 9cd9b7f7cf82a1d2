//! The code executor: runs the `repl` blocks of a reply, in order, in the session.

use serde::{Deserialize, Serialize};

use super::blocks::CodeBlock;
use super::upstream::ExecutionResult;

/// One block of a reply and what running it produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockRun {
    /// The block.
    pub block: CodeBlock,
    /// Its execution.
    pub result: ExecutionResult,
}
