//! Runs the instances: each through the RLM loop in its own REPL session, a few at a time,
//! and optionally through the baseline (the root model with the context in its prompt).
//!
//! Sessions share the process's interpreter and take turns on the GIL, so the Python parts
//! of parallel runs interleave rather than overlap; what overlaps is the waiting on models
//! (the GIL is released during every model call), which is most of a run's time against a
//! real endpoint. Each run has its own endpoint registry, built from the same options: a
//! block's sub-call records are the ledger's records since the block started, so runs sharing
//! a ledger would count each other's calls. Budgets and `--batch-concurrency` therefore hold
//! per run.
//!
//! A sweep of depths (`--depths 1,2`) runs every instance once per depth, each a run of its
//! own with its `--max-depth`: its own registry, so its own budget for its tree and its own
//! sub-call record (no depth is answered from another's cache). The baseline does not depend
//! on the depth and runs once per instance.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use anyhow::{Context as _, Result};
use bridge::{CallOptions, CancellationToken, ChatRequest, Endpoints, Message};
use kernel::eval::{TaskInstance, TaskKind, format_size, instance_seed};
use kernel::repl::{ContextSource, ReplSession, SessionConfig};
use kernel::rlm::{Rlm, RlmConfig, SessionMetrics, StopHandle, TrajectoryWriter};
use serde::{Deserialize, Serialize};

use super::scripted::BASELINE_SYSTEM;
use crate::outputs::LogFile;

/// One instance to run: a family, a size, its index, and the depth of the run tree.
#[derive(Debug, Clone, Copy)]
pub(super) struct Job {
    pub(super) kind: TaskKind,
    pub(super) size: u64,
    pub(super) index: usize,
    /// The run's `--max-depth`.
    pub(super) depth: u32,
    /// Whether depths are swept (`--depths`): the depth is then part of the file stem.
    pub(super) swept: bool,
    /// Whether the baseline runs after it (once per instance, whatever the depths).
    pub(super) baseline: bool,
}

impl Job {
    /// The file stem of this job's outputs: `needle-8k-003`, or `linked-8k-d2-003` in a sweep
    /// of depths.
    pub(super) fn stem(&self) -> String {
        let depth = if self.swept {
            format!("-d{}", self.depth)
        } else {
            String::new()
        };
        format!(
            "{}-{}{depth}-{:03}",
            self.kind,
            format_size(self.size),
            self.index
        )
    }
}

/// How the answers were obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Method {
    /// The RLM loop.
    Rlm,
    /// The root model with the context (cut to the window) in its prompt.
    Base,
}

impl Method {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Rlm => "rlm",
            Self::Base => "base",
        }
    }
}

/// The record of one run.
#[derive(Debug, Clone, Serialize)]
pub(super) struct RunRecord {
    pub(super) task: TaskKind,
    pub(super) size_tokens: u64,
    pub(super) index: usize,
    pub(super) seed: u64,
    pub(super) method: Method,
    /// The run's `--max-depth` (none for the baseline).
    pub(super) depth: Option<u32>,
    /// Tokens of the context (4 bytes a token).
    pub(super) context_tokens: u64,
    pub(super) score: f64,
    pub(super) exact: bool,
    /// How the run ended: a termination reason of the loop (`final_answer`, `max_iterations`,
    /// …), or for the baseline `answered` or the call's failure kind (`timeout`, `http_429`, …).
    pub(super) outcome: String,
    pub(super) iterations: u32,
    /// Sub-calls of the root run's code.
    pub(super) sub_calls: u64,
    /// Calls sent to a model in the whole run tree: root iterations, sub-calls and every
    /// child run's; calls answered by the sub-call cache or refused before sending are not
    /// counted.
    pub(super) model_calls: u64,
    /// `rlm_query` child runs at every depth.
    pub(super) child_runs: u64,
    pub(super) prompt_tokens: u64,
    pub(super) completion_tokens: u64,
    pub(super) cost_usd: Option<f64>,
    pub(super) latency_ms: f64,
    /// The answer, cut to its first and last 1 000 characters.
    pub(super) answer: Option<String>,
    pub(super) trajectory: Option<PathBuf>,
}

