//! The `rlm` command line: argument parsing, configuration and the subcommands.

pub(crate) mod args;
pub(crate) mod demo;
pub(crate) mod mock_lm;
pub(crate) mod run;
pub(crate) mod trace;
