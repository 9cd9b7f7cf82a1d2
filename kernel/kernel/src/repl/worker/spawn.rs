//! Starting a worker process: which program ([`WorkerProgram`]), with what environment, and
//! with which file descriptors; and keeping one started ahead of need.
//!
//! Workers are forked from one long-lived thread of the parent: `PR_SET_PDEATHSIG` (the
//! worker is killed when its parent dies) follows the *thread* that forked, and the threads
//! that start sessions (tokio's blocking pool, a workflow step's thread) come and go.
//!
//! In the child, before `exec`: its own process group (the terminal's Ctrl-C goes to the
//! parent, which stops the block itself), the death signal, the link at fd 3; every other
//! descriptor is marked close-on-exec, so nothing of the parent (its trajectory, its
//! database) is inherited. Standard input is `/dev/null`; standard output and error go to a
//! pipe the parent reads (a crash's last words). The context memfds come later, in one
//! `sendmsg` with the start frame ([`send_fds`]).
//!
//! A *spare* is a worker started before a session needs it: its interpreter starts while
//! nobody waits, and the next session (or the restart after a crash) takes it and only
//! sends its start frame. When no worker template serves the process (`template.rs`), one is
//! prepared when a session ends (for the process's next one) and after a restart (for the
//! next crash); the environment it is started with holds only Python's own variables (the
//! session's comes with the start frame, and confinement sets it). The template is started
//! here too, as a worker told to serve forks.

use std::ffi::OsString;
use std::io::{self, IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::lock::lock;
use super::protocol::{LINK_FD, MAX_MEMFDS, NoSigPipe, TEMPLATE_VAR};

/// The argument that makes a program that embeds the kernel serve as a worker
/// ([`serve_if_worker`](super::serve_if_worker)).
pub const WORKER_ARG: &str = "__worker";

/// The program a worker process runs: this executable with [`WORKER_ARG`] (`rlm __worker`),
/// or an interpreter with a module (`python -m rlm_kernel._worker`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerProgram {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables set for the worker besides the allowed ones of the parent's environment.
    pub env: Vec<(OsString, OsString)>,
}

impl WorkerProgram {
    /// This executable again, with [`WORKER_ARG`]; its `main` must start with
    /// [`serve_if_worker`](super::serve_if_worker).
    pub fn this_executable() -> Self {
        Self {
            // The running image itself, even if its file was replaced since it started.
            program: PathBuf::from("/proc/self/exe"),
            args: vec![OsString::from(WORKER_ARG)],
            env: Vec::new(),
        }
    }
}

static PROGRAM: RwLock<Option<WorkerProgram>> = RwLock::new(None);

/// Registers the program that isolated sessions of this process start as their workers; a
/// program that embeds the kernel calls it once at start (`rlm` does, the Python package
/// does on import).
pub fn set_worker_program(program: WorkerProgram) {
    *PROGRAM.write().unwrap_or_else(PoisonError::into_inner) = Some(program);
}

pub(crate) fn worker_program() -> Option<WorkerProgram> {
    PROGRAM
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Variables of the parent's environment a worker keeps: what Python, its packages and the
/// C libraries under them read. Nothing else passes (API keys above all).
const KEPT_VARIABLES: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONHASHSEED",
    "PYTHONUTF8",
    "PYTHONIOENCODING",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "RAYON_NUM_THREADS",
];

/// Prefixes of kept variables (locale settings, polars' own).
const KEPT_PREFIXES: &[&str] = &["LC_", "POLARS_"];

/// The kept variables of ours and the program's own: what a worker starts with.
pub(crate) fn spawn_env(program: &WorkerProgram) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(name, _)| {
            name.to_str().is_some_and(|name| {
                KEPT_VARIABLES.contains(&name) || KEPT_PREFIXES.iter().any(|p| name.starts_with(p))
            })
        })
        .collect();
    env.extend(program.env.iter().cloned());
    env
}

