//! `rlm`: the command-line front end of rlm-kernel.
//!
//! Exit codes (one cause each; the table is in `rlm run --help` and the README): 0 the model
//! gave a final answer; 1 an error (bad input, unreachable endpoint, failed run); 2 a usage
//! error; 3 a limit stopped the run (iterations, time, budget, repeated failures) — a partial
//! or fallback answer may still have been printed — or refused it before it started; 4 a fatal signal (a crash in C code a cell
//! called; one line on stderr names the block, see `kernel::fatal`); 101 a panic, i.e. a bug;
//! 130 Ctrl-C stopped the run (the first Ctrl-C stops it gracefully, keeping its best answer
//! and trajectory; a second one quits at once). A `SIGKILL` (the OOM killer) leaves no code of
//! ours: shells show 137, and the trajectory's last line names the block that was running.

mod agent;
mod args;
mod bench;
mod chat;
mod contexts;
mod demo;
mod eval;
mod flow;
mod logging;
mod mock_lm;
mod outputs;
mod report;
mod run;
mod secrets;
mod show;
mod trace;
mod view;

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;

use args::{Cli, Command};

fn main() -> ExitCode {
    // Before anything runs a cell: a crash in C code then says which block it was.
    if let Err(err) = kernel::fatal::install(run::EXIT_CRASHED) {
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
    json_errors(json);
    match dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", secrets::redact(&err.to_string()));
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {}", secrets::redact(&cause.to_string()));
            }
            let code: u8 = if err.downcast_ref::<UsageError>().is_some() {
                2
            } else if err.downcast_ref::<LimitError>().is_some() {
                run::EXIT_LIMIT
            } else {
                flow::exit_code(&err).unwrap_or(1)
            };
            if JSON_ERRORS.load(Ordering::Relaxed) {
                print_json_error(&err, code);
            }
            ExitCode::from(code)
        }
    }
}

/// Set once `--json` is known to be on (flag or `rlm.toml`): a run that fails before it
/// starts still gives a JSON reader a document.
static JSON_ERRORS: AtomicBool = AtomicBool::new(false);

/// Whether a failure prints a JSON error document on stdout: `--json` of `rlm run`, `rlm
/// bench` and `rlm eval`, given as a flag or in `rlm.toml`.
pub(crate) fn json_errors(on: bool) {
    JSON_ERRORS.store(on, Ordering::Relaxed);
}

/// `{"error": {...}}` on stdout, for a run that failed before it started.
fn print_json_error(err: &anyhow::Error, code: u8) {
    let document = serde_json::json!({
        "rlm_version": env!("CARGO_PKG_VERSION"),
        "error": {
            "message": err.to_string(),
            "causes": err.chain().skip(1).map(|c| c.to_string()).collect::<Vec<_>>(),
            "usage_error": code == 2,
            "exit_code": code,
        }
    });
    let text = serde_json::to_string_pretty(&document).unwrap_or_default();
    let _ = writeln!(std::io::stdout().lock(), "{}", secrets::redact(&text));
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => {
            let file = run::load_config_file(cli.config.as_deref())?;
            let path = run::config_file_path(cli.config.as_deref());
            run::execute(*args, file, path.as_deref(), cli.verbose)
        }
        Command::Chat(args) => {
            let file = run::load_config_file(cli.config.as_deref())?;
            let path = run::config_file_path(cli.config.as_deref());
            chat::execute(*args, file, path.as_deref(), cli.verbose)
        }
        Command::Demo(args) => {
            let file = run::load_config_file(cli.config.as_deref())?;
            let path = run::config_file_path(cli.config.as_deref());
            demo::execute(*args, file, path.as_deref(), cli.verbose)
        }
        Command::Bench(args) => {
            let file = run::load_config_file(cli.config.as_deref())?;
            bench::execute(*args, file)
        }
        Command::Eval(args) => {
            let file = run::load_config_file(cli.config.as_deref())?;
            let path = run::config_file_path(cli.config.as_deref());
            eval::execute(*args, file, path.as_deref())
        }
        Command::Agent(args) => {
            let file = run::load_config_file(cli.config.as_deref())?;
            agent::execute(*args, file, cli.verbose)
        }
        Command::Show(args) => show::execute(&args),
        Command::MockLm(args) => {
            kernel::runtime::shared().block_on(mock_lm::serve(args))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::View(args) => view::execute(args),
        Command::Flow(args) => {
            let file = run::load_config_file(cli.config.as_deref())?;
            flow::execute(args, file)
        }
    }
}

/// A mistake in how `rlm` was called (exit code 2), as opposed to a failure while running.
#[derive(Debug)]
pub(crate) struct UsageError(String);

impl UsageError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A limit refused the work before it started (exit code 3, as for a run a limit stopped).
#[derive(Debug)]
pub(crate) struct LimitError(String);

impl LimitError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl std::fmt::Display for LimitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LimitError {}
