//! Every process the confined code starts dies with the worker.
//!
//! The process that calls [`enter`](crate::enter) (the *supervisor*, whose pid the parent
//! knows) never runs model code. After it has entered the new namespaces it forks:
//!
//! ```text
//! supervisor (pid the parent holds; relays signals and the exit status)
//!   └─ init (pid 1 of the new PID namespace; reaps orphans, relays signals)
//!        └─ confined (returns from `enter`; runs Python)
//! ```
//!
//! When the confined process ends, init writes its wait status to the supervisor and exits;
//! the kernel then kills every process left in the namespace — `setsid`, double forks and
//! daemons included, since none can leave a PID namespace. When the supervisor is killed,
//! init gets `SIGKILL` (parent-death signal) and the same happens. The supervisor ends the
//! way the confined process ended (same exit code, or same signal), so the parent sees a
//! segfault as a segfault.
//!
//! Without a PID namespace the supervisor becomes a *child subreaper*: orphans of the
//! confined tree are re-parented to it, and when the confined process ends it kills them
//! all. That is weaker (a process survives if the supervisor itself is `SIGKILL`ed before
//! it cleans up) and reported as partial.
//!
//! Signals the parent sends the supervisor (`SIGINT`, `SIGTERM`, `SIGHUP`, `SIGQUIT`,
//! `SIGUSR1`, `SIGUSR2`) are relayed down to the confined process.
//!
//! # Session
//! The confined process runs in a session of its own, so it has no controlling terminal:
//! `/dev/tty` opens nothing, and no terminal's keys, size or job control reach it (seccomp
//! also refuses `TIOCSTI`: two walls against typing into the user's shell). The supervisor
//! cannot start that session: the worker's parent makes it a process-group leader (the
//! terminal's Ctrl-C then reaches only the parent, which stops the block itself), and
//! `setsid` refuses a group leader. Its children are never leaders, so `setsid` is called
//! in the first of them: init, which leads the session and never opens a terminal (a
//! session leader would acquire the first terminal it opens; the confined process, not a
//! leader, cannot); without a PID namespace, the confined process itself. Signals still
//! come down by pid, so the relay above does not change.

use std::io;

use rustix::io::Errno;

use crate::error::SandboxError;

/// Signals relayed from the supervisor down to the confined process.
const RELAYED: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// How the confined process's lifetime is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Binding {
    /// The confined process runs under an init in its own PID namespace.
    PidNamespace {
        /// The `pid_max` init set in the namespace, if it could.
        pid_max: Option<u64>,
    },
    /// The supervisor is a child subreaper that kills what is left.
    Subreaper,
}

/// What [`split`] set up, seen from the confined process.
pub(crate) struct Tree<T> {
    /// How the confined process's lifetime is bound.
    pub(crate) binding: Binding,
    /// Whether the confined process is in a session of its own (see the [module
    /// docs](self)), or why not.
    pub(crate) session: Result<(), Errno>,
    /// What the `mounts` step of [`split`] returned.
    pub(crate) mounted: T,
}

/// Forks the process tree above and returns in the confined process. `pid_namespace`: the
/// supervisor has unshared a PID namespace (its next child is pid 1 there); `cap_pids`:
/// init caps the namespace's `pid_max` at this many processes; `mounts` runs in the process
/// that forks the confined one, after the cap (it makes `/proc` read-only), and its result
/// comes back with the binding.
pub(crate) fn split<T>(
    pid_namespace: bool,
    cap_pids: Option<u64>,
    mounts: impl FnOnce() -> T,
) -> Result<Tree<T>, SandboxError> {
    let step = |step, source| SandboxError::Step { step, source };
    // Children must start with the default SIGCHLD (an inherited "ignore" would reap them
    // behind our back) and with the relayed signals blocked until each process decides.
    // SAFETY: plain signal-mask and disposition calls on a single-threaded process.
    let old_mask = unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        let mut old: libc::sigset_t = std::mem::zeroed();
        let set = waited_signals();
        if libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old) != 0 {
            return Err(step("blocking signals", io::Error::last_os_error()));
        }
        old
    };
    if !pid_namespace {
        rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
            .map_err(|e| step("`PR_SET_CHILD_SUBREAPER`", e.into()))?;
        let mounted = mounts();
        let confined = fork().map_err(|e| step("`fork`", e))?;
        if confined == 0 {
            become_child(&old_mask)?;
            return Ok(Tree {
                binding: Binding::Subreaper,
                session: new_session(),
                mounted,
            });
        }
        supervise_without_namespace(confined)
    }
    let (status_read, status_write) = pipe().map_err(|e| step("`pipe`", e))?;
    let init = fork().map_err(|e| step("`fork`", e))?;
    if init != 0 {
        close(status_write);
        close_other_fds(&[status_read]);
        supervise(init, status_read)
    }
    // Init: pid 1 of the new namespace, and the leader of the confined process's session.
    die_with_parent()?;
    let session = new_session();
    close(status_read);
    let pid_max = cap_pids.and_then(|n| super::ns::cap_pids(n).ok());
    let mounted = mounts();
    let confined = fork().map_err(|e| step("`fork`", e))?;
    if confined == 0 {
        close(status_write);
        become_child(&old_mask)?;
        return Ok(Tree {
            binding: Binding::PidNamespace { pid_max },
            session,
            mounted,
        });
    }
    close_other_fds(&[status_write]);
    init_loop(confined, status_write)
}