/// What of the worker's start environment its Python keeps once confined (the sandbox's
/// policy environment replaces the rest): the variables that say where Python and its
/// packages are and how their native libraries behave, and the program's own.
pub(crate) fn python_env(program: &WorkerProgram) -> Vec<(String, String)> {
    spawn_env(program)
        .into_iter()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(name, _)| !matches!(name.as_str(), "PATH" | "HOME" | "USER" | "LOGNAME"))
        .collect()
}

/// A started worker process the parent has not talked to yet.
#[derive(Debug)]
pub(crate) struct Spawned {
    /// Its pid (ours to reap).
    pub(crate) pid: i32,
    /// The parent's end of its link.
    pub(crate) link: UnixStream,
    /// Its standard output and error.
    pub(crate) output: Output,
    /// It was started ahead of need (it may have died since).
    pub(crate) spare: bool,
    /// What it runs.
    pub(crate) program: WorkerProgram,
    /// The count of out-of-memory kills it would be among when it was started ([`oom_kills`]).
    pub(crate) oom_kills: Option<u64>,
}

/// A worker's own stdout and stderr, as its parent holds them.
#[derive(Debug)]
pub(crate) enum Output {
    /// Not read yet.
    Pipe(io::PipeReader),
    /// Read by a thread of their own, which keeps their tail here ([`drain_output`]).
    Drained(Arc<Mutex<Vec<u8>>>),
}

impl Spawned {
    /// Has its own stdout/stderr read from now on, by a thread of their own started at the
    /// first call ([`drain_output`]), and returns where that thread keeps their tail. A
    /// worker confined ahead of need (`pool.rs`) has it started on the pool's thread, not on
    /// the path of the session that takes it.
    pub(crate) fn read_output(&mut self) -> Arc<Mutex<Vec<u8>>> {
        if let Output::Drained(kept) = &self.output {
            return Arc::clone(kept);
        }
        let kept = Arc::new(Mutex::new(Vec::new()));
        let drained = Output::Drained(Arc::clone(&kept));
        if let Output::Pipe(pipe) = std::mem::replace(&mut self.output, drained) {
            drain_output(pipe, Arc::clone(&kept));
        }
        kept
    }
}

/// A worker for a session when no template serves it: the spare when there is one started
/// by `program`, else a new one. A spare that died meanwhile is found out when the session
/// sends its start frame (see `parent.rs`, which then asks for a new one).
pub(crate) fn take_worker(program: &WorkerProgram) -> io::Result<Spawned> {
    let spare = lock(spare_slot()).take();
    match spare {
        Some(spare) if spare.program == *program => Ok(Spawned {
            spare: true,
            ..spare
        }),
        Some(other) => {
            end_spare(other);
            start_worker(program)
        }
        None => start_worker(program),
    }
}

/// Starts a spare for the next session, unless one is there, on the spawner thread.
pub(crate) fn prepare_spare(program: &WorkerProgram) {
    if lock(spare_slot()).is_some() {
        return;
    }
    let program = program.clone();
    let job: SpawnJob = Box::new(move || {
        if lock(spare_slot()).is_some() {
            return;
        }
        match spawn_now(&program, None) {
            Ok(spare) => *lock(spare_slot()) = Some(spare),
            Err(e) => tracing::debug!("could not prepare a spare worker: {e}"),
        }
    });
    run_on_spawner(job);
}

/// Runs `job` on the spawner thread, without waiting for it; whether it was queued.
pub(crate) fn run_on_spawner(job: SpawnJob) -> bool {
    let queued = lock(spawner()).send(job).is_ok();
    if !queued {
        tracing::debug!("the worker-starting thread is gone");
    }
    queued
}

/// Starts the worker template (on the spawner thread): a worker process told to serve
/// forks (see `template.rs`), and to move its code to huge pages first if `huge_code`.
pub(crate) fn spawn_template(program: &WorkerProgram, huge_code: bool) -> io::Result<Spawned> {
    spawn_now(program, Some(huge_code))
}

