//! Diagnostic logs: the library's `tracing` events (retries and their backoff, interrupts,
//! trajectory failures) on stderr, when a user asks for them.
//!
//! Quiet by default. `-v` shows `info` events (a retried model call, a stopped block), `-vv`
//! the rlm crates' `debug` events, `-vvv` everything at `trace`. `RUST_LOG` (the `tracing`
//! filter syntax, e.g. `RUST_LOG=bridge=debug`) wins over `-v`. For `rlm run`, `-v` also turns
//! on the readable trace of the run (see `trace.rs`); logs and trace are separate streams that
//! both go to stderr. Known secrets are redacted from every event ([`RedactedStderr`]).

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
        .with_writer(|| RedactedStderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_target(false)
        .compact()
        .init();
}

/// Standard error with every secret the process knows redacted (see [`crate::secrets`]).
/// The subscriber writes each event whole, so a value is never split across two writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RedactedStderr;

impl std::io::Write for RedactedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(crate::secrets::redact(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
