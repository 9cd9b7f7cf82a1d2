//! The worker process's side: [`main`] serves one session to the parent over the link on
//! fd 3.
//!
//! Order at start, while the process is still single-threaded: start CPython (which starts no
//! thread; a spare worker does this before its session exists) and read its own paths (a
//! template reads them once for all its forks, which run no Python until they are confined),
//! read the [`Confine`] frame, enter the session's directory, confine the process ([`confine`]:
//! the policy's environment replaces the one the worker started with), start the session's
//! threads (its session thread and watchdog, the output thread) and build its namespace with
//! the settings the `Confine` frame says it will start with (the support module's session, the
//! natives, the answer dict, `FINAL_VAR`, `SHOW_VARS`, then the kernel's own warm-up block: no
//! model code), and say so; then receive the context memfds and the [`Start`] frame (a worker
//! confined ahead of need waits for them, idle, until a session takes it, with all that done)
//! and add the contexts to the namespace (or, should the `Start` bring other settings, build it
//! again with them). Then the link is read in turns ([`Inbox`]): the session thread, idle, reads it
//! itself, so that a request wakes one thread, not two; it hands the reader back to the main thread
//! as it takes a request, without waking it unless it has been idle for a while (the main thread
//! looks every [`CANCEL_POLL`] meanwhile), runs it and writes its reply to the link itself (a
//! block's once its output is sent). While a request runs, the main thread reads: requests go to the session
//! thread's queue, in order, without waiting ([`LocalSession::submit`]); interrupts, sub-call
//! answers and `EndProcesses` are handled at once, even while a block runs (what of these the idle
//! session thread reads is done by it, or left to the main thread: `EndProcesses`, the link's end).
//! A thread waiting for a sub-call's answer takes the reader in turn too, and reads its answer
//! itself.
//! The worker bounds no request's wait itself: its parent stops a block that outlives its time, and
//! ends a worker that does not answer. Block output is sent as written after a quiet spell, else
//! buffered and sent in chunks (at 32 KiB, after 10 ms, and before a block's reply), never from a
//! forked child (a block's copy in a forked child ends there and never reaches its reply). No tokio
//! runtime runs in a worker.

use std::collections::HashMap;
use std::io::BufReader;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvError, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

use super::confinement::{PythonPaths, confine};
use super::huge_code;
use super::lock::lock;
use super::protocol::TEMPLATE_VAR;
use super::protocol::{
    Confine, FrameError, FromWorker, MemfdContent, ObjectFormat, Reply, Request, Start, ToWorker,
    WireContext, WireSource, read_frame, write_frame,
};
use super::spawn::{WORKER_ARG, receive_fds, take_link_fd};
use super::template::serve_forks;
use super::transfer::share_module;
use super::turns::{Frames, Readable, Wakeup, wait_for};
use crate::repl::capture::{OutputSink, Stream};
use crate::repl::config::SessionConfig;
use crate::repl::context::{
    LoadedContext, load_context, load_encoded, load_live_value, load_text_bytes,
};
use crate::repl::error::ReplError;
use crate::repl::interpreter;
use crate::repl::interrupt::BlockEvents;
use crate::repl::local::{
    Answer, ContextLoader, Embedding, Job, JobSource, LocalSession, Prepared, Ran, ensure_module,
    pop_result,
};
use crate::repl::natives::{RemoteCalls, SubAnswer, SubCallRoute, SubFailure, WireChild};
use crate::repl::source::{ContextInput, ContextSource, LoadOptions, check_names};

/// Output is sent once this much is buffered...
const FLUSH_BYTES: usize = 32 * 1024;
/// ...or this long after the first unsent write.
const FLUSH_DELAY: Duration = Duration::from_millis(10);
/// How often a waiting sub-call looks at its block's cancellation.
const CANCEL_POLL: Duration = Duration::from_millis(10);
/// How long the main thread looks every [`CANCEL_POLL`] whether the idle session thread gave
/// the link's reader back (see `Inbox`); then it sleeps until woken.
const LOOKING: Duration = Duration::from_secs(1);

/// When this process was started as a worker (its first argument is [`WORKER_ARG`]), serves
/// its session and returns the exit code; else `None`. Call it first thing in `main`, before
/// anything starts a thread.
pub fn serve_if_worker() -> Option<std::process::ExitCode> {
    (std::env::args_os().nth(1).as_deref() == Some(WORKER_ARG.as_ref()))
        .then(|| std::process::ExitCode::from(main()))
}

/// Serves one session to the parent that started this process (see the `repl::worker` module docs).
/// Called first thing by the worker executable (`rlm __worker`, `python -m rlm_kernel._worker`).
/// A session that started ends the process itself (`_exit(0)`) when the parent says so or
/// goes away; otherwise (a spare or a template the parent no longer needs, a failed start) it
/// returns the exit status, and the caller exits with it, without finalising the interpreter.
pub fn main() -> u8 {
    match serve() {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("rlm worker: {message}");
            2
        }
    }
}

fn serve() -> Result<(), String> {
    let template = take_template_role();
    let mut link = take_link_fd()?;
    if let Some(huge_code) = template {
        // With one thread, before the interpreter starts: see `huge_code`. Where the machine
        // cannot have it, the forks run their code from the files' pages as before, at the
        // speed measured before. What it did and why not more goes to the template's stderr,
        // which its host logs at debug level (`rlm -vv`).
        let moved = huge_code::move_own_code(huge_code);
        // One write: the host logs each read of the pipe as one line.
        let said = format!("the worker template's code on huge pages: {moved}\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), said.as_bytes());
    }
    // The interpreter starts while the parent may not have a session for us yet (a spare,
    // the template).
    interpreter::start().map_err(|e| e.to_string())?;
    enable_fault_handler();
    // Python's own files, read now: a template reads them once for all its forks, which then
    // run no Python until they are confined (the confined process runs Python's after-fork
    // work then, once).
    let python = Python::attach(|py| python_paths(py).map_err(|e| e.to_string()));
    if template.is_some() {
        match serve_forks(link)? {
            // A worker forked by the template, with its own link.
            Some(own) => link = own,
            None => return Ok(()),
        }
    }
    let mut reader = BufReader::new(
        link.try_clone()
            .map_err(|e| format!("cannot read its link: {e}"))?,
    );
    let mut buffer = Vec::new();
    let confine = match read_frame::<ToWorker>(&mut reader, &mut buffer) {
        Ok(ToWorker::Confine(confine)) => confine,
        // The parent went away before it needed this spare.
        Err(FrameError::Closed) => return Ok(()),
        Ok(_) => return Err("the parent did not start with a `Confine` frame".to_owned()),
        Err(e) => return Err(format!("reading the confinement frame: {e}")),
    };
    let confinement = match confine_worker(&confine, &python) {
        Ok(confinement) => confinement,
        Err(error) => return report_failed_start(&link, error),
    };
    // Now multi-threaded: everything of the session its start frame does not change, before
    // the worker says it is confined (a worker of the pool is then ready to the last thread).
    let fds = link
        .try_clone()
        .map_err(|e| format!("cannot share its link: {e}"))?;
    // After `confine`: this is the confined process, whose pid the link must know.
    let link = Arc::new(Link::new(link));
    let inbox = match Inbox::new(Arc::clone(&link)) {
        Ok(inbox) => Arc::new(inbox),
        Err(e) => {
            let error = ReplError::internal("making the link's inbox", e);
            return report_failed_start(&fds, error);
        }
    };
    // The session's namespace too, with the settings it is expected to start with.
    let prepared = Prepared::new().and_then(|mut prepared| {
        let (route, embedding) = embedded(&inbox, None);
        prepared.build(confine.session.clone(), route, embedding)?;
        Ok(prepared)
    });
    let prepared = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return report_failed_start(&fds, error),
    };
    link.clone().start_flusher();
    link.send(&FromWorker::Confined(confinement))
        .map_err(|e| format!("could not answer its confinement: {e}"))?;
    // A worker of the pool waits here, confined, until a session takes it (or the run ends).
    let memfds = match receive_fds(&fds) {
        Ok(memfds) => memfds,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
        Err(e) => return Err(format!("receiving the contexts' memfds: {e}")),
    };
    let start = match read_frame::<ToWorker>(&mut reader, &mut buffer) {
        Ok(ToWorker::Start(start)) => start,
        Err(FrameError::Closed) => return Ok(()),
        Ok(_) => return Err("the parent did not send a `Start` frame".to_owned()),
        Err(e) => return Err(format!("reading the start frame: {e}")),
    };
    match start_session(&inbox, prepared, *start, confine.session, memfds) {
        Ok(session) => {
            run(&inbox, &session, Frames::new(reader, buffer));
            end_served()
        }
        Err(error) => link
            .send(&FromWorker::Failed(error))
            .map_err(|e| format!("could not report a failed start: {e}")),
    }
}

