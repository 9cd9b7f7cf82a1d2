//! `rlm run`: resolve the configuration, build the endpoints and the session, run the loop,
//! print the answer.
//!
//! Precedence of every option: flag > environment variable > `rlm.toml` (`[run]` table) >
//! built-in default. Output contract: progress and the trace go to stderr; the final answer is
//! the last line(s) of stdout (or the whole result as JSON with `--json`); the exit code says
//! how the run ended (`exit::RunOutcome`).

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use bridge::Endpoints;
use clap::Args;
use kernel::repl::ReplSession;
use kernel::rlm::Rlm;

use kernel::options::{Keys, RunOptions};

use crate::contexts::{self, ContextArgs};
use crate::endpoints;
use crate::exit::{self, UsageError};
use crate::observe::{Display, run_loop};
use crate::outputs::{Guard, Inputs};
use crate::report::{self, option_inputs, run_outputs};
use crate::secrets;
use crate::settings::{RunFlags, Switches, offers};

/// Arguments of `rlm run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) context: ContextArgs,

    /// The question to answer about the context.
    #[arg(long, short = 'q')]
    pub(crate) query: String,

    /// Load the contexts and print the exact first request to the root model (system prompt,
    /// context description, query), then stop: no model is called.
    #[arg(long)]
    pub(crate) dry_run: bool,

    #[command(flatten)]
    pub(crate) options: RunFlags<{ offers::RUN }>,
}

/// The model name a dry run's endpoints carry when none is given (nothing is sent).
const NO_MODEL: &str = "(no model given)";

/// `--dry-run`: the first root-model request as it would be sent, on stdout; with `--json`
/// also the options the run would use (flags, environment and `rlm.toml` merged).
fn print_first_request(
    rlm: &Rlm,
    endpoints: &Endpoints,
    query: &str,
    opts: &RunOptions,
) -> Result<()> {
    // As the bridge would send them: with known secrets redacted.
    let mut messages = rlm.first_messages(query);
    let redactor = bridge::secret::redactor();
    for message in &mut messages {
        redactor.redact_in_place(&mut message.content);
    }
    let root = endpoints.get(&rlm.config().root_endpoint)?;
    let endpoint = root.config();
    let mut out = std::io::stdout().lock();
    if opts.json() {
        let request = serde_json::json!({
            "dry_run": true,
            "provider": endpoint.provider.to_string(),
            "base_url": endpoint.base_url,
            "model": opts.model,
            "messages": messages,
            "options": opts.to_map(),
        });
        serde_json::to_writer_pretty(&mut out, &request)?;
        writeln!(out)?;
    } else {
        let model = match &opts.model {
            Some(model) => format!("`{model}`"),
            None => "the root model (no `--model` given)".to_owned(),
        };
        writeln!(
            out,
            "First request to {model} at {} ({}):",
            endpoint.base_url, endpoint.provider
        )?;
        for message in &messages {
            writeln!(
                out,
                "\n── {} ─────────────\n{}",
                message.role.as_str(),
                message.content.trim_end()
            )?;
        }
    }
    out.flush()?;
    eprintln!("Dry run: no model was called.");
    Ok(())
}

/// `rlm run`; `config` is the `--config` file, if given.
pub(crate) fn execute(args: RunArgs, config: Option<&Path>, verbosity: u8) -> Result<ExitCode> {
    if args.query.trim().is_empty() {
        return Err(UsageError::new(
            "`--query` is empty; ask a question about the context, e.g. `--query \"Which service failed first?\"`",
        )
        .into());
    }
    let settings = args.options.settings(config)?;
    let opts = settings.opts;
    // First, while the process has one thread and no Python: keys leave the environment.
    secrets::protect(&opts)?;
    exit::json_errors(opts.json());
    // Every option is checked before the context loads: a big context can take a while. A
    // dry run sends nothing, so it needs no API key and no model: the request can be checked
    // before either is chosen.
    let endpoints = if args.dry_run {
        let model = opts.model.clone().or_else(|| Some(NO_MODEL.to_owned()));
        let placeholder = RunOptions {
            model,
            ..opts.clone()
        };
        endpoints::endpoints(&placeholder, Keys::Optional)?
    } else {
        endpoints::endpoints(&opts, Keys::Required)?
    };
    let config = endpoints::rlm_config(&opts)?;
    let session_config = endpoints::session_config(&opts)?;
    let contexts = contexts::resolve(&args.context.contexts)?;
    let mut inputs = Inputs::new();
    for path in &contexts.paths {
        inputs.context(path);
    }
    option_inputs(&mut inputs, &opts, settings.file.as_deref());
    let outputs = run_outputs(&opts, &mut Guard::new(inputs, opts.force()))?;
    let session =
        ReplSession::with_inputs(session_config, Arc::clone(&endpoints), &contexts.inputs)
            .context("Could not load the context")?;
    contexts::print_warnings(session.contexts());
    crate::observe::report_isolation(&session);
    if args.dry_run {
        let rlm = Rlm::new(config, Arc::clone(&endpoints), Arc::new(session));
        print_first_request(&rlm, &endpoints, &args.query, &opts)?;
        return Ok(ExitCode::SUCCESS);
    }
    let display = Display::choose(&opts, verbosity, Display::Progress);
    let result = run_loop(
        &args.query,
        config,
        endpoints,
        Arc::new(session),
        outputs.trajectory,
        display,
    )?;
    Ok(report::report(&result, &opts, &args.query, outputs.answer.as_ref())?.exit_code())
}
