//! `rlm flow runs`, `history RUN` and `decisions RUN`: what the run database holds.
//!
//! Each prints a table (or numbered records) on stdout, or with `--json` one JSON array.
//! Times are RFC 3339 in UTC. The database is only read (opened read-only: a read-only file,
//! folder or mount will do). A node's checkpoint shows the node's
//! path from the root graph down, each loop with its iteration
//! (`plan_discover[2]/discovery[3]/discoverer`).
//! `runs` shows a run as its owner stands, not only as stored: a `running` run whose process
//! is gone (killed, crashed) is `interrupted` (resume continues it); a run a process drives is
//! `running`, with its pid.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use engine::durable::{
    CheckpointRecord, LeaseHolder, Liveness, RunRecord, Store, StoreError, checkpoint_path,
};
use engine::flow::path_text;
use serde_json::{Value, json};

use super::durable::{RunDb, decision_lines, decisions_of, store_error, time_of, wait};
use crate::exit::UsageError;
use crate::settings::{RunFlags, offers};
use crate::table::{self, Align};

/// Arguments of `rlm flow runs`.
#[derive(Debug, Args)]
pub(crate) struct RunsArgs {
    #[command(flatten)]
    options: RunFlags<{ offers::RECORDS }>,

    /// Print the runs as one JSON array.
    #[arg(long)]
    json: bool,
}

/// Arguments of `rlm flow history` and `rlm flow decisions`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The run's id (`rlm flow runs` lists them).
    #[arg(value_name = "RUN")]
    run: String,

    #[command(flatten)]
    options: RunFlags<{ offers::RECORDS }>,

    /// Print them as one JSON array.
    #[arg(long)]
    json: bool,
}

impl RunArgs {
    /// The run database the settings name (`config`: the `--config` file, if given), opened
    /// to read it.
    fn open_read_only(&self, config: Option<&Path>) -> Result<Arc<dyn Store>> {
        RunDb::of(&self.options.clone().settings(config)?.opts)?.open_read_only()
    }
}

/// `rlm flow runs`: every run, oldest first.
pub(crate) fn runs(args: RunsArgs, config: Option<&Path>) -> Result<ExitCode> {
    let db = RunDb::of(&args.options.settings(config)?.opts)?;
    // No database yet is no runs yet.
    let runs = match wait(engine::durable::open_read_only(&db.location()?)) {
        Ok(store) => wait(store.runs()).map_err(store_error)?,
        Err(StoreError::Missing { .. }) => Vec::new(),
        Err(e) => return Err(store_error(e)),
    };
    if args.json {
        let rows: Vec<Value> = runs.iter().map(run_json).collect();
        return print(&format!("{}\n", serde_json::to_string_pretty(&rows)?));
    }
    if runs.is_empty() {
        return print("No runs yet; `rlm flow run FILE|NAME` starts one.\n");
    }
    let rows: Vec<[String; 7]> = runs
        .iter()
        .map(|run| {
            let (status, driver) = shown(run);
            let owner = match driver {
                Some((holder, Liveness::Unchecked)) => {
                    format!("pid {} on {}", holder.owner.pid, holder.owner.host)
                }
                // Taken over by any host once the lease runs out unrenewed.
                Some((holder, Liveness::Renewed)) => format!(
                    "pid {} on {}, lease until {}",
                    holder.owner.pid,
                    holder.owner.host,
                    time_of(holder.expires_ms.unwrap_or(holder.since_ms))
                ),
                Some((holder, _)) => format!("pid {}", holder.owner.pid),
                None => "-".to_owned(),
            };
            [
                run.run_id.clone(),
                status.to_owned(),
                run.workflow.clone(),
                time_of(run.created_ms),
                time_of(run.updated_ms),
                run.head.map_or_else(|| "-".to_owned(), |h| h.to_string()),
                owner,
            ]
        })
        .collect();
    let header = [
        "RUN", "STATUS", "WORKFLOW", "STARTED", "UPDATED", "HEAD", "OWNER",
    ];
    print(&table::render(&header, &rows, |_| Align::Left))
}

