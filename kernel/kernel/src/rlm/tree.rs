//! The run tree: `rlm_query` children, each a whole RLM loop of its own, and their records.
//!
//! [`ChildRuns`] is the [`ChildRunner`] a run installs on its session when its depth limit
//! ([`RlmConfig::max_depth`]) allows children. Each child gets a new [`ReplSession`] (its own
//! worker process when the session is isolated: the parent runs the child, never the model's
//! code) whose context is the object the code passed, and a new [`Rlm`] whose root model is
//! the session's sub endpoint unless the code named another. Children share the parent's
//! endpoints — limiter, ledger (one budget for the whole tree: their iterations, calls, tokens
//! and cost are reserved before they are sent, like the parent's) and sub-call record (the
//! cache) — and stop with the block that started them (its timeout, the run's deadline or a
//! stop). Batched children run concurrently, at most the session's fan-out width at once.
//!
//! Every child that ran is a [`ChildRun`] node on the [`BlockRecord`](super::BlockRecord) of
//! the block that started it (so its parent is that iteration and block), with its depth,
//! answer, termination reason, metrics and iterations. A node's texts are cut like sub-call
//! texts ([`SessionConfig::sub_call_text_chars`]): the prompt, the answer, each reply and each
//! block's code and output keep their head and tail, so a trajectory stays bounded however deep
//! and wide the tree.
//!
//! A child stopped by a budget stops its parent after the block too, with a message that
//! names the node, so the stop reason of the root says where the tree ran out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::config::RlmConfig;
use super::feedback::truncate_middle;
use super::metadata::{IterationRecord, RlmResult, SessionMetrics, TerminationReason};
use super::runner::Rlm;
use crate::repl::{
    ChildAnswer, ChildQuery, ChildRunner, ContextMetadata, ReplSession, SessionConfig, SubFailure,
};
use bridge::{BudgetLimit, CancellationToken, Endpoints};

/// One `rlm_query` child run: a node of the run tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildRun {
    /// Position among the children its block started, from 0 (a batch's in input order).
    pub index: usize,
    /// Its depth: 1 for a child of the root run.
    pub depth: u32,
    /// The endpoint of its root model.
    pub model: String,
    /// Its query, head and tail kept.
    pub prompt: String,
    /// Its answer (head and tail kept), if it gave one.
    pub answer: Option<String>,
    /// Why it ended.
    pub termination_reason: TerminationReason,
    /// What went wrong, when it ended without a final answer.
    pub error: Option<String>,
    /// Its totals (tokens and cost include its own children).
    pub metrics: SessionMetrics,
    /// Its context.
    pub contexts: Vec<ContextMetadata>,
    /// Its iterations, texts cut (see the [module docs](self)).
    pub iterations: Vec<IterationRecord>,
}

