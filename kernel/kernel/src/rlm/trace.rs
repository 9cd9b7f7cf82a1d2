//! The readable trace of a run: the query and models, each reply's prose, each block with its
//! output and sub-calls, and a closing summary.
//!
//! One renderer serves both the live run ([`TraceHook`], for `rlm run -v` / `--trace`, `rlm
//! demo` and `RLM(trace=True)` in Python) and a saved trajectory (`rlm show`): each part is
//! rendered from the records the trajectory keeps ([`IterationRecord`](super::IterationRecord),
//! [`BlockRecord`], the bridge's `SubCallMetadata`), so what a user sees live is what they see
//! replayed. Renderers return text; the caller decides where it goes (through a progress bar,
//! so the bar does not tear the trace; to `sys.stderr` in Python).

use std::fmt::Write as _;

use bridge::SubCallMetadata;

use super::{
    BlockRecord, BlockRun, ChildRun, EndpointSummary, FinalKind, Hook, HookAction, ModelCall,
    RlmResult, RunError, RunInfo, SessionMetrics, TerminationReason, extract_code_blocks,
    truncate_middle,
};
use crate::repl::ContextMetadata;

/// Characters of prose, code or output shown per part before the middle is elided.
const SHOWN_CHARS: usize = 1_200;

/// Sub-calls shown per block (prompt → reply, one line each).
const SHOWN_SUB_CALLS: usize = 3;

/// `rlm_query` children shown per block (and per child, for theirs).
const SHOWN_CHILDREN: usize = 8;

/// Characters of a prompt or reply on its one line.
const SHOWN_TEXT_CHARS: usize = 60;

/// Where rendered text goes.
pub type Sink = Box<dyn FnMut(&str) + Send>;

/// Renders the run as it goes and hands each part to its sink.
pub struct TraceHook {
    sink: Sink,
    cell_timeout: String,
}

impl std::fmt::Debug for TraceHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceHook").finish_non_exhaustive()
    }
}

impl TraceHook {
    /// A hook that hands each rendered part to `sink`; a block stopped at its time limit
    /// names `cell_timeout`, the setting as the user spells it (`` `--cell-timeout` ``).
    pub fn new(sink: Sink, cell_timeout: &str) -> Self {
        Self {
            sink,
            cell_timeout: cell_timeout.to_owned(),
        }
    }
}

impl Hook for TraceHook {
    fn before_run(&mut self, run: &RunInfo<'_>) -> HookAction<String> {
        (self.sink)(&header(run.query, run.endpoints, run.contexts));
        HookAction::Continue
    }

    fn after_model_call(&mut self, call: &mut ModelCall) {
        (self.sink)(&reply(call.iteration, call.answer_now, &call.reply));
    }

    fn after_block(&mut self, _iteration: u32, run: &mut BlockRun) {
        let record = BlockRecord::from_run(run, SHOWN_CHARS);
        (self.sink)(&block(&record, &run.result.sub_calls, &self.cell_timeout));
    }

    fn on_error(&mut self, error: &RunError) {
        (self.sink)(&failure(error));
    }

    fn after_run(&mut self, result: &mut RlmResult) {
        (self.sink)(&answer(result.answer.as_deref()));
    }
}

/// The query, the models and the contexts.
pub fn header(query: &str, endpoints: &[EndpointSummary], contexts: &[ContextMetadata]) -> String {
    let mut out = format!("query: {}\n", truncate_middle(query.trim(), SHOWN_CHARS));
    let models: Vec<String> = endpoints
        .iter()
        .map(|e| format!("{} `{}`", e.name, e.model))
        .collect();
    if !models.is_empty() {
        let _ = writeln!(out, "models: {}", models.join(", "));
    }
    for context in contexts {
        let _ = writeln!(out, "{}", context.summary());
    }
    out
}

