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
mod workflow;

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use engine::flow::file::{load_workflow_from, render_mermaid};

use crate::table::{self, Align};

use builtin::BUILTINS;
pub(crate) use durable::exit_code;
use workflow::Workflow;

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
  3    a limit stopped the run (its timeout or budget, an agent's iteration or time limit,
       a graph's step limit)
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

/// `rlm flow`; `config` is the `--config` file, if given.
pub(crate) fn execute(args: FlowArgs, config: Option<&Path>) -> Result<ExitCode> {
    match args.command {
        FlowCommand::Run(args) => {
            let settings = args.options.clone().settings(config)?;
            // First, while the process has one thread and no Python: keys leave the environment.
            crate::secrets::protect(&settings.opts)?;
            let workflow = Workflow::find(&args.workflow)?;
            run::execute(*args, &settings, &workflow, None)
        }
        // Keys leave the environment there, once the run's stored settings are read.
        FlowCommand::Resume(args) => resume::execute(*args, config),
        FlowCommand::Runs(args) => records::runs(args, config),
        FlowCommand::History(args) => records::history(args, config),
        FlowCommand::Decisions(args) => records::decisions(args, config),
        FlowCommand::Demo(args) => demo::execute(args, config),
        FlowCommand::List => list(),
        FlowCommand::Graph(args) => {
            let spec = workflow::read(&args.workflow)?;
            records::print(&render_mermaid(&spec))
        }
    }
}

fn list() -> Result<ExitCode> {
    let mut out = String::new();
    for builtin in BUILTINS {
        let spec = load_workflow_from(&builtin.embedded(), builtin.root)?;
        out.push_str(&format!(
            "{} {}\n",
            table::pad(builtin.name, 16, Align::Left),
            spec.config.description()
        ));
    }
    records::print(&out)
}
