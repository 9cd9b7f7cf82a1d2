//! The embedded Python REPL: a persistent namespace over CPython where a model's code meets
//! a huge context and the sub-models.
//!
//! # Pieces
//! - [`session`](ReplSession): the `Send + Sync` handle, over one of two backends
//!   ([`SessionConfig::isolation`]): in this process (`local`: each session owns one
//!   dedicated thread that holds its Python namespace and runs its blocks; calls send jobs
//!   over a channel and wait, bounded, for the reply; sessions in one process share the
//!   interpreter and interleave through the GIL, each with its own globals, captures and
//!   watchdog), or in a confined worker process of its own ([`worker`]: the same local
//!   session there, the parent keeping the endpoints, keys, ledger and output).
//! - `exec` + `capture`: a block is compiled as `<repl-block-N>`, run directly in the
//!   globals, a final bare expression's `repr` is shown (like IPython), stdout/stderr go to
//!   bounded head+tail buffers (`sys.stdout` routes each thread's writes to its session's
//!   capture; threads a block starts belong to its session).
//! - `interrupt`: the watchdog that stops a block at its time limit or on cancellation —
//!   asynchronous `CellTimeout` (a `BaseException`, re-raised until the block ends), a stop
//!   event that wakes the patched `time.sleep`, and cancellation of in-flight sub-calls.
//! - `stop_watch`: a stop run by the thread that cancels a token (a block's, a session's, a
//!   run's), with no task or thread watching it: an isolated block's and an `rlm_query`
//!   child's.
//! - `natives`: `llm_query` / `llm_query_batched` in Rust on the bridge (GIL released while
//!   waiting); `children`: `rlm_query` / `rlm_query_batched`, run by the `ChildRunner` the
//!   RLM loop sets on the session (`ReplSession::set_children`), else `llm_query`; `support.py` adds
//!   `FINAL_VAR`, `SHOW_VARS` and the `answer` dict.
//! - `source`: what to load ([`ContextInput`]: a [`ContextSource`] and an optional variable
//!   name; [`LoadOptions`]); `detect`: what a file is from its first bytes (compression,
//!   tables, binaries); `context`: the loaders (text, JSON, JSON lines, tables and workbooks
//!   via Python polars, directories, stdin) and [`ContextMetadata`].
//! - `error`: [`ReplError`] — only kernel failures; Python exceptions are data in
//!   [`ExecutionResult::error`].
//!
//! # Data flow of one block
//! `exec(code)` → job → session thread: compile → arm watchdog → run (GIL held; released in
//! `llm_query`, `time.sleep`, I/O) → disarm → describe exception → restore reserved names →
//! collect output, sub-call records, variables, final answer → [`ExecutionResult`].
//!
//! # What a model's code sees
//! - `context`, `context_0…n`, the contexts' own names (`sales=sales.csv`), `llm_query`,
//!   `llm_query_batched`, `rlm_query`, `rlm_query_batched`, `FINAL_VAR`, `SHOW_VARS`,
//!   `answer` and `LlmQueryError` are reserved: put back (with a note on stderr) after a block
//!   that rebinds or deletes them. The model's own variables are never touched.
//! - A final bare expression is shown like IPython: `repr(value)` on stdout unless `None`.
//! - Final answers: `FINAL_VAR(x)` records `str(x)`, or, when `x` is a str naming a variable,
//!   that variable's `str()`. `answer["ready"] = True` records `str(answer["content"])` at
//!   that moment, and again when `content` changes while `ready` stays truthy (so both
//!   assignment orders work); `answer.update(...)` or rebinding `answer` to a ready dict is
//!   caught after the block. A block's [`ExecutionResult::final_answer`] is the last recorded.
//! - `SHOW_VARS()` prints the user's variables (name, type, `len`, preview) and returns None;
//!   the same list is in [`ExecutionResult::variables`].
//! - Secrets: every value the process knows as secret ([`bridge::secret`]) is `[redacted]` in
//!   what the session reports — block output (redacted as it is written, so the head/tail cut
//!   never keeps half of one), exceptions, final answers, variable previews, `SHOW_VARS()` —
//!   so the model never reads one in a block's output, even one the code found on its own.
//!   In this process the session leaves the environment alone: removing API keys from it is
//!   the host's step (the `rlm` binary does it before Python starts); in a host's own
//!   interpreter (the Python package) `os.environ` is the user's, and only redaction applies.
//!   A worker's environment is built from an allow-list: no key ever enters it, and its
//!   output is captured and redacted by its parent, which knows the secrets.
//! - `sys.stdin` is empty (`input()` raises `EOFError`); `sys.exit()`, `exit()` and
//!   `KeyboardInterrupt` are reported as errors and the session goes on. So are the calls
//!   that would end the whole process: `os._exit(n)`, `os.abort()`, and `os.kill` of the
//!   session's own process (or its group) or `signal.raise_signal` with a signal whose default
//!   action ends or stops a process; each raises `ProcessExit` (a `SystemExit`) in the block.
//!   A forked child (a pool worker) keeps the real calls.
//!
//! # Processes
//! - The namespace is the dict of a module registered in `sys.modules` as
//!   `__rlm_session_N__` (N: [`ReplSession::id`]), never `__main__`, which stays the
//!   embedding host's. Functions, classes and named lambdas (`f = lambda ...` at the top of a
//!   block is compiled as `def f`) therefore pickle by reference, so `multiprocessing.Pool`
//!   and `ProcessPoolExecutor` map them. A block is the main program: in it
//!   `__name__ == "__main__"` holds, though `__name__` names the module.
//! - `fork` workers inherit the module. A `spawn` or `forkserver` worker is a fresh
//!   interpreter: the kernel writes a module file per session into a private temporary
//!   directory on the worker's `sys.path` (never the parent's) when a worker starts (one
//!   writer at a time, as sessions on other threads may start workers at once); the file
//!   re-creates every block's top-level imports, functions, classes and named lambdas from
//!   their source, then the data globals they name, copied by value up to 1 MiB each (a
//!   whole context is not copied: pass data as arguments), as spawn re-imports a script's
//!   `__main__`. When the kernel initialised the interpreter (the `rlm` binary),
//!   `sys.executable` is set to the Python whose library is embedded, which spawn runs.
//! - A forked child never returns into the runtime: when its copy of a block ends, it exits
//!   at once (`_exit`) with status 0, 1 after an exception, or the code of `sys.exit(code)`;
//!   its output goes to the copy of the block's capture and is lost, and it never touches
//!   the parent's trajectory, sockets or terminal. `llm_query` in a forked child raises
//!   `LlmQueryError` (kind `forked_child`): sub-model calls belong to the session's process.
//!   Pool workers' prints are lost too (a spawn worker's go to `/dev/null` once it loads the
//!   session module): workers return results.
//! - Processes a block starts (direct children, seen on Linux in `/proc`: every process whose
//!   parent is this one, also when the thread that started it has ended; and
//!   multiprocessing's own, such as forkserver workers) belong to the session. Those still
//!   running are terminated — pools through their own `terminate` (workers that ignore it
//!   are killed after 1 s), the others and their descendants with SIGTERM, then SIGKILL
//!   after 1 s — when the block is interrupted (cell timeout, cancellation), when a run ends
//!   ([`ReplSession::end_processes`]) and when the session closes. The host's own processes
//!   and multiprocessing's shared helpers (forkserver, resource tracker) are left alone,
//!   except that in an interpreter the kernel started (`rlm`, whose Python never runs its
//!   exit) the last session to close stops the forkserver, runs multiprocessing's exit
//!   finalizers, which remove its folder (`pymp-*`, the forkserver's socket) from `TMPDIR`,
//!   and stops the resource tracker; a session starting meanwhile (on another thread) waits
//!   for that end, which would take its pools too. That end waits at most 30 s for what a
//!   block left behind: a forkserver or resource tracker kept running by a process that holds
//!   its pipe (one a block forked and no session tracked) is then killed, and the feeder
//!   threads of queues whose data no process read are given up; stderr says so. Processes started between
//!   blocks by threads a block left running are not tracked. `/proc` is read only for a block that
//!   may have started a process: an audit hook (`sys.addaudithook`) sees the session's
//!   threads about to call `subprocess`, `os.system`, `os.fork`, `os.posix_spawn`, `pty` or
//!   look up a C function through `ctypes`, and the children are noted just before; a block
//!   that does none of these (most) costs no scan. A process a C extension starts on its own
//!   (or a `ctypes` function looked up in an earlier block) is not seen by it; in a worker,
//!   it still dies with the worker. In a confined worker, `/proc` is its PID namespace's own
//!   (mounted by the sandbox's init, the namespace's first process: the worker sees its own
//!   processes by the pids `os.kill` takes, and nothing of the machine's), and init adopts
//!   orphans: its children that started during a block (a double fork's daemon) count as
//!   the block's. Where the kernel refuses that `/proc` (see `rlm doctor`), an interrupted
//!   block's processes run on until the worker ends.
//!
//! # Limits of interruption
//! A timeout stops pure-Python code, `time.sleep` and `llm_query`/`llm_query_batched` (also
//! in threads the block started, e.g. a `ThreadPoolExecutor` mapping `llm_query`). Other
//! blocking C calls in the session thread (a bare `lock.acquire()`, a socket read, a
//! catastrophic regular expression, a C `sleep`) are interrupted only when they return. In a
//! worker, the parent then ends the worker half a second after the limit and restores the
//! session in a fresh one ([`ExecutionResult::restart`]); so it does after a crash in C code,
//! a C-level `exit()` or the memory limit. In this process (`isolation = none`), `exec`
//! returns [`ReplError::Unresponsive`] once the limit plus 10 s has passed and the session
//! stays busy until the call returns, and a crash in C code ends the process (see
//! [`crate::fatal`] for what is reported then).
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use bridge::{Budget, Endpoints, Ledger};
//! use kernel::repl::{ContextSource, ReplSession, SessionConfig};
//!
//! // No endpoints needed unless the code calls llm_query.
//! let endpoints = Arc::new(Endpoints::new(Vec::new(), Arc::new(Ledger::new(Budget::default())))?);
//! let session = ReplSession::new(
//!     SessionConfig::default(),
//!     endpoints,
//!     &[ContextSource::Text("alpha beta gamma".into())],
//! )?;
//! session.exec("words = context.split()")?;
//! let result = session.exec("len(words)")?;
//! assert_eq!(result.stdout, "3\n");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod capture;
mod children;
mod config;
mod context;
mod detect;
mod error;
mod exec;
mod interpreter;
mod interrupt;
mod local;
mod metadata;
mod natives;
mod plain;
mod pystr;
mod session;
mod source;
mod stop_watch;
pub mod worker;

