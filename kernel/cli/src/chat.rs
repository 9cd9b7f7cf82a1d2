//! `rlm chat`: follow-up questions over contexts loaded once.
//!
//! The contexts load once into one REPL session; each question runs the RLM loop in it
//! ([`RlmChat`]), so variables made for one question are there for the next, and the root model
//! sees a bounded summary of earlier questions and answers (`--summary-chars`). On a terminal,
//! questions are read with line editing and history (rustyline); otherwise one question per
//! line of standard input, blank lines skipped, until end of input. Each answer goes to stdout,
//! the closing line of each run to stderr. Ctrl-C during a question stops the chat as it stops
//! `rlm run` (best answer printed, exit 130); Ctrl-C or Ctrl-D at the prompt ends the chat.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use kernel::options::RunOptions;
use kernel::repl::{ContextSource, ReplSession};
use kernel::rlm::{Rlm, RlmChat};

use crate::contexts::ContextArgs;
use crate::endpoints;
use crate::exit::{RunOutcome, UsageError};
use crate::observe::{self, Display};
use crate::outputs::{Guard, Inputs};
use crate::questions::Questions;
use crate::report::{self, option_inputs, run_outputs};
use crate::settings::{RunFlags, Switches, at_least, offers};

/// Arguments of `rlm chat`.
#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    // Loaded once; `-` is refused (questions come from standard input).
    #[command(flatten)]
    pub(crate) context: ContextArgs,

    /// Characters of the summary of earlier questions and answers the root model sees with
    /// each new question (the most recent that fit; 0 for none) [default: 4000].
    #[arg(long, value_name = "CHARS", value_parser = at_least::<usize>(0))]
    pub(crate) summary_chars: Option<usize>,

    #[command(flatten)]
    pub(crate) options: RunFlags<{ offers::RUN }>,
}

/// `rlm chat`; `config` is the `--config` file, if given.
pub(crate) fn execute(args: ChatArgs, config: Option<&Path>, verbosity: u8) -> Result<ExitCode> {
    let settings = args.options.settings(config)?;
    if settings.flags.answer_file.is_some() {
        return Err(UsageError::new(
            "`--answer-file` holds one answer; `rlm chat` prints each answer on stdout instead",
        )
        .into());
    }
    // One answer file in a shared `rlm.toml` is for `rlm run`.
    let opts = RunOptions {
        answer_file: None,
        ..settings.opts
    };
    // First, while the process has one thread and no Python: keys leave the environment.
    crate::secrets::protect(&opts)?;
    let contexts = crate::contexts::resolve(&args.context.contexts)?;
    if contexts
        .inputs
        .iter()
        .any(|i| i.source == ContextSource::Stdin)
    {
        return Err(UsageError::new(
            "`rlm chat` reads its questions from standard input, so `-` cannot be a context; pass a file",
        )
        .into());
    }
    let endpoints = endpoints::build_endpoints(&opts)?;
    let config = endpoints::rlm_config(&opts)?;
    let session_config = endpoints::session_config(&opts)?;
    let mut inputs = Inputs::new();
    for path in &contexts.paths {
        inputs.context(path);
    }
    option_inputs(&mut inputs, &opts, settings.file.as_deref());
    let outputs = run_outputs(&opts, &mut Guard::new(inputs, opts.force()))?;
    let session =
        ReplSession::with_inputs(session_config, Arc::clone(&endpoints), &contexts.inputs)
            .context("Could not load the context")?;
    crate::contexts::print_warnings(session.contexts());
    observe::report_isolation(&session);
    let display = Display::choose(&opts, verbosity, Display::Progress);
    let rlm = Rlm::new(config, endpoints, Arc::new(session));
    let mut chat = RlmChat::new(rlm);
    if let Some(chars) = args.summary_chars {
        chat = chat.with_summary_limit(chars);
    }
    let observed = observe::observe(chat.rlm(), outputs.trajectory, display)?;
    let mut questions = Questions::open("? ")?;
    let mut last = RunOutcome::Answered;
    while let Some(question) = questions.next()? {
        let result = observed.run(|| chat.ask(&question))?;
        last = report::report(&result, &opts, &question, None)?;
        std::io::stdout().flush()?;
        if last == RunOutcome::Interrupted {
            break;
        }
    }
    Ok(last.exit_code())
}