/// Ends the worker once its session is over (`run` flushed its output and closed its link):
/// `_exit`, not a return through the program's `main`. A return would drop the session (its
/// Python objects, while its threads may still run) and run the C library's exit handlers and
/// every library's destructors — writes to pages the worker still shares copy-on-write, each
/// one copied, for a process that is about to end. What the session's code started ends with
/// the worker's PID namespace (or its supervisor), as before.
fn end_served() -> ! {
    // SAFETY: ends this process; nothing of it runs after.
    unsafe { libc::_exit(0) }
}

fn report_failed_start(link: &UnixStream, error: ReplError) -> Result<(), String> {
    let mut stream = link;
    write_frame(&mut stream, &FromWorker::Failed(error))
        .map_err(|e| format!("could not report a failed start: {e}"))
}

/// Whether this process was started as the worker template ([`TEMPLATE_VAR`]), and if so
/// whether it moves its code to huge pages; the variable is removed before the interpreter
/// copies the environment.
fn take_template_role() -> Option<bool> {
    let template = std::env::var_os(TEMPLATE_VAR)?;
    // SAFETY: called first thing in `serve`, while this process has one thread.
    unsafe { std::env::remove_var(TEMPLATE_VAR) };
    Some(template != "plain")
}

/// Enters the session's directory and confines the process (see the [module docs](self)) with
/// `python`'s files reachable (read at the interpreter's start, see [`python_paths`]). Runs no
/// Python before the confinement's forks.
fn confine_worker(
    confine_as: &Confine,
    python: &Result<PythonPaths, String>,
) -> Result<sandbox::Report, ReplError> {
    enter_directory(&confine_as.cwd)?;
    let mut python = python
        .clone()
        .map_err(|e| ReplError::internal("reading the interpreter's paths", e))?;
    // `python -m` puts the working directory on `sys.path`: the user's, not Python's.
    python.read.retain(|path| *path != confine_as.cwd);
    let confinement = confine(confine_as.policy.clone(), confine_as.level, python)?;
    // `enter` replaced the environment with the policy's; Python copied the old one. And it
    // forked: this process, not the one that started the interpreter, holds the sessions.
    sync_python_environment()?;
    Python::attach(|py| {
        interpreter::interpreter(py)?
            .support(py)
            .call_method0("adopt_process")
            .map(drop)
            .map_err(|e| ReplError::internal("adopting the confined process", e))
    })?;
    Ok(confinement)
}

/// Starts the session `prepared` built ahead for `built_for`: with `start`'s settings if it
/// brings others (the namespace is built again), its contexts added.
fn start_session(
    inbox: &Arc<Inbox>,
    prepared: Prepared,
    start: Start,
    built_for: SessionConfig,
    memfds: Vec<OwnedFd>,
) -> Result<LocalSession, ReplError> {
    let inputs: Vec<ContextInput> = start.contexts.iter().map(placeholder_input).collect();
    check_names(&inputs)?;
    let loader = Arc::new(WireLoader {
        contexts: start.contexts,
        memfds,
    });
    let (route, embedding) = embedded(inbox, Some(loader));
    let config = start.settings.unwrap_or(built_for);
    let session = prepared.start(config, route, &inputs, embedding)?;
    let ready = FromWorker::Ready {
        contexts: session.contexts().to_vec(),
    };
    inbox
        .link
        .send(&ready)
        .map_err(|e| ReplError::internal("answering the parent", e))?;
    Ok(session)
}

/// How the worker's session reaches its parent: sub-calls, output and block events over
/// the link, its requests from the link's `inbox` while it is idle; contexts through `loader`.
fn embedded(
    inbox: &Arc<Inbox>,
    loader: Option<Arc<dyn ContextLoader>>,
) -> (SubCallRoute, Embedding) {
    let link = &inbox.link;
    let remote: Arc<dyn RemoteCalls> = inbox.clone();
    let jobs: Arc<dyn JobSource> = inbox.clone();
    let embedding = Embedding {
        output: Some(link.clone()),
        events: Some(link.clone()),
        loader,
        jobs: Some(jobs),
    };
    (SubCallRoute::Remote(remote), embedding)
}

/// The interpreter's own files, which the worker must reach once confined: its prefixes
/// (executed: spawn workers of `multiprocessing`, the standard library's extension modules),
/// and the rest of `sys.path` (read: site-packages, folders `.pth` files add). `''` is left
/// out, and the session's working directory is when the worker is confined: they are the
/// user's, not Python's.
fn python_paths(py: Python<'_>) -> PyResult<PythonPaths> {
    let sys = py.import("sys")?;
    let mut paths = PythonPaths::default();
    for name in [
        "prefix",
        "base_prefix",
        "exec_prefix",
        "base_exec_prefix",
        "executable",
    ] {
        if let Ok(path) = sys.getattr(name)?.extract::<String>()
            && !path.is_empty()
        {
            paths.exec.push(PathBuf::from(path));
        }
    }
    for entry in sys.getattr("path")?.try_iter()? {
        if let Ok(path) = entry?.extract::<String>()
            && !path.is_empty()
        {
            paths.read.push(PathBuf::from(path));
        }
    }
    Ok(paths)
}