/// What every run shares.
pub(super) struct Plan<'a> {
    pub(super) jobs: &'a [Job],
    pub(super) seed: u64,
    pub(super) needles: usize,
    pub(super) parallel: usize,
    pub(super) baseline_window: Option<u64>,
    /// Each job's trajectory (`--out DIR`), by its stem, taken when the job runs.
    pub(super) trajectories: &'a Mutex<HashMap<String, LogFile>>,
    pub(super) rlm_config: RlmConfig,
    pub(super) session_config: SessionConfig,
    /// Builds a run's endpoint registry.
    pub(super) endpoints: &'a (dyn Fn() -> Result<Arc<Endpoints>> + Sync),
    /// Called after each run, e.g. to move a progress bar.
    pub(super) on_done: &'a (dyn Fn(&RunRecord) + Sync),
    /// Where the RLM runs happen.
    pub(super) rlm_runs: RlmRuns,
}

/// Where the RLM runs of a plan happen.
pub(super) enum RlmRuns {
    /// Here, each in its own REPL session.
    Local,
    /// Already run on a Ray cluster (`--ray`): each job's outcome by its stem, scored and
    /// written here as a local run's.
    Done(Mutex<HashMap<String, RemoteRun>>),
}

/// What a run on the cluster sent back (a line of `python -m rlm_kernel.ray eval`).
#[derive(Debug, Deserialize)]
pub(super) struct RemoteRun {
    pub(super) name: String,
    pub(super) answer: Option<String>,
    /// `None` when the run failed before the loop ended (then `error` says why).
    pub(super) termination_reason: Option<String>,
    pub(super) error: Option<String>,
    /// `None` when the run failed before it started.
    pub(super) metrics: Option<SessionMetrics>,
    pub(super) trajectory_jsonl: Option<String>,
}

/// Stops every run in progress (Ctrl-C) and keeps new ones from starting.
#[derive(Debug, Default, Clone)]
pub(super) struct Stopper {
    stopped: Arc<AtomicBool>,
    running: Arc<Mutex<Vec<(String, StopHandle)>>>,
    cancel: CancellationToken,
}

impl Stopper {
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.cancel.cancel();
        let running = self.running.lock().map(|r| r.clone()).unwrap_or_default();
        for (_, handle) in running {
            handle.stop();
        }
    }

    pub(super) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}

/// Runs every job of `plan`, `plan.parallel` at a time; the records come back in job order
/// (RLM run, then its baseline). Jobs not started when `stopper` fires are left out.
pub(super) fn run_all(plan: &Plan<'_>, stopper: &Stopper) -> Result<Vec<RunRecord>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Vec<RunRecord>)>> = Mutex::new(Vec::new());
    let failure: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..plan.parallel.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(job) = plan.jobs.get(i) else { break };
                    if stopper.is_stopped() || failure.lock().map_or(true, |f| f.is_some()) {
                        break;
                    }
                    match run_job(plan, *job, stopper) {
                        Ok(records) => {
                            for record in &records {
                                (plan.on_done)(record);
                            }
                            if let Ok(mut r) = results.lock() {
                                r.push((i, records));
                            }
                        }
                        Err(err) => {
                            if let Ok(mut f) = failure.lock() {
                                f.get_or_insert(err);
                            }
                            stopper.stop();
                        }
                    }
                }
            });
        }
    });
    if let Some(err) = failure.into_inner().ok().flatten() {
        return Err(err);
    }
    let mut results = results.into_inner().unwrap_or_default();
    results.sort_by_key(|(i, _)| *i);
    Ok(results.into_iter().flat_map(|(_, r)| r).collect())
}

