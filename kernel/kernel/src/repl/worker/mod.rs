//! Isolated sessions: the session's Python in a worker process of its own.
//!
//! The parent (the `rlm` process, or the Python package's host) keeps what must not be in
//! the reach of model-written code: the endpoints with their keys, the budget and ledger,
//! the trajectory. The worker holds the embedded interpreter and the contexts, and is
//! confined at its start (`confinement`). They talk over a Unix socket pair (`protocol`):
//!
//! ```text
//!  parent (parent.rs)                              worker (child.rs)
//!  ReplSession ─ exec ▸ ─────────────────────────▸ LocalSession runs the block
//!              ◂ output chunks ◂ ────────────────  stdout/stderr as written
//!  bridge     ◂ llm_query / llm_query_batched ◂─  natives (SubCallRoute::Remote)
//!             ─ answers ▸ ───────────────────────▸
//!              ─ interrupt ▸ ─────────────────────▸ watchdog
//!              ◂ reply / exit status ◂ ───────────
//! ```
//!
//! - `spawn`: which program is the worker ([`WorkerProgram`]: `rlm __worker`, or
//!   `python -m rlm_kernel._worker`), its environment (an allow-list: keys never enter it),
//!   its file descriptors.
//! - `template`: the worker template, a fork server: a worker process with its interpreter
//!   started that forks each session's worker, so that it skips `exec` and that start.
//! - `pool`: while a run with `rlm_query` children lives, workers forked from the template
//!   and confined ahead of need, so that a child's start is its session's start only.
//! - `quiet`: the pool's background work (the next worker's confinement, a closed worker's
//!   exit) held until a run of the process waits for a model, off the children's hops.
//! - `turns`: what the worker's threads take turns at reading the link with (the main
//!   thread, the idle session thread, a thread waiting for a sub-call's answer), so that a
//!   request or a sub-call's answer wakes one thread of the worker, not two.
//! - `transfer`: contexts are paths the worker reads itself; text, standard input and the
//!   Python package's live objects go once into sealed memfds the worker maps (`share.py`).
//! - `scratch`: each worker's scratch directory, removed with its session (or the pool's
//!   idle worker); those a process ended by `kill -9` left, provably dead (a lock the
//!   kernel dropped) and empty, removed by the next process.
//! - `journal`: what a crashed worker's session is rebuilt from; each block keeps the record
//!   of its sub-calls' answers ([`bridge::record`]), so a replay asks no model again.
//! - `parent`: `WorkerSession`, the session as the parent sees it:
//!   stops a block stuck in native code by ending the worker, and survives the worker's end;
//!   the worker code's `rlm_query` children run on its `threads`, kept for the next call.
//!
//! # Example
//! A program that embeds the kernel registers itself as the worker program and serves as
//! one when started so (as `rlm` does):
//! ```no_run
//! use kernel::repl::{WorkerProgram, serve_if_worker, set_worker_program};
//!
//! fn main() -> std::process::ExitCode {
//!     if let Some(code) = serve_if_worker() {
//!         return code;
//!     }
//!     set_worker_program(WorkerProgram::this_executable());
//!     // ... sessions with `isolation: Isolation::Process` now run in workers.
//!     std::process::ExitCode::SUCCESS
//! }
//! ```

mod child;
mod closer;
mod confinement;
mod huge_code;
mod journal;
mod lock;
pub(crate) mod parent;
mod policy;
mod pool;
mod protocol;
mod quiet;
mod scratch;
mod spawn;
mod template;
mod threads;
mod transfer;
mod turns;

pub use child::{main as worker_main, serve_if_worker};
pub use huge_code::{HugeCode, HugeCodeRefused, try_huge_code, use_huge_code};
pub use policy::worker_policy;
pub use pool::use_worker_pool;
pub(crate) use pool::{ReadyWorkers, Shape, keep_ready};
pub(crate) use quiet::in_flight;
#[cfg(test)]
pub(crate) use quiet::timers_armed;
pub use spawn::{WORKER_ARG, WorkerProgram, set_worker_program};
pub use template::{TEMPLATE_NAME, use_worker_template};

/// Has the next isolated session of `config` in this process find its worker warm, without
/// waiting: the template running (or a spare started) unless no worker program is
/// registered; nothing while a run keeps workers ready (`pool`: a session that starts orders
/// the next on the pool's thread, and the template is the pool's to keep running).
pub(crate) fn prepare_worker() {
    if pool::in_use() {
        return;
    }
    if let Some(program) = spawn::worker_program() {
        template::prepare_next(&program);
    }
}