/// The session's view of a context: its name, and for a file its path (the loader reads the
/// others from their memfds).
fn placeholder_input(context: &WireContext) -> ContextInput {
    ContextInput {
        name: context.name.clone(),
        source: match &context.source {
            WireSource::Path(path) => ContextSource::Path(path.clone()),
            WireSource::Memfd { .. } => ContextSource::Text(String::new()),
        },
    }
}

/// The session's working directory (the parent's: relative context paths mean the same).
fn enter_directory(cwd: &std::path::Path) -> Result<(), ReplError> {
    std::env::set_current_dir(cwd).map_err(|e| ReplError::Worker {
        problem: format!(
            "could not enter its session's directory `{}`: {e}",
            cwd.display()
        ),
    })
}

/// `os.environ` is what the process's environment is now (Python copied it at its start).
fn sync_python_environment() -> Result<(), ReplError> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    Python::attach(|py| -> PyResult<()> {
        let environ = py.import("os")?.getattr("environ")?;
        let data = environ.getattr("_data")?;
        data.call_method0("clear")?;
        for (name, value) in env {
            environ.set_item(name, value)?;
        }
        Ok(())
    })
    .map_err(|e| ReplError::internal("setting the worker's environment", e))
}

/// Python's fault handler writes the Python stack of a fatal signal to stderr (which the
/// parent keeps as the crash's last words), then lets the signal end the process as usual.
fn enable_fault_handler() {
    let enabled = Python::attach(|py| -> PyResult<()> {
        let sys = py.import("sys")?;
        let stderr = sys.getattr("__stderr__")?;
        py.import("faulthandler")?
            .call_method1("enable", (stderr, false))
            .map(drop)
    });
    if let Err(e) = enabled {
        tracing::debug!("no fault handler in the worker: {e}");
    }
}

/// Loads the contexts the parent described: files as usual, memfds mapped.
#[derive(Debug)]
struct WireLoader {
    contexts: Vec<WireContext>,
    memfds: Vec<OwnedFd>,
}

impl ContextLoader for WireLoader {
    fn load<'py>(
        &self,
        py: Python<'py>,
        index: usize,
        input: &ContextInput,
        options: &LoadOptions,
    ) -> Result<LoadedContext<'py>, ReplError> {
        let Some(WireSource::Memfd {
            index: memfd,
            content,
        }) = self.contexts.get(index).map(|c| &c.source)
        else {
            return load_context(py, index, input, options);
        };
        let fd = self
            .memfds
            .get(*memfd)
            .ok_or_else(|| {
                ReplError::internal("loading a context", "its memfd was not handed over")
            })?
            .as_raw_fd();
        match content {
            MemfdContent::Text { source } => {
                let mapped = Mapped::new(fd)
                    .map_err(|e| ReplError::internal("mapping a context's shared memory", e))?;
                load_text_bytes(py, index, input, source, mapped.bytes())
            }
            MemfdContent::Encoded { source, format } => {
                let mapped = Mapped::new(fd)
                    .map_err(|e| ReplError::internal("mapping a context's shared memory", e))?;
                load_encoded(py, index, input, source, *format, mapped.bytes(), options)
            }
            MemfdContent::Object { label, format } => {
                let value = share_module(py)
                    .and_then(|share| {
                        share.call_method1("import_shared", (fd, format_name(*format)))
                    })
                    .map_err(|e| ReplError::Worker {
                        problem: format!("could not read the context `{label}` it was handed: {e}"),
                    })?;
                load_live_value(py, index, input, label, value)
            }
        }
    }
}

fn format_name(format: ObjectFormat) -> &'static str {
    match format {
        ObjectFormat::Text => "text",
        ObjectFormat::Bytes => "bytes",
        ObjectFormat::ArrowIpc => "arrow_ipc",
        ObjectFormat::Pickle => "pickle",
    }
}

/// A memfd mapped read-only for as long as the value is alive.
struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapped {
    fn new(fd: i32) -> std::io::Result<Self> {
        // SAFETY: fstat fills the struct for an open descriptor.
        let len = unsafe {
            let mut stat: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut stat) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            usize::try_from(stat.st_size).unwrap_or(0)
        };
        if len == 0 {
            return Ok(Self {
                ptr: std::ptr::null_mut(),
                len: 0,
            });
        }
        // SAFETY: a fresh read-only private mapping of `len` bytes of an open file.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` maps `len` readable bytes until `self` is dropped; the memfd is
        // sealed, so they do not change.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly the mapping made in `new`, borrowed by nobody now.
            unsafe {
                libc::munmap(self.ptr, self.len);
            }
        }
    }
}

/// Reads frames until the parent says to stop or goes away, in turns with the session thread
/// (see [`Inbox`]): requests go to the session thread in order, which runs each and writes its
/// reply itself; the rest is handled here at once.
fn run(inbox: &Inbox, session: &LocalSession, frames: Frames) {
    // The link's reader while this thread has the turn.
    let mut mine = Some(frames);
    loop {
        match inbox.next_action(&mut mine) {
            Action::Job(job) => {
                if session.submit(job).is_err() {
                    break;
                }
            }
            Action::EndProcesses(id) => {
                let done = session.end_processes().map(|()| None);
                inbox.link.reply(id, Reply::Text(done));
            }
            Action::CheckStop => session.check_stop(),
            Action::Nothing => {}
            Action::End => break,
        }
    }
    inbox.link.close();
}

/// The next frame the main thread reads, or `None` once the session thread claims the turn
/// (it is idle): the main thread waits on the link and the claim at once.
fn next_or_claim(frames: &mut Frames, claim: &Wakeup) -> Option<Result<ToWorker, FrameError>> {
    if !frames.read_ahead() {
        match wait_for(frames.fd(), Some(claim), None) {
            Ok(Readable::Link) => {}
            Ok(Readable::Woken) => return None,
            Err(e) => return Some(Err(FrameError::Io(e))),
        }
    }
    Some(frames.read())
}

