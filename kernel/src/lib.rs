//! The rlm kernel.

pub mod repl;
pub mod rlm;
