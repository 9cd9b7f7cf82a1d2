//! `rlm show FILE`: a saved trajectory printed with the renderer of the live trace
//! (`kernel::rlm::trace`), on stdout; a workflow's event log as its steps, one line each.
//!
//! Reads the JSONL lines `TrajectoryWriter` writes (`header`, `reply`, `block`, `iteration`,
//! `error`, `result`). The `reply` and `block` lines written before each iteration's record
//! are what the record later says in full; an iteration with no record did not finish and is
//! printed from them, its last block as the one the run stopped in (with no `result` line:
//! the block that crashed it, or that a kill stopped). A file cut short (a killed run) prints
//! what it has and says where it ends, a last line cut off mid-write included; a line in the
//! middle that is not JSON is an error naming the line. An event log (`rlm flow run
//! --events`) is recognised and printed as its agents' steps ([`event_log`]).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
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
use serde_json::Value;

use kernel::rlm::trace;

/// Arguments of `rlm show`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The trajectory file (JSONL) written by `rlm run --trajectory`, or a workflow's event
    /// log (`rlm flow run --events`).
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

/// A `reply` or `block` line: written as the iteration goes, before its record.
#[derive(Deserialize)]
struct Started {
    iteration: u32,
    #[serde(default)]
    reply: Option<String>,
    #[serde(default)]
    code: Option<String>,
}

/// `rlm show`.
pub(crate) fn execute(args: &ShowArgs) -> Result<ExitCode> {
    let path = &args.trajectory;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("Could not read the trajectory `{}`", path.display()))?;
    if text.trim().is_empty() {
        bail!("`{}` is empty; it holds no trajectory", path.display());
    }
    let shown = if kernel::flow::is_event_log(&text) {
        event_log(&text)
    } else {
        trajectory(&text, path)?
    };
    let mut out = std::io::stdout().lock();
    out.write_all(shown.as_bytes())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// A trajectory as the live trace printed it.
fn trajectory(text: &str, path: &Path) -> Result<String> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(number, line)| (number + 1, line))
        .collect();
    let mut out = String::new();
    let mut calls: Vec<SubCallMetadata> = Vec::new();
    let mut failed_children = 0;
    // Iterations that started, by their `reply` and `block` lines, until their record comes.
    let mut started: Vec<(u32, Option<String>, Vec<String>)> = Vec::new();
    let mut closed = false;
    let mut cut = None;
    for (position, &(number, line)) in lines.iter().enumerate() {
        let value: Value = match serde_json::from_str(line) {
            Ok(value) => value,
            // A run killed mid-write leaves its last line incomplete.
            Err(_) if position > 0 && position + 1 == lines.len() => {
                cut = Some(number);
                break;
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "Line {number} of `{}` is not JSON; is it a trajectory written by `rlm run --trajectory`?",
                        path.display()
                    )
                });
            }
        };
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
        match kind {
            "header" => {
                let header: Header = serde_json::from_value(value).with_context(|| parsed(kind))?;
                if header.version > TRAJECTORY_VERSION {
                    eprintln!(
                        "warning: `{}` has trajectory format {}, newer than this `rlm` reads ({TRAJECTORY_VERSION}); some parts may be missing",
                        path.display(),
                        header.version
                    );
                }
                out.push_str(&trace::header(
                    &header.query,
                    &header.endpoints,
                    &header.contexts,
                ));
            }
            "reply" | "block" => {
                let line: Started = serde_json::from_value(value).with_context(|| parsed(kind))?;
                let at = match started.iter().position(|(n, _, _)| *n == line.iteration) {
                    Some(at) => at,
                    None => {
                        started.push((line.iteration, None, Vec::new()));
                        started.len() - 1
                    }
                };
                let entry = &mut started[at];
                if let Some(reply) = line.reply {
                    entry.1 = Some(reply);
                }
                entry.2.extend(line.code);
            }
            "iteration" => {
                let record: IterationRecord =
                    serde_json::from_value(value).with_context(|| parsed(kind))?;
                started.retain(|(n, _, _)| *n != record.metadata.iteration);
                out.push_str(&iteration(&record));
                failed_children += record.failed_children();
                calls.extend(record.sub_calls);
            }
            "error" => {
                let error: RunError =
                    serde_json::from_value(value).with_context(|| parsed(kind))?;
                out.push_str(&trace::failure(&error));
            }
            "result" => {
                let closing: Closing =
                    serde_json::from_value(value).with_context(|| parsed(kind))?;
                closed = true;
                out.push_str(&result(&closing, &calls, failed_children));
            }
            // A newer writer's extra line kinds are not ours to judge.
            _ => {}
        }
    }
    for (n, reply, blocks) in &started {
        out.push_str(&trace::reply(*n, false, reply.as_deref().unwrap_or("")));
        for (i, code) in blocks.iter().enumerate() {
            out.push_str(&trace::unfinished_block(
                code,
                !closed && i + 1 == blocks.len(),
            ));
        }
    }
    if let Some(number) = cut {
        let _ = write!(
            out,
            "\n(line {number} is cut off: the run was stopped while writing it)"
        );
    }
    if !closed {
        out.push_str(
            "\n(the trajectory ends here: the run was stopped before it wrote its result)\n",
        );
    } else if cut.is_some() {
        out.push('\n');
    }
    Ok(out)
}

