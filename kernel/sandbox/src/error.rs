//! Why confinement could not be entered.

use crate::report::Report;

/// A failure of [`enter`](crate::enter). A layer the kernel lacks is not an error (it is
/// reported) unless the level is [`Strict`](crate::Level::Strict).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// `enter` must run before any thread starts (namespaces and `fork` need it).
    #[error(
        "Confinement must be entered while the process has one thread, but it has {threads}; call `sandbox::enter` first thing in the worker's `main`"
    )]
    Threaded {
        /// Threads found.
        threads: usize,
    },
    /// `--isolation strict` and some layer is not in force.
    #[error(
        "Strict isolation refuses to run: {}; run `rlm doctor` to see why, or use `--isolation process` to run with what this machine offers",
        .report.summary()
    )]
    NotConfined {
        /// What is and is not in force.
        report: Box<Report>,
    },
    /// A step of confinement failed in a way that leaves the process unsafe to run code in.
    #[error("Could not confine the worker: {step} failed: {source}")]
    Step {
        /// The step (e.g. "`fork`", "Landlock").
        step: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The seccomp filter could not be built (a bug: the rules are fixed).
    #[error("Could not build the seccomp filter: {0}")]
    Filter(String),
}