fn spare_slot() -> &'static Mutex<Option<Spawned>> {
    static SPARE: Mutex<Option<Spawned>> = Mutex::new(None);
    &SPARE
}

/// A spare of another program: it exits when its link closes, and is reaped here.
fn end_spare(spare: Spawned) {
    drop(spare.link);
    // SAFETY: our unreaped child; a spare runs no user code, it only waits for its start.
    unsafe {
        libc::kill(spare.pid, libc::SIGKILL);
        libc::waitpid(spare.pid, std::ptr::null_mut(), 0);
    }
}

/// After its link closed, how long a worker may take to finish dying before it is killed:
/// its exit status is what tells a crash from a kill.
pub(crate) const REAP_WAIT: Duration = Duration::from_secs(1);

/// How a worker process ended, as `wait4` saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exit {
    /// The raw wait status, when the worker was reaped.
    pub(crate) status: Option<i32>,
    /// Its peak resident memory (and its children's), in bytes.
    pub(crate) peak_bytes: u64,
    /// It was still alive [`REAP_WAIT`] after its link closed, and [`reap`] killed it.
    pub(crate) killed: bool,
    /// For a worker ended by `SIGKILL`, the out-of-memory kills the kernel counted while it
    /// ran where its own would be ([`oom_kills`]), where both counts are known: its session's
    /// reaper fills it in.
    pub(crate) oom_kills: Option<u64>,
}

impl Exit {
    /// The signal that ended it, if one did.
    pub(crate) fn signal(&self) -> Option<i32> {
        self.status
            .filter(|&status| libc::WIFSIGNALED(status))
            .map(|status| libc::WTERMSIG(status))
    }
}

/// The count of processes the kernel's out-of-memory killer ended that a worker this process
/// starts would be counted in ([`oom_counter`]); `None` where none is kept. The killer's
/// victim gets `SIGKILL`, as from `kill -9`: what tells them apart is this count rising while
/// the worker ran.
pub(crate) fn oom_kills() -> Option<u64> {
    oom_counter()?.read()
}

/// Where the kernel counts the out-of-memory kills a worker's would be among.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OomCounter {
    /// The memory cgroup this process runs in, which its workers start in too: `oom_kill` in
    /// its `memory.oom_control` (cgroup v1) or `memory.events` (v2), Linux 4.13. The kernel
    /// counts there its kills of the group's processes (in v2, of the groups below it too),
    /// whether the group's limit or the machine's memory ran out; a kill elsewhere on the
    /// machine does not count.
    Group(PathBuf),
    /// The machine: `oom_kill` in `/proc/vmstat`, every kill on it, so one elsewhere while a
    /// worker ran counts too. Where the group keeps no count found here (the root group, a
    /// cgroup file system mounted elsewhere than `/sys/fs/cgroup`).
    Machine,
}

impl OomCounter {
    /// Its count now.
    fn read(&self) -> Option<u64> {
        let file = match self {
            Self::Group(file) => file.as_path(),
            Self::Machine => std::path::Path::new("/proc/vmstat"),
        };
        std::fs::read_to_string(file)
            .ok()?
            .lines()
            .find_map(|line| line.strip_prefix("oom_kill "))
            .and_then(|count| count.trim().parse().ok())
    }

    /// Where it counts, as a worker's end is told.
    pub(crate) fn scope(&self) -> &'static str {
        match self {
            Self::Group(_) => "among the processes of the worker's memory cgroup",
            Self::Machine => "on this machine",
        }
    }
}

/// Where this process's workers' out-of-memory kills are counted: its memory cgroup's count
/// where one is kept, else the machine's; found once.
pub(crate) fn oom_counter() -> Option<&'static OomCounter> {
    static COUNTER: OnceLock<Option<OomCounter>> = OnceLock::new();
    COUNTER
        .get_or_init(|| {
            let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
            group_oom_counts(&cgroups)
                .into_iter()
                .map(OomCounter::Group)
                .chain([OomCounter::Machine])
                .find(|counter| counter.read().is_some())
        })
        .as_ref()
}

