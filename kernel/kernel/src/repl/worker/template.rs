//! The worker template: a fork server, so that an isolated session's worker skips `exec` and
//! the start of its interpreter.
//!
//! The template is a worker process started with `RLM_WORKER_TEMPLATE` set: it starts CPython
//! and the kernel's support module like any worker, then, instead of waiting for a session,
//! serves fork requests on its link ([`serve_forks`]) until the host closes it. It never
//! runs model code and never starts a thread: it compiles the seccomp filters its forks will
//! install (`sandbox::prepare`, once), then only reads a request, forks, and answers.
//!
//! ```text
//!  host (spawn.rs)                      template                    forked worker
//!  socket pair + output pipe
//!  ─ 1 byte + SCM_RIGHTS [link, out] ─▸ clone(CLONE_PARENT)  ─────▸ death signal, own group,
//!                                                                   out on 1/2, link on 3,
//!  ◂─────────────── its pid (4 bytes) ─ closes its copies           the rest closed; then the
//!  waitid: the pid is the host's child                              worker's usual start:
//!  memfds, start frame ─────────────────────────────────────────▸ `sandbox::enter`, session
//! ```
//!
//! - **The host's child.** `CLONE_PARENT` makes the fork a child of the template's parent,
//!   the host, which sees, stops, times out, reaps and restores it exactly as a worker it
//!   started itself: `wait4` on its pid, `kill` of its process group, its output pipe's
//!   last words. Its death signal (`PR_SET_PDEATHSIG`) follows the host's worker-starting
//!   thread, as a started worker's does.
//! - **A fresh worker's confinement.** The fork enters every layer itself, as a worker
//!   started by `exec` does (its own user, network, PID and mount namespaces, rlimits,
//!   Landlock domain, seccomp filter): nothing is shared between the workers of a run but
//!   the memory image they were forked from. What that image shares (address layout, hash
//!   seed) is weighed in the security guide (`kernel/cli/docs/security.md`).
//! - **Python after a fork.** The template forks while its one thread is detached from the
//!   interpreter (it holds none of its locks), and the fork runs no Python until it is
//!   confined: Python's own paths were read by the template before its first fork. The
//!   confined process, two forks further down, runs `PyOS_AfterFork_Child` as after
//!   `os.fork()`, once: the interpreter's locks are reset and the at-fork hooks run (`random`
//!   reseeds its generator in each worker). Running it in the template's fork too copied, on
//!   write, the pages it touches once there and again in the confined process.
//! - **A stale thread id.** A raw `clone` does not update the C library's cached thread id of
//!   the forked thread (glibc's `fork` passes `CLONE_CHILD_SETTID` for it). The fork only
//!   prepares the session and becomes the sandbox's supervisor, which runs no model code;
//!   the confined process that runs it is forked from there by the C library's `fork`.
//! - **When it ends.** A template killed or broken is reaped as soon as its output closes
//!   (the thread that reads it), or ended and reaped by the next session that asks it for a
//!   worker, whichever comes first; sessions then start their workers the way a
//!   template-less host does (a spare, or a new one), and a new template is started (at most
//!   [`MAX_STARTS`] in a process's life). So is a template whose program or start
//!   environment (the variables Python reads at its start, such as `PYTHONPATH`) is no
//!   longer what a new worker would get; a fork of the host leaves its host's template
//!   alone.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::huge_code;
use super::lock::lock;
use super::protocol::LINK_FD;
use super::spawn::{
    Output, Spawned, WorkerProgram, drain_output_then, oom_kills, prepare_spare, receive_fds,
    run_on_spawner, send_fds, spawn_env, spawn_template, take_link_fd, take_worker,
};

/// The template's process name (`/proc/PID/comm`, what `ps` shows).
pub const TEMPLATE_NAME: &std::ffi::CStr = c"rlm-template";

/// How long a session waits for the template's answer (it may still be starting its
/// interpreter on a loaded machine); a template that does not answer by then is ended.
const FORK_WAIT: Duration = Duration::from_secs(30);

