//! Being asked from outside to stop: Ctrl-C (`SIGINT`), a `kill PID` (`SIGTERM`) and a closed
//! terminal (`SIGHUP`) are one request. The first stops the command gracefully, as the
//! command says ([`on_interrupt`]: a run keeps its best answer and closes its trajectory, a
//! workflow keeps its state and checkpoint), so that its workers are ended and their scratch
//! directories removed as at any end; a second one quits at once (exit 130), which the
//! workers do not outlive (their death signal) but which leaves their scratch directories.
//!
//! Only a command that stops gracefully watches them: once watched, these signals no longer
//! end the process by themselves. Nor its forks: a process forked from `rlm` without an
//! `exec` (the model's code with `--isolation none`, e.g. a `multiprocessing` pool) would
//! inherit the handler and the pipe it writes to, so that a `SIGTERM` meant for it (the end
//! of an interrupted block's processes) would not end it and would stop `rlm`'s run instead:
//! in a fork the three signals get their default back.

use std::io::Write as _;

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::exit::EXIT_INTERRUPTED;

/// The signals that ask the command to stop, watched.
struct Requests {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

/// The signals [`Requests`] watches.
const WATCHED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// In a process just forked from this one: the watched signals' default back (see the
/// [module docs](self)).
extern "C" fn default_in_fork() {
    for signal in WATCHED {
        // SAFETY: `signal` with `SIG_DFL` is async-signal-safe, as a fork's child requires.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
}

impl Requests {
    fn watch() -> std::io::Result<Self> {
        static IN_FORKS: std::sync::Once = std::sync::Once::new();
        IN_FORKS.call_once(|| {
            // SAFETY: registers a handler that only makes async-signal-safe calls.
            unsafe { libc::pthread_atfork(None, None, Some(default_in_fork)) };
        });
        let _runtime = kernel::runtime::shared().enter();
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next request.
    async fn next(&mut self) -> Request {
        tokio::select! {
            _ = self.interrupt.recv() => Request::CtrlC,
            _ = self.terminate.recv() => Request::Terminate,
            _ = self.hangup.recv() => Request::Hangup,
        }
    }
}

/// How the command was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// Ctrl-C (`SIGINT`).
    CtrlC,
    /// `SIGTERM`: a `kill PID`, a service manager, a job scheduler.
    Terminate,
    /// `SIGHUP`: the terminal was closed.
    Hangup,
}

impl Request {
    /// The line to print when asked to stop (`doing`: e.g. "stopping the run and keeping
    /// what it found").
    pub(crate) fn line(self, doing: &str) -> String {
        let by = match self {
            Self::CtrlC => "",
            Self::Terminate => " by SIGTERM",
            Self::Hangup => " by SIGHUP",
        };
        format!("\nInterrupted{by}: {doing} (Ctrl-C again to quit at once)")
    }

    /// Prints [`Request::line`] on stderr, never failing (the terminal may be gone).
    pub(crate) fn say(self, doing: &str) {
        let _ = writeln!(std::io::stderr(), "{}", self.line(doing));
    }
}

/// Watches for a request to stop from now on: the first runs `stop` (given how it was
/// asked), a second runs `quit` and exits with code 130. Nothing is watched (the signals
/// keep their default) when they cannot be.
pub(crate) fn on_interrupt(
    stop: impl FnOnce(Request) + Send + 'static,
    quit: impl FnOnce() + Send + 'static,
) {
    let Ok(mut requests) = Requests::watch() else {
        return;
    };
    kernel::runtime::shared().spawn(async move {
        stop(requests.next().await);
        requests.next().await;
        quit();
        std::process::exit(i32::from(EXIT_INTERRUPTED));
    });
}
