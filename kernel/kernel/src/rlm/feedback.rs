//! The user message after each reply: what every block printed, what went wrong, what the
//! session now holds, and why an attempt to finish did not count.
//!
//! Per block: a status line, stdout, stderr (the traceback of a failed block is there), and the
//! user variables. The stdout and stderr text of one block is cut to
//! [`FeedbackConfig::block_limit`] characters, keeping the head and the tail around a marker
//! that says how much was left out, so a block that prints a whole context costs the model at
//! most that much.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::final_answer::FinalNote;
use super::metadata::BlockRun;
use super::prompts::{Prompts, group_digits};
use crate::repl::VariableInfo;

/// Settings of the feedback messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedbackConfig {
    /// The characters of output (stdout and stderr together) shown per block.
    pub block_limit: usize,
    /// The user variables listed per block; the rest are counted.
    pub max_listed_variables: usize,
}

impl Default for FeedbackConfig {
    fn default() -> Self {
        Self {
            block_limit: 20_000,
            max_listed_variables: 40,
        }
    }
}

pub use engine::text::truncate_middle;

/// The feedback message for the blocks of one reply.
///
/// `runs` are the reply's blocks in order (empty for a reply without code), `notes` the
/// completion checker's complaints, `iterations_done` counts this reply.
pub fn format_feedback(
    runs: &[BlockRun],
    notes: &[FinalNote],
    prompts: &Prompts,
    config: &FeedbackConfig,
    iterations_done: u32,
) -> String {
    let mut out = String::new();
    for run in runs {
        out.push_str(&format_block(run, runs.len(), config));
        out.push('\n');
    }
    if runs.is_empty() && notes.is_empty() {
        out.push_str(prompts.no_code_nudge());
        out.push('\n');
    }
    if !notes.is_empty() {
        out.push_str("Note:\n");
        for note in notes {
            out.push_str("- ");
            out.push_str(&prompts.note(note));
        }
        out.push('\n');
    }
    out.push_str(&prompts.feedback_footer(iterations_done));
    out
}

/// One block's section of the feedback.
pub fn format_block(run: &BlockRun, total_blocks: usize, config: &FeedbackConfig) -> String {
    let result = &run.result;
    let mut status = format!("[block {} of {}] ", run.block.index + 1, total_blocks);
    if result.timed_out {
        status.push_str("interrupted: it ran past the time limit");
    } else if let Some(error) = &result.error {
        status.push_str(&format!("raised {}", error.type_name));
        if let Some(line) = error.line {
            status.push_str(&format!(" at line {line}"));
        }
    } else {
        status.push_str("ok");
    }
    status.push_str(&format!(" · {}", format_duration(result.duration)));
    match result.sub_calls.len() {
        0 => {}
        1 => status.push_str(" · 1 sub-call"),
        n => status.push_str(&format!(" · {n} sub-calls")),
    }
    status.push('\n');

    let mut body = String::new();
    push_stream(&mut body, "stdout", &result.stdout);
    push_stream(&mut body, "stderr", &result.stderr);
    // The traceback normally arrives on stderr; never leave an error unexplained.
    if result.stderr.trim().is_empty()
        && let Some(error) = &result.error
    {
        body.push_str(&format!(
            "--- error ---\n{}: {}\n",
            error.type_name, error.message
        ));
    }
    if body.is_empty() {
        body.push_str("(no output)\n");
    }
    let mut out = status;
    out.push_str(&truncate_middle(&body, config.block_limit));
    if !out.ends_with('\n') {
        out.push('\n');
    }
    for (name, dropped) in [
        ("stdout", result.stdout_omitted_chars),
        ("stderr", result.stderr_omitted_chars),
    ] {
        if dropped > 0 {
            out.push_str(&format!(
                "[the session kept only the head and tail of {name}: {} characters were dropped]\n",
                group_digits(dropped as u64)
            ));
        }
    }
    out.push_str(&format_variables(
        &result.variables,
        config.max_listed_variables,
    ));
    out
}

fn push_stream(body: &mut String, name: &str, text: &str) {
    if text.is_empty() {
        return;
    }
    body.push_str(&format!("--- {name} ---\n"));
    body.push_str(text);
    if !text.ends_with('\n') {
        body.push('\n');
    }
}

fn format_variables(variables: &[VariableInfo], max_listed: usize) -> String {
    if variables.is_empty() {
        return "--- variables ---\n(none yet)\n".to_owned();
    }
    let listed: Vec<String> = variables
        .iter()
        .take(max_listed)
        .map(|v| match v.size {
            Some(size) => format!(
                "{}: {} (len {})",
                v.name,
                v.type_name,
                group_digits(size as u64)
            ),
            None => format!("{}: {}", v.name, v.type_name),
        })
        .collect();
    let mut out = format!("--- variables ---\n{}", listed.join(", "));
    if variables.len() > max_listed {
        out.push_str(&format!(
            ", and {} more (see SHOW_VARS())",
            variables.len() - max_listed
        ));
    }
    out.push('\n');
    out
}