/// The link's incoming side, read in turns: by the main thread; by the session thread while
/// it waits for its next job, so that a request wakes one thread of the worker, not two (the
/// main thread reading it, then the session thread handed it); and by a thread that waits
/// for a sub-call's answer (the session thread in a block, or a thread the block started),
/// so that the answer wakes it alone. The session thread, idle, claims the turn
/// ([`JobSource::next_job`]: its queue empty); the main thread, which waits on the link and
/// the claim at once, hands it the reader; the session thread reads until a request comes,
/// hands the reader back, and runs it. The main thread looks every [`CANCEL_POLL`] whether
/// the reader is back, for [`LOOKING`] at most (then it sleeps until woken: an idle worker's
/// looks stay bounded): the session thread hands it back without waking it, unless it
/// stopped looking, so that the request's way to its start holds no other thread's wake-up
/// (~10 µs of the session thread's on a virtual machine). So while a block runs the main
/// thread reads (interrupts, `EndProcesses` are handled at once; those in a block's first
/// [`CANCEL_POLL`] that much later at most, where a block's parent kills its worker half a
/// second after an interrupt), and what the session thread reads that is the main thread's
/// to do (`EndProcesses`, the end of the link) it leaves to it, waking it. A block shorter
/// than [`CANCEL_POLL`] often ends before the main thread took the reader back, and the
/// idle session thread takes it again without a wake-up either. A
/// thread that sends a sub-call claims the turn the same way, unless another thread has or
/// claims it (then the answer comes from the one that reads, as before): it reads, every
/// [`CANCEL_POLL`] at most looking at its call's cancellation, delivers the answers it reads
/// (its own, or another waiting thread's), and hands the reader back with its own answer,
/// or at the first frame that asks anything of the main thread (a request, an interrupt
/// for the watchdog to see, `EndProcesses`, the link's end), which goes back with it and
/// wakes the main thread. With its answer it wakes no thread: the main thread, while a
/// waiting thread has the reader, looks every [`CANCEL_POLL`] whether it is back, and the
/// block's next sub-call (or the session thread once idle) takes it first if it comes
/// sooner. So a block's code that goes on after a sub-call has its interrupts read
/// [`CANCEL_POLL`] later at most.
struct Inbox {
    link: Arc<Link>,
    turn: Mutex<Turn>,
    turned: Condvar,
    /// Woken by the session thread when it claims the turn from the main thread waiting on
    /// the link.
    claim: Wakeup,
    /// The exec being run, or the last one: an interrupt names the exec it is for.
    current: Mutex<Option<(u64, CancellationToken)>>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").finish_non_exhaustive()
    }
}

/// Who reads the link (see [`Inbox`]).
#[derive(Default)]
struct Turn {
    /// The reader, `None` while a thread holds it.
    frames: Option<Frames>,
    /// The idle session thread waits for the turn or has it.
    claimed: bool,
    /// A thread waiting for a sub-call's answer waits for the turn or has it.
    waiting: bool,
    /// The main thread, waiting for the reader, looks every [`CANCEL_POLL`] whether it is
    /// back: it need not be woken.
    looking: bool,
    /// What another thread read that the main thread is to do (it takes the reader with it).
    left: Option<Action>,
}

impl Turn {
    /// The reader for a thread other than the main thread: not while it carries what the
    /// main thread is to do.
    fn take_free(&mut self) -> Option<Frames> {
        if self.left.is_none() {
            self.frames.take()
        } else {
            None
        }
    }
}

/// A thread waiting for a sub-call's answer, at reading the link (see [`Inbox`]).
enum Reading {
    /// Another thread reads: the answer comes from it.
    No,
    /// Claimed from the main thread, not yet handed over.
    Claimed,
    Holding(Frames),
}

/// What a frame asks of the worker.
enum Action {
    /// A request for the session thread.
    Job(Job),
    /// End the processes the session's blocks started, now, and reply to request `id`.
    EndProcesses(u64),
    /// The running block's stop token was cancelled: the watchdog looks at it now.
    CheckStop,
    Nothing,
    /// The parent said to stop, or went away.
    End,
}

impl Inbox {
    fn new(link: Arc<Link>) -> std::io::Result<Self> {
        Ok(Self {
            link,
            turn: Mutex::new(Turn::default()),
            turned: Condvar::new(),
            claim: Wakeup::new()?,
            current: Mutex::new(None),
        })
    }

    /// The main thread's next thing to do: what the next frame it reads asks (`mine`: the
    /// reader while it has the turn), or what another thread left to it.
    fn next_action(&self, mine: &mut Option<Frames>) -> Action {
        loop {
            match mine {
                Some(frames) => {
                    let mut turn = lock(&self.turn);
                    if turn.claimed || turn.waiting {
                        turn.frames = mine.take();
                        drop(turn);
                        self.turned.notify_all();
                    } else {
                        drop(turn);
                        if let Some(frame) = next_or_claim(frames, &self.claim) {
                            return self.dispatch(frame);
                        }
                    }
                }
                None => {
                    let (frames, left) = self.await_turn();
                    *mine = Some(frames);
                    if let Some(action) = left {
                        return action;
                    }
                }
            }
        }
    }

    /// The main thread waits for the reader back (no other thread claims it), with what
    /// the thread that gave it back left to it. It looks every [`CANCEL_POLL`] whether it is
    /// back while a waiting thread has the reader, and for [`LOOKING`] while the idle session
    /// thread has it or claims it: they give it back without waking it (unless they leave it
    /// something to do, or it stopped looking).
    fn await_turn(&self) -> (Frames, Option<Action>) {
        let mut turn = lock(&self.turn);
        let since = Instant::now();
        loop {
            if (turn.left.is_some() || !(turn.claimed || turn.waiting))
                && let Some(frames) = turn.frames.take()
            {
                turn.looking = false;
                return (frames, turn.left.take());
            }
            turn.looking = turn.waiting || (turn.claimed && since.elapsed() < LOOKING);
            turn = if turn.looking {
                self.turned
                    .wait_timeout(turn, CANCEL_POLL)
                    .map_or_else(|poisoned| poisoned.into_inner().0, |(turn, _)| turn)
            } else {
                self.turned
                    .wait(turn)
                    .unwrap_or_else(PoisonError::into_inner)
            };
        }
    }

