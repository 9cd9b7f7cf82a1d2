//! `rlm show FILE`: a saved trajectory printed with the renderer of the live trace
//! ([`crate::trace`]), on stdout.
//!
//! Reads the JSONL lines `TrajectoryWriter` writes (`header`, `iteration`, `error`, `result`).
//! A file cut short (a killed run) prints what it has and says where it ends; a line that is
//! not JSON is an error naming the line.

use std::io::{BufRead, BufReader, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use bridge::SubCallMetadata;
use clap::Args;
use kernel::repl::ContextMetadata;
use kernel::rlm::{
    EndpointSummary, IterationRecord, RunError, SessionMetrics, TRAJECTORY_VERSION,
    TerminationReason,
};
use serde::Deserialize;

use crate::trace::{self, SubCallCounts};

/// Arguments of `rlm show`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The trajectory file (JSONL) written by `rlm run --trajectory`.
    #[arg(value_name = "FILE")]
    pub(crate) trajectory: PathBuf,
}

#[derive(Deserialize)]
struct Header {
    version: u32,
    query: String,
    #[serde(default)]
    endpoints: Vec<EndpointSummary>,
    #[serde(default)]
    contexts: Vec<ContextMetadata>,
}

#[derive(Deserialize)]
struct Closing {
    answer: Option<String>,
    termination_reason: TerminationReason,
    error: Option<String>,
    metrics: SessionMetrics,
}

/// `rlm show`.
pub(crate) fn execute(args: &ShowArgs) -> Result<ExitCode> {
    let path = &args.trajectory;
    let file = std::fs::File::open(path)
        .with_context(|| format!("Could not open the trajectory `{}`", path.display()))?;
    let mut out = std::io::stdout().lock();
    let mut calls: Vec<SubCallMetadata> = Vec::new();
    let mut closed = false;
    let mut lines = 0usize;
    for (number, line) in BufReader::new(file).lines().enumerate() {
        let number = number + 1;
        let line =
            line.with_context(|| format!("Could not read `{}` at line {number}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        lines += 1;
        let value: serde_json::Value = serde_json::from_str(&line).with_context(|| {
            format!(
                "Line {number} of `{}` is not JSON; is it a trajectory written by `rlm run --trajectory`?",
                path.display()
            )
        })?;
        let kind = value
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or("")
            .to_owned();
        let kind = kind.as_str();
        let parsed = |what: &str| {
            format!(
                "Line {number} of `{}` is not a valid `{what}` line",
                path.display()
            )
        };
        let text = match kind {
            "header" => {
                let header: Header = serde_json::from_value(value).with_context(|| parsed(kind))?;
                if header.version > TRAJECTORY_VERSION {
                    eprintln!(
                        "warning: `{}` has trajectory format {}, newer than this `rlm` reads ({TRAJECTORY_VERSION}); some parts may be missing",
                        path.display(),
                        header.version
                    );
                }
                trace::header(&header.query, &header.endpoints, &header.contexts)
            }
            "iteration" => {
                let record: IterationRecord =
                    serde_json::from_value(value).with_context(|| parsed(kind))?;
                let text = iteration(&record);
                calls.extend(record.sub_calls);
                text
            }
            "error" => {
                let error: RunError =
                    serde_json::from_value(value).with_context(|| parsed(kind))?;
                trace::failure(&error)
            }
            "result" => {
                let closing: Closing =
                    serde_json::from_value(value).with_context(|| parsed(kind))?;
                closed = true;
                result(&closing, &calls)
            }
            // A newer writer's extra line kinds are not ours to judge.
            _ => continue,
        };
        out.write_all(text.as_bytes())?;
    }
    if lines == 0 {
        bail!("`{}` is empty; it holds no trajectory", path.display());
    }
    if !closed {
        writeln!(
            out,
            "\n(the trajectory ends here: the run was stopped before it wrote its result)"
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// An iteration: the reply's prose, then each block with the sub-calls it made (blocks run one
/// after another, so their calls follow in the iteration's list).
fn iteration(record: &IterationRecord) -> String {
    let mut text = trace::reply(record.metadata.iteration, false, &record.reply);
    let mut rest = record.sub_calls.as_slice();
    for block in &record.blocks {
        let (mine, later) = rest.split_at(block.sub_calls.min(rest.len()));
        text.push_str(&trace::block(block, mine));
        rest = later;
    }
    text
}

fn result(closing: &Closing, sub_calls: &[SubCallMetadata]) -> String {
    let mut text = trace::answer(closing.answer.as_deref());
    if let Some(error) = &closing.error {
        text.push_str(&format!("{error}\n"));
    }
    let priced = sub_calls.iter().any(|c| c.cost_usd.is_some()) || closing.metrics.cost_usd > 0.0;
    text.push_str(&trace::summary(
        closing.termination_reason,
        &closing.metrics,
        &SubCallCounts::of(sub_calls),
        priced,
    ));
    text.push('\n');
    text
}
