//! The run tree: `rlm_query` children, each a whole RLM loop of its own, and their records.
//!
//! `ChildRuns` (in the runner, which it starts loops of) is the `ChildRunner` a run installs on its session when its depth limit
//! ([`RlmConfig::max_depth`](super::RlmConfig::max_depth)) allows children. Each child gets a
//! new [`ReplSession`](crate::repl::ReplSession) (its own
//! worker process when the session is isolated: the parent runs the child, never the model's
//! code) whose context is the object the code passed, and a new [`Rlm`](super::Rlm) whose root model is
//! the session's sub endpoint unless the code named another. Children share the parent's
//! endpoints — limiter, ledger (one budget for the whole tree: their iterations, calls, tokens
//! and cost are reserved before they are sent, like the parent's) and sub-call record (the
//! cache) — and stop with the block that started them (its timeout, the run's deadline or a
//! stop). Batched children run concurrently, at most the session's fan-out width at once.
//!
//! Every child that ran is a [`ChildRun`] node (defined with the other records in `metadata`) on the [`BlockRecord`](super::BlockRecord) of
//! the block that started it (so its parent is that iteration and block), with its depth,
//! answer, termination reason, metrics and iterations. A node's texts are cut like sub-call
//! texts ([`SessionConfig::sub_call_text_chars`](crate::repl::SessionConfig::sub_call_text_chars)): the prompt, the answer, each reply and each
//! block's code and output keep their head and tail, so a trajectory stays bounded however deep
//! and wide the tree. A child that did not run has a node too, which ends for what kept it
//! from starting ([`NotRun`]): the tree's budget already spent ends it for that budget, as if
//! the budget had stopped it as it ran, so that its code, its node and its parent's stop say
//! the same.
//!
//! The code that asked gets the answers as soon as every child of the call has one (made from
//! each child's result: [`answer_for_code`]); the last child's node is made and its session
//! closed (its worker handed to the closer) after that, while the code goes on, and the end
//! of the block that started them waits for their nodes, so a block's record is complete
//! when the block is.
//!
//! A child stopped by a budget stops its parent after the block too, with a message that
//! names the node, so the stop reason of the root says where the tree ran out.

use super::feedback::truncate_middle;
use super::metadata::{ChildRun, RlmResult, SessionMetrics, TerminationReason};
use crate::repl::{ChildAnswer, SubFailure};

impl ChildRun {
    /// The node of a finished child run, its texts cut to `chars` each.
    pub(crate) fn from_result(
        index: usize,
        depth: u32,
        model: String,
        prompt: &str,
        result: RlmResult,
        chars: usize,
    ) -> Self {
        let cut = |text: &str| truncate_middle(text, chars).into_owned();
        let iterations = result
            .iterations
            .into_iter()
            .map(|mut iteration| {
                iteration.reply = cut(&iteration.reply);
                for block in &mut iteration.blocks {
                    block.code = cut(&block.code);
                    block.stdout = cut(&block.stdout);
                    block.stderr = cut(&block.stderr);
                }
                iteration
            })
            .collect();
        Self {
            index,
            depth,
            model,
            prompt: cut(prompt),
            answer: result.answer.as_deref().map(cut),
            termination_reason: result.termination_reason,
            error: result.error,
            metrics: result.metrics,
            contexts: result.contexts,
            iterations,
        }
    }

    /// The node of a child that did not run: it could not start, or rlm could not run or
    /// record it (it panicked: the error says so).
    pub(crate) fn not_run(
        index: usize,
        depth: u32,
        model: String,
        prompt: &str,
        why: NotRun,
        chars: usize,
    ) -> Self {
        Self {
            index,
            depth,
            model,
            prompt: truncate_middle(prompt, chars).into_owned(),
            answer: None,
            termination_reason: why.reason,
            error: Some(why.message),
            metrics: SessionMetrics {
                termination_reason: Some(why.reason),
                ..SessionMetrics::default()
            },
            contexts: Vec::new(),
            iterations: Vec::new(),
        }
    }
}

/// Why a child did not run, as its node says it ended: what kept it from starting (the
/// tree's budget already spent: that budget's reason, so that its parent stops as for a child
/// the budget stopped while it ran; the run stopped: `Interrupted`; a model name with no
/// endpoint: `RootModelError`; its session failing: `KernelError`), or a bug in rlm
/// (`KernelError`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NotRun {
    /// How its node says it ended.
    pub(crate) reason: TerminationReason,
    /// What went wrong.
    pub(crate) message: String,
}

impl NotRun {
    /// A child that rlm could not start or run, for `message` (its session failed, or rlm
    /// panicked).
    pub(crate) fn kernel(message: String) -> Self {
        Self {
            reason: TerminationReason::KernelError,
            message,
        }
    }

    /// What the code that started the child gets: a per-item failure whose kind names the
    /// budget that was spent (as for a child stopped by it), else `child_error`.
    pub(crate) fn answer_for_code(&self) -> ChildAnswer {
        Err(SubFailure {
            kind: failure_kind(self.reason, || "child_error".to_owned()),
            message: format!("the rlm_query child run could not run: {}", self.message),
        })
    }
}

/// The kind of the failure of a child that ended for `reason`: the budget's, if one stopped
/// it, else `otherwise`'s.
fn failure_kind(reason: TerminationReason, otherwise: impl FnOnce() -> String) -> String {
    match reason.budget_limit() {
        Some(limit) => bridge::FailureKind::Budget(limit).name().to_owned(),
        None => otherwise(),
    }
}

/// What the code that started a child gets from its `result`: the answer, or a per-item
/// failure. Made from the result itself, before its node (the code need not wait for that).
pub(crate) fn answer_for_code(result: &RlmResult) -> ChildAnswer {
    let reason = result.termination_reason;
    match &result.answer {
        Some(answer) if reason.hands_over_answer() => Ok(answer.clone()),
        _ => {
            let kind = failure_kind(reason, || format!("child_{}", reason_name(reason)));
            let why = result
                .error
                .clone()
                .unwrap_or_else(|| "it gave no answer".to_owned());
            Err(SubFailure {
                kind,
                message: format!(
                    "the rlm_query child run ended without an answer ({}): {why}",
                    reason_name(reason)
                ),
            })
        }
    }
}

/// The snake-case name of a termination reason, as the trajectory spells it.
fn reason_name(reason: TerminationReason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{reason:?}"))
}
