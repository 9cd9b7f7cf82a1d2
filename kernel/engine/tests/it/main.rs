//! Integration tests of the workflow engine: one binary, a module per area.
//!
//! The bundle tests run against copies of the real agent-bundle fixtures in
//! `shared/fixtures/bmad/` (found by walking up from the workspace), in temporary folders so
//! that documents can be written.

mod agent_loop;
mod agent_support;
mod agent_transcript;
mod bundle_fixtures;
mod bundle_sandbox;
mod bundle_support;
mod callbacks;
mod control;
mod durable_nested;
mod durable_roots;
mod file;
mod file_wire;
mod graph;
mod heap;
mod limits;
mod llm;
mod persona;
mod router;
mod scoping;
mod skills;
mod state;
mod support;
mod workflow;
mod writes;
