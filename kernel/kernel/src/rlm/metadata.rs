//! The records of a run, under the names users know from the design: [`IterationMetadata`],
//! [`ExecutionMetadata`], [`SessionMetrics`] (with the bridge's `SubCallMetadata` and the REPL's
//! `ContextMetadata`). They are what the result carries and what the trajectory writes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::blocks::CodeBlock;
use super::final_answer::{FinalKind, FinalNote};
use crate::repl::{ContextMetadata, ExecError, ExecutionResult, SubCallText};
use bridge::{BudgetLimit, SubCallMetadata, add_cost};
use engine::text::truncate_middle;

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminationReason {
    /// The model gave a final answer.
    FinalAnswer,
    /// The iteration limit was reached; the answer is the reply to the "answer now" request.
    MaxIterations,
    /// The wall-clock limit of the run passed.
    Timeout,
    /// The budget of model calls is spent.
    CallBudget,
    /// The token budget is spent.
    TokenBudget,
    /// The USD budget is spent.
    CostBudget,
    /// The budget of iterations over the whole tree of runs (`Budget::max_iterations`) is
    /// spent.
    IterationBudget,
    /// Too many iterations in a row had a failing block.
    ConsecutiveFailures,
    /// The root model could not be reached or kept failing after the bridge's retries.
    RootModelError,
    /// The REPL session itself broke (not the model's code).
    KernelError,
    /// A hook stopped the run.
    StoppedByHook,
    /// The run was stopped from outside ([`StopHandle::stop`](super::StopHandle::stop), Ctrl-C).
    Interrupted,
}

impl TerminationReason {
    /// The reason a run stops when `limit` refuses a call.
    pub fn for_budget(limit: BudgetLimit) -> Self {
        match limit {
            BudgetLimit::Calls => Self::CallBudget,
            BudgetLimit::Tokens => Self::TokenBudget,
            BudgetLimit::Usd => Self::CostBudget,
            BudgetLimit::Iterations => Self::IterationBudget,
        }
    }

    /// The budget that stopped the run, if one did (the inverse of [`Self::for_budget`]).
    pub fn budget_limit(self) -> Option<BudgetLimit> {
        match self {
            Self::CallBudget => Some(BudgetLimit::Calls),
            Self::TokenBudget => Some(BudgetLimit::Tokens),
            Self::CostBudget => Some(BudgetLimit::Usd),
            Self::IterationBudget => Some(BudgetLimit::Iterations),
            _ => None,
        }
    }

    /// Whether the run ended with a model-given answer rather than a limit or an error.
    pub fn is_success(self) -> bool {
        self == TerminationReason::FinalAnswer
    }

    /// Whether a run that ended so hands its answer, if it has one, to whoever asked (an
    /// `rlm_query` child's to its parent's code): the final answer, or the one asked for at
    /// the iteration limit.
    pub fn hands_over_answer(self) -> bool {
        matches!(
            self,
            TerminationReason::FinalAnswer | TerminationReason::MaxIterations
        )
    }

    /// Whether the run ended because a limit was reached (iterations, time, budget, failures).
    pub fn is_limit(self) -> bool {
        matches!(
            self,
            TerminationReason::MaxIterations
                | TerminationReason::Timeout
                | TerminationReason::CallBudget
                | TerminationReason::TokenBudget
                | TerminationReason::CostBudget
                | TerminationReason::IterationBudget
                | TerminationReason::ConsecutiveFailures
                | TerminationReason::StoppedByHook
        )
    }
}

/// What the model did in one iteration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterationMetadata {
    /// The iteration, from 1.
    pub iteration: u32,
    /// `repl` blocks in the reply.
    pub code_blocks: usize,
    /// `llm_query` calls made by the blocks.
    pub llm_query_calls: u32,
    /// `llm_query_batched` calls made by the blocks.
    pub llm_query_batched_calls: u32,
    /// Answers the blocks' code got as an error instead of a sub-model's (see
    /// [`SessionMetrics::sub_call_errors`]).
    #[serde(default)]
    pub sub_call_errors: u32,
    /// Whether the iteration ended the run with an answer.
    pub final_answer_found: bool,
    /// How the answer was given.
    pub final_answer_type: Option<FinalKind>,
}

/// How running an iteration's blocks went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    /// Every block ran to its end.
    Success,
    /// A block raised or was interrupted.
    Error,
    /// The reply had no block.
    NoCode,
}

