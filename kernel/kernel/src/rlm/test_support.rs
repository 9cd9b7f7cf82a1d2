//! Helpers shared by unit tests: of the loop, and of the worker session's side in rlm.

use std::time::Duration;

use crate::repl::ExecutionResult;

/// A block result with no output, no error and no variables.
pub(crate) fn empty_result() -> ExecutionResult {
    ExecutionResult {
        stdout: String::new(),
        stderr: String::new(),
        stdout_omitted_chars: 0,
        stderr_omitted_chars: 0,
        error: None,
        timed_out: false,
        duration: Duration::ZERO,
        sub_calls: Vec::new(),
        sub_call_texts: Vec::new(),
        llm_query_calls: 0,
        llm_query_batched_calls: 0,
        sub_call_errors: 0,
        final_answers: Vec::new(),
        variables: Vec::new(),
        new_variables: Vec::new(),
        restart: None,
    }
}