/// In a new child: the parent-death signal, and the caller's signal mask back.
fn become_child(old_mask: &libc::sigset_t) -> Result<(), SandboxError> {
    die_with_parent()?;
    // SAFETY: restores the mask saved above; single-threaded.
    if unsafe { libc::sigprocmask(libc::SIG_SETMASK, old_mask, std::ptr::null_mut()) } != 0 {
        return Err(SandboxError::Step {
            step: "restoring the signal mask",
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// A new session led by this process (a child of the supervisor: never a group leader).
fn new_session() -> Result<(), Errno> {
    rustix::process::setsid().map(drop)
}

/// `SIGKILL` when the parent ends.
pub(crate) fn die_with_parent() -> Result<(), SandboxError> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)).map_err(
        |e| SandboxError::Step {
            step: "`PR_SET_PDEATHSIG`",
            source: e.into(),
        },
    )
}

fn waited_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for sig in RELAYED {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Waits for the next blocked signal of [`waited_signals`].
fn next_signal() -> libc::c_int {
    let set = waited_signals();
    loop {
        // SAFETY: waits for a signal blocked in this thread.
        let sig = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        if sig > 0 {
            return sig;
        }
    }
}

fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: the process is single-threaded (checked by `enter`), so the child may run
    // any code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid)
    }
}

fn pipe() -> io::Result<(libc::c_int, libc::c_int)> {
    let mut fds = [0; 2];
    // SAFETY: writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fds[0], fds[1]))
}

fn close(fd: libc::c_int) {
    // SAFETY: closes a descriptor this module opened and no longer uses.
    unsafe { libc::close(fd) };
}

/// Closes every descriptor above stderr except `keep`, so that only the confined process
/// holds the worker's socket to the parent (the parent sees it close the moment that
/// process ends).
fn close_other_fds(keep: &[libc::c_int]) {
    let mut from: libc::c_uint = 3;
    let mut keep: Vec<libc::c_uint> = keep.iter().map(|&fd| fd as libc::c_uint).collect();
    keep.sort_unstable();
    for fd in keep {
        if fd > from {
            // SAFETY: closes a range of descriptors of this process.
            unsafe { libc::syscall(libc::SYS_close_range, from, fd - 1, 0) };
        }
        from = from.max(fd + 1);
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0) };
}

fn forward(pid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: sends a signal to our own child.
    unsafe { libc::kill(pid, sig) };
}

/// The supervisor with a PID namespace: relay signals to init; when init ends, end like the
/// confined process (its status comes through the pipe).
fn supervise(init: libc::pid_t, status_read: libc::c_int) -> ! {
    loop {
        let sig = next_signal();
        if sig != libc::SIGCHLD {
            forward(init, sig);
            continue;
        }
        let mut status = 0;
        // SAFETY: reaps our own child without blocking.
        let done = unsafe { libc::waitpid(init, &mut status, libc::WNOHANG) };
        if done != init {
            continue;
        }
        let mut buf = [0u8; 4];
        // SAFETY: reads at most 4 bytes into `buf`.
        let n = unsafe { libc::read(status_read, buf.as_mut_ptr().cast(), 4) };
        // Init killed before it could report (its parent-death signal or an outside kill):
        // end like init.
        let confined_status = if n == 4 {
            i32::from_ne_bytes(buf)
        } else {
            status
        };
        exit_like(confined_status)
    }
}

/// Pid 1 of the namespace: reap every orphan, relay signals to the confined process, and
/// when it ends, report its status and exit (the kernel kills the rest of the namespace).
fn init_loop(confined: libc::pid_t, status_write: libc::c_int) -> ! {
    loop {
        let sig = next_signal();
        if sig != libc::SIGCHLD {
            forward(confined, sig);
            continue;
        }
        loop {
            let mut status = 0;
            // SAFETY: reaps any child of ours without blocking.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            if pid == confined {
                let bytes = status.to_ne_bytes();
                // SAFETY: writes 4 bytes to the status pipe, then exits without unwinding.
                unsafe {
                    libc::write(status_write, bytes.as_ptr().cast(), 4);
                    libc::_exit(0);
                }
            }
        }
    }
}

/// The supervisor without a PID namespace: relay signals; when the confined process ends,
/// kill every process re-parented to us, then end like the confined process.
fn supervise_without_namespace(confined: libc::pid_t) -> ! {
    loop {
        let sig = next_signal();
        if sig != libc::SIGCHLD {
            forward(confined, sig);
            continue;
        }
        loop {
            let mut status = 0;
            // SAFETY: reaps any child of ours without blocking.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            if pid == confined {
                kill_descendants();
                exit_like(status);
            }
        }
    }
}

/// Kills every child (orphans come to us as the subreaper) until none is left; bounded.
fn kill_descendants() {
    let me = std::process::id();
    for _ in 0..1000 {
        let children =
            std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")).unwrap_or_default();
        let pids: Vec<libc::pid_t> = children
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            forward(pid, libc::SIGKILL);
        }
        // Reap; the children of the killed are re-parented to us for the next round.
        // SAFETY: reaps children of ours, blocking until one is reaped.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Ends this process the way `status` says the confined one ended.
fn exit_like(status: libc::c_int) -> ! {
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: default disposition, unblocked, raised on ourselves; no core file.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
            libc::_exit(128 + sig)
        }
    }
    // SAFETY: exits without unwinding or running destructors of a half-forked process.
    unsafe { libc::_exit(libc::WEXITSTATUS(status)) }
}
