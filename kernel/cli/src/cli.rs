//! The command line as clap parses it: the global flags and one subcommand, whose arguments
//! each command's module owns (`run::RunArgs`, `bench::BenchArgs`, …). The top of the CLI
//! below `main`: it knows every command, and no command knows it.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// `rlm`: a Recursive Language Model runtime.
#[derive(Debug, Parser)]
#[command(
    name = "rlm",
    version,
    about = "Recursive Language Model runtime: a root model, a Python REPL holding a huge context, and sub-models",
    long_about = None,
)]
pub(crate) struct Cli {
    /// Configuration file: its `[run]` table sets options as flags would, below flags and
    /// `RLM_*` variables (default: the file `RLM_CONFIG` names, else `./rlm.toml` when it
    /// exists).
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,

    /// More output on stderr: `-v` shows the run's trace (as `--trace`) and info logs (retries,
    /// interrupts), `-vv` debug logs. `RUST_LOG` sets the log filter itself.
    #[arg(long, short = 'v', global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Every exit code of `rlm run`, one cause each (also in the README).
const EXIT_CODES: &str = "\
Exit codes:
  0    the model gave a final answer
  1    an error: bad input, an unreachable endpoint, a failed run
  2    a usage error: a bad option or argument
  3    a limit stopped the run (iterations, time, budget, repeated failures); a partial
       answer may still be printed
  4    the process crashed in a cell (a fatal signal in C code, e.g. a segfault); one line
       on stderr and the trajectory's last line name the block
  101  a bug in rlm (a panic)
  130  Ctrl-C, SIGTERM or SIGHUP stopped the run (its best answer printed, the trajectory
       closed)
A SIGKILL (e.g. the OOM killer) leaves no code of rlm's own (shells show 137); the
trajectory's last line still names the block that was running.";

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Answer a query over one or more contexts with the RLM loop.
    #[command(allow_negative_numbers = true, after_help = EXIT_CODES)]
    Run(Box<crate::run::RunArgs>),
    /// Ask one question after another about contexts loaded once; each question runs in the
    /// same Python session, so variables made for one are there for the next.
    #[command(allow_negative_numbers = true)]
    Chat(Box<crate::chat::ChatArgs>),
    /// Talk with a persona agent — a BMAD agent skill (`.claude/skills/bmad-agent-pm`), any
    /// Agent Skill, or a BMAD 6.0 agent file (`agents/NAME.md`): it loads its files and skills
    /// through tools, only when a command needs them.
    #[command(allow_negative_numbers = true)]
    Agent(Box<crate::agent::AgentArgs>),
    /// Run a complete RLM analysis on generated logs against scripted mock models (no API key needed).
    #[command(allow_negative_numbers = true)]
    Demo(Box<crate::demo::DemoArgs>),
    /// Measure sub-call throughput of an endpoint (or the built-in mock) over a sweep of widths.
    #[command(allow_negative_numbers = true)]
    Bench(Box<crate::bench::BenchArgs>),
    /// Score RLM runs on generated long-context tasks (needle, aggregate, pairs) at chosen
    /// context sizes, optionally against the model with the context in its prompt.
    #[command(allow_negative_numbers = true)]
    Eval(Box<crate::eval::EvalArgs>),
    /// Serve the mock LM server (OpenAI and Anthropic wire formats) on 127.0.0.1.
    MockLm(crate::mock_lm::MockLmArgs),
    /// Print a saved trajectory (`--trajectory FILE`) as the readable trace `--trace` shows.
    Show(crate::show::ShowArgs),
    /// Render a trajectory (`--trajectory` JSONL) or a workflow's event log as one
    /// self-contained HTML page.
    View(crate::view::ViewArgs),
    /// Workflows of agents from YAML files: run, list the built-ins, draw as Mermaid.
    #[command(after_help = EXIT_CODES)]
    Flow(crate::flow::FlowArgs),
    /// Show which layers confining model code (Landlock, network, seccomp, limits, process
    /// cap and lifetime, environment) are in force on this machine, and why any is not.
    Doctor(crate::doctor::DoctorArgs),
}