/// A root-model reply: the prose around its blocks (the blocks print as they run), or the
/// whole text when it has none.
pub fn reply(iteration: u32, answer_now: bool, text: &str) -> String {
    let shown = if extract_code_blocks(text).is_empty() {
        text.trim().to_owned()
    } else {
        text.split("```")
            .step_by(2)
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let label = if answer_now {
        "answer-now"
    } else {
        "iteration"
    };
    let mut out = format!("\n── {label} {iteration} · root model ─────────────\n");
    if !shown.is_empty() {
        let _ = writeln!(out, "{}", truncate_middle(&shown, SHOWN_CHARS));
    }
    out
}

/// One block: its code, its sub-calls (and the errors its code got instead of answers, when it
/// got any: a call never sent and a failed `rlm_query` child included, so they are not a part
/// of its sub-calls; counted as the closing line counts a run's, [`SubCallCounts::of_run`]),
/// its output, the `rlm_query` children it started and whether it set the final answer.
/// `sub_calls` are the calls the block made; `cell_timeout` names the time limit's setting.
pub fn block(record: &BlockRecord, sub_calls: &[SubCallMetadata], cell_timeout: &str) -> String {
    let mut out = format!("  ┌ repl block ({:.0} ms)\n", record.duration_ms);
    let _ = writeln!(
        out,
        "{}",
        indent(&truncate_middle(record.code.trim_end(), SHOWN_CHARS))
    );
    if !sub_calls.is_empty() || record.sub_call_errors > 0 {
        let natives: Vec<String> = [
            ("llm_query", record.llm_query_calls),
            ("llm_query_batched", record.llm_query_batched_calls),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{name} ×{n}"))
        .collect();
        out.push_str("  ├ ");
        if !natives.is_empty() {
            let _ = write!(out, "{}: ", natives.join(", "));
        }
        let failed_children = record.children.iter().filter(|c| !c.answered()).count();
        let _ = write!(
            out,
            "{}",
            SubCallCounts::of_run(
                sub_calls,
                failed_children,
                u64::from(record.sub_call_errors)
            )
        );
        if record.sub_call_errors > 0 {
            let _ = write!(out, " · {} sub-call error(s)", record.sub_call_errors);
        }
        out.push('\n');
    }
    for text in record.sub_call_texts.iter().take(SHOWN_SUB_CALLS) {
        let _ = writeln!(
            out,
            "  │ {} → {}",
            one_line(&text.prompt),
            one_line(&text.reply)
        );
    }
    if record.sub_call_texts.len() > SHOWN_SUB_CALLS {
        let _ = writeln!(
            out,
            "  │ … {} more in the trajectory",
            record.sub_call_texts.len() - SHOWN_SUB_CALLS
        );
    }
    for (label, text, omitted) in [
        ("output", &record.stdout, record.stdout_omitted_chars),
        ("stderr", &record.stderr, record.stderr_omitted_chars),
    ] {
        let text = text.trim_end();
        if text.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  ├ {label}");
        let _ = writeln!(out, "{}", indent(&truncate_middle(text, SHOWN_CHARS)));
        if omitted > 0 {
            let _ = writeln!(out, "  │ ({omitted} more characters not kept)");
        }
    }
    if !record.children.is_empty() {
        let _ = writeln!(
            out,
            "  ├ rlm_query children ×{} (their runs, folded: `rlm view` opens them)",
            record.children.len()
        );
        children(&mut out, &record.children, 1);
    }
    if record.timed_out {
        let _ = writeln!(out, "  ├ stopped at its time limit ({cell_timeout})");
    } else if record
        .error
        .as_ref()
        .is_some_and(|e| e.type_name == "CellCancelled")
    {
        let _ = writeln!(out, "  ├ interrupted by Ctrl-C (or a stop request)");
    }
    match record.final_answer {
        Some(kind) => {
            let _ = writeln!(out, "  └ final answer set ({})", convention(kind));
        }
        None => out.push_str("  └\n"),
    }
    out
}

/// A block that started and has no record (its iteration never finished): its code, and that
/// its output was never recorded; `crashed` when it is the block the run stopped in, without a
/// result (it crashed the process, or a kill stopped it).
pub fn unfinished_block(code: &str, crashed: bool) -> String {
    let mut out = "  ┌ repl block\n".to_owned();
    let _ = writeln!(
        out,
        "{}",
        indent(&truncate_middle(code.trim_end(), SHOWN_CHARS))
    );
    out.push_str(if crashed {
        "  └ ✗ the run stopped while this block ran: it crashed the process (exit code 4) or \
         was killed; its output was never recorded\n"
    } else {
        "  └ (its output was never recorded)\n"
    });
    out
}

/// One line per child run, its own children below it, indented by depth.
fn children(out: &mut String, nodes: &[ChildRun], level: usize) {
    for node in nodes.iter().take(SHOWN_CHILDREN) {
        let outcome = match &node.answer {
            Some(answer) if node.answered() => format!("→ {}", one_line(answer)),
            _ => format!(
                "✗ {}{}",
                describe(node.termination_reason),
                node.error
                    .as_deref()
                    .map(|e| format!(": {}", one_line(e)))
                    .unwrap_or_default()
            ),
        };
        let _ = writeln!(
            out,
            "  │ {}#{} {} · {} iteration{} · {} tokens {outcome}",
            "  ".repeat(level - 1),
            node.index,
            node.model,
            node.iterations.len(),
            if node.iterations.len() == 1 { "" } else { "s" },
            node.metrics.prompt_tokens + node.metrics.completion_tokens,
        );
        let grandchildren: Vec<ChildRun> = node
            .iterations
            .iter()
            .flat_map(|it| it.blocks.iter().flat_map(|b| b.children.iter().cloned()))
            .collect();
        children(out, &grandchildren, level + 1);
    }
    if nodes.len() > SHOWN_CHILDREN {
        let _ = writeln!(
            out,
            "  │ {}… {} more in the trajectory",
            "  ".repeat(level - 1),
            nodes.len() - SHOWN_CHILDREN
        );
    }
}

/// The answer the run ended with (the whole of it is on stdout).
pub fn answer(answer: Option<&str>) -> String {
    match answer {
        Some(text) => format!(
            "\n── answer ─────────────\n{}\n",
            truncate_middle(text.trim_end(), SHOWN_CHARS)
        ),
        None => "\n── no answer ─────────────\n".to_owned(),
    }
}

/// A failed step.
pub fn failure(error: &RunError) -> String {
    format!("  ✗ {}\n", error.message)
}

/// Sub-calls by how they ended: sent (and of those, failed), answered by the sub-call cache,
/// or refused before sending; and, for a run, its `rlm_query` children that failed and the
/// errors its code got that no call records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubCallCounts {
    /// Calls that reached the server (at least one HTTP attempt).
    pub sent: usize,
    /// Sent calls that failed.
    pub failed: usize,
    /// Calls the run's sub-call record answered (an identical call was asked before).
    pub cached: usize,
    /// Calls never sent: refused by a budget, or cancelled before their first attempt.
    pub refused: usize,
    /// The run's `rlm_query` children whose code got an error instead of their answer (see
    /// [`Self::of_run`]; 0 in [`Self::of`]).
    pub failed_children: usize,
    /// Errors the run's code got instead of an answer beyond those of the recorded calls and
    /// the failed children: a model name with no endpoint, never a call (see
    /// [`Self::of_run`]; 0 in [`Self::of`]).
    pub unsent: usize,
}

impl SubCallCounts {
    /// The counts of a run's `calls`, and of the errors its code got (its
    /// [`SessionMetrics::sub_call_errors`], the one count of them, which a failed `rlm_query`
    /// child is one more of) the `failed_children` (whose nodes say so: a failed child is no
    /// call, and no call's record holds its error) and those of no record or node: `unsent`.
    /// So the counts agree with `sub_call_errors`: it is the calls recorded with an error
    /// (`failed`, `refused`) plus `failed_children` plus `unsent`.
    pub fn of_run(calls: &[SubCallMetadata], failed_children: usize, sub_call_errors: u64) -> Self {
        let recorded = calls.iter().filter(|call| call.error.is_some()).count();
        let errors = usize::try_from(sub_call_errors).unwrap_or(usize::MAX);
        let failed_children = failed_children.min(errors.saturating_sub(recorded));
        Self {
            failed_children,
            unsent: errors.saturating_sub(recorded + failed_children),
            ..Self::of(calls)
        }
    }

    /// The counts of `calls`.
    pub fn of<'a>(calls: impl IntoIterator<Item = &'a SubCallMetadata>) -> Self {
        let mut counts = Self::default();
        for call in calls {
            if call.cache.is_some() {
                counts.cached += 1;
            } else if call.attempts == 0 && call.error.is_some() {
                counts.refused += 1;
            } else {
                counts.sent += 1;
                counts.failed += usize::from(call.error.is_some());
            }
        }
        counts
    }
}