    /// The session thread, idle, takes the reader (the main thread told if it holds it).
    fn claim_turn(&self) -> Frames {
        let mut turn = lock(&self.turn);
        turn.claimed = true;
        if turn.frames.is_none() {
            self.claim.wake();
        }
        loop {
            if let Some(frames) = turn.take_free() {
                return frames;
            }
            turn = self
                .turned
                .wait(turn)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The session thread hands the reader back to the main thread, with `left` for it to do:
    /// woken only then or when it no longer looks (see [`Inbox`]), else it takes the reader
    /// at its next look, and the request taken starts without another thread's wake-up on
    /// its way.
    fn give_back(&self, frames: Frames, left: Option<Action>) {
        let wake = {
            let mut turn = lock(&self.turn);
            turn.frames = Some(frames);
            turn.claimed = false;
            let wake = left.is_some() || !turn.looking;
            turn.left = left;
            wake
        };
        if wake {
            self.turned.notify_all();
        }
    }

    /// Sends `message` (built with the call's id) and waits for its answer, reading the
    /// link itself meanwhile when no other thread does but the main thread (see [`Inbox`]);
    /// `Err` when the call was cancelled or the link is gone.
    fn ask(
        &self,
        message: impl FnOnce(u64) -> FromWorker,
        cancel: &CancellationToken,
    ) -> Result<CallAnswer, SubFailure> {
        let link = &self.link;
        let call = link.next_call.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        lock(&link.calls).insert(call, tx);
        if let Err(e) = link.send(&message(call)) {
            lock(&link.calls).remove(&call);
            return Err(link_gone(&e.to_string()));
        }
        let mut reading = self.claim_for_answer();
        loop {
            let answer = match reading {
                Reading::No => rx.recv_timeout(CANCEL_POLL),
                Reading::Claimed | Reading::Holding(_) => {
                    reading = self.read_for_answer(reading);
                    rx.try_recv().map_err(|e| match e {
                        TryRecvError::Empty => RecvTimeoutError::Timeout,
                        TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                    })
                }
            };
            let answer = match answer {
                Ok(answer) => Ok(answer),
                Err(RecvTimeoutError::Timeout) if cancel.is_cancelled() => {
                    lock(&link.calls).remove(&call);
                    Err(SubFailure::from(&bridge::BridgeError::Cancelled))
                }
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => Err(link_gone("it closed")),
            };
            self.end_reading(reading, None);
            return answer;
        }
    }

    /// A thread that waits for a sub-call's answer claims the reader, unless another thread
    /// has it or claims it (the idle session thread, another waiting thread): then the
    /// answer reaches it from the thread that reads.
    fn claim_for_answer(&self) -> Reading {
        let mut turn = lock(&self.turn);
        if turn.claimed || turn.waiting {
            return Reading::No;
        }
        turn.waiting = true;
        if let Some(frames) = turn.take_free() {
            return Reading::Holding(frames);
        }
        if turn.frames.is_none() {
            // The main thread has the reader, and waits on the link.
            self.claim.wake();
        }
        Reading::Claimed
    }

    /// A waiting thread's next step at reading, for at most [`CANCEL_POLL`]: the reader
    /// handed over, or the next frame read and done; what is the main thread's to do goes
    /// back to it with the reader, and the thread waits for its answer as the others do.
    fn read_for_answer(&self, reading: Reading) -> Reading {
        let mut frames = match reading {
            Reading::No => return Reading::No,
            Reading::Claimed => {
                let turn = lock(&self.turn);
                let (mut turn, _) = self
                    .turned
                    .wait_timeout_while(turn, CANCEL_POLL, |turn| {
                        turn.frames.is_none() || turn.left.is_some()
                    })
                    .unwrap_or_else(PoisonError::into_inner);
                return turn.take_free().map_or(Reading::Claimed, Reading::Holding);
            }
            Reading::Holding(frames) => frames,
        };
        if !frames.read_ahead() {
            match wait_for(frames.fd(), None, Some(CANCEL_POLL)) {
                Ok(Readable::Link) => {}
                Ok(Readable::Woken) => return Reading::Holding(frames),
                // The main thread finds the same and ends the worker.
                Err(_) => {
                    self.end_reading(Reading::Holding(frames), None);
                    return Reading::No;
                }
            }
        }
        match self.dispatch(frames.read()) {
            Action::Nothing => Reading::Holding(frames),
            action => {
                self.end_reading(Reading::Holding(frames), Some(action));
                Reading::No
            }
        }
    }

    /// A waiting thread is done reading: it hands the reader back, with `left` for the main
    /// thread to do, or gives up its claim. The main thread is woken only for what it is to
    /// do, and the idle session thread if it waits for the reader: else the main thread
    /// takes the reader back at its next look (within [`CANCEL_POLL`]), or the next
    /// sub-call's thread takes it first, so that the waiting thread's wake-up of another
    /// thread (~15 µs of its own on a virtual machine) is not on the answer's way back.
    fn end_reading(&self, reading: Reading, left: Option<Action>) {
        if matches!(reading, Reading::No) {
            return;
        }
        let wake = {
            let mut turn = lock(&self.turn);
            turn.waiting = false;
            if let Reading::Holding(frames) = reading {
                turn.frames = Some(frames);
                turn.left = left;
            }
            turn.left.is_some() || turn.claimed
        };
        if wake {
            self.turned.notify_all();
        }
    }

    /// What `frame` asks; a request becomes the session thread's job.
    fn dispatch(&self, frame: Result<ToWorker, FrameError>) -> Action {
        let link = &self.link;
        match frame {
            Ok(ToWorker::Request { id, request }) => Action::Job(match request {
                Request::EndProcesses => return Action::EndProcesses(id),
                Request::Exec { code, stopped } => {
                    let stop = CancellationToken::new();
                    if stopped {
                        stop.cancel();
                    }
                    *lock(&self.current) = Some((id, stop.clone()));
                    block(link, id, code, stop)
                }
                Request::Variables => Job::Variables {
                    reply: replying(link, id, Reply::Variables),
                },
                Request::VariableString { name } => Job::VariableString {
                    name,
                    reply: replying(link, id, Reply::Text),
                },
                Request::ResetAnswer => Job::ResetAnswer {
                    reply: replying(link, id, |done: Result<(), ReplError>| {
                        Reply::Text(done.map(|()| None))
                    }),
                },
                Request::AnswerContent => Job::AnswerContent {
                    reply: replying(link, id, Reply::Text),
                },
                Request::EnsureModule { name, source } => Job::Call {
                    call: Box::new(move || ensure_module(&name, &source).map(|()| None)),
                    reply: replying(link, id, Reply::Text),
                },
                Request::PopResult { module, token } => Job::Call {
                    call: Box::new(move || pop_result(&module, token)),
                    reply: replying(link, id, Reply::Text),
                },
            }),
            Ok(ToWorker::Interrupt { id }) => match &*lock(&self.current) {
                Some((running, stop)) if *running == id => {
                    stop.cancel();
                    Action::CheckStop
                }
                _ => Action::Nothing,
            },
            Ok(ToWorker::Answer { call, answer }) => {
                link.deliver(call, CallAnswer::One(answer));
                Action::Nothing
            }
            Ok(ToWorker::Answers { call, answers }) => {
                link.deliver(call, CallAnswer::Many(answers));
                Action::Nothing
            }
            Ok(ToWorker::ChildAnswers { call, answers }) => {
                link.deliver(call, CallAnswer::Children(answers));
                Action::Nothing
            }
            Ok(ToWorker::Shutdown | ToWorker::Confine(_) | ToWorker::Start(_)) | Err(_) => {
                Action::End
            }
        }
    }
}

impl JobSource for Inbox {
    fn next_job(&self, queued: &Receiver<Job>) -> Result<Job, RecvError> {
        loop {
            match queued.try_recv() {
                Ok(job) => return Ok(job),
                Err(TryRecvError::Disconnected) => return Err(RecvError),
                Err(TryRecvError::Empty) => {}
            }
            let mut frames = self.claim_turn();
            // A request the main thread read before it handed the reader over.
            if let Ok(job) = queued.try_recv() {
                self.give_back(frames, None);
                return Ok(job);
            }
            loop {
                match self.dispatch(frames.read()) {
                    Action::Job(job) => {
                        self.give_back(frames, None);
                        return Ok(job);
                    }
                    // No block runs: nothing for the watchdog to look at.
                    Action::CheckStop | Action::Nothing => {}
                    Action::EndProcesses(id) => {
                        self.give_back(frames, Some(Action::EndProcesses(id)));
                        break;
                    }
                    Action::End => {
                        self.give_back(frames, Some(Action::End));
                        // The main thread ends the worker.
                        return queued.recv();
                    }
                }
            }
        }
    }
}

/// Block `id` for the session thread, which writes its reply once the block's output is sent.
fn block(link: &Arc<Link>, id: u64, code: String, stop: CancellationToken) -> Job {
    link.set_running(Some(id));
    let link = Arc::clone(link);
    let reply: Answer<Ran> = Box::new(move |ran| {
        link.set_running(None);
        // Every chunk of the block's output goes before its reply.
        link.flush_output();
        link.reply(
            id,
            Reply::Exec {
                result: ran.result.map(Box::new),
                processes: ran.processes,
            },
        );
    });
    Job::Exec {
        code,
        stop: Some(stop),
        reply,
    }
}

/// An answer that goes to the parent as the reply to request `id`.
fn replying<T: 'static>(
    link: &Arc<Link>,
    id: u64,
    reply: impl FnOnce(T) -> Reply + Send + 'static,
) -> Answer<T> {
    let link = Arc::clone(link);
    Box::new(move |value| link.reply(id, reply(value)))
}

/// The answer to a sub-call the worker sent.
enum CallAnswer {
    One(SubAnswer),
    Many(Result<Vec<SubAnswer>, SubFailure>),
    Children(Option<Vec<SubAnswer>>),
}

/// The worker's end of the link: framed writes under one lock, sub-calls waiting for their
/// answers, and the output buffer.
#[derive(Debug)]
struct Link {
    writer: Mutex<UnixStream>,
    /// This process: a forked child's copy of the link never writes.
    pid: u32,
    next_call: AtomicU64,
    calls: Mutex<HashMap<u64, Sender<CallAnswer>>>,
    output: Mutex<Output>,
    output_waiting: Condvar,
    /// Taken while output is sent, so chunks leave in the order they were written.
    sending: Mutex<()>,
    running: Mutex<Option<u64>>,
}

impl std::fmt::Debug for CallAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallAnswer")
    }
}

