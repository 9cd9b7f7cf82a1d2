//! A last word before a fatal crash: a signal handler that names the running block.
//!
//! A segfault or abort in C code that a cell called (`ctypes.string_at(0)`, a crashing
//! extension) cannot be survived in-process: the interpreter's memory may be corrupt. What
//! the process can still do is say so. [`install`] sets a handler for `SIGSEGV`, `SIGBUS`,
//! `SIGFPE`, `SIGILL` and `SIGABRT` that writes one line to stderr, naming the signal and the
//! block running at the time ([`set_running_block`], kept by the loop's executor), then ends
//! the process with `_exit(code)`. The handler is async-signal-safe: it only reads buffers
//! formatted before the block started and calls `write(2)` and `_exit(2)`. A forked child
//! (a pool worker) that crashes dies of its signal as usual.
//!
//! Not covered: `SIGKILL` (the kernel's OOM killer) cannot be caught at all; the trajectory,
//! which gets each block's code before the block runs, still names the block. Both only
//! happen to a session in this process (`isolation = none`): an isolated session's worker
//! dies of the signal instead, and its parent reports the crash as a block error and restores
//! the session ([`crate::repl::worker`]).

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Bytes of the running block's description kept for the handler (longer ones are cut).
const LABEL_CAP: usize = 240;

/// No block is running.
const NONE: usize = usize::MAX;

/// One description buffer; written only under `WRITER`, read by the handler.
struct Label(std::cell::UnsafeCell<[u8; LABEL_CAP]>, AtomicUsize);

// SAFETY: writers are serialised by `WRITER` and write only the buffer that is not `ACTIVE`;
// the handler only reads the `ACTIVE` one.
unsafe impl Sync for Label {}

static LABELS: [Label; 2] = [
    Label(
        std::cell::UnsafeCell::new([0; LABEL_CAP]),
        AtomicUsize::new(0),
    ),
    Label(
        std::cell::UnsafeCell::new([0; LABEL_CAP]),
        AtomicUsize::new(0),
    ),
];
static ACTIVE: AtomicUsize = AtomicUsize::new(NONE);
static WRITER: Mutex<()> = Mutex::new(());
static EXIT_CODE: AtomicI32 = AtomicI32::new(1);
static HOST_PID: AtomicI32 = AtomicI32::new(0);

/// The signals the handler reports.
pub const FATAL_SIGNALS: [i32; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGABRT,
];

/// Installs the handler: on a fatal signal the process writes one line to stderr and exits
/// with `exit_code`. Call once, early, from a program (not a library embedding the kernel).
pub fn install(exit_code: u8) -> io::Result<()> {
    EXIT_CODE.store(i32::from(exit_code), Ordering::SeqCst);
    // SAFETY: getpid has no preconditions.
    HOST_PID.store(unsafe { libc::getpid() }, Ordering::SeqCst);
    for signal in FATAL_SIGNALS {
        // SAFETY: a zeroed sigaction is a valid starting point; the handler is an
        // `extern "C" fn(c_int)` that only makes async-signal-safe calls.
        let result = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fatal_signal as extern "C" fn(libc::c_int) as usize;
            // On the alternate stack where there is one (a stack overflow), once.
            action.sa_flags = libc::SA_ONSTACK | libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if result != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Records the block about to run, for the handler: `block 2 of iteration 3 (`first line`)`.
pub fn set_running_block(iteration: u32, index: usize, code: &str) {
    let first_line = code
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    let label = format!(
        "block {} of iteration {iteration} (`{first_line}`)",
        index + 1
    );
    let _turn = WRITER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let next = match ACTIVE.load(Ordering::SeqCst) {
        0 => 1,
        _ => 0,
    };
    let mut len = label.len().min(LABEL_CAP);
    while !label.is_char_boundary(len) {
        len -= 1;
    }
    let slot = &LABELS[next];
    // SAFETY: only this writer (under `WRITER`) touches the inactive buffer.
    unsafe { (&mut (*slot.0.get()))[..len].copy_from_slice(&label.as_bytes()[..len]) };
    slot.1.store(len, Ordering::SeqCst);
    ACTIVE.store(next, Ordering::SeqCst);
}

/// No block is running any more.
pub fn clear_running_block() {
    ACTIVE.store(NONE, Ordering::SeqCst);
}

fn signal_name(signal: libc::c_int) -> &'static [u8] {
    match signal {
        libc::SIGSEGV => b"SIGSEGV (segmentation fault)",
        libc::SIGBUS => b"SIGBUS (bus error)",
        libc::SIGFPE => b"SIGFPE (arithmetic fault)",
        libc::SIGILL => b"SIGILL (illegal instruction)",
        libc::SIGABRT => b"SIGABRT (abort)",
        _ => b"signal",
    }
}

fn write_all(bytes: &[u8]) {
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: writes initialised bytes to stderr; write(2) is async-signal-safe.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        rest = &rest[n.unsigned_abs().min(rest.len())..];
    }
}

extern "C" fn on_fatal_signal(signal: libc::c_int) {
    // SAFETY: getpid is async-signal-safe.
    if unsafe { libc::getpid() } != HOST_PID.load(Ordering::SeqCst) {
        // A forked child: die of the signal as usual (SA_RESETHAND restored the default).
        // SAFETY: raise is async-signal-safe.
        unsafe { libc::raise(signal) };
        return;
    }
    write_all(b"rlm: fatal signal ");
    write_all(signal_name(signal));
    match ACTIVE.load(Ordering::SeqCst) {
        index @ (0 | 1) => {
            let slot = &LABELS[index];
            let len = slot.1.load(Ordering::SeqCst).min(LABEL_CAP);
            write_all(b" while running ");
            // SAFETY: the active buffer is complete (written before it became active).
            write_all(unsafe { &(&(*slot.0.get()))[..len] });
        }
        _ => write_all(b" outside any block"),
    }
    write_all(
        b"; a crash in C code cannot be survived, the trajectory's last line names the block\n",
    );
    // SAFETY: _exit is async-signal-safe and ends the process without running anything else.
    unsafe { libc::_exit(EXIT_CODE.load(Ordering::SeqCst)) }
}