/// An iteration: the reply's prose, then each block with the sub-calls it made (blocks run one
/// after another, so their calls follow in the iteration's list).
fn iteration(record: &IterationRecord) -> String {
    let mut text = trace::reply(record.metadata.iteration, false, &record.reply);
    let mut rest = record.sub_calls.as_slice();
    for block in &record.blocks {
        let (mine, later) = rest.split_at(block.sub_calls.min(rest.len()));
        text.push_str(&trace::block(block, mine, "`--cell-timeout`"));
        rest = later;
    }
    text
}

fn result(closing: &Closing, sub_calls: &[SubCallMetadata], failed_children: usize) -> String {
    let mut text = trace::answer(closing.answer.as_deref());
    if let Some(error) = &closing.error {
        text.push_str(&format!("{error}\n"));
    }
    text.push_str(&trace::summary(
        closing.termination_reason,
        &closing.metrics,
        sub_calls,
        failed_children,
    ));
    text.push('\n');
    text
}

/// Characters of a message, a tool call's arguments or result shown on its line.
const EVENT_TEXT_CHARS: usize = 300;

/// A workflow's event log: each step on a line, indented by the agent's depth — starts and
/// ends, loop iterations, messages, tool calls and results, the state keys a step wrote.
/// Events are read loosely (a newer log's extra fields and kinds are passed over), and a last
/// line cut off mid-write is said, not fatal.
fn event_log(text: &str) -> String {
    let mut out = String::new();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    for (position, line) in lines.iter().enumerate() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            if position + 1 == lines.len() {
                out.push_str("(the last line is cut off: the run was stopped while writing it)\n");
            }
            continue;
        };
        let field = |key: &str| event.get(key).and_then(Value::as_str).unwrap_or_default();
        let author = field("author");
        let indent = "  ".repeat(field("branch").matches('/').count());
        let content = event.get("content").and_then(Value::as_str);
        match field("kind") {
            "start" => {
                let _ = writeln!(out, "{indent}▶ {author}");
            }
            "end" => {
                let _ = writeln!(out, "{indent}■ {author} {}", field("status"));
                if let Some(error) = content {
                    let _ = writeln!(out, "{indent}  {}", shorten(error));
                }
            }
            "iteration" => {
                let n = event.get("iteration").and_then(Value::as_u64).unwrap_or(0);
                let _ = writeln!(out, "{indent}↻ {author} iteration {n}");
            }
            "message" => {
                let _ = writeln!(
                    out,
                    "{indent}  {author}: {}",
                    shorten(content.unwrap_or_default())
                );
            }
            "tool_calls" => {
                for call in event
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let name = call.get("name").and_then(Value::as_str).unwrap_or("?");
                    // Arguments travel as the JSON text the model wrote.
                    let arguments = match call.get("arguments") {
                        Some(Value::String(text)) => text.clone(),
                        Some(other) => other.to_string(),
                        None => String::new(),
                    };
                    let _ = writeln!(
                        out,
                        "{indent}  {author} calls {name}({})",
                        shorten(&arguments)
                    );
                }
            }
            "tool_results" => {
                for result in event
                    .get("tool_results")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let name = result.get("name").and_then(Value::as_str).unwrap_or("?");
                    let failed = result.get("is_error").and_then(Value::as_bool) == Some(true);
                    let value = result.get("result").map(Value::to_string);
                    let _ = writeln!(
                        out,
                        "{indent}  {name} {} {}",
                        if failed { "✗" } else { "→" },
                        shorten(value.as_deref().unwrap_or_default())
                    );
                }
            }
            _ => {}
        }
        // The keys of its writes; a log written before writes had their own form holds an
        // object of values.
        let keys: Vec<&str> = match event.get("delta") {
            Some(Value::Array(writes)) => {
                let mut keys = Vec::new();
                for key in writes.iter().filter_map(|w| w.get("key")?.as_str()) {
                    if !keys.contains(&key) {
                        keys.push(key);
                    }
                }
                keys
            }
            Some(Value::Object(values)) => values.keys().map(String::as_str).collect(),
            _ => Vec::new(),
        };
        if !keys.is_empty() {
            let _ = writeln!(out, "{indent}  {author} wrote {}", keys.join(", "));
        }
    }
    out
}

/// `text` on one line, cut to [`EVENT_TEXT_CHARS`].
fn shorten(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(EVENT_TEXT_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}