#[derive(Debug)]
struct Output {
    chunks: Vec<(Stream, String)>,
    bytes: usize,
    /// When output was last sent: a write after a quiet spell goes out at once (so a print
    /// just before a crash is not lost), writes in a burst are batched.
    sent_at: Instant,
    closed: bool,
}

impl Link {
    fn new(stream: UnixStream) -> Self {
        Self {
            writer: Mutex::new(stream),
            pid: std::process::id(),
            next_call: AtomicU64::new(1),
            calls: Mutex::new(HashMap::new()),
            output: Mutex::new(Output {
                chunks: Vec::new(),
                bytes: 0,
                sent_at: Instant::now(),
                closed: false,
            }),
            output_waiting: Condvar::new(),
            sending: Mutex::new(()),
            running: Mutex::new(None),
        }
    }

    fn send(&self, message: &FromWorker) -> std::io::Result<()> {
        if std::process::id() != self.pid {
            return Err(std::io::Error::other(
                "a forked child never writes to the link",
            ));
        }
        write_frame(&mut *lock(&self.writer), message)
    }

    fn reply(&self, id: u64, reply: Reply) {
        if let Err(e) = self.send(&FromWorker::Reply { id, reply }) {
            tracing::debug!("could not answer the parent: {e}");
        }
    }

    fn set_running(&self, id: Option<u64>) {
        *lock(&self.running) = id;
    }

    fn deliver(&self, call: u64, answer: CallAnswer) {
        // A call given up (its block was stopped) has no waiter any more.
        if let Some(waiter) = lock(&self.calls).remove(&call) {
            let _ = waiter.send(answer);
        }
    }

