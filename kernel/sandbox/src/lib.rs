//! Confinement of the worker process that runs model-written code.
//!
//! The code an RLM runs is written by a model that has read the user's data, so a prompt
//! injection can steer it. The worker that runs it calls [`enter`] first thing in `main`,
//! while it still has one thread, and from then on it and every process it starts are
//! confined by these layers, each applied when the kernel supports it and reported:
//!
//! | layer | mechanism |
//! |---|---|
//! | filesystem | Landlock: read the system, Python and the contexts; write only the scratch dir; a read-only `/proc` of the PID namespace's own, holding only its processes |
//! | network | an empty network namespace (inside a user namespace); seccomp: sockets only `AF_UNIX`, no `connect`/`bind`; Landlock: no TCP |
//! | syscalls | seccomp: no `ptrace`, `process_vm_*`, `mount`, `bpf`, `kexec_*`, `perf_event_open`, keyrings, `io_uring`, new namespaces, …; no new privileges, not dumpable, no capabilities |
//! | limits | rlimits: memory (`RLIMIT_DATA`), CPU time, file size, open files; no core dumps |
//! | processes | `RLIMIT_NPROC` in the user namespace, or for root the PID namespace's `pid_max` |
//! | lifetime | a PID namespace whose init ends with the worker, taking every process along, and whose own `/proc` lets the worker find and end an interrupted block's processes; a session init leads, so no controlling terminal |
//! | environment | only the policy's variables (no keys) |
//!
//! # Pieces
//! - [`Policy`] (`policy`): what the process may read, execute and write, its network,
//!   [`Limits`] and environment; [`Level`]: best effort or strict.
//! - [`Report`] (`report`): each [`Layer`]'s [`State`] — active, partial or unavailable with
//!   the reason.
//! - `linux`: the layers (`ns`, `lifetime`, `limits`, `privileges`, `filesystem`,
//!   `syscalls`, `env`) and the order they are applied in; other systems report every layer
//!   unavailable.
//! - [`SandboxError`] (`error`): why confinement could not be entered.
//!
//! # Process shape
//! `enter` turns the calling process into a *supervisor* that never runs model code: it
//! forks an init (pid 1 of a new PID namespace), which forks the confined process, and only
//! the confined process returns from `enter`. The supervisor relays signals down and ends
//! the way the confined process ended (same exit code or signal). See the `lifetime` module.
//!
//! # Example
//! ```no_run
//! let scratch = std::env::temp_dir().join("rlm-scratch");
//! let policy = sandbox::Policy::new(&scratch).allow_exec("/opt/python3.11");
//! println!("{}", sandbox::probe(&policy)); // what `enter` would apply here
//! let report = sandbox::enter(&policy, sandbox::Level::BestEffort)?;
//! if !report.is_fully_confined() {
//!     eprintln!("{}", report.summary());
//! }
//! // … start Python, serve the parent …
//! # Ok::<(), sandbox::SandboxError>(())
//! ```

mod error;
#[cfg(target_os = "linux")]
mod linux;
mod policy;
mod report;

pub use error::SandboxError;
pub use policy::{
    CONFINED_PATH, DEFAULT_CPU_SECONDS, DEFAULT_FILE_SIZE_BYTES, DEFAULT_OPEN_FILES,
    DEFAULT_PROCESSES, INHERITED_ENV, Level, Limits, Policy, SYSTEM_EXEC_PATHS, SYSTEM_READ_PATHS,
    SYSTEM_WRITE_FILES, default_memory_limit,
};
pub use report::{Layer, LayerReport, Report, State};

/// Confines the calling process under `policy` and returns, in the confined process, what
/// is in force. Call it first thing in the worker's `main`, before any thread starts
/// (Python, tokio, a logger's thread): it fails with [`SandboxError::Threaded`] otherwise.
///
/// The calling process becomes the supervisor and never returns from this call (see the
/// crate docs). With [`Level::Strict`] it fails with [`SandboxError::NotConfined`] unless
/// every layer is in force, as found by applying them (in the confined process, before the
/// caller runs anything there; the supervisor then ends as that process does); with
/// [`Level::BestEffort`] missing layers are only reported.
///
/// After it, the process cannot `connect` or `bind` any socket (it keeps the ones it has:
/// talk to the parent over an inherited socket pair), and cannot undo any layer.
pub fn enter(policy: &Policy, level: Level) -> Result<Report, SandboxError> {
    #[cfg(target_os = "linux")]
    {
        linux::enter(policy, level)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let report = unsupported();
        match level {
            Level::Strict => Err(SandboxError::NotConfined {
                report: Box::new(report),
            }),
            Level::BestEffort => Ok(report),
        }
    }
}

/// Does ahead, once, what [`enter`] does the same way in every process: compiles the
/// seccomp filters (for both network settings; ~0.2 ms). A process that forks the processes
/// which then call `enter` (rlm's worker template) calls it before it forks, so that each
/// fork finds them compiled in the memory it was forked with. Optional: `enter` compiles
/// what was not. Pure computation: no thread, no system call that changes anything.
pub fn prepare() {
    #[cfg(target_os = "linux")]
    linux::prepare();
}

/// What [`enter`] would put in force here, without confining anything (for `rlm doctor`
/// and `-v`). Namespaces are tried in a throwaway child; Landlock and seccomp are asked of
/// the kernel. Safe to call from a threaded process.
pub fn probe(policy: &Policy) -> Report {
    #[cfg(target_os = "linux")]
    {
        linux::probe(policy)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = policy;
        unsupported()
    }
}

#[cfg(not(target_os = "linux"))]
fn unsupported() -> Report {
    let reason = format!(
        "confinement needs Linux (Landlock, seccomp, namespaces); this is {}",
        std::env::consts::OS
    );
    Report::new(Layer::ALL.map(|layer| {
        (
            layer,
            State::Unavailable {
                reason: reason.clone(),
            },
        )
    }))
}
