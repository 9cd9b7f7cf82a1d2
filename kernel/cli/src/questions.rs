//! Where the questions of `rlm chat` and the turns of `rlm agent` come from: a terminal with
//! line editing and history (rustyline), or one per line of standard input, blank lines
//! skipped, until end of input.

use std::io::{BufRead, IsTerminal as _};

use anyhow::{Context, Result};
use rustyline::error::ReadlineError;

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
