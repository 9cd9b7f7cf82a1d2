//! `rlm chat`: follow-up questions over contexts loaded once.
//!
//! The contexts load once into one REPL session; each question runs the RLM loop in it
//! ([`RlmChat`]), so variables made for one question are there for the next, and the root model
//! sees a bounded summary of earlier questions and answers (`--summary-chars`). On a terminal,
//! questions are read with line editing and history (rustyline); otherwise one question per
//! line of standard input, blank lines skipped, until end of input. Each answer goes to stdout,
//! the closing line of each run to stderr. Ctrl-C during a question stops the chat as it stops
//! `rlm run` (best answer printed, exit 130); Ctrl-C or Ctrl-D at the prompt ends the chat.

use std::io::{BufRead, IsTerminal as _, Write as _};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use kernel::repl::{ContextSource, ReplSession};
use kernel::rlm::{Rlm, RlmChat};
use rustyline::error::ReadlineError;

use crate::UsageError;
use crate::args::{ChatArgs, RunOptions};
use crate::report;
use crate::run::{self, Display, RunOutcome};

/// Where the questions (or, for `rlm agent`, the turns) come from.
pub(crate) enum Questions {
    /// A terminal: line editing and history, with its prompt.
    Editor(Box<rustyline::DefaultEditor>, &'static str),
    /// A pipe or file: one question per line.
    Lines(std::io::StdinLock<'static>),
}

impl Questions {
    /// A terminal with `prompt` when stdin is one, else stdin's lines.
    pub(crate) fn open(prompt: &'static str) -> Result<Self> {
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            let editor = rustyline::DefaultEditor::new()
                .context("Could not set up line editing on the terminal")?;
            Ok(Self::Editor(Box::new(editor), prompt))
        } else {
            Ok(Self::Lines(stdin.lock()))
        }
    }

    /// The next non-blank question; `None` at the end of input.
    pub(crate) fn next(&mut self) -> Result<Option<String>> {
        loop {
            let line = match self {
                Self::Editor(editor, prompt) => match editor.readline(*prompt) {
                    Ok(line) => {
                        let _ = editor.add_history_entry(line.as_str());
                        line
                    }
                    Err(ReadlineError::Eof | ReadlineError::Interrupted) => return Ok(None),
                    Err(e) => return Err(e).context("Could not read a question"),
                },
                Self::Lines(stdin) => {
                    let mut line = String::new();
                    if stdin
                        .read_line(&mut line)
                        .context("Could not read a question from standard input")?
                        == 0
                    {
                        return Ok(None);
                    }
                    line
                }
            };
            if !line.trim().is_empty() {
                return Ok(Some(line.trim().to_owned()));
            }
        }
    }
}

/// `rlm chat`.
pub(crate) fn execute(
    args: ChatArgs,
    file: RunOptions,
    config_path: Option<&Path>,
    verbosity: u8,
) -> Result<ExitCode> {
    let opts = run::merge(args.options, file);
    // First, while the process has one thread and no Python: keys leave the environment.
    crate::secrets::protect(&opts)?;
    let contexts = args.context.resolve()?;
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
    if opts.answer_file.is_some() {
        return Err(UsageError::new(
            "`--answer-file` holds one answer; `rlm chat` prints each answer on stdout instead",
        )
        .into());
    }
    let endpoints = run::build_endpoints(&opts)?;
    let config = run::rlm_config(&opts)?;
    let mut session_config = run::session_config(&opts)?;
    session_config.load = contexts.load;
    let mut inputs = contexts.paths;
    inputs.extend(run::option_inputs(&opts, config_path));
    run::check_outputs(&opts, &inputs)?;
    let session =
        ReplSession::with_inputs(session_config, Arc::clone(&endpoints), &contexts.inputs)
            .context("Could not load the context")?;
    crate::contexts::print_warnings(session.contexts());
    let display = Display::choose(&opts, verbosity, Display::Progress);
    let rlm = Rlm::new(config, endpoints, Arc::new(session));
    let mut chat = RlmChat::new(rlm);
    if let Some(chars) = args.summary_chars {
        chat = chat.with_summary_limit(chars);
    }
    let observed = run::observe(chat.rlm(), opts.trajectory.as_deref(), display)?;
    let mut questions = Questions::open("? ")?;
    let mut last = RunOutcome::Answered;
    while let Some(question) = questions.next()? {
        let result = observed.run(|| chat.ask(&question))?;
        last = report::report(&result, &opts, &question)?;
        std::io::stdout().flush()?;
        if last == RunOutcome::Interrupted {
            break;
        }
    }
    Ok(last.exit_code())
}
