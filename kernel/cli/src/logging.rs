//! Diagnostic logs: the library's `tracing` events (retries and their backoff, interrupts,
//! trajectory failures) on stderr, when a user asks for them.
//!
//! Quiet by default. `-v` shows `info` events (a retried model call, a stopped block), `-vv`
//! the rlm crates' `debug` events, `-vvv` everything at `trace`. `RUST_LOG` (the `tracing`
//! filter syntax, e.g. `RUST_LOG=bridge=debug`) wins over `-v`. For `rlm run`, `-v` also turns
//! on the readable trace of the run (see `trace.rs`); logs and trace are separate streams that
//! both go to stderr.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// Installs the subscriber for the process; call once, before any work.
pub(crate) fn init(verbosity: u8) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::new(spec),
        _ => EnvFilter::new(match verbosity {
            0 => "off",
            1 => "info",
            2 => "info,bridge=debug,kernel=debug,rlm=debug",
            _ => "trace",
        }),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_target(false)
        .compact()
        .init();
}