/// How many templates one process starts in its life: the first and replacements for
/// templates that ended (killed from outside, or failed to start).
pub(crate) const MAX_STARTS: u32 = 8;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Whether isolated sessions of this process take their workers from a template (the
/// default) or start each as a new process (a spare started ahead of need, else one
/// started when asked), as before templates existed. Called before the first isolated
/// session, `false` keeps this process from ever starting a template; later, a running
/// template is left idle (it ends with the process) and serves again when turned back on.
/// For benchmarks that measure one way against the other, and hosts that want no process
/// kept ahead of need.
pub fn use_worker_template(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Whether isolated sessions of this process take their workers from a template.
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The template of this process, as the host sees it.
#[derive(Debug)]
pub(crate) struct Template {
    /// Its pid (ours to reap).
    pid: i32,
    /// The host's end of its link.
    control: UnixStream,
    /// What it was started as, and with which environment: a session of another program,
    /// or after the variables Python reads at its start changed (`PYTHONPATH`, ...), does
    /// not use it.
    program: WorkerProgram,
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// The process it is a child of (a fork of this process's own copy is not).
    host: u32,
    /// Whether it moved its code to huge pages ([`use_huge_code`](super::use_huge_code)).
    huge_code: bool,
    /// The tail of its own stdout/stderr.
    last_words: Arc<Mutex<Vec<u8>>>,
}

#[derive(Debug, Default)]
struct Slot {
    running: Option<Template>,
    starts: u32,
}

fn slot() -> &'static Mutex<Slot> {
    static SLOT: Mutex<Slot> = Mutex::new(Slot {
        running: None,
        starts: 0,
    });
    &SLOT
}

/// Why a fork request failed.
enum ForkError {
    /// The template is gone or broken: end it.
    Gone(String),
    /// It could not fork this time (e.g. `EAGAIN`): it stays.
    Refused(io::Error),
}

impl Template {
    /// A template process just started (see `spawn.rs`).
    pub(crate) fn new(spawned: Spawned, huge_code: bool) -> io::Result<Self> {
        spawned.link.set_read_timeout(Some(FORK_WAIT))?;
        let last_words: Arc<Mutex<Vec<u8>>> = Arc::default();
        let ours = Arc::clone(&last_words);
        let program = spawned.program.clone();
        let Output::Pipe(output) = spawned.output else {
            return Err(io::Error::other("its output is read already"));
        };
        drain_output_then(output, Arc::clone(&last_words), move || {
            ended(&ours, &program)
        });
        Ok(Self {
            pid: spawned.pid,
            control: spawned.link,
            env: spawn_env(&spawned.program),
            program: spawned.program,
            host: std::process::id(),
            huge_code,
            last_words,
        })
    }

    /// Whether its workers are what `program` would start now, for this process.
    fn serves(&self, program: &WorkerProgram) -> bool {
        self.host == std::process::id()
            && self.program == *program
            && self.env == spawn_env(program)
            && self.huge_code == huge_code::enabled()
    }

    /// Ends it, unless it is another process's (this process is a fork of its host): then
    /// only this copy of its link is closed.
    fn retire(self) {
        if self.host == std::process::id() {
            self.end();
        }
    }

    fn fork(&self) -> Result<Spawned, ForkError> {
        let local = |e: io::Error| ForkError::Refused(e);
        let (ours, theirs) = UnixStream::pair().map_err(local)?;
        let (output, output_writer) = io::pipe().map_err(local)?;
        // Ours are closed once sent: the worker and the template hold the only copies.
        send_fds(
            &self.control,
            &[OwnedFd::from(theirs), OwnedFd::from(output_writer)],
            &[],
        )
        .map_err(|e| ForkError::Gone(format!("could not be asked for a worker: {e}")))?;
        let mut answer = [0u8; 4];
        (&self.control)
            .read_exact(&mut answer)
            .map_err(|e| ForkError::Gone(format!("did not answer a fork request: {e}")))?;
        let pid = i32::from_ne_bytes(answer);
        if pid < 0 {
            return Err(ForkError::Refused(io::Error::from_raw_os_error(-pid)));
        }
        if !is_our_child(pid) {
            return Err(ForkError::Gone(format!(
                "answered with pid {pid}, which is not a child of this process"
            )));
        }
        Ok(Spawned {
            pid,
            link: ours,
            output: Output::Pipe(output),
            spare: false,
            program: self.program.clone(),
            oom_kills: oom_kills(),
        })
    }

    /// Closes its link (it exits when it reads the end), kills and reaps it.
    fn end(self) {
        drop(self.control);
        // SAFETY: our unreaped child, so the pid cannot have been reused; it runs no code of
        // anyone's but ours.
        let status = unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(self.pid, &mut status, 0);
            status
        };
        let words = String::from_utf8_lossy(&lock(&self.last_words)).into_owned();
        tracing::debug!(
            "the worker template {} ended (wait status {status}){}",
            self.pid,
            if words.trim().is_empty() {
                String::new()
            } else {
                format!("; it said: {}", words.trim())
            }
        );
    }
}