fn run_job(plan: &Plan<'_>, job: Job, stopper: &Stopper) -> Result<Vec<RunRecord>> {
    let seed = instance_seed(plan.seed, job.index);
    let task = TaskInstance::generate_with_needles(job.kind, job.size, seed, plan.needles);
    let rlm = match &plan.rlm_runs {
        RlmRuns::Local => run_rlm(plan, (plan.endpoints)()?, job, &task, stopper)?,
        RlmRuns::Done(runs) => {
            let run = runs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&job.stem())
                .with_context(|| format!("The cluster sent no result for `{}`", job.stem()))?;
            remote_record(plan, job, &task, run)?
        }
    };
    let mut records = vec![rlm];
    if let Some(window) = plan.baseline_window
        && job.baseline
        && !stopper.is_stopped()
    {
        let endpoints = (plan.endpoints)()?;
        records.push(run_baseline(plan, &endpoints, job, &task, window, stopper)?);
    }
    Ok(records)
}

fn record(job: Job, task: &TaskInstance, method: Method, answer: Option<&str>) -> RunRecord {
    let score = task.score(answer);
    RunRecord {
        task: job.kind,
        size_tokens: job.size,
        index: job.index,
        seed: task.seed,
        method,
        depth: (method == Method::Rlm).then_some(job.depth),
        context_tokens: kernel::eval::estimate_tokens(&task.context),
        score: score.value,
        exact: score.exact,
        outcome: String::new(),
        iterations: 0,
        sub_calls: 0,
        model_calls: 0,
        child_runs: 0,
        prompt_tokens: 0,
        completion_tokens: 0,
        cost_usd: None,
        latency_ms: 0.0,
        answer: answer.map(|a| kernel::rlm::truncate_middle(a, 2_000).into_owned()),
        trajectory: None,
    }
}

fn run_rlm(
    plan: &Plan<'_>,
    endpoints: Arc<Endpoints>,
    job: Job,
    task: &TaskInstance,
    stopper: &Stopper,
) -> Result<RunRecord> {
    let session = ReplSession::new(
        plan.session_config.clone(),
        Arc::clone(&endpoints),
        &[ContextSource::Text(task.context.clone())],
    )
    .with_context(|| format!("Could not load the context of `{}`", job.stem()))?;
    crate::observe::report_isolation(&session);
    let config = RlmConfig {
        max_depth: job.depth,
        ..plan.rlm_config.clone()
    };
    let mut rlm = Rlm::new(config, endpoints, Arc::new(session));
    let log = plan
        .trajectories
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&job.stem());
    let mut trajectory = None;
    if let Some(log) = log {
        let log = log.open()?;
        rlm.add_hook(TrajectoryWriter::from_file(log.file, &log.path));
        trajectory = Some(log.path);
    }
    let handle = rlm.stop_handle();
    if let Ok(mut running) = stopper.running.lock() {
        running.push((job.stem(), handle.clone()));
    }
    if stopper.is_stopped() {
        handle.stop();
    }
    let result = rlm.run(&task.query);
    if let Ok(mut running) = stopper.running.lock() {
        running.retain(|(stem, _)| *stem != job.stem());
    }
    let result = result.with_context(|| format!("Could not run `{}`", job.stem()))?;
    let outcome = serde_json::to_value(result.termination_reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let answer = result.answer.as_deref();
    Ok(rlm_record(
        job,
        task,
        outcome,
        &result.metrics,
        answer,
        trajectory,
    ))
}

/// The record of an RLM run, from how it ended, its metrics, answer and trajectory.
fn rlm_record(
    job: Job,
    task: &TaskInstance,
    outcome: String,
    m: &SessionMetrics,
    answer: Option<&str>,
    trajectory: Option<PathBuf>,
) -> RunRecord {
    RunRecord {
        outcome,
        iterations: m.iterations,
        sub_calls: m.sub_calls,
        model_calls: m.models.values().map(|model| model.sent).sum(),
        child_runs: m.child_runs,
        prompt_tokens: m.prompt_tokens,
        completion_tokens: m.completion_tokens,
        cost_usd: m.cost_usd,
        latency_ms: m.total_ms,
        trajectory,
        ..record(job, task, Method::Rlm, answer)
    }
}