impl ChildRun {
    /// The node of a finished child run, its texts cut to `chars` each.
    fn from_result(
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

    /// The node of a child that could not start (its session failed).
    fn not_started(
        index: usize,
        depth: u32,
        model: String,
        prompt: &str,
        error: String,
        chars: usize,
    ) -> Self {
        Self {
            index,
            depth,
            model,
            prompt: truncate_middle(prompt, chars).into_owned(),
            answer: None,
            termination_reason: TerminationReason::KernelError,
            error: Some(error),
            metrics: SessionMetrics {
                termination_reason: Some(TerminationReason::KernelError),
                ..SessionMetrics::default()
            },
            contexts: Vec::new(),
            iterations: Vec::new(),
        }
    }

    /// Child runs in this node's subtree, itself included.
    pub fn runs(&self) -> u64 {
        1 + self.metrics.child_runs
    }

    /// The budget that stopped this child, if one did.
    pub fn budget_limit(&self) -> Option<BudgetLimit> {
        match self.termination_reason {
            TerminationReason::CallBudget => Some(BudgetLimit::Calls),
            TerminationReason::TokenBudget => Some(BudgetLimit::Tokens),
            TerminationReason::CostBudget => Some(BudgetLimit::Usd),
            TerminationReason::IterationBudget => Some(BudgetLimit::Iterations),
            _ => None,
        }
    }

    /// What the code that started it gets: the answer, or a per-item failure.
    fn answer_for_code(&self, full_answer: Option<String>) -> ChildAnswer {
        let reason = self.termination_reason;
        let answered = matches!(
            reason,
            TerminationReason::FinalAnswer | TerminationReason::MaxIterations
        );
        match full_answer {
            Some(answer) if answered => Ok(answer),
            _ => {
                let kind = match self.budget_limit() {
                    Some(limit) => bridge::FailureKind::Budget(limit).name().to_owned(),
                    None => format!("child_{}", reason_name(reason)),
                };
                let why = self
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
}

/// The snake-case name of a termination reason, as the trajectory spells it.
fn reason_name(reason: TerminationReason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{reason:?}"))
}

/// Runs a session's `rlm_query` children (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct ChildRuns {
    endpoints: Arc<Endpoints>,
    /// The parent's session settings: each child's session gets the same.
    session: SessionConfig,
    /// The parent's loop settings: each child runs with them (its own root model).
    config: RlmConfig,
    /// The depth of the children this runner starts.
    depth: u32,
    /// The parent run's stop: stopping it stops the children.
    stop: CancellationToken,
    /// The parent run's deadline: children end by it too.
    deadline: Option<Instant>,
    /// Nodes of the children that ended since the last [`take`](Self::take).
    finished: Mutex<Vec<ChildRun>>,
    /// The index of the next child of the current block.
    next: AtomicUsize,
}

impl ChildRuns {
    pub(crate) fn new(
        endpoints: Arc<Endpoints>,
        session: SessionConfig,
        config: RlmConfig,
        depth: u32,
        stop: CancellationToken,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            endpoints,
            session,
            config,
            depth,
            stop,
            deadline,
            finished: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
        }
    }

    /// The nodes of the children that ended since the last call, in the order they were
    /// started; the next child is numbered 0 again (call it after each block).
    pub(crate) fn take(&self) -> Vec<ChildRun> {
        let mut nodes =
            std::mem::take(&mut *self.finished.lock().unwrap_or_else(PoisonError::into_inner));
        self.next.store(0, Ordering::Relaxed);
        nodes.sort_by_key(|node| node.index);
        nodes
    }

    /// Runs one child to its end; returns what its code gets.
    fn run_one(&self, index: usize, query: ChildQuery, cancel: &CancellationToken) -> ChildAnswer {
        let model = query
            .model
            .clone()
            .unwrap_or_else(|| self.session.sub_endpoint.clone());
        let chars = self.session.sub_call_text_chars;
        let (node, answer) = match self.start(&model, &query, cancel) {
            Ok((mut rlm, stop_watch)) => {
                let outcome = rlm.run(&query.prompt);
                stop_watch.cancel();
                match outcome {
                    Ok(result) => {
                        let answer = result.answer.clone();
                        let node = ChildRun::from_result(
                            index,
                            self.depth,
                            model,
                            &query.prompt,
                            result,
                            chars,
                        );
                        let code_gets = node.answer_for_code(answer);
                        (node, code_gets)
                    }
                    Err(e) => self.failed(index, model, &query.prompt, e.to_string()),
                }
            }
            Err(message) => self.failed(index, model, &query.prompt, message),
        };
        self.finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(node);
        answer
    }

    fn failed(
        &self,
        index: usize,
        model: String,
        prompt: &str,
        message: String,
    ) -> (ChildRun, ChildAnswer) {
        let failure = SubFailure {
            kind: "child_error".to_owned(),
            message: format!("the rlm_query child run could not run: {message}"),
        };
        let node = ChildRun::not_started(
            index,
            self.depth,
            model,
            prompt,
            message,
            self.session.sub_call_text_chars,
        );
        (node, Err(failure))
    }

    /// A child's session and loop, ready to run; the returned token ends the task that
    /// stops the child when its block (or the parent run) stops.
    fn start(
        &self,
        model: &str,
        query: &ChildQuery,
        cancel: &CancellationToken,
    ) -> Result<(Rlm, CancellationToken), String> {
        self.endpoints.get(model).map_err(|e| e.to_string())?;
        let contexts: Vec<_> = query.context.iter().cloned().collect();
        let session =
            ReplSession::new(self.session.clone(), Arc::clone(&self.endpoints), &contexts)
                .map_err(|e| e.to_string())?;
        let mut config = self.config.clone();
        model.clone_into(&mut config.root_endpoint);
        if let Some(n) = query.max_iterations {
            config.max_iterations = n;
        }
        if let Some(deadline) = self.deadline {
            // A deadline already passed leaves the child the least time there is: it stops
            // at its first check.
            let left = deadline.saturating_duration_since(Instant::now());
            config.run_timeout = Some(left.max(std::time::Duration::from_millis(1)));
        }
        let rlm = Rlm::child(
            config,
            Arc::clone(&self.endpoints),
            Arc::new(session),
            self.depth,
        );
        let handle = rlm.stop_handle();
        let done = CancellationToken::new();
        let (block, parent, watch) = (cancel.clone(), self.stop.clone(), done.clone());
        crate::runtime::shared().spawn(async move {
            tokio::select! {
                () = block.cancelled() => handle.stop(),
                () = parent.cancelled() => handle.stop(),
                () = watch.cancelled() => {}
            }
        });
        Ok((rlm, done))
    }
}

impl ChildRunner for ChildRuns {
    fn run(&self, queries: Vec<ChildQuery>, cancel: &CancellationToken) -> Vec<ChildAnswer> {
        let n = queries.len();
        let first = self.next.fetch_add(n, Ordering::Relaxed);
        let width = self
            .session
            .batch_concurrency
            .unwrap_or(n)
            .clamp(1, n.max(1));
        let answers: Vec<Mutex<Option<ChildAnswer>>> = (0..n).map(|_| Mutex::new(None)).collect();
        let cursor = AtomicUsize::new(0);
        let queries = &queries;
        std::thread::scope(|scope| {
            for _ in 0..width.min(n) {
                scope.spawn(|| {
                    loop {
                        let i = cursor.fetch_add(1, Ordering::Relaxed);
                        let Some(query) = queries.get(i) else { break };
                        let answer = self.run_one(first + i, query.clone(), cancel);
                        *answers[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
                    }
                });
            }
        });
        answers
            .into_iter()
            .map(|slot| {
                slot.into_inner()
                    .unwrap_or_else(PoisonError::into_inner)
                    .unwrap_or_else(|| {
                        Err(SubFailure {
                            kind: "child_error".to_owned(),
                            message: "the rlm_query child run did not finish".to_owned(),
                        })
                    })
            })
            .collect()
    }
}

/// The stop message of a parent whose child `node`, started by `iteration`'s block `block`,
/// was stopped by a budget.
pub(crate) fn budget_stop_message(node: &ChildRun, iteration: u32, block: usize) -> String {
    format!(
        "the rlm_query child #{} (depth {}, started by iteration {iteration}, block {block}) hit the budget: {}",
        node.index,
        node.depth,
        node.error.as_deref().unwrap_or("no reason given")
    )
}