/// What running an iteration's blocks did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionMetadata {
    /// Blocks run.
    pub blocks_executed: usize,
    /// Sub-model calls made by the blocks.
    pub sub_calls: usize,
    /// Time spent running the blocks, in milliseconds.
    pub execution_ms: f64,
    /// The outcome.
    pub status: ExecutionStatus,
    /// The type of the first error (`TimeoutError` for an interrupted block).
    pub error_type: Option<String>,
    /// Variables the blocks created, in order of creation.
    pub variables_created: Vec<String>,
}

impl ExecutionMetadata {
    /// The metadata of a reply's block runs.
    pub fn from_runs(runs: &[BlockRun]) -> Self {
        let mut error_type = None;
        let mut variables_created: Vec<String> = Vec::new();
        for run in runs {
            if error_type.is_none() {
                error_type = if run.result.timed_out {
                    Some("TimeoutError".to_owned())
                } else {
                    run.result.error.as_ref().map(|e| e.type_name.clone())
                };
            }
            for name in &run.result.new_variables {
                if !variables_created.contains(name) {
                    variables_created.push(name.clone());
                }
            }
        }
        let status = if runs.is_empty() {
            ExecutionStatus::NoCode
        } else if error_type.is_some() {
            ExecutionStatus::Error
        } else {
            ExecutionStatus::Success
        };
        Self {
            blocks_executed: runs.len(),
            sub_calls: runs.iter().map(|r| r.result.sub_calls.len()).sum(),
            execution_ms: runs
                .iter()
                .map(|r| r.result.duration.as_secs_f64() * 1000.0)
                .sum(),
            status,
            error_type,
            variables_created,
        }
    }
}

/// One model's calls, tokens, cost and latency in a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelMetrics {
    /// Calls made (including failed ones, and those the sub-call cache answered).
    pub calls: u64,
    /// Calls answered from the run's sub-call record without a request.
    #[serde(default)]
    pub cache_hits: u64,
    /// Calls sent to the server (at least one HTTP attempt): not those the cache answered,
    /// nor those refused (a budget, the context window) or cancelled before sending.
    #[serde(default)]
    pub sent: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Whether some token counts are estimates.
    pub tokens_estimated: bool,
    /// Cost in USD; `None` when no price was given for the model (unknown, not free).
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// Latency summed over calls, in milliseconds.
    pub latency_ms: f64,
}

impl ModelMetrics {
    /// Adds another's totals.
    pub fn merge(&mut self, other: &ModelMetrics) {
        self.calls += other.calls;
        self.cache_hits += other.cache_hits;
        self.sent += other.sent;
        self.errors += other.errors;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.tokens_estimated |= other.tokens_estimated;
        self.cost_usd = add_cost(self.cost_usd, other.cost_usd);
        self.latency_ms += other.latency_ms;
    }

    /// Adds one call record.
    pub fn add(&mut self, call: &SubCallMetadata) {
        self.calls += 1;
        self.cache_hits += u64::from(call.cache.is_some());
        self.sent += u64::from(call.attempts > 0);
        self.errors += u64::from(call.error.is_some());
        self.prompt_tokens += call.prompt_tokens;
        self.completion_tokens += call.completion_tokens;
        self.tokens_estimated |= call.tokens_estimated;
        self.cost_usd = add_cost(self.cost_usd, call.cost_usd);
        self.latency_ms += call.latency_ms;
    }
}

/// The totals of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionMetrics {
    /// Iterations run (root-model replies handled), without the "answer now" call.
    pub iterations: u32,
    /// `repl` blocks run.
    pub code_blocks: usize,
    /// `llm_query` calls.
    pub llm_query_calls: u64,
    /// `llm_query_batched` calls.
    pub llm_query_batched_calls: u64,
    /// Sub-model calls (each prompt of a batch counts).
    pub sub_calls: u64,
    /// Sub-calls whose code got an error instead of an answer (an `"Error: …"` string or
    /// `LlmQueryError`; each slot of a batch counts), whatever failed: a call after its
    /// retries, a refusal (a budget, the model's window), a model name with no endpoint
    /// (never sent, so not among `sub_calls`), an `rlm_query` child that gave no answer (no
    /// sub-call either: its [`ChildRun`] node says why). The run's own code only: a child's
    /// are in its node's metrics.
    pub sub_call_errors: u64,
    /// Sub-model calls the run's sub-call record answered without a request (an identical
    /// call asked before, or in flight at the same time).
    #[serde(default)]
    pub sub_call_cache_hits: u64,
    /// Root-model calls, including the "answer now" call.
    pub root_calls: u64,
    /// `rlm_query` child runs below this run, at every depth.
    #[serde(default)]
    pub child_runs: u64,
    /// Wall-clock time of the run, in milliseconds.
    pub total_ms: f64,
    /// Time spent waiting for the root model, in milliseconds.
    pub root_latency_ms: f64,
    /// Time spent running blocks, in milliseconds.
    pub execution_ms: f64,
    /// Calls, tokens, cost and latency per model (root and sub-models), the `rlm_query`
    /// children's included.
    pub models: BTreeMap<String, ModelMetrics>,
    /// Prompt tokens over all models, the children's included.
    pub prompt_tokens: u64,
    /// Completion tokens over all models, the children's included.
    pub completion_tokens: u64,
    /// Cost over all models, in USD, the children's included; `None` when no price was
    /// given (unknown, not free).
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// Blocks that raised.
    pub block_errors: u64,
    /// Blocks interrupted by the time limit.
    pub block_timeouts: u64,
    /// Whether the run ended with a final answer.
    pub final_answer_found: bool,
    /// Why the run ended (set when it ends).
    pub termination_reason: Option<TerminationReason>,
}