/// On its output's thread, once the template whose kept output is `words` closed it: it
/// ended (killed from outside, or failed). Unless it left the slot already (whoever took it
/// out reaps it), it is taken out and reaped now, not left a zombie until a session asks it
/// for a worker, and another is prepared. Known by its output buffer, not by its pid: a
/// template reaped already may have left its pid to a newer one.
fn ended(words: &Arc<Mutex<Vec<u8>>>, program: &WorkerProgram) {
    let gone = {
        let mut slot = lock(slot());
        let this = slot
            .running
            .as_ref()
            .is_some_and(|t| Arc::ptr_eq(&t.last_words, words));
        if !this {
            return;
        }
        publish(None);
        slot.running.take()
    };
    if let Some(template) = gone {
        tracing::warn!(
            "the worker template {} ended; workers start as new processes until another is ready",
            template.pid
        );
        template.end();
        prepare(program);
    }
}

/// Whether `pid` is a child of this process (running or not yet reaped).
fn is_our_child(pid: i32) -> bool {
    // SAFETY: a zeroed siginfo is valid for waitid to fill; WNOWAIT leaves the child as it is.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        ) == 0
    }
}

/// A worker for a session: forked by the template when one runs, else as a template-less
/// host starts one (`spawn.rs`: the spare, or a new process).
pub(crate) fn take(program: &WorkerProgram) -> io::Result<Spawned> {
    match fork_worker(program) {
        Some((forked, _)) => Ok(forked),
        None => take_worker(program),
    }
}

/// The pid of the template in this process's slot, and of the process it serves (`0`: none),
/// read without the slot's lock (held while a fork is asked for): see [`current`].
static RUNNING: [AtomicI32; 2] = [AtomicI32::new(0), AtomicI32::new(0)];

/// Puts `running` in the slot's place (what [`current`] reads).
fn publish(running: Option<&Template>) {
    let (pid, host) = running.map_or((0, 0), |t| (t.pid, i32::try_from(t.host).unwrap_or(0)));
    RUNNING[0].store(pid, Ordering::Release);
    RUNNING[1].store(host, Ordering::Release);
}

/// The pid of the template this process's workers are forked from now, if one runs: what a
/// worker confined ahead of need was forked from, or it is not served (`pool.rs`).
pub(crate) fn current() -> Option<i32> {
    let pid = RUNNING[0].load(Ordering::Acquire);
    let host = RUNNING[1].load(Ordering::Acquire);
    let ours = u32::try_from(host).is_ok_and(|host| host == std::process::id());
    (ENABLED.load(Ordering::Relaxed) && pid > 0 && ours).then_some(pid)
}