impl std::fmt::Display for SubCallCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} sub-call(s) sent", self.sent)?;
        if self.failed > 0 {
            write!(f, " ({} failed)", self.failed)?;
        }
        if self.cached > 0 {
            write!(f, ", {} answered by the cache", self.cached)?;
        }
        if self.refused > 0 {
            write!(f, ", {} refused before sending", self.refused)?;
        }
        if self.failed_children > 0 {
            write!(
                f,
                ", {} rlm_query child run(s) gave no answer",
                self.failed_children
            )?;
        }
        if self.unsent > 0 {
            write!(f, ", {} more got an error without being sent", self.unsent)?;
        }
        Ok(())
    }
}

/// The closing line: how the run ended, iterations, sub-calls (the run's own `sub_calls` and
/// `failed_children`, its iterations' [`IterationRecord::failed_children`](super::IterationRecord::failed_children),
/// as [`SubCallCounts::of_run`] counts them), tokens, cost (when a price was given) and time.
pub fn summary(
    reason: TerminationReason,
    metrics: &SessionMetrics,
    sub_calls: &[SubCallMetadata],
    failed_children: usize,
) -> String {
    let mut line = format!(
        "{} after {} iteration(s), {}, {} tokens",
        describe(reason),
        metrics.iterations,
        SubCallCounts::of_run(sub_calls, failed_children, metrics.sub_call_errors),
        metrics.prompt_tokens + metrics.completion_tokens,
    );
    if let Some(usd) = metrics.cost_usd {
        let _ = write!(line, ", ${usd:.4}");
    }
    let _ = write!(line, ", {:.2}s", metrics.total_ms / 1e3);
    line
}

