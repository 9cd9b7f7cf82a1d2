//! End-to-end tests of the real `rlm` binary against the mock LM server on 127.0.0.1.
//!
//! Each test starts a mock server in-process with a script for the root model (`root-model`,
//! replies by turn) and the sub-model (`sub-model`), runs `rlm` as a child process, and asserts
//! on its exit code, stdout, stderr, trajectory file and the server's request log.

// The tests make their fixtures with plain file writes; the rule that every write goes through
// the output guard (`kernel/cli/clippy.toml`) is the binary's.
#![allow(clippy::disallowed_methods)]

mod support;

mod agent;
mod bench;
mod chat;
mod cli_errors;
mod contexts;
mod demo;
mod doctor;
mod dry_run;
mod eval;
mod fatal_cells;
mod final_answers;
mod flow;
mod flow_durable;
mod flow_postgres;
mod flow_run;
mod flow_tools;
mod hostile;
mod isolation;
mod limits;
mod messages;
mod mock_lm;
mod options;
mod outputs;
mod plan_discover;
mod plan_discover_resume;
mod processes;
mod readme;
mod recursion;
mod run;
mod run_database;
mod secrets;
mod skills;
mod template;
mod trace;
mod view;
