//! The rlm kernel: the embedded Python REPL ([`repl`]), the RLM loop ([`rlm`]), the
//! Python-backed agent [`tools`], the workflow agents that need Python ([`flow`]) and the
//! process-wide tokio [`runtime`]; [`fatal`] reports a crash in C code before the process
//! dies; [`eval`] generates long-context tasks with exact scorers (no Python); [`options`]
//! resolves a run's options (the `rlm run` flags, the Python keywords) to its configurations.

pub mod eval;
pub mod fatal;
pub mod flow;
pub mod options;
pub mod repl;
pub mod rlm;
pub mod runtime;
pub mod tools;