/// The files that may hold the out-of-memory kill count of the memory cgroup that
/// `/proc/self/cgroup` (`cgroups`) names, where the cgroup file systems are usually mounted:
/// cgroup v1's `memory` hierarchy first, then v2's. None for the root group, which keeps none
/// in v2 and holds what no other group does: the machine's count serves it.
fn group_oom_counts(cgroups: &str) -> Vec<PathBuf> {
    let mut v1 = Vec::new();
    let mut v2 = Vec::new();
    for line in cgroups.lines() {
        // `hierarchy:controllers:path`; v2's line has no controllers.
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if path.is_empty() {
            continue;
        }
        if controllers.split(',').any(|c| c == "memory") {
            v1.push(
                PathBuf::from("/sys/fs/cgroup/memory")
                    .join(path)
                    .join("memory.oom_control"),
            );
        } else if controllers.is_empty() {
            v2.push(
                PathBuf::from("/sys/fs/cgroup")
                    .join(path)
                    .join("memory.events"),
            );
        }
    }
    v1.extend(v2);
    v1
}

/// Waits for `pid`, giving it [`REAP_WAIT`] to finish dying before it is killed: on a pidfd
/// (Linux 5.3), which is readable the moment the process has exited, so it is reaped then and
/// its waiting thread woken once; where there is none, by asking every 2 ms.
pub(crate) fn reap(pid: i32) -> Exit {
    let deadline = Instant::now() + REAP_WAIT;
    let exited = exit_of(pid);
    let mut killed = false;
    loop {
        let mut status = 0;
        // SAFETY: a zeroed rusage is valid for wait4 to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let options = if killed { 0 } else { libc::WNOHANG };
        // SAFETY: waits for our own child; status and usage point to live locals.
        let reaped = unsafe { libc::wait4(pid, &mut status, options, &mut usage) };
        if reaped == pid {
            return Exit {
                status: Some(status),
                peak_bytes: u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024,
                killed,
                oom_kills: None,
            };
        }
        if reaped < 0 {
            return Exit {
                status: None,
                peak_bytes: 0,
                killed,
                oom_kills: None,
            };
        }
        let now = Instant::now();
        if !killed && now >= deadline {
            // SAFETY: our unreaped child: the pid cannot have been reused.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed = true;
            continue;
        }
        match &exited {
            Some(pidfd) => wait_readable(pidfd, deadline - now),
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// A descriptor of our unreaped child `pid` that becomes readable when it exits (`None`:
/// the kernel has no pidfds).
fn exit_of(pid: i32) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// Waits until `fd` is readable, at most `wait` (and at least a millisecond).
fn wait_readable(fd: &OwnedFd, wait: Duration) {
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(wait.as_millis().max(1)).unwrap_or(i32::MAX);
    // SAFETY: one pollfd, alive for the call. Interrupted or failed, the loop asks again.
    unsafe { libc::poll(&mut poll, 1, ms) };
}

/// Bytes of a worker's own stderr kept for a crash report.
const LAST_WORDS: usize = 2048;

/// A job of the spawner thread.
pub(crate) type SpawnJob = Box<dyn FnOnce() + Send>;

/// Starts a worker now (on the spawner thread, see the [module docs](self)).
pub(crate) fn start_worker(program: &WorkerProgram) -> io::Result<Spawned> {
    let (reply, answer) = mpsc::channel();
    let program = program.clone();
    let job: SpawnJob = Box::new(move || {
        let _ = reply.send(spawn_now(&program, None));
    });
    let gone = || io::Error::other("the worker-starting thread is gone");
    lock(spawner()).send(job).map_err(|_| gone())?;
    answer.recv().map_err(|_| gone())?
}

/// Forks and execs `program` with the link at fd 3 (on the spawner thread); as the template
/// if `template` (which says whether it moves its code to huge pages).
fn spawn_now(program: &WorkerProgram, template: Option<bool>) -> io::Result<Spawned> {
    let (ours, theirs) = UnixStream::pair()?;
    let (output, output_writer) = io::pipe()?;
    let mut command = Command::new(&program.program);
    command
        .args(&program.args)
        .env_clear()
        .envs(spawn_env(program))
        .stdin(Stdio::null())
        .stdout(Stdio::from(output_writer.try_clone()?))
        .stderr(Stdio::from(output_writer));
    if let Some(huge_code) = template {
        command.env(TEMPLATE_VAR, if huge_code { "1" } else { "plain" });
    }
    let link = theirs.as_raw_fd();
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe calls (setpgid, prctl, getppid, dup2, syscall, _exit).
    unsafe {
        command.pre_exec(move || place_link(parent, link));
    }
    let child = command.spawn()?;
    // Ours to reap (`wait4`, see `parent.rs`); std's handle is not used again.
    let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
    drop(child);
    Ok(Spawned {
        pid,
        link: ours,
        output: Output::Pipe(output),
        spare: false,
        program: program.clone(),
        oom_kills: oom_kills(),
    })
}

/// In the child before exec: see the [module docs](self).
fn place_link(parent: libc::pid_t, link: RawFd) -> io::Result<()> {
    // SAFETY: async-signal-safe calls on numbers (descriptors, pids) of this process.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::getppid() != parent {
            // The parent died before the death signal was armed.
            libc::_exit(1);
        }
        // dup2 leaves the new descriptor without close-on-exec (and does nothing if the
        // link is already at fd 3, which then keeps its close-on-exec: clear it).
        if link == LINK_FD {
            if libc::fcntl(LINK_FD, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
        } else if libc::dup2(link, LINK_FD) < 0 {
            return Err(io::Error::last_os_error());
        }
        // Everything after fd 3 closes at exec (CLOSE_RANGE_CLOEXEC, Linux 5.11; the
        // kernel's own descriptors are close-on-exec already, so an older kernel leaks only
        // what a library opened without the flag). Not closed now: std reports a failed
        // exec through a close-on-exec pipe.
        const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
        libc::syscall(
            libc::SYS_close_range,
            (LINK_FD + 1) as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        );
    }
    Ok(())
}

/// The long-lived thread that forks every worker (see the [module docs](self)).
fn spawner() -> &'static Mutex<Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Mutex<Sender<SpawnJob>>> = OnceLock::new();
    SPAWNER.get_or_init(|| job_threads("rlm-worker-spawner", 1))
}

/// `n` long-lived threads named `name` that run the jobs sent to them, each job on the first
/// of them that is free (with one, one job after another).
pub(crate) fn job_threads(name: &str, n: usize) -> Mutex<Sender<SpawnJob>> {
    let (jobs, queue) = mpsc::channel::<SpawnJob>();
    let queue = Arc::new(Mutex::new(queue));
    for _ in 0..n {
        let queue = Arc::clone(&queue);
        let started = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                loop {
                    // The queue's lock is held while waiting for a job, not while running it.
                    let job = lock(&queue).recv();
                    let Ok(job) = job else { return };
                    job();
                }
            });
        if let Err(e) = started {
            tracing::error!("cannot start the thread `{name}`: {e}");
        }
    }
    Mutex::new(jobs)
}