/// `rlm flow history RUN`: the run's checkpoints, oldest first.
pub(crate) fn history(args: RunArgs, config: Option<&Path>) -> Result<ExitCode> {
    let store = args.open_read_only(config)?;
    let checkpoints = wait(store.history(&args.run)).map_err(store_error)?;
    if args.json {
        let rows: Vec<Value> = checkpoints.iter().map(checkpoint_json).collect();
        return print(&format!("{}\n", serde_json::to_string_pretty(&rows)?));
    }
    let rows: Vec<[String; 6]> = checkpoints
        .iter()
        .map(|c| {
            [
                c.id.to_string(),
                c.parent.map_or_else(|| "-".to_owned(), |p| p.to_string()),
                node_text(c),
                if c.written.is_empty() {
                    "-".to_owned()
                } else {
                    c.written.join(", ")
                },
                if c.next.is_empty() {
                    "-".to_owned()
                } else {
                    c.next.join(", ")
                },
                time_of(c.created_ms),
            ]
        })
        .collect();
    let header = ["ID", "PARENT", "NODE", "WRITES", "NEXT", "TIME"];
    print(&table::render(&header, &rows, |_| Align::Left))
}

/// `rlm flow decisions RUN`: the routing decisions on record at the run's head.
pub(crate) fn decisions(args: RunArgs, config: Option<&Path>) -> Result<ExitCode> {
    let store = args.open_read_only(config)?;
    let run = find(store.as_ref(), &args.run)?;
    let decisions = match run.head {
        Some(head) => decisions_of(&wait(store.state_at(head)).map_err(store_error)?.state),
        None => Vec::new(),
    };
    if args.json {
        return print(&format!("{}\n", serde_json::to_string_pretty(&decisions)?));
    }
    if decisions.is_empty() {
        return print(&format!(
            "Run `{}` has no routing decisions on record (only a router node makes them).\n",
            args.run
        ));
    }
    print(&decision_lines(&decisions))
}

fn find(store: &dyn Store, run: &str) -> Result<RunRecord> {
    wait(store.run(run)).map_err(store_error)?.ok_or_else(|| {
        UsageError::new(format!(
            "No run `{run}` in `{}`; `rlm flow runs` lists the runs",
            store.location()
        ))
        .into()
    })
}

/// How run `run` stands: a process that drives it makes it `running` (with that process and
/// whether it could be checked); a `running` run nobody drives any more is `interrupted`.
fn shown(run: &RunRecord) -> (&'static str, Option<(&LeaseHolder, Liveness)>) {
    let driver = run
        .lease
        .as_ref()
        .map(|holder| (holder, holder.liveness()))
        .filter(|(_, liveness)| *liveness != Liveness::Dead);
    match (&run.status, driver) {
        (_, Some(driver)) => ("running", Some(driver)),
        (engine::durable::RunStatus::Running, None) => ("interrupted", None),
        (status, None) => (status.name(), None),
    }
}

fn run_json(run: &RunRecord) -> Value {
    let detail = match &run.status {
        engine::durable::RunStatus::Failed { error } => json!({"error": error}),
        engine::durable::RunStatus::AwaitingHuman { question } => json!({"question": question}),
        _ => json!({}),
    };
    let (status, driver) = shown(run);
    let owner = driver.map(|(holder, liveness)| {
        json!({
            "pid": holder.owner.pid,
            "host": holder.owner.host,
            "since": time_of(holder.since_ms),
            "checked": liveness == Liveness::Alive,
            // A lease with a heartbeat (PostgreSQL): when it runs out unless renewed.
            "lease_until": holder.expires_ms.map(time_of),
        })
    });
    json!({
        "run_id": run.run_id,
        "status": status,
        "owner": owner,
        "detail": detail,
        "workflow": run.workflow,
        "started": time_of(run.created_ms),
        "updated": time_of(run.updated_ms),
        "head": run.head,
        "checkpoints": run.checkpoints,
        "input": run.input,
    })
}

fn checkpoint_json(c: &CheckpointRecord) -> Value {
    json!({
        "id": c.id,
        "parent": c.parent,
        "step": c.step,
        "node": c.node,
        "path": checkpoint_path(c).map(|path| path_text(&path)),
        "writes": c.written,
        "next": c.next,
        "time": time_of(c.created_ms),
        "write_bytes": c.write_bytes,
        "snapshot": c.snapshot,
        "metadata": c.metadata,
    })
}

/// The checkpoint's node, as its path when it has one.
fn node_text(c: &CheckpointRecord) -> String {
    checkpoint_path(c).map_or_else(|| c.node.clone(), |path| path_text(&path))
}

/// Prints `text` on stdout: a command that succeeded.
pub(super) fn print(text: &str) -> Result<ExitCode> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}
