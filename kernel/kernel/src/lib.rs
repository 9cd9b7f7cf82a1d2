//! The rlm kernel: the embedded Python REPL ([`repl`]), the RLM loop ([`rlm`]) and the
//! process-wide tokio [`runtime`].

pub mod repl;
pub mod rlm;
pub mod runtime;