/// Has the next session find its worker ready: a template, when they are on, else a spare.
pub(crate) fn prepare_next(program: &WorkerProgram) {
    if !prepare(program) {
        prepare_spare(program);
    }
}

/// A worker forked by the running template of `program` and that template's pid, or `None`
/// when there is none (turned off, not started, started by another program, or broken: then
/// it is ended, and a new one prepared).
pub(crate) fn fork_worker(program: &WorkerProgram) -> Option<(Spawned, i32)> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let mut slot = lock(slot());
    let template = slot.running.as_ref()?;
    if !template.serves(program) {
        let other = slot.running.take();
        publish(None);
        drop(slot);
        if let Some(template) = other {
            template.retire();
        }
        prepare(program);
        return None;
    }
    match template.fork() {
        Ok(spawned) => Some((spawned, template.pid)),
        Err(ForkError::Refused(e)) => {
            tracing::debug!("the worker template could not fork: {e}");
            None
        }
        Err(ForkError::Gone(detail)) => {
            let gone = slot.running.take();
            publish(None);
            drop(slot);
            tracing::warn!(
                "the worker template {detail}; it is ended, workers start as new processes until another is ready"
            );
            if let Some(template) = gone {
                template.end();
            }
            prepare(program);
            None
        }
    }
}

/// Has a template of `program` serve this process's next sessions: starts one on the
/// worker-starting thread unless one runs. `false` when templates are off or this process
/// started [`MAX_STARTS`] already (the caller prepares a spare instead).
fn prepare(program: &WorkerProgram) -> bool {
    if !ENABLED.load(Ordering::Relaxed) {
        return false;
    }
    {
        let slot = lock(slot());
        if slot
            .running
            .as_ref()
            .is_some_and(|running| running.serves(program))
        {
            return true;
        }
        if slot.starts >= MAX_STARTS {
            return false;
        }
    }
    let program = program.clone();
    run_on_spawner(Box::new(move || {
        {
            let mut slot = lock(slot());
            let ready = slot
                .running
                .as_ref()
                .is_some_and(|running| running.serves(&program));
            if ready || slot.starts >= MAX_STARTS || !ENABLED.load(Ordering::Relaxed) {
                return;
            }
            slot.starts += 1;
        }
        let huge_code = huge_code::enabled();
        let started = spawn_template(&program, huge_code)
            .and_then(|spawned| Template::new(spawned, huge_code));
        match started {
            Ok(template) => {
                let old = {
                    let mut slot = lock(slot());
                    let old = slot.running.replace(template);
                    publish(slot.running.as_ref());
                    old
                };
                if let Some(template) = old {
                    template.retire();
                }
            }
            Err(e) => tracing::debug!("could not start a worker template: {e}"),
        }
    }))
}

/// In the template process (interpreter started, one thread): serves fork requests on
/// `control` until the host closes it. Returns `None` in the template when it is done, and
/// in each forked worker its link (on fd 3), for the worker's usual start.
pub(crate) fn serve_forks(control: UnixStream) -> Result<Option<UnixStream>, String> {
    // SAFETY: getppid has no preconditions.
    let host = unsafe { libc::getppid() };
    // `ps` shows it as what it is; each worker takes the name back.
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into `name`; PR_SET_NAME reads a
    // NUL-terminated string.
    unsafe {
        libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr());
        libc::prctl(libc::PR_SET_NAME, TEMPLATE_NAME.as_ptr());
    }
    // Other processes of the user cannot read the template's memory (nothing secret is in
    // it, but each worker starts as a copy of it).
    // SAFETY: prctl on this process.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) };
    // What every fork's confinement would otherwise compute again (the seccomp filters).
    sandbox::prepare();
    loop {
        let fds = match receive_fds(&control) {
            Ok(fds) => fds,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(format!("the worker template could not read a request: {e}")),
        };
        let [link, output]: [OwnedFd; 2] = fds
            .try_into()
            .map_err(|_| "a fork request carries a link and an output, nothing else")?;
        let threads = std::fs::read_dir("/proc/self/task").map_or(1, Iterator::count);
        if threads != 1 {
            return Err(format!(
                "the worker template has {threads} threads; it forks only while it has one"
            ));
        }
        let pid = fork(host, &name, link.as_raw_fd(), output.as_raw_fd());
        if pid == 0 {
            // The forked worker: fd 3 is its link now, and every descriptor above it was
            // closed, these included.
            let _ = (
                control.into_raw_fd(),
                link.into_raw_fd(),
                output.into_raw_fd(),
            );
            return take_link_fd().map(Some);
        }
        let answer = if pid > 0 {
            pid
        } else {
            -io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EAGAIN)
        };
        (&control)
            .write_all(&answer.to_ne_bytes())
            .map_err(|e| format!("the worker template could not answer: {e}"))?;
    }
}

