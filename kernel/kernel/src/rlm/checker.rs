//! The completion checker: after a reply's blocks ran, did the model finish?
//!
//! A thin stage over [`check_completion`](super::check_completion): it takes the final answers
//! the blocks recorded (`ExecutionResult::final_answers`) and reads `FINAL_VAR(name)` lines'
//! variables through a resolver (in the loop: `ReplSession::variable_as_string`). A reply whose
//! blocks did not all run, or of which a block raised or timed out, is [`ReplyCode::Failed`].

use super::blocks::extract_code_blocks;
use super::final_answer::{Completion, CompletionRules, FinalKind, ReplyCode, check_completion};
use super::metadata::BlockRun;
use crate::repl::FinalSource;

/// Decides whether a reply ended the run; the rules are those of
/// [`check_completion`](super::check_completion).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompletionChecker {
    rules: CompletionRules,
}

impl CompletionChecker {
    /// A checker with these rules.
    pub fn new(rules: CompletionRules) -> Self {
        Self { rules }
    }

    /// The rules.
    pub fn rules(&self) -> CompletionRules {
        self.rules
    }

    /// Checks `reply` after its blocks ran (`runs`, in order); `resolve` reads a session
    /// variable as `str(value)`, `None` when unset.
    pub fn check(
        &self,
        reply: &str,
        runs: &[BlockRun],
        resolve: &mut dyn FnMut(&str) -> Option<String>,
    ) -> Completion {
        let code_finals: Vec<(FinalKind, String)> = runs
            .iter()
            .flat_map(|run| &run.result.final_answers)
            .map(|answer| {
                let kind = match answer.source {
                    FinalSource::AnswerDict => FinalKind::AnswerDict,
                    FinalSource::FinalVar => FinalKind::FinalVar,
                };
                (kind, answer.value.clone())
            })
            .collect();
        // A hook may have answered for blocks (they count as run); a stop leaves some unrun.
        let blocks = extract_code_blocks(reply).len().max(runs.len());
        let raised = runs
            .iter()
            .any(|run| run.result.error.is_some() || run.result.timed_out);
        let code = if blocks == 0 {
            ReplyCode::NoBlocks
        } else if raised || runs.len() < blocks {
            ReplyCode::Failed
        } else {
            ReplyCode::Succeeded
        };
        check_completion(reply, code, &code_finals, self.rules, resolve)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::{ExecutionResult, FinalAnswer};
    use crate::rlm::blocks::CodeBlock;
    use crate::rlm::final_answer::{FinalNote, FoundAnswer};
    use crate::rlm::test_support::empty_result;

    fn run(final_answer: Option<FinalAnswer>) -> BlockRun {
        BlockRun {
            block: CodeBlock {
                index: 0,
                code: "x".into(),
            },
            result: ExecutionResult {
                final_answers: final_answer.into_iter().collect(),
                ..empty_result()
            },
            children: Vec::new(),
        }
    }

    #[test]
    fn code_finals_come_from_execution_results() {
        let checker = CompletionChecker::default();
        let runs = [
            run(None),
            run(Some(FinalAnswer {
                value: "from the dict".into(),
                source: FinalSource::AnswerDict,
            })),
        ];
        let done = checker.check("```repl\nx\n```\n```repl\ny\n```", &runs, &mut |_| None);
        assert_eq!(
            done.answer,
            Some(FoundAnswer {
                value: "from the dict".into(),
                kind: FinalKind::AnswerDict
            })
        );
    }

    #[test]
    fn final_var_lines_use_the_resolver() {
        let checker = CompletionChecker::default();
        let mut asked = Vec::new();
        let done = checker.check("FINAL_VAR('total')", &[], &mut |name| {
            asked.push(name.to_owned());
            None
        });
        assert_eq!(asked, ["total"]);
        assert_eq!(
            done.notes,
            [FinalNote::MissingVariable {
                name: "total".into()
            }]
        );
    }
}
