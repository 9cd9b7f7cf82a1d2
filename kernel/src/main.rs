//! `rlm`: the command-line front end of rlm-kernel.

mod cli;

use std::process::ExitCode;

use clap::Parser;

use cli::args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err}");
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::MockLm(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(cli::mock_lm::serve(args))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(_) | Command::Demo(_) => anyhow::bail!("not yet wired"),
    }
}
