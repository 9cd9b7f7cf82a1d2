//! Integration tests of the bridge over real HTTP against the mock LM server.

mod anthropic;
mod batch;
mod budget;
mod budget_tree;
mod cancel;
mod errors;
mod interop;
mod mock;
mod openai;
mod retry;
mod secrets;
mod support;
mod tools;