pub use bridge::{Endpoints, Ledger, SubCallMetadata};
pub(crate) use children::{ChildAnswer, ChildQuery, ChildRunner};
pub use config::{Isolation, OnCrash, SessionConfig, UnknownIsolation, UnknownOnCrash};
pub use error::{NameProblem, PythonHost, ReplError, RowProblem};
pub use metadata::{
    BinaryKind, Compression, ContextKind, ContextMetadata, ExecError, ExecutionResult, FinalAnswer,
    FinalSource, FrameLibrary, ItemSizes, Restore, SheetShape, SkippedFile, SkippedRows,
    SubCallText, VariableInfo, WorkerEnd, WorkerRestart,
};
pub(crate) use natives::SubFailure;
pub use natives::{SubCallErrorMode, UnknownSubCallErrorMode};
pub(crate) use session::AheadSession;
pub use session::ReplSession;
pub use source::{
    ContextInput, ContextSource, EncodedContext, LiveObject, LoadOptions, RESERVED_NAMES,
    check_context_name, check_encoding,
};
pub(crate) use stop_watch::StopWatch;
pub use worker::{
    HugeCode, HugeCodeRefused, TEMPLATE_NAME, WORKER_ARG, WorkerProgram, serve_if_worker,
    set_worker_program, try_huge_code, use_huge_code, use_worker_pool, use_worker_template,
    worker_main, worker_policy,
};
