//! `rlm`: the command-line front end of rlm-kernel.
//!
//! Exit codes: 0 the model gave a final answer; 1 an error (bad input, unreachable endpoint,
//! failed run); 2 a usage error; 3 a limit stopped the run (iterations, time, budget, repeated
//! failures) — a partial or fallback answer may still have been printed; 130 Ctrl-C stopped
//! the run (the first Ctrl-C stops it gracefully, keeping its best answer and trajectory; a
//! second one quits at once).

mod args;
mod chat;
mod demo;
mod logging;
mod mock_lm;
mod outputs;
mod run;
mod show;
mod trace;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.verbose);
    match dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err}");
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            if err.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
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
        Command::Show(args) => show::execute(&args),
        Command::MockLm(args) => {
            kernel::runtime::shared().block_on(mock_lm::serve(args))?;
            Ok(ExitCode::SUCCESS)
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
