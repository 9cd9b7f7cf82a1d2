//! Ctrl-C while a call of the package waits: the interpreter's pending-signal flag, and a
//! count of our own beside it, so that no interrupt is lost.
//!
//! A wait (a completion, a direct `llm_query`) runs on the calling thread in short slices with
//! the GIL released and calls `Python::check_signals` between them: that runs the Python
//! handler of a SIGINT that arrived (Jupyter's stop button sends one), which raises
//! `KeyboardInterrupt`. That flag is one bit, though, and any Python code that runs on the
//! main thread before the check consumes it: a finalizer run when pyo3 re-attaches the thread
//! (it applies the reference counts other threads dropped), code a progress callback runs, the
//! run's set-up. The handler then raises inside code whose error is dropped (CPython clears
//! the error of a file object's finalizer and only reports that of a `__del__`), and the run
//! went on as if nothing had been pressed.
//!
//! So each wait puts a hook in front of the interpreter's SIGINT handler that counts presses
//! (an atomic add: async-signal-safe) and calls the handler it displaced, with the same
//! flags. Each wait checks the hook is still there: `signal.signal(SIGINT, ...)` replaces it at
//! the C level, and Jupyter's kernel does so around every cell. A wait that sees the count
//! move while the interpreter raised nothing takes it as the interrupt it was and raises
//! `KeyboardInterrupt` itself, provided SIGINT's Python handler is still
//! `signal.default_int_handler` (a handler of the user's own ran and decided) and the wait
//! runs on the main thread (where Python delivers signals). When SIGINT is ignored or has its
//! default action (no interpreter handler to chain to), nothing is hooked.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;

/// SIGINTs the hook counted.
static SIGINTS: AtomicU64 = AtomicU64::new(0);

/// The handler the hook displaced (`sa_sigaction`) and its `sa_flags`, called after counting.
static DISPLACED: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static DISPLACED_FLAGS: AtomicI32 = AtomicI32::new(0);

type SigInfoHandler = extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void);
type PlainHandler = extern "C" fn(c_int);

extern "C" fn on_sigint(signal: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    SIGINTS.fetch_add(1, Ordering::SeqCst);
    let handler = DISPLACED.load(Ordering::SeqCst);
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        return;
    }
    // SAFETY: `handler` is the function the kernel would have called for this signal (read
    // with its flags by `hook`): a three-argument one when `SA_SIGINFO` is set.
    unsafe {
        if DISPLACED_FLAGS.load(Ordering::SeqCst) & libc::SA_SIGINFO != 0 {
            std::mem::transmute::<usize, SigInfoHandler>(handler)(signal, info, context);
        } else {
            std::mem::transmute::<usize, PlainHandler>(handler)(signal);
        }
    }
}

/// Puts the hook in front of the current SIGINT handler unless it is there already (or there
/// is no handler to chain to).
fn hook() {
    // SAFETY: `sigaction` reads into and from zero-initialised, valid structs; the handler
    // installed only makes an atomic add and calls the handler it displaced.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGINT, std::ptr::null(), &mut current) != 0 {
            return;
        }
        let ours = on_sigint as SigInfoHandler as usize;
        if current.sa_sigaction == ours
            || current.sa_sigaction == libc::SIG_DFL
            || current.sa_sigaction == libc::SIG_IGN
        {
            return;
        }
        DISPLACED_FLAGS.store(current.sa_flags, Ordering::SeqCst);
        DISPLACED.store(current.sa_sigaction, Ordering::SeqCst);
        let mut hooked = current;
        hooked.sa_sigaction = ours;
        hooked.sa_flags = current.sa_flags | libc::SA_SIGINFO;
        // On failure the interpreter's handler stays, and waits rely on its flag alone.
        libc::sigaction(libc::SIGINT, &hooked, std::ptr::null_mut());
    }
}

/// The interrupts of one wait: [`check`](Self::check) between slices raises the Ctrl-C that
/// arrived since [`watch`](Self::watch), whether or not the interpreter's flag survived.
#[derive(Debug)]
pub(crate) struct Interrupts {
    seen: u64,
}

impl Interrupts {
    /// Starts watching (call it before anything of the call runs, so that a SIGINT during its
    /// set-up counts too).
    pub(crate) fn watch() -> Self {
        hook();
        Self {
            seen: SIGINTS.load(Ordering::SeqCst),
        }
    }

    /// Runs the Python handlers of the signals that arrived (as `Python::check_signals`), then
    /// raises `KeyboardInterrupt` for a SIGINT whose Python handler did not get to raise it.
    pub(crate) fn check(&mut self, py: Python<'_>) -> PyResult<()> {
        py.check_signals()?;
        let now = SIGINTS.load(Ordering::SeqCst);
        if now == self.seen {
            return Ok(());
        }
        self.seen = now;
        if default_handler_on_main_thread(py)? {
            Err(PyKeyboardInterrupt::new_err(()))
        } else {
            Ok(())
        }
    }

    /// The exception to raise for `interrupt` once the call has wound down: the interpreter's
    /// own if its handler raised one for the same Ctrl-C meanwhile (a SIGINT handled on
    /// another thread trips the flag just after the hook counted it), so that one press raises
    /// once.
    pub(crate) fn settle(py: Python<'_>, interrupt: PyErr) -> PyErr {
        py.check_signals().err().unwrap_or(interrupt)
    }
}

/// Whether SIGINT's Python handler is the default one (it raises `KeyboardInterrupt`) and
/// this is the interpreter's main thread.
fn default_handler_on_main_thread(py: Python<'_>) -> PyResult<bool> {
    let threading = py.import("threading")?;
    let main = threading
        .call_method0("main_thread")?
        .is(&threading.call_method0("current_thread")?);
    if !main {
        return Ok(false);
    }
    let signal = py.import("signal")?;
    let handler = signal.call_method1("getsignal", (libc::SIGINT,))?;
    Ok(handler.is(&signal.getattr("default_int_handler")?))
}