impl SessionMetrics {
    /// Adds a child run's totals: its runs, and its models, tokens and cost (which include
    /// its own children's).
    pub fn add_child(&mut self, child: &SessionMetrics) {
        self.child_runs += 1 + child.child_runs;
        for (model, usage) in &child.models {
            self.models.entry(model.clone()).or_default().merge(usage);
        }
        self.prompt_tokens += child.prompt_tokens;
        self.completion_tokens += child.completion_tokens;
        self.cost_usd = add_cost(self.cost_usd, child.cost_usd);
    }

    /// Adds a model call (root or sub) to the per-model and overall totals.
    pub fn add_call(&mut self, call: &SubCallMetadata) {
        self.models.entry(call.model.clone()).or_default().add(call);
        self.prompt_tokens += call.prompt_tokens;
        self.completion_tokens += call.completion_tokens;
        self.cost_usd = add_cost(self.cost_usd, call.cost_usd);
    }
}

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
    /// Its iterations, their texts cut as sub-call texts are (`--sub-call-text-chars`).
    pub iterations: Vec<IterationRecord>,
}

impl ChildRun {
    /// Child runs in this node's subtree, itself included.
    pub fn runs(&self) -> u64 {
        1 + self.metrics.child_runs
    }

    /// Whether its parent's code got its answer; otherwise the code got an error in its
    /// place (counted in the parent's `sub_call_errors`), and `termination_reason` and
    /// `error` say why.
    pub fn answered(&self) -> bool {
        self.answer.is_some() && self.termination_reason.hands_over_answer()
    }

    /// The budget that stopped this child, if one did.
    pub fn budget_limit(&self) -> Option<BudgetLimit> {
        self.termination_reason.budget_limit()
    }

    /// What its parent's run says when this child, started by `iteration`'s block `block`,
    /// was stopped by a budget.
    pub(crate) fn budget_stop(&self, iteration: u32, block: usize) -> String {
        format!(
            "the rlm_query child #{} (depth {}, started by iteration {iteration}, block {block}) hit the budget: {}",
            self.index,
            self.depth,
            self.error.as_deref().unwrap_or("no reason given")
        )
    }
}

/// One block of a reply and what running it produced: its execution and the `rlm_query`
/// children it started. Complete when [`Hook::after_block`](super::Hook::after_block) gets it,
/// so what a hook sees of a block (the live trace) is what its [`BlockRecord`] keeps.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BlockRun {
    /// The block.
    pub block: CodeBlock,
    /// Its execution.
    pub result: ExecutionResult,
    /// The `rlm_query` child runs it started, in the order they were started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildRun>,
}

/// One block of an iteration as recorded: the code and its outputs, capped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockRecord {
    /// Position in the reply, from 0.
    pub index: usize,
    /// The code.
    pub code: String,
    /// Standard output, cut head+tail to the feedback limit.
    pub stdout: String,
    /// Standard error (with the traceback), cut head+tail to the feedback limit.
    pub stderr: String,
    /// Characters of stdout not recorded (dropped by the session or by the cap).
    pub stdout_omitted_chars: usize,
    /// Characters of stderr not recorded.
    pub stderr_omitted_chars: usize,
    /// The exception, if the block raised.
    pub error: Option<ExecError>,
    /// Whether the block was interrupted by the time limit.
    pub timed_out: bool,
    /// Run time in milliseconds.
    pub duration_ms: f64,
    /// `llm_query` calls.
    pub llm_query_calls: u32,
    /// `llm_query_batched` calls.
    pub llm_query_batched_calls: u32,
    /// Sub-model calls.
    pub sub_calls: usize,
    /// Answers the code got as an error instead of a sub-model's (see
    /// [`SessionMetrics::sub_call_errors`]): a call never sent (a model name with no endpoint)
    /// and a failed `rlm_query` child too, so it can outnumber `sub_calls`.
    #[serde(default)]
    pub sub_call_errors: u32,
    /// What the sub-calls asked and answered, head and tail kept (see
    /// [`SessionConfig::sub_call_text_chars`](crate::repl::SessionConfig::sub_call_text_chars)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sub_call_texts: Vec<SubCallText>,
    /// Variables the block created.
    pub new_variables: Vec<String>,
    /// The final answer the block recorded, if any.
    pub final_answer: Option<FinalKind>,
    /// The session's worker process ended during the block (or before it) and was replaced:
    /// why, and how the session was restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<crate::repl::WorkerRestart>,
    /// The `rlm_query` child runs the block started, in the order they were started: the
    /// nodes of the run tree below it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildRun>,
}

