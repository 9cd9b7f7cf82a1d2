//! `rlm`: the command-line front end of rlm-kernel.
//!
//! Exit codes (one cause each; the table is in `rlm run --help` and the README): 0 the model
//! gave a final answer; 1 an error (bad input, unreachable endpoint, failed run); 2 a usage
//! error; 3 a limit stopped the run (iterations, time, budget, repeated failures) — a partial
//! or fallback answer may still have been printed — or refused it before it started; 4 a
//! fatal signal (a crash in C code a cell called; one line on stderr names the block, see
//! `kernel::fatal`); 5 a workflow waits for a human; 6 another process drives the workflow
//! run; 101 a panic, i.e. a bug; 130 Ctrl-C stopped the run (the first Ctrl-C stops it
//! gracefully, keeping its best answer and trajectory; a second one quits at once). A
//! `SIGKILL` (the OOM killer) leaves no code of ours: shells show 137, and the trajectory's
//! last line names the block that was running. The codes are in [`exit`].
//!
//! The modules form layers; each imports only from the layers below it (no cycle, checked by
//! `.ci/module-cycles.py`):
//! - `main` (this file): parse, dispatch, print a failure with its exit code;
//! - [`cli`]: the clap tree, the global flags and one subcommand;
//! - the commands, each owning its arguments: [`run`], [`chat`], [`agent`], [`demo`],
//!   [`bench`](mod@bench), [`eval`], [`flow`], [`mock_lm`], [`show`], [`view`], [`doctor`];
//! - what several commands share: [`observe`] (progress line, trace, trajectory and Ctrl-C
//!   of an RLM run), [`report`] (a run's output files and closing lines),
//!   [`contexts`] (`--context` and how files load), [`questions`] (turns from a terminal or
//!   standard input);
//! - the bottom: [`settings`] (the run options as flags, environment and `rlm.toml`, merged),
//!   [`endpoints`] (from settings to the kernel's endpoints and configurations), [`secrets`],
//!   [`outputs`], [`logging`], [`exit`] (exit codes and the errors that have their own) and
//!   [`table`] (text in columns, by terminal width).

mod agent;
mod bench;
mod chat;
mod cli;
mod contexts;
mod demo;
mod doctor;
mod endpoints;
mod eval;
mod exit;
mod flow;
mod interrupt;
mod logging;
mod mock_lm;
mod observe;
mod outputs;
mod questions;
mod report;
mod run;
mod secrets;
mod settings;
mod show;
mod table;
mod view;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

fn main() -> ExitCode {
    // Started as an isolated session's worker (`rlm __worker`): nothing else of `rlm` runs,
    // and nothing starts a thread before the worker confines itself.
    if let Some(code) = kernel::repl::serve_if_worker() {
        return code;
    }
    kernel::repl::set_worker_program(kernel::repl::WorkerProgram::this_executable());
    // Before anything runs a cell: a crash in C code then says which block it was.
    if let Err(err) = kernel::fatal::install(exit::EXIT_CRASHED) {
        eprintln!("warning: could not install the crash reporter: {err}");
    }
    let cli = Cli::parse();
    logging::init(cli.verbose);
    // The commands that print one JSON document with `--json` print one for an early failure
    // too; each rechecks once `rlm.toml` is merged (`json_errors`).
    let json = match &cli.command {
        Command::Run(args) => args.options.json(),
        Command::Bench(args) => args.options.json(),
        Command::Eval(args) => args.options.json(),
        _ => false,
    };
    exit::json_errors(json);
    match dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", secrets::redact(&err.to_string()));
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {}", secrets::redact(&cause.to_string()));
            }
            let code = exit::code_of(&err, flow::exit_code(&err));
            if exit::json_errors_on() {
                print_json_error(&err, code);
            }
            ExitCode::from(code)
        }
    }
}

/// `{"error": {...}}` on stdout, for a run that failed before it started.
fn print_json_error(err: &anyhow::Error, code: u8) {
    let document = serde_json::json!({
        "rlm_version": env!("CARGO_PKG_VERSION"),
        "error": {
            "message": err.to_string(),
            "causes": err.chain().skip(1).map(|c| c.to_string()).collect::<Vec<_>>(),
            "usage_error": code == exit::EXIT_USAGE,
            "exit_code": code,
        }
    });
    let text = serde_json::to_string_pretty(&document).unwrap_or_default();
    let _ = writeln!(std::io::stdout().lock(), "{}", secrets::redact(&text));
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = cli.config.as_deref();
    match cli.command {
        Command::Run(args) => run::execute(*args, config, cli.verbose),
        Command::Chat(args) => chat::execute(*args, config, cli.verbose),
        Command::Demo(args) => demo::execute(*args, config, cli.verbose),
        Command::Bench(args) => bench::execute(*args, config),
        Command::Eval(args) => eval::execute(*args, config),
        Command::Agent(args) => agent::execute(*args, config, cli.verbose),
        Command::Show(args) => show::execute(&args),
        Command::MockLm(args) => {
            kernel::runtime::shared().block_on(mock_lm::serve(args))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::View(args) => view::execute(args),
        Command::Doctor(args) => doctor::execute(&args),
        Command::Flow(args) => flow::execute(args, config),
    }
}