/// The record of a run made on the cluster: scored here, its trajectory written to `--out`.
fn remote_record(
    plan: &Plan<'_>,
    job: Job,
    task: &TaskInstance,
    run: RemoteRun,
) -> Result<RunRecord> {
    let log = plan
        .trajectories
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&job.stem());
    let mut trajectory = None;
    if let (Some(log), Some(text)) = (log, &run.trajectory_jsonl) {
        let mut log = log.open()?;
        log.file
            .write_all(text.as_bytes())
            .and_then(|()| log.file.flush())
            .with_context(|| format!("Could not write `{}`", log.path.display()))?;
        trajectory = Some(log.path);
    }
    let outcome = match (&run.termination_reason, &run.error) {
        (Some(reason), _) => reason.clone(),
        (None, error) => {
            eprintln!(
                "rlm eval: `{}` failed on the cluster: {}",
                run.name,
                error.as_deref().unwrap_or("no reason given")
            );
            "error".to_owned()
        }
    };
    let metrics = run.metrics.unwrap_or_default();
    let answer = run.answer.as_deref();
    Ok(rlm_record(job, task, outcome, &metrics, answer, trajectory))
}

/// The document of a baseline request: the context's first `window` tokens, cut at a line end.
fn baseline_prompt(task: &TaskInstance, window: u64) -> String {
    let limit = usize::try_from(window.saturating_mul(4)).unwrap_or(usize::MAX);
    let text = &task.context;
    let shown = if text.len() <= limit {
        text.as_str()
    } else {
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let cut = &text[..end];
        cut.rfind('\n').map_or(cut, |at| &cut[..=at])
    };
    let note = if shown.len() < text.len() {
        format!(
            " (the first {} of its {} tokens; the rest did not fit)",
            kernel::eval::estimate_tokens(shown),
            kernel::eval::estimate_tokens(text)
        )
    } else {
        String::new()
    };
    format!(
        "The document{note}:\n<document>\n{shown}</document>\n\n{}",
        task.query
    )
}

fn run_baseline(
    plan: &Plan<'_>,
    endpoints: &Endpoints,
    job: Job,
    task: &TaskInstance,
    window: u64,
    stopper: &Stopper,
) -> Result<RunRecord> {
    let root = endpoints.get(&plan.rlm_config.root_endpoint)?;
    let request = ChatRequest {
        messages: vec![
            Message::system(BASELINE_SYSTEM),
            Message::user(baseline_prompt(task, window)),
        ],
        ..ChatRequest::default()
    };
    let options = CallOptions {
        cancel: stopper.cancel.child_token(),
        ..CallOptions::default()
    };
    let started = Instant::now();
    let call = kernel::runtime::shared().block_on(root.call_recorded(request, &options));
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    let (answer, outcome) = match &call.result {
        Ok(response) => (Some(response.content.as_str()), "answered".to_owned()),
        Err(err) => (None, err.kind().to_string()),
    };
    Ok(RunRecord {
        outcome,
        iterations: 1,
        model_calls: 1,
        prompt_tokens: call.record.prompt_tokens,
        completion_tokens: call.record.completion_tokens,
        cost_usd: call.record.cost_usd,
        latency_ms,
        ..record(job, task, Method::Base, answer)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_baseline_document_is_cut_at_a_line_end_within_the_window() {
        let task = TaskInstance::generate(TaskKind::Aggregate, 2_000, 1);
        let prompt = baseline_prompt(&task, 500);
        let document = prompt
            .split("<document>\n")
            .nth(1)
            .and_then(|rest| rest.split("</document>").next())
            .expect("a document");
        assert!(
            document.len() <= 2_000 && document.len() > 1_800,
            "{}",
            document.len()
        );
        assert!(task.context.starts_with(document) && document.ends_with('\n'));
        assert!(prompt.contains("tokens; the rest did not fit)"), "{prompt}");
        assert!(prompt.ends_with(&task.query));
        let whole = baseline_prompt(&task, 1_000_000);
        assert!(whole.contains(&task.context) && !whole.contains("did not fit"));
    }
}
