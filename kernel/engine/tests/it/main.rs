//! Integration tests of the workflow engine: one binary, a module per area.

mod graph;
mod scoping;
mod support;
