//! `--context` arguments and the flags that say how files load.
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
use clap::{Args, ValueEnum};
use kernel::repl::{
    ContextInput, ContextMetadata, ContextSource, FrameLibrary, LoadOptions, check_context_name,
    check_encoding,
};

use crate::exit::UsageError;

/// The contexts of a run and how they load.
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

    /// CSV field separator, one character (`tab` for a tab) [default: sniffed from `,` `;` tab `|`].
    #[arg(long, value_name = "CHAR")]
    pub(crate) csv_sep: Option<String>,

    /// Leave out CSV rows with more fields than the header (and say how many) instead of failing.
    #[arg(long)]
    pub(crate) csv_skip_bad_rows: bool,

    /// Encoding of text, JSON and CSV files, e.g. `latin-1`, `cp1252`, `utf-16` [default: UTF-8].
    #[arg(long, value_name = "CODEC")]
    pub(crate) encoding: Option<String>,

    /// The library of the data frames tables load as.
    #[arg(
        long = "as",
        value_enum,
        value_name = "LIBRARY",
        default_value = "polars"
    )]
    pub(crate) frames: FramesArg,
}

/// Data-frame libraries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum FramesArg {
    /// `polars.DataFrame`.
    Polars,
    /// `pandas.DataFrame` (converted from polars).
    Pandas,
}

/// What to load, resolved from [`ContextArgs`].
#[derive(Debug)]
pub(crate) struct Contexts {
    pub(crate) inputs: Vec<ContextInput>,
    /// The paths read (for the check that no output overwrites an input).
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) load: LoadOptions,
}

impl ContextArgs {
    /// Parses the arguments; bad names, separators and encodings are usage errors.
    pub(crate) fn resolve(&self) -> Result<Contexts> {
        let inputs = self
            .contexts
            .iter()
            .map(parse_context)
            .collect::<Result<Vec<_>>>()?;
        let paths = inputs
            .iter()
            .filter_map(|i| match &i.source {
                ContextSource::Path(p) => Some(p.clone()),
                _ => None,
            })
            .collect();
        let csv_separator = self.csv_sep.as_deref().map(separator).transpose()?;
        if let Some(encoding) = &self.encoding {
            check_encoding(encoding).map_err(|e| UsageError::new(format!("`--encoding`: {e}")))?;
        }
        let load = LoadOptions {
            csv_separator,
            skip_bad_rows: self.csv_skip_bad_rows,
            encoding: self.encoding.clone(),
            frames: match self.frames {
                FramesArg::Polars => FrameLibrary::Polars,
                FramesArg::Pandas => FrameLibrary::Pandas,
            },
        };
        Ok(Contexts {
            inputs,
            paths,
            load,
        })
    }
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

/// `--csv-sep`: one ASCII character, `tab` or `\t`.
fn separator(text: &str) -> Result<u8> {
    match text {
        "tab" | "\\t" | "\t" => return Ok(b'\t'),
        _ => {}
    }
    match text.as_bytes() {
        [b] if b.is_ascii() && !matches!(b, b'"' | b'\n' | b'\r') => Ok(*b),
        _ => Err(UsageError::new(format!(
            "`--csv-sep` takes one ASCII character other than a quote or newline (or `tab`), e.g. `--csv-sep ';'`; got `{text}`"
        ))
        .into()),
    }
}

/// Prints what users should know about the loaded contexts (empty, rows or files skipped).
pub(crate) fn print_warnings(contexts: &[ContextMetadata]) {
    for warning in contexts.iter().flat_map(ContextMetadata::warnings) {
        eprintln!("warning: {warning}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_accept_one_character_or_tab() {
        assert_eq!(separator(";").ok(), Some(b';'));
        assert_eq!(separator("tab").ok(), Some(b'\t'));
        assert_eq!(separator("\\t").ok(), Some(b'\t'));
        assert!(separator(";;").is_err());
        assert!(separator("\"").is_err());
        assert!(separator("é").is_err());
    }
}