/// How a run ended, in words.
pub fn describe(reason: TerminationReason) -> &'static str {
    match reason {
        TerminationReason::FinalAnswer => "final answer",
        TerminationReason::MaxIterations => "stopped at the iteration limit (answer requested)",
        TerminationReason::Timeout => "stopped at the run timeout",
        TerminationReason::CallBudget => "stopped: sub-call budget spent",
        TerminationReason::TokenBudget => "stopped: token budget spent",
        TerminationReason::CostBudget => "stopped: USD budget spent",
        TerminationReason::IterationBudget => "stopped: iteration budget of the tree spent",
        TerminationReason::ConsecutiveFailures => "stopped: too many failing iterations in a row",
        TerminationReason::RootModelError => "failed: the root model did not answer",
        TerminationReason::KernelError => "failed: the Python session broke",
        TerminationReason::StoppedByHook => "failed: the trajectory could not be written",
        TerminationReason::Interrupted => "interrupted (Ctrl-C)",
    }
}

/// How a model writes a final-answer convention, for messages.
pub fn convention(kind: FinalKind) -> &'static str {
    match kind {
        FinalKind::AnswerDict => "`answer[\"ready\"] = True`",
        FinalKind::FinalVar => "`FINAL_VAR(...)` in code",
        FinalKind::FinalVarLine => "a `FINAL_VAR(name)` line",
        FinalKind::FinalLine => "a `FINAL(...)` line",
        FinalKind::AnswerNow => "the answer-now reply",
        FinalKind::Hook => "a hook",
    }
}

/// `text` on one line (newlines shown as `⏎`), its head only.
fn one_line(text: &str) -> String {
    let flat = text.trim().replace('\n', "⏎");
    if flat.chars().count() <= SHOWN_TEXT_CHARS {
        return format!("`{flat}`");
    }
    let head: String = flat.chars().take(SHOWN_TEXT_CHARS - 1).collect();
    format!("`{head}…`")
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  │ {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
