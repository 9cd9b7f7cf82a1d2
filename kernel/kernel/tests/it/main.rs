//! Integration tests of the kernel: one binary, a module per area.

mod context;
mod fatal;
mod flow;
mod flow_tools;
mod natives;
mod repl;
mod rlm;
mod support;
mod tools;
mod tree;
