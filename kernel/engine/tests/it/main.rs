//! Integration tests of the workflow engine: one binary, a module per area.

mod callbacks;
mod file;
mod graph;
mod limits;
mod scoping;
mod session;
mod state;
mod support;