impl BlockRecord {
    /// The record of a block run with outputs cut to `limit` characters each.
    pub fn from_run(run: &BlockRun, limit: usize) -> Self {
        let result = &run.result;
        let (stdout, stdout_cut) = capped(&result.stdout, limit);
        let (stderr, stderr_cut) = capped(&result.stderr, limit);
        Self {
            index: run.block.index,
            code: run.block.code.clone(),
            stdout,
            stderr,
            stdout_omitted_chars: result.stdout_omitted_chars + stdout_cut,
            stderr_omitted_chars: result.stderr_omitted_chars + stderr_cut,
            error: result.error.clone(),
            timed_out: result.timed_out,
            duration_ms: result.duration.as_secs_f64() * 1000.0,
            llm_query_calls: result.llm_query_calls,
            llm_query_batched_calls: result.llm_query_batched_calls,
            sub_calls: result.sub_calls.len(),
            sub_call_errors: result.sub_call_errors,
            sub_call_texts: result.sub_call_texts.clone(),
            new_variables: result.new_variables.clone(),
            final_answer: result.final_answer().map(|f| match f.source {
                crate::repl::FinalSource::AnswerDict => FinalKind::AnswerDict,
                crate::repl::FinalSource::FinalVar => FinalKind::FinalVar,
            }),
            restart: result.restart.clone(),
            children: run.children.clone(),
        }
    }

    /// The block this record describes.
    pub fn block(&self) -> CodeBlock {
        CodeBlock {
            index: self.index,
            code: self.code.clone(),
        }
    }
}

/// `text` cut head+tail to `limit` characters, and how many characters were left out.
fn capped(text: &str, limit: usize) -> (String, usize) {
    let total = text.chars().count();
    if total <= limit {
        return (text.to_owned(), 0);
    }
    (truncate_middle(text, limit).into_owned(), total - limit)
}

/// Everything recorded about one iteration: what the result lists and the trajectory writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterationRecord {
    /// What the model did.
    #[serde(flatten)]
    pub metadata: IterationMetadata,
    /// What running its code did.
    pub execution: ExecutionMetadata,
    /// The root model's reply, verbatim.
    pub reply: String,
    /// The blocks with their capped outputs.
    pub blocks: Vec<BlockRecord>,
    /// The root-model call.
    pub root_call: Option<SubCallMetadata>,
    /// The sub-model calls the blocks made.
    pub sub_calls: Vec<SubCallMetadata>,
    /// Why an attempt to finish did not count.
    pub notes: Vec<FinalNote>,
    /// Start of the iteration, in milliseconds since the run started.
    pub started_ms: f64,
    /// Time waiting for the root model, in milliseconds.
    pub model_ms: f64,
    /// Time running blocks, in milliseconds.
    pub execution_ms: f64,
}

impl IterationRecord {
    /// How many of the `rlm_query` children its blocks started gave their code an error
    /// instead of an answer.
    pub fn failed_children(&self) -> usize {
        self.blocks
            .iter()
            .flat_map(|block| &block.children)
            .filter(|child| !child.answered())
            .count()
    }
}

/// What a run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RlmResult {
    /// The final answer, or the best partial answer when a limit stopped the run.
    pub answer: Option<String>,
    /// How the answer was given.
    pub answer_kind: Option<FinalKind>,
    /// Why the run ended.
    pub termination_reason: TerminationReason,
    /// What went wrong, for stops other than a final answer.
    pub error: Option<String>,
    /// Totals.
    pub metrics: SessionMetrics,
    /// Every iteration, in order.
    pub iterations: Vec<IterationRecord>,
    /// Every sub-model call made by the run's code, in call order.
    pub sub_calls: Vec<SubCallMetadata>,
    /// The contexts the run worked on.
    pub contexts: Vec<ContextMetadata>,
}