/// Sends one byte carrying `fds` (`SCM_RIGHTS`): a session's context memfds, or a new
/// worker's link and output to the template (`template.rs`); and `then`, the bytes that follow
/// it on the link (a session's start frame), in the same `sendmsg`, so that the worker is woken
/// once for both. What the socket does not take at once follows as a plain write.
pub(crate) fn send_fds(link: &UnixStream, fds: &[OwnedFd], then: &[u8]) -> io::Result<()> {
    let fds: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_MEMFDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a worker takes at most {MAX_MEMFDS} contexts held in memory"),
        ));
    }
    let count = [u8::try_from(fds.len()).unwrap_or(u8::MAX)];
    let sent = rustix::net::sendmsg(
        link,
        &[IoSlice::new(&count), IoSlice::new(then)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    // The descriptors went with the first byte; a stream socket may have taken less of `then`.
    let Some(taken) = sent.checked_sub(count.len()) else {
        return Err(io::Error::from(io::ErrorKind::WriteZero));
    };
    NoSigPipe(link).write_all(&then[taken..])
}

/// Receives the byte [`send_fds`] sent and the descriptors it carries (in the worker, in the
/// template); close-on-exec.
pub(crate) fn receive_fds(link: &UnixStream) -> io::Result<Vec<OwnedFd>> {
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_MEMFDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut count = [0u8; 1];
    let received = rustix::net::recvmsg(
        link,
        &mut [io::IoSliceMut::new(&mut count)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    if received.bytes != 1 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the parent closed the link before starting the session",
        ));
    }
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if fds.len() != usize::from(count[0]) {
        return Err(io::Error::other(format!(
            "expected {} descriptors, received {}",
            count[0],
            fds.len()
        )));
    }
    Ok(fds)
}

