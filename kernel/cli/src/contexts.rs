//! `--context` arguments: what a run loads (how files load is a run option of the schema).
//!
//! A `--context` argument is `-` (standard input), a path, or `NAME=PATH`. The rule, so that
//! a file whose name contains `=` still loads: an argument that names an existing file or
//! directory is a path; otherwise one whose text before the first `=` has no `/` is
//! `NAME=PATH` (`./a=b.csv` is always a path). NAME becomes a variable beside `context_N`
//! and is checked before anything loads (a Python identifier, not a keyword, builtin or
//! kernel name): a bad one is a usage error.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use kernel::repl::{ContextInput, ContextMetadata, ContextSource, check_context_name};

use crate::exit::UsageError;

/// The contexts of a run (how they load is a run option: `--csv-sep`, `--encoding`, `--as`,
/// `--csv-skip-bad-rows`).
#[derive(Debug, Args)]
pub(crate) struct ContextArgs {
    /// Context file(s) or directory; `-` reads standard input; `NAME=PATH` also names it
    /// `NAME` in the REPL. Several become `context_0 … context_n`.
    #[arg(
        long = "context",
        short = 'c',
        value_name = "[NAME=]PATH",
        num_args = 1..,
        required = true
    )]
    pub(crate) contexts: Vec<OsString>,
}

/// What to load, resolved from [`ContextArgs`].
#[derive(Debug)]
pub(crate) struct Contexts {
    pub(crate) inputs: Vec<ContextInput>,
    /// The paths read (for the check that no output overwrites an input).
    pub(crate) paths: Vec<PathBuf>,
}

/// Parses `--context` arguments; a bad name is a usage error.
pub(crate) fn resolve(contexts: &[OsString]) -> Result<Contexts> {
    let inputs = contexts
        .iter()
        .map(parse_context)
        .collect::<Result<Vec<_>>>()?;
    for (i, input) in inputs.iter().enumerate() {
        let Some(name) = &input.name else { continue };
        if inputs[..i]
            .iter()
            .any(|earlier| earlier.name.as_ref() == Some(name))
        {
            return Err(UsageError::new(format!(
                "`--context {}`: the name `{name}` is given to two contexts; pick another, e.g. \
                 `-c sales=sales.csv`",
                contexts[i].to_string_lossy()
            ))
            .into());
        }
    }
    let paths = inputs
        .iter()
        .filter_map(|i| match &i.source {
            ContextSource::Path(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    Ok(Contexts { inputs, paths })
}

fn parse_context(arg: &OsString) -> Result<ContextInput> {
    let plain = |source| ContextInput { name: None, source };
    if arg == "-" {
        return Ok(plain(ContextSource::Stdin));
    }
    let as_path = || plain(ContextSource::Path(PathBuf::from(arg)));
    if Path::new(arg).exists() {
        return Ok(as_path());
    }
    let Some((name, path)) = arg.to_str().and_then(|text| text.split_once('=')) else {
        return Ok(as_path());
    };
    if name.contains('/') || name.contains(std::path::MAIN_SEPARATOR) {
        return Ok(as_path());
    }
    let text = arg.to_string_lossy();
    check_context_name(name).map_err(|e| {
        UsageError::new(format!(
            "`--context {text}`: {e} (a file whose name holds `=` loads as a path when it exists, or as `./{text}`)"
        ))
    })?;
    if path.is_empty() {
        return Err(UsageError::new(format!(
            "`--context {text}` names no path after `=`; write `NAME=PATH`, e.g. `-c sales=sales.csv`"
        ))
        .into());
    }
    Ok(ContextInput {
        name: Some(name.to_owned()),
        source: ContextSource::from_arg(path),
    })
}

/// Prints what users should know about the loaded contexts (empty, rows or files skipped).
pub(crate) fn print_warnings(contexts: &[ContextMetadata]) {
    for warning in contexts.iter().flat_map(ContextMetadata::warnings) {
        eprintln!("warning: {warning}");
    }
}