/// `420 ms`, `3.2 s`.
pub(crate) fn format_duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::{ExecError, ExecutionResult};
    use crate::rlm::blocks::CodeBlock;
    use crate::rlm::final_answer::{CompletionRules, FinalKind};
    use crate::rlm::prompts::PromptConfig;
    use crate::rlm::test_support::empty_result;
    use bridge::SubCallMetadata;

    fn run(index: usize, result: ExecutionResult) -> BlockRun {
        BlockRun {
            block: CodeBlock {
                index,
                code: "...".into(),
            },
            result,
            children: Vec::new(),
        }
    }

    fn var(name: &str, type_name: &str, size: Option<usize>) -> VariableInfo {
        VariableInfo {
            name: name.into(),
            type_name: type_name.into(),
            size,
            preview: String::new(),
        }
    }

    fn sub_call(i: u64) -> SubCallMetadata {
        SubCallMetadata {
            call_index: i,
            endpoint: "sub".into(),
            model: "mock-sub".into(),
            prompt_chars: 10,
            response_chars: 2,
            prompt_tokens: 3,
            completion_tokens: 1,
            tokens_estimated: false,
            latency_ms: 1.0,
            attempts: 1,
            batched: true,
            batch_size: 2,
            started_at_ms: 0,
            cost_usd: None,
            error: None,
            error_kind: None,
            session: None,
            cache: None,
        }
    }

    fn prompts() -> Prompts {
        Prompts::new(
            PromptConfig::default(),
            CompletionRules::default(),
            20_000,
            30,
        )
    }

    #[test]
    fn feedback_for_a_multi_block_reply() {
        let ok = ExecutionResult {
            stdout: "<class 'str'> 52428800\n".into(),
            duration: Duration::from_millis(3),
            variables: vec![var("n", "int", None)],
            new_variables: vec!["n".into()],
            ..empty_result()
        };
        let fanned = ExecutionResult {
            stdout: "['ERROR', 'OK']".into(),
            duration: Duration::from_millis(1_234),
            sub_calls: vec![sub_call(0), sub_call(1)],
            llm_query_batched_calls: 1,
            variables: vec![
                var("n", "int", None),
                var("chunks", "list", Some(2)),
                var("labels", "list", Some(2)),
            ],
            ..empty_result()
        };
        let failed = ExecutionResult {
            stdout: "before the error\n".into(),
            stderr: "Traceback (most recent call last):\n  File \"<repl>\", line 2, in <module>\nZeroDivisionError: division by zero\n".into(),
            error: Some(ExecError {
                type_name: "ZeroDivisionError".into(),
                message: "division by zero".into(),
                traceback: String::new(),
                line: Some(2),
            }),
            duration: Duration::from_millis(1),
            variables: vec![var("n", "int", None), var("chunks", "list", Some(2)), var("labels", "list", Some(2))],
            ..empty_result()
        };
        let text = format_feedback(
            &[run(0, ok), run(1, fanned), run(2, failed)],
            &[],
            &prompts(),
            &FeedbackConfig::default(),
            1,
        );
        insta::assert_snapshot!(text);
    }

    #[test]
    fn feedback_for_timeout_silence_and_a_huge_print() {
        let timed_out = ExecutionResult {
            stderr: "TimeoutError: the block ran longer than 5 s and was interrupted\n".into(),
            timed_out: true,
            duration: Duration::from_millis(5_004),
            ..empty_result()
        };
        let silent = ExecutionResult {
            duration: Duration::from_millis(0),
            ..empty_result()
        };
        let huge = ExecutionResult {
            stdout: format!("HEAD{}TAIL", "x".repeat(1_000)),
            stdout_omitted_chars: 5_000_000,
            duration: Duration::from_millis(40),
            variables: (0..5)
                .map(|i| var(&format!("v{i}"), "str", Some(i)))
                .collect(),
            ..empty_result()
        };
        let config = FeedbackConfig {
            block_limit: 100,
            max_listed_variables: 3,
        };
        let text = format_feedback(
            &[run(0, timed_out), run(1, silent), run(2, huge)],
            &[FinalNote::SeeOutputFirst {
                kind: FinalKind::FinalLine,
            }],
            &prompts(),
            &config,
            29,
        );
        insta::assert_snapshot!(text);
    }

    #[test]
    fn feedback_for_a_reply_without_code() {
        let p = prompts();
        insta::assert_snapshot!(
            "no_code",
            format_feedback(&[], &[], &p, &FeedbackConfig::default(), 2)
        );
        let with_note = format_feedback(
            &[],
            &[FinalNote::MissingVariable {
                name: "result".into(),
            }],
            &p,
            &FeedbackConfig::default(),
            2,
        );
        assert!(with_note.contains("`FINAL_VAR(result)` names a variable that does not exist"));
        assert!(
            !with_note.contains(p.no_code_nudge()),
            "a note replaces the nudge"
        );
    }

    #[test]
    fn error_without_stderr_is_still_explained() {
        let result = ExecutionResult {
            error: Some(ExecError {
                type_name: "KeyError".into(),
                message: "'x'".into(),
                traceback: String::new(),
                line: None,
            }),
            ..empty_result()
        };
        let text = format_block(&run(0, result), 1, &FeedbackConfig::default());
        assert!(text.contains("raised KeyError"), "{text}");
        assert!(text.contains("--- error ---\nKeyError: 'x'\n"), "{text}");
    }
}