/// fd 3, checked to be a socket: a user running `rlm __worker` by hand gets a sentence, not
/// a hang.
pub(crate) fn take_link_fd() -> Result<UnixStream, String> {
    // SAFETY: fstat on a descriptor number only reads the kernel's table.
    let is_socket = unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        libc::fstat(LINK_FD, &mut stat) == 0 && (stat.st_mode & libc::S_IFMT) == libc::S_IFSOCK
    };
    if !is_socket {
        return Err(
            "this is the internal worker of rlm's isolated sessions; it is started by `rlm run` (and the Python package), not by hand".to_owned(),
        );
    }
    set_cloexec(LINK_FD);
    // SAFETY: fd 3 is open (checked) and owned by nobody else in this process: the parent
    // placed the link there for us.
    Ok(UnixStream::from(unsafe { OwnedFd::from_raw_fd(LINK_FD) }))
}

/// Processes the code starts do not inherit `fd` (forked children still do).
pub(crate) fn set_cloexec(fd: i32) {
    // SAFETY: fcntl on a descriptor number; a failure leaves it as it was.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
    }
}

/// Reads a worker's own stdout/stderr (its crash messages; Python's own complaints) on a
/// thread, keeping the last [`LAST_WORDS`] bytes and logging them at debug level.
pub(crate) fn drain_output(output: io::PipeReader, last_words: Arc<Mutex<Vec<u8>>>) {
    drain_output_then(output, last_words, || {});
}

