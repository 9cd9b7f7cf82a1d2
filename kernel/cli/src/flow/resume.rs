//! `rlm flow resume RUN`: continue a checkpointed run.
//!
//! The run record names the workflow, the contexts, the bundle and the run's model and session
//! settings (`--isolation` among them; a flag given here overrides the stored value); the
//! state comes from the checkpoint.
//! Without options the run continues from its head: after a crash (`kill -9`) or Ctrl-C the
//! node that was running **re-executes** from the state before it — at whatever depth of
//! nested loops and sequences it ran, each enclosing loop going on at its own iteration — so
//! side effects belong in idempotent tools. `--input TEXT` answers a run waiting for a human
//! (recorded as `human_input` and a `human` message; the node it escalated from runs again
//! with it). `--from-checkpoint ID` re-runs from an earlier checkpoint of the run (time
//! travel); the new checkpoints branch from it and the old ones stay in `history`. A run
//! another live process drives is refused (exit 6); one whose owner died is taken over;
//! `--take-over` takes over one whose owner runs on another host (a shared disk) and so
//! cannot be checked.

use std::ffi::OsString;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use engine::durable::{CheckpointId, StoreError};
use serde_json::Value;

use super::durable::{DurableArgs, Resume, RunDb, store_error, stored_settings};
use super::run::FlowRunArgs;
use crate::exit::UsageError;
use crate::settings::{RunFlags, offers};

/// Arguments of `rlm flow resume`.
#[derive(Debug, Args)]
pub(crate) struct FlowResumeArgs {
    /// The run's id (`rlm flow runs` lists them).
    #[arg(value_name = "RUN")]
    run: String,

    /// The human's answer to the question a run waiting for one (`awaiting_human`) asked.
    #[arg(long, value_name = "TEXT")]
    input: Option<String>,

    /// Run again from this checkpoint of the run (`rlm flow history RUN`) instead of its head.
    #[arg(long, value_name = "ID")]
    from_checkpoint: Option<CheckpointId>,

    /// Take the run over from a process on another host that holds it (it cannot be checked
    /// from here: make sure it is gone). A dead process on this host is taken over anyway.
    #[arg(long)]
    take_over: bool,

    /// After the run, keep only its last N checkpoints (older ones are removed).
    #[arg(long, value_name = "N")]
    keep_last: Option<NonZeroUsize>,

    /// Write the JSONL event log here.
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) options: RunFlags<{ offers::FLOW }>,
}

/// `rlm flow resume`; `config` is the `--config` file, if given.
pub(crate) fn execute(args: FlowResumeArgs, config: Option<&Path>) -> Result<ExitCode> {
    // Read first: the run names what the resumed run reads, which the output guard needs
    // before the database is opened for writing.
    // On a runtime of this thread only, gone before the keys leave the environment below
    // (which needs a process of one thread).
    let db = RunDb::of(&args.options.clone().settings(config)?.opts)?;
    let run = super::durable::before_threads(async {
        let store = db.open_read_only_async().await?;
        store.run(&args.run).await.map_err(store_error)
    })??
    .ok_or_else(|| store_error(StoreError::UnknownRun(args.run.clone())))?;
    // This command's flags over the run's stored settings over the environment and the
    // configuration file.
    let settings = args
        .options
        .clone()
        .settings_over(stored_settings(&run)?, config)?;
    // First, while the process has one thread and no Python: keys leave the environment.
    crate::secrets::protect(&settings.opts)?;
    let workflow = super::workflow::Workflow::find(&run.workflow).map_err(|_| {
        UsageError::new(format!(
            "Run `{}` ran the workflow `{}`, which is no longer there; put it back to resume",
            run.run_id, run.workflow
        ))
    })?;
    let contexts: Vec<OsString> = run
        .input
        .get("contexts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(OsString::from)
        .collect();
    let durable_args = DurableArgs {
        db,
        run_id: Some(args.run),
        keep_last: args.keep_last,
    };
    let resume = Resume {
        from: args.from_checkpoint,
        answer: args.input,
        take_over: args.take_over,
    };
    let run_args = FlowRunArgs {
        workflow: run.workflow,
        inputs: Vec::new(),
        contexts,
        state: None,
        events: args.events,
        bundle: run
            .input
            .get("bundle")
            .and_then(Value::as_str)
            .map(PathBuf::from),
        durable: durable_args,
        options: args.options,
    };
    super::run::execute(run_args, &settings, &workflow, Some(resume))
}