/// Forks a worker that is the host's child (see the [module docs](self)); in the worker,
/// places its descriptors first. Returns as `fork` does.
fn fork(host: libc::pid_t, name: &[u8; 16], link: RawFd, output: RawFd) -> i32 {
    // SAFETY: this process has one thread, not attached to the interpreter, so the copy holds
    // no lock another thread took; the fork runs no Python until it is confined (see the
    // [module docs](self)). `clone` with these flags and no new stack returns twice, as
    // `fork` does; the child's first calls are async-signal-safe (`place`).
    unsafe {
        let flags = (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong;
        let pid = libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize);
        if pid == 0 {
            place(host, name, link, output);
            return 0;
        }
        if pid < 0 {
            // errno is the clone's, for the caller's `last_os_error`.
            return -1;
        }
        i32::try_from(pid).unwrap_or(-1)
    }
}

/// In the forked worker: dies with the host's worker-starting thread, its own process group
/// (the host stops it and what it starts by group), dumpable as a started worker is (to write
/// its user namespace's id maps: `sandbox::enter` turns it off once they are written), its
/// output on 1 and 2, its link on 3, nothing else open. Exits when any step fails.
///
/// # Safety
/// Only in the child of a fork, before anything else: async-signal-safe calls only.
unsafe fn place(host: libc::pid_t, name: &[u8; 16], link: RawFd, output: RawFd) {
    // SAFETY: async-signal-safe calls on numbers of this process and on `name`, which holds
    // a NUL (PR_GET_NAME wrote at most 15 bytes).
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
        let placed = libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0
            // The host ended before the death signal was armed: we were re-parented.
            && libc::getppid() == host
            && libc::setpgid(0, 0) == 0
            && libc::prctl(libc::PR_SET_DUMPABLE, 1) == 0
            && libc::dup2(output, 1) == 1
            && libc::dup2(output, 2) == 2
            // Replaces the template's link (fd 3) with the worker's.
            && libc::dup2(link, LINK_FD) == LINK_FD;
        if !placed {
            libc::_exit(1);
        }
        libc::syscall(
            libc::SYS_close_range,
            (LINK_FD + 1) as libc::c_uint,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A template serves only while templates are started with the code setting it was
    /// started with ([`use_huge_code`](super::super::use_huge_code)): after a change, the next
    /// session's request replaces it (`fork_worker`), and workers forked from it keep theirs.
    #[test]
    fn a_template_serves_only_while_its_huge_code_setting_is_current() {
        let program = WorkerProgram::this_executable();
        let template = |huge_code| Template {
            pid: 0,
            control: UnixStream::pair().expect("a socket pair").0,
            env: spawn_env(&program),
            program: program.clone(),
            host: std::process::id(),
            huge_code,
            last_words: Arc::default(),
        };
        let (moved, plain) = (template(true), template(false));
        huge_code::use_huge_code(true);
        assert!(moved.serves(&program) && !plain.serves(&program));
        huge_code::use_huge_code(false);
        assert!(!moved.serves(&program) && plain.serves(&program));
        huge_code::use_huge_code(true);
    }
}
