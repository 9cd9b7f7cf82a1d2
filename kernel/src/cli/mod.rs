//! The `rlm` command line: argument parsing, configuration and the subcommands.

pub(crate) mod args;
pub(crate) mod mock_lm;