/// [`drain_output`], then `ended` on the same thread once the output closed: the process
/// ended (or closed it, which a worker or the template never does).
pub(crate) fn drain_output_then(
    mut output: io::PipeReader,
    last_words: Arc<Mutex<Vec<u8>>>,
    ended: impl FnOnce() + Send + 'static,
) {
    let spawned = std::thread::Builder::new()
        .name("rlm-worker-stderr".to_owned())
        .spawn(move || {
            let mut chunk = [0u8; 4096];
            loop {
                match output.read(&mut chunk) {
                    Ok(0) | Err(_) => return ended(),
                    Ok(n) => {
                        tracing::debug!(
                            "worker: {}",
                            String::from_utf8_lossy(&chunk[..n]).trim_end()
                        );
                        let mut kept = lock(&last_words);
                        kept.extend_from_slice(&chunk[..n]);
                        let excess = kept.len().saturating_sub(LAST_WORDS);
                        kept.drain(..excess);
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot read a worker's stderr: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::super::protocol::{FrameError, Start, ToWorker, read_frame, write_frame};
    use super::*;

    #[test]
    fn the_oom_count_is_read_from_the_memory_cgroup_this_process_runs_in() {
        let v1 = "9:name=systemd:/\n4:memory:/process_api/c6e4\n3:cpuset:/\n0::/\n";
        assert_eq!(
            group_oom_counts(v1),
            [PathBuf::from(
                "/sys/fs/cgroup/memory/process_api/c6e4/memory.oom_control"
            )]
        );
        let v2 = "0::/user.slice/user-1000.slice/session-2.scope\n";
        assert_eq!(
            group_oom_counts(v2),
            [PathBuf::from(
                "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope/memory.events"
            )]
        );
        // Joined controllers; v1 before v2.
        let both = "0::/app\n7:cpu,memory:/app\n";
        assert_eq!(
            group_oom_counts(both),
            [
                PathBuf::from("/sys/fs/cgroup/memory/app/memory.oom_control"),
                PathBuf::from("/sys/fs/cgroup/app/memory.events"),
            ]
        );
        // The root group, and what is not a cgroup line: the machine's count.
        for none in ["4:memory:/\n0::/\n", "", "garbage\n4:memory\n"] {
            assert_eq!(group_oom_counts(none), Vec::<PathBuf>::new(), "{none:?}");
        }
    }

    /// A start frame as a session sends it.
    fn start_frame() -> Vec<u8> {
        let start = Start {
            settings: None,
            contexts: Vec::new(),
        };
        let mut frame = Vec::new();
        write_frame(&mut frame, &ToWorker::Start(Box::new(start))).expect("a frame");
        frame
    }

    /// A link whose worker's end gives up after 10 s (a test that would hang fails).
    fn link() -> (UnixStream, UnixStream) {
        let (parent, worker) = UnixStream::pair().expect("a socket pair");
        worker
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        (parent, worker)
    }

    /// A child process of this one running `script` in `sh`, not waited for by std.
    fn child(script: &str) -> i32 {
        let child = Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh starts");
        let pid = i32::try_from(child.id()).expect("a pid");
        // Reaped by the test (`reap`), not by std's handle.
        drop(child);
        pid
    }

    #[test]
    fn a_worker_is_reaped_as_it_exits_and_killed_past_its_wait() {
        // Exits by itself: reaped with its status (the pidfd says it exited; or the polling).
        let exit = reap(child("exit 3"));
        let status = exit.status.expect("reaped");
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 3,
            "{status}"
        );
        // Exits after 100 ms: still within its wait, reaped when it exits.
        let started = Instant::now();
        let exit = reap(child("sleep 0.1; exit 4"));
        let status = exit.status.expect("reaped");
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 4,
            "{status}"
        );
        assert!(started.elapsed() >= Duration::from_millis(100));
        // Does not exit: killed once its wait is over, then reaped.
        let started = Instant::now();
        let exit = reap(child("exec sleep 30"));
        let status = exit.status.expect("reaped");
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL,
            "{status}"
        );
        assert!(started.elapsed() >= REAP_WAIT);
        assert!(started.elapsed() < Duration::from_secs(20));
        // A child already reaped (or none): nothing to wait for.
        assert!(reap(i32::MAX).status.is_none());
    }

    #[test]
    fn a_pidfd_is_readable_once_its_child_exited_and_not_before() {
        let pid = child("exec sleep 0.2");
        let Some(exited) = exit_of(pid) else {
            // No pidfds on this kernel: the polling serves, tested above.
            return;
        };
        let readable = || {
            let mut poll = libc::pollfd {
                fd: exited.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, alive for the call; no wait.
            unsafe { libc::poll(&mut poll, 1, 0) }
        };
        assert_eq!(readable(), 0, "readable while it runs");
        wait_readable(&exited, Duration::from_secs(10));
        assert_eq!(readable(), 1, "not readable once it exited");
        assert!(reap(pid).status.is_some());
    }

    #[test]
    fn the_descriptors_and_the_start_frame_after_them_arrive_from_one_sendmsg() {
        let (parent, worker) = link();
        let (pipe_out, pipe_in) = io::pipe().expect("a pipe");
        send_fds(&parent, &[OwnedFd::from(pipe_in)], &start_frame()).expect("sent");
        let fds = receive_fds(&worker).expect("the descriptors");
        assert_eq!(fds.len(), 1);
        // The descriptor received is the pipe sent.
        let mut received = std::fs::File::from(fds.into_iter().next().expect("one"));
        received.write_all(b"through").expect("written");
        drop(received);
        let mut through = String::new();
        (&pipe_out).read_to_string(&mut through).expect("read");
        assert_eq!(through, "through");
        // The frame follows the byte, whole.
        let frame = read_frame::<ToWorker>(&mut &worker, &mut Vec::new());
        assert!(matches!(frame, Ok(ToWorker::Start(_))), "{frame:?}");
    }

    #[test]
    fn a_start_frame_larger_than_the_socket_buffer_arrives_whole() {
        let (parent, worker) = link();
        let then: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
        let expected = then.clone();
        let reader = std::thread::spawn(move || {
            let fds = receive_fds(&worker).expect("the byte");
            let mut got = vec![0u8; expected.len()];
            (&worker).read_exact(&mut got).expect("the rest");
            (fds.len(), got == expected)
        });
        send_fds(&parent, &[], &then).expect("sent");
        assert_eq!(reader.join().expect("the reader ends"), (0, true));
    }

    #[test]
    fn a_cut_or_hostile_start_fails_cleanly_at_the_worker() {
        let frame = start_frame();
        // Cut: the link closes halfway through the frame.
        let (parent, worker) = link();
        send_fds(&parent, &[], &frame[..frame.len() / 2]).expect("sent");
        drop(parent);
        assert_eq!(receive_fds(&worker).expect("the byte").len(), 0);
        let cut = read_frame::<ToWorker>(&mut &worker, &mut Vec::new());
        assert!(matches!(cut, Err(FrameError::Closed)), "{cut:?}");
        // A frame of garbage, whole.
        let (parent, worker) = link();
        let mut garbage = 8u32.to_be_bytes().to_vec();
        garbage.extend_from_slice(&[0xc1; 8]);
        send_fds(&parent, &[], &garbage).expect("sent");
        assert_eq!(receive_fds(&worker).expect("the byte").len(), 0);
        let bad = read_frame::<ToWorker>(&mut &worker, &mut Vec::new());
        assert!(matches!(bad, Err(FrameError::Malformed(_))), "{bad:?}");
        // A byte that claims more descriptors than it carries.
        let (parent, worker) = link();
        let mut space =
            vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_MEMFDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let (_out, pipe_in) = io::pipe().expect("a pipe");
        let one = [pipe_in.as_fd()];
        assert!(control.push(SendAncillaryMessage::ScmRights(&one)));
        let mut claim = vec![3u8];
        claim.extend_from_slice(&frame);
        rustix::net::sendmsg(
            &parent,
            &[IoSlice::new(&claim)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .expect("sent");
        let refused = receive_fds(&worker).map(|fds| fds.len());
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string() == "expected 3 descriptors, received 1"),
            "{refused:?}"
        );
    }

    /// Runs two jobs on `n` job threads, each of which waits (up to 2 s) for the other to
    /// have started; returns whether both saw the other.
    fn two_jobs_meet(n: usize) -> bool {
        let threads = job_threads("rlm-test-jobs", n);
        let (done_tx, done) = mpsc::channel();
        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        for (tell, wait) in [(a_tx, b_rx), (b_tx, a_rx)] {
            let done_tx = done_tx.clone();
            let job: SpawnJob = Box::new(move || {
                let _ = tell.send(());
                let met = wait.recv_timeout(Duration::from_secs(2)).is_ok();
                let _ = done_tx.send(met);
            });
            assert!(lock(&threads).send(job).is_ok());
        }
        (0..2).all(|_| done.recv_timeout(Duration::from_secs(10)) == Ok(true))
    }

    #[test]
    fn two_job_threads_run_two_jobs_at_once_and_one_runs_them_in_turn() {
        assert!(
            two_jobs_meet(2),
            "two threads ran the two jobs one after another"
        );
        assert!(!two_jobs_meet(1), "one thread ran two jobs at once");
    }
}