    /// The output thread: sends buffered output [`FLUSH_DELAY`] after it was written.
    fn start_flusher(self: Arc<Self>) {
        let spawned = std::thread::Builder::new()
            .name("rlm-worker-output".to_owned())
            .spawn(move || {
                loop {
                    {
                        let mut output = lock(&self.output);
                        while output.chunks.is_empty() && !output.closed {
                            output = self
                                .output_waiting
                                .wait(output)
                                .unwrap_or_else(PoisonError::into_inner);
                        }
                        if output.closed {
                            return;
                        }
                    }
                    std::thread::sleep(FLUSH_DELAY);
                    self.flush_output();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no output thread ({e}); output is sent at the end of each block");
        }
    }

    fn flush_output(&self) {
        let _turn = lock(&self.sending);
        let chunks = {
            let mut output = lock(&self.output);
            output.bytes = 0;
            output.sent_at = Instant::now();
            std::mem::take(&mut output.chunks)
        };
        for (stream, text) in chunks {
            if let Err(e) = self.send(&FromWorker::Output { stream, text }) {
                tracing::debug!("could not send output: {e}");
                return;
            }
        }
    }

    fn close(&self) {
        self.flush_output();
        lock(&self.output).closed = true;
        self.output_waiting.notify_all();
    }
}

fn link_gone(detail: &str) -> SubFailure {
    SubFailure {
        kind: "worker_link".to_owned(),
        message: format!(
            "The REPL's worker lost its link to the rlm process ({detail}); sub-model calls go through it"
        ),
    }
}

impl OutputSink for Link {
    fn write(&self, stream: Stream, text: &str) {
        if std::process::id() != self.pid || text.is_empty() {
            return;
        }
        let send_now = {
            let mut output = lock(&self.output);
            let was_empty = output.chunks.is_empty();
            match output.chunks.last_mut() {
                Some((last, buffered)) if *last == stream => buffered.push_str(text),
                _ => output.chunks.push((stream, text.to_owned())),
            }
            output.bytes += text.len();
            let quiet = was_empty && output.sent_at.elapsed() >= FLUSH_DELAY;
            if was_empty && !quiet {
                self.output_waiting.notify_one();
            }
            quiet || output.bytes >= FLUSH_BYTES
        };
        if send_now {
            self.flush_output();
        }
    }

    fn flush(&self) {
        if std::process::id() == self.pid {
            self.flush_output();
        }
    }
}

impl BlockEvents for Link {
    fn interrupted_code_returned(&self) {
        let running = *lock(&self.running);
        if let Some(id) = running
            && let Err(e) = self.send(&FromWorker::Returned { id })
        {
            tracing::debug!("could not tell the parent a block is winding down: {e}");
        }
    }
}

impl RemoteCalls for Inbox {
    fn call(
        &self,
        endpoint: Option<String>,
        prompt: String,
        cancel: &CancellationToken,
    ) -> SubAnswer {
        match self.ask(
            |call| FromWorker::Call {
                call,
                endpoint,
                prompt,
            },
            cancel,
        )? {
            CallAnswer::One(answer) => answer,
            CallAnswer::Many(_) | CallAnswer::Children(_) => {
                Err(link_gone("it answered a call with a batch"))
            }
        }
    }

    fn batch(
        &self,
        endpoint: Option<String>,
        prompts: Vec<String>,
        cancel: &CancellationToken,
    ) -> Result<Vec<SubAnswer>, SubFailure> {
        let n = prompts.len();
        let answer = self.ask(
            |call| FromWorker::Batch {
                call,
                endpoint,
                prompts,
            },
            cancel,
        );
        match answer {
            Ok(CallAnswer::Many(answers)) => answers,
            Ok(CallAnswer::One(_) | CallAnswer::Children(_)) => {
                Err(link_gone("it answered a batch with one call"))
            }
            // Each slot fails as the whole batch did, as in-process when cancelled.
            Err(failure) => Ok(vec![Err(failure); n]),
        }
    }

    fn children(
        &self,
        children: Vec<WireChild>,
        cancel: &CancellationToken,
    ) -> Option<Vec<SubAnswer>> {
        let n = children.len();
        match self.ask(|call| FromWorker::Children { call, children }, cancel) {
            Ok(CallAnswer::Children(answers)) => answers,
            Ok(CallAnswer::One(_) | CallAnswer::Many(_)) => {
                Some(vec![
                    Err(link_gone("it answered children with sub-calls"));
                    n
                ])
            }
            Err(failure) => Some(vec![Err(failure); n]),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(10);

    /// What a job is, and an exec's stop token.
    type Took = (&'static str, Option<CancellationToken>);

    /// A worker's link without its Python: the parent's end; the main thread's loop as `run`
    /// has it (a request it reads goes to the session thread's queue), which reports what it
    /// does and ends at the link's end; and a session thread that takes its next job (as idle)
    /// each time it is told to, and reports what it got.
    struct Served {
        parent: UnixStream,
        inbox: Arc<Inbox>,
        main_did: Receiver<&'static str>,
        take_next: Sender<()>,
        took: Receiver<Result<Took, RecvError>>,
    }

    fn served() -> Served {
        let (parent, worker) = UnixStream::pair().unwrap();
        let link = Arc::new(Link::new(worker.try_clone().unwrap()));
        let inbox = Arc::new(Inbox::new(link).unwrap());
        let (submit, queued) = mpsc::channel();
        let (did, main_did) = mpsc::channel();
        let main_inbox = Arc::clone(&inbox);
        std::thread::spawn(move || {
            let mut mine = Some(Frames::new(BufReader::new(worker), Vec::new()));
            loop {
                let done = match main_inbox.next_action(&mut mine) {
                    Action::Job(job) => {
                        let _ = submit.send(job);
                        "job"
                    }
                    Action::EndProcesses(_) => "end processes",
                    Action::CheckStop => "check stop",
                    Action::Nothing => "nothing",
                    Action::End => "end",
                };
                let _ = did.send(done);
                if done == "end" {
                    return;
                }
            }
        });
        let (take_next, orders) = mpsc::channel::<()>();
        let (tell, took) = mpsc::channel();
        let session_inbox = Arc::clone(&inbox);
        std::thread::spawn(move || {
            while orders.recv().is_ok() {
                let job = session_inbox.next_job(&queued).map(|job| match job {
                    Job::Exec { stop, .. } => ("exec", stop),
                    Job::Variables { .. } => ("variables", None),
                    Job::AnswerContent { .. } => ("answer content", None),
                    Job::ResetAnswer { .. } => ("reset answer", None),
                    _ => ("other", None),
                });
                let _ = tell.send(job);
            }
        });
        Served {
            parent,
            inbox,
            main_did,
            take_next,
            took,
        }
    }

    impl Served {
        fn send(&self, frame: &ToWorker) {
            write_frame(&mut &self.parent, frame).unwrap();
        }

        fn request(&self, id: u64, request: Request) {
            self.send(&ToWorker::Request { id, request });
        }

        /// The session thread goes idle: it waits for its next job.
        fn take_next(&self) {
            self.take_next.send(()).unwrap();
        }

        /// The job the session thread took.
        fn took(&self) -> Result<Took, RecvError> {
            self.took.recv_timeout(WAIT).unwrap()
        }

        fn main_did(&self) -> &'static str {
            self.main_did.recv_timeout(WAIT).unwrap()
        }

        /// The session thread goes idle, reads `request` itself, and takes it: what it took.
        fn idle_takes(&self, id: u64, request: Request) -> &'static str {
            self.take_next();
            self.until_the_session_thread_reads();
            self.request(id, request);
            let took = self.took().unwrap().0;
            self.main_quiet();
            took
        }

        /// Nothing more from the main thread for a while.
        fn main_quiet(&self) {
            let done = self.main_did.recv_timeout(Duration::from_millis(200));
            assert!(done.is_err(), "the main thread did {done:?}");
        }

        /// Waits until the idle session thread reads the link.
        fn until_the_session_thread_reads(&self) {
            self.until_read_by(|turn| turn.claimed);
        }

        /// Waits until a thread waiting for a sub-call's answer reads the link.
        fn until_a_waiting_thread_reads(&self) {
            self.until_read_by(|turn| turn.waiting);
        }

        /// Waits until a thread other than the main thread reads the link: once it has
        /// claimed the turn (`claimed`), frames that need nothing from either thread (the
        /// answer to no call) go out until one is not read by the main thread. Bounded in
        /// time, not in frames: on a loaded machine the other thread may not run for a while.
        fn until_read_by(&self, claimed: fn(&Turn) -> bool) {
            let deadline = std::time::Instant::now() + WAIT;
            while !claimed(&lock(&self.inbox.turn)) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no thread claimed the link's reader"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            while std::time::Instant::now() < deadline {
                self.send(&ToWorker::Answer {
                    call: u64::MAX,
                    answer: Ok(String::new()),
                });
                if self
                    .main_did
                    .recv_timeout(Duration::from_millis(200))
                    .is_err()
                {
                    return;
                }
            }
            panic!("no thread took the link's reader from the main thread");
        }

        /// The next frame the worker sent.
        fn sent(&self) -> FromWorker {
            let mut reader = &self.parent;
            read_frame::<FromWorker>(&mut reader, &mut Vec::new()).unwrap()
        }

        /// Asks `call` on a thread of its own, with `cancel`; its answer comes on the receiver.
        fn ask_aside<T: Send + 'static>(
            &self,
            call: impl FnOnce(&Inbox, &CancellationToken) -> T + Send + 'static,
            cancel: &CancellationToken,
        ) -> Receiver<T> {
            let (tell, told) = mpsc::channel();
            let (inbox, cancel) = (Arc::clone(&self.inbox), cancel.clone());
            std::thread::spawn(move || {
                let _ = tell.send(call(&inbox, &cancel));
            });
            told
        }

        /// The session thread takes a block, which it runs until the test says: its stop.
        fn block_runs(&self) -> CancellationToken {
            self.take_next();
            self.until_the_session_thread_reads();
            self.request(
                1,
                Request::Exec {
                    code: "r = llm_query('question')".to_owned(),
                    stopped: false,
                },
            );
            let (took, stop) = self.took().unwrap();
            assert_eq!(took, "exec");
            stop.unwrap()
        }
        /// A block runs and asks `prompt` on a thread of its own, which has the link's reader
        /// while it waits: the block's stop (the call's cancellation), the call's answer to
        /// come, and the call's id.
        fn block_asks(&self, prompt: &str) -> (CancellationToken, Receiver<SubAnswer>, u64) {
            let stop = self.block_runs();
            let prompt = prompt.to_owned();
            let asked =
                self.ask_aside(move |inbox, cancel| inbox.call(None, prompt, cancel), &stop);
            let call = call_id(self.sent());
            self.until_a_waiting_thread_reads();
            (stop, asked, call)
        }
    }

    fn call_id(frame: FromWorker) -> u64 {
        match frame {
            FromWorker::Call { call, .. }
            | FromWorker::Batch { call, .. }
            | FromWorker::Children { call, .. } => call,
            other => panic!("not a sub-call: {other:?}"),
        }
    }

    #[test]
    fn a_sub_call_is_answered_by_the_thread_that_waits_reading_the_link_then_the_main_thread_reads()
    {
        let served = served();
        let (stop, asked, call) = served.block_asks("question");
        served.send(&ToWorker::Answer {
            call,
            answer: Ok("answer".to_owned()),
        });
        assert_eq!(asked.recv_timeout(WAIT).unwrap().unwrap(), "answer");
        // Read by the waiting thread, not the main thread...
        served.main_quiet();
        // ... which has the reader back: an interrupt stops the block at once.
        served.send(&ToWorker::Interrupt { id: 1 });
        assert_eq!(served.main_did(), "check stop");
        assert!(stop.is_cancelled());
    }

    #[test]
    fn an_interrupt_read_by_a_waiting_thread_goes_to_the_main_thread_and_ends_the_wait() {
        let served = served();
        // The call stops with the block (in a worker the watchdog cancels the block's calls
        // when it looks at the stop: the main thread's `CheckStop`).
        let (_, asked, call) = served.block_asks("question");
        served.send(&ToWorker::Interrupt { id: 1 });
        assert_eq!(served.main_did(), "check stop");
        let failure = asked.recv_timeout(WAIT).unwrap().unwrap_err();
        assert_eq!(
            failure.kind,
            SubFailure::from(&bridge::BridgeError::Cancelled).kind
        );
        // The answer that comes after is nobody's; the main thread reads again.
        served.send(&ToWorker::Answer {
            call,
            answer: Ok("late".to_owned()),
        });
        assert_eq!(served.main_did(), "nothing");
        served.request(2, Request::Variables);
        assert_eq!(served.main_did(), "job");
    }

    #[test]
    fn answers_in_any_order_reach_each_waiting_thread() {
        let served = served();
        let (stop, one, first) = served.block_asks("one");
        // A second thread's batch while the first reads: its answers come from the first.
        let batch = served.ask_aside(
            |inbox, cancel| inbox.batch(None, vec!["two".to_owned(), "three".to_owned()], cancel),
            &stop,
        );
        let second = call_id(served.sent());
        served.send(&ToWorker::Answers {
            call: second,
            answers: Ok(vec![Ok("2".to_owned()), Ok("3".to_owned())]),
        });
        let answers: Vec<String> = batch
            .recv_timeout(WAIT)
            .unwrap()
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(answers, ["2", "3"]);
        assert!(
            one.recv_timeout(Duration::from_millis(100)).is_err(),
            "the first call returned with another's answer"
        );
        served.send(&ToWorker::Answer {
            call: first,
            answer: Ok("1".to_owned()),
        });
        assert_eq!(one.recv_timeout(WAIT).unwrap().unwrap(), "1");
        served.main_quiet();
        served.send(&ToWorker::Interrupt { id: 1 });
        assert_eq!(served.main_did(), "check stop");
    }

    #[test]
    fn the_links_end_read_by_a_waiting_thread_ends_the_worker() {
        let served = served();
        let (stop, asked, _) = served.block_asks("question");
        drop(served.parent);
        assert_eq!(served.main_did.recv_timeout(WAIT).unwrap(), "end");
        // (A worker ends here; the call waits on for an answer, until its block is stopped.)
        stop.cancel();
        assert!(asked.recv_timeout(WAIT).unwrap().is_err());
    }

    #[test]
    fn an_idle_session_thread_reads_its_request_and_the_main_thread_what_comes_while_it_runs() {
        let served = served();
        let stop = served.block_runs();
        served.main_quiet();
        // While it runs, the main thread reads: an interrupt stops it at once...
        served.send(&ToWorker::Interrupt { id: 1 });
        assert_eq!(served.main_did(), "check stop");
        assert!(stop.is_cancelled());
        // Idle again: what the session thread reads that is the main thread's, it leaves to it.
        served.take_next();
        served.until_the_session_thread_reads();
        served.request(2, Request::EndProcesses);
        assert_eq!(served.main_did(), "end processes");
        served.until_the_session_thread_reads();
        served.request(3, Request::Variables);
        assert_eq!(served.took().unwrap().0, "variables");
        served.main_quiet();
        assert_eq!(
            served.idle_takes(4, Request::AnswerContent),
            "answer content"
        );
        // Closed while idle: the main thread ends the worker.
        served.take_next();
        served.until_the_session_thread_reads();
        served.send(&ToWorker::Shutdown);
        assert_eq!(served.main_did(), "end");
        assert!(
            served.took().is_err(),
            "the session thread took a job after the end"
        );
    }

    #[test]
    fn a_block_started_after_a_long_idle_wakes_the_main_thread_and_after_a_short_one_need_not() {
        let served = served();
        // Idle past LOOKING: the main thread no longer looks whether the reader is back.
        served.take_next();
        served.until_the_session_thread_reads();
        std::thread::sleep(LOOKING + CANCEL_POLL * 10);
        assert!(
            !lock(&served.inbox.turn).looking,
            "the main thread still looks after {LOOKING:?}"
        );
        // So the reader handed back with the block wakes it: it reads the block's interrupt.
        let exec = || Request::Exec {
            code: "pass".to_owned(),
            stopped: false,
        };
        served.request(1, exec());
        let (took, stop) = served.took().unwrap();
        assert_eq!(took, "exec");
        served.send(&ToWorker::Interrupt { id: 1 });
        assert_eq!(served.main_did(), "check stop");
        assert!(stop.unwrap().is_cancelled());
        // Idle a moment: it looks, and takes the reader back by itself.
        served.take_next();
        served.until_the_session_thread_reads();
        assert!(lock(&served.inbox.turn).looking, "the main thread sleeps");
        served.request(2, exec());
        let (_, stop) = served.took().unwrap();
        served.send(&ToWorker::Interrupt { id: 2 });
        assert_eq!(served.main_did(), "check stop");
        assert!(stop.unwrap().is_cancelled());
    }

    #[test]
    fn requests_the_main_thread_read_reach_the_session_thread_in_order() {
        let served = served();
        served.request(1, Request::Variables);
        served.request(2, Request::AnswerContent);
        assert_eq!(served.main_did(), "job");
        assert_eq!(served.main_did(), "job");
        for expected in ["variables", "answer content"] {
            served.take_next();
            assert_eq!(served.took().unwrap().0, expected);
        }
        assert_eq!(served.idle_takes(3, Request::ResetAnswer), "reset answer");
        // The parent gone while the session thread reads: the main thread ends the worker.
        served.take_next();
        served.until_the_session_thread_reads();
        drop(served.parent);
        assert_eq!(served.main_did.recv_timeout(WAIT).unwrap(), "end");
    }
}
