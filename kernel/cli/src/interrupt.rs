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
//!
//! A signal ignored when `rlm` started stays ignored: `nohup rlm ...` (which ignores `SIGHUP`)
//! runs on when its terminal closes, and a background job of a script (`SIGINT` ignored)
//! is not stopped by the script's Ctrl-C.
//!
//! After a hangup the terminal is gone: every write to it fails. Standard output and error
//! that were that terminal write nowhere from then on (`/dev/null`), so that the command
//! still stops as it would, writing its files (the trajectory, `--answer-file`, the
//! checkpoint), instead of failing at its first line of output.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::exit::EXIT_INTERRUPTED;

/// The signals that ask the command to stop, each watched unless it was ignored (see the
/// [module docs](self)).
struct Requests {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
    hangup: Option<Signal>,
}

/// The signals [`Requests`] watches, each with whether it is watched in this process.
static WATCHED: [(libc::c_int, AtomicBool); 3] = [
    (libc::SIGINT, AtomicBool::new(false)),
    (libc::SIGTERM, AtomicBool::new(false)),
    (libc::SIGHUP, AtomicBool::new(false)),
];

/// In a process just forked from this one: the watched signals' default back (see the
/// [module docs](self)).
extern "C" fn default_in_fork() {
    for (signal, watched) in &WATCHED {
        if watched.load(Ordering::Relaxed) {
            // SAFETY: `signal` with `SIG_DFL` is async-signal-safe, as a fork's child requires.
            unsafe { libc::signal(*signal, libc::SIG_DFL) };
        }
    }
}

/// Whether `signal` is ignored in this process.
fn ignored(signal: libc::c_int) -> bool {
    let mut action = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: reads the disposition into `action` and changes nothing (no new action).
    let read = unsafe { libc::sigaction(signal, std::ptr::null(), action.as_mut_ptr()) };
    // SAFETY: zeroed, and filled by `sigaction` when it succeeded.
    read == 0 && unsafe { action.assume_init() }.sa_sigaction == libc::SIG_IGN
}

/// Watches `WATCHED[index]`, unless it was ignored before anything watched it.
fn watch(index: usize) -> std::io::Result<Option<Signal>> {
    let (raw, watched) = &WATCHED[index];
    if !watched.load(Ordering::Relaxed) && ignored(*raw) {
        return Ok(None);
    }
    let stream = signal(SignalKind::from_raw(*raw))?;
    watched.store(true, Ordering::Relaxed);
    Ok(Some(stream))
}

/// The next delivery of `signal`; never, when it is not watched.
async fn delivered(signal: &mut Option<Signal>) {
    if let Some(signal) = signal
        && signal.recv().await.is_some()
    {
        return;
    }
    std::future::pending::<()>().await;
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
            interrupt: watch(0)?,
            terminate: watch(1)?,
            hangup: watch(2)?,
        })
    }

    /// The next request.
    async fn next(&mut self) -> Request {
        let request = tokio::select! {
            () = delivered(&mut self.interrupt) => Request::CtrlC,
            () = delivered(&mut self.terminate) => Request::Terminate,
            () = delivered(&mut self.hangup) => Request::Hangup,
        };
        if request == Request::Hangup {
            write_nowhere_if_hung_up();
        }
        request
    }
}

/// Points standard output and error that were a terminal now hung up at `/dev/null` (see
/// the [module docs](self)); a pipe, a file or a terminal still there is left as it is.
fn write_nowhere_if_hung_up() {
    // SAFETY: opens a path given as a C string; the descriptor is checked below.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if null < 0 {
        return;
    }
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // A write of nothing fails (`EIO`) on a hung-up terminal alone.
        // SAFETY: writes zero bytes from a valid, empty buffer.
        let probe = unsafe { libc::write(fd, [0u8; 0].as_ptr().cast(), 0) };
        if probe < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EIO) {
            // SAFETY: both descriptors are open; `fd` is replaced atomically.
            unsafe { libc::dup2(null, fd) };
        }
    }
    // SAFETY: closes the descriptor opened above, which nothing else holds.
    unsafe { libc::close(null) };
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
