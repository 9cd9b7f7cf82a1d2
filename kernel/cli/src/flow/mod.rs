//! `rlm flow`: workflows of agents from YAML files (ADK Agent Config format).
//!
//! Subcommands: `run` a workflow ([`run`], checkpointed by [`durable`]), `resume` a run
//! ([`resume`]), `runs` / `history` / `decisions` from the run database ([`records`]), `demo`
//! a built-in against scripted models ([`demo`]), `list` the built-in workflows, `graph` a
//! workflow as Mermaid text. A workflow is named by a path to its root YAML file or by the
//! name of a built-in ([`builtin`]); files are read and checked by `engine::flow::file`, so
//! every error names the file, line and column; `persona:` agents come from the run's agent
//! bundle ([`bundle`]).

mod builtin;
mod bundle;
mod demo;
mod durable;
mod input;
mod live;
mod progress;
mod records;
mod resume;
mod run;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use engine::flow::file::{AgentSpec, load_workflow, load_workflow_from, render_mermaid};

use builtin::{BUILTINS, Builtin};
pub(crate) use durable::exit_code;

/// Arguments of `rlm flow`.
#[derive(Debug, Args)]
pub(crate) struct FlowArgs {
    #[command(subcommand)]
    command: FlowCommand,
}

#[derive(Debug, Subcommand)]
enum FlowCommand {
    /// Run a workflow with the model flags of `rlm run`, checkpointed into the run database.
    #[command(after_help = EXIT_CODES)]
    Run(Box<run::FlowRunArgs>),
    /// Continue a run: after a crash or Ctrl-C, with a human's answer, or from an earlier
    /// checkpoint.
    #[command(after_help = EXIT_CODES)]
    Resume(Box<resume::FlowResumeArgs>),
    /// List the runs in the run database: status, workflow, times, head checkpoint.
    Runs(records::RunsArgs),
    /// List a run's checkpoints: node, the state keys it wrote, parent, time.
    History(records::RunArgs),
    /// List a run's routing decisions: who, what, why, when, and what they concern.
    Decisions(records::RunArgs),
    /// Run a built-in workflow against scripted mock models (no API key, no real model).
    Demo(demo::FlowDemoArgs),
    /// List the built-in workflows.
    List,
    /// Print a workflow's agent tree and edges as Mermaid flowchart text.
    Graph(GraphArgs),
}

/// The exit codes of `rlm flow run` and `resume`.
const EXIT_CODES: &str = "\
Exit codes:
  0    the workflow completed
  1    an error: an agent failed, a damaged or locked run database
  2    a usage error: a bad option, an unknown run or checkpoint, a completed run
  3    a limit stopped the run (timeout, budget)
  5    the run waits for a human (`awaiting_human`): answer with
       `rlm flow resume RUN --input \"...\"`
  6    another process drives the run (it was refused, or taken over meanwhile)
  130  Ctrl-C stopped the run (its state, event log and checkpoints kept; resume it)";

/// Arguments of `rlm flow graph`.
#[derive(Debug, Args)]
struct GraphArgs {
    /// The workflow: a YAML file, or the name of a built-in (`rlm flow list`).
    #[arg(value_name = "FILE|NAME")]
    workflow: String,
}

/// `rlm flow`; `file` holds the `[run]` options of the configuration file.
pub(crate) fn execute(args: FlowArgs, file: crate::args::RunOptions) -> Result<ExitCode> {
    match args.command {
        FlowCommand::Run(args) => {
            // First, while the process has one thread and no Python: keys leave the environment.
            crate::secrets::protect(&run::merged(&args, &file))?;
            let workflow = Workflow::find(&args.workflow)?;
            run::execute(*args, file, &workflow, None)
        }
        FlowCommand::Resume(args) => {
            crate::secrets::protect(&crate::run::merge(args.options.clone(), file.clone()))?;
            resume::execute(*args, file)
        }
        FlowCommand::Runs(args) => records::runs(args),
        FlowCommand::History(args) => records::history(args),
        FlowCommand::Decisions(args) => records::decisions(args),
        FlowCommand::Demo(args) => demo::execute(args, file),
        FlowCommand::List => list(),
        FlowCommand::Graph(args) => {
            let spec = read(&args.workflow)?;
            print(&render_mermaid(&spec))
        }
    }
}

/// Reads the workflow `name`: a file when one is there, else a built-in.
fn read(name: &str) -> Result<AgentSpec> {
    let path = PathBuf::from(name);
    if path.exists() {
        return Ok(load_workflow(&path)?);
    }
    let builtin = Builtin::find(name).ok_or_else(|| unknown(name))?;
    Ok(load_workflow_from(&builtin.embedded(), builtin.root)?)
}

fn unknown(name: &str) -> anyhow::Error {
    crate::UsageError::new(format!(
        "`{name}` is neither a workflow file nor a built-in workflow ({}); see `rlm flow list`",
        BUILTINS
            .iter()
            .map(|b| format!("`{}`", b.name))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .into()
}

/// A workflow on disk: a file, or a built-in written to a temporary folder (its Python
/// steps are loaded from files).
pub(crate) struct Workflow {
    root: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Workflow {
    /// The workflow `name`: a file when one is there, else a built-in.
    pub(crate) fn find(name: &str) -> Result<Self> {
        let path = PathBuf::from(name);
        if path.exists() {
            return Ok(Self {
                root: path,
                _dir: None,
            });
        }
        let builtin = Builtin::find(name).ok_or_else(|| unknown(name))?;
        let dir = tempfile::tempdir().context("Could not create a temporary directory")?;
        for (path, text) in builtin.files {
            let target = dir.path().join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("Could not create `{}`", parent.display()))?;
            }
            std::fs::write(&target, text)
                .with_context(|| format!("Could not write `{}`", target.display()))?;
        }
        Ok(Self {
            root: dir.path().join(builtin.root),
            _dir: Some(dir),
        })
    }

    /// The root file.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The root file's folder.
    pub(crate) fn dir(&self) -> &Path {
        self.root.parent().unwrap_or_else(|| Path::new("."))
    }
}

fn list() -> Result<ExitCode> {
    let mut out = String::new();
    for builtin in BUILTINS {
        let spec = load_workflow_from(&builtin.embedded(), builtin.root)?;
        out.push_str(&format!(
            "{:<16} {}\n",
            builtin.name,
            spec.config.description()
        ));
    }
    print(&out)
}

fn print(text: &str) -> Result<ExitCode> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}
