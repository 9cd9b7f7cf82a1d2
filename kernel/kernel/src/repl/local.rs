//! [`LocalSession`]: the in-process session — one Python namespace that lives on its own
//! dedicated thread of this process. [`ReplSession`](super::ReplSession) uses it directly
//! with `isolation = none`; a worker process runs one for its parent.
//!
//! `exec`, `variables` and `variable_as_string` send a job over a channel to the session
//! thread and wait (bounded) for its reply; a worker's main thread, which must go on reading
//! its link, hands jobs over without waiting ([`LocalSession::submit`]), and the session thread
//! writes each reply to the link itself: every answer is given on the session thread, without
//! the GIL, before it waits for the next job (after a block's answer, it first makes what the
//! next block starts with, off that block's path: `SessionState::prepare_block`). A worker's
//! idle session thread waits on its link, not on its queue alone ([`JobSource`]: it reads the
//! next request itself, so that a request wakes one thread of the worker, not two). The session
//! thread holds the GIL while it runs a job and releases it while idle, so several sessions in
//! one process interleave through the GIL like ordinary Python threads, each with its own
//! globals, captures and watchdog: a timeout in one session never touches another.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvError, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyModule};
use tokio_util::sync::CancellationToken;

use super::capture::OutputSink;
use super::children::{ChildSlot, RlmQuery, RlmQueryBatched};
use super::config::SessionConfig;
use super::context::{LoadedContext, load_context};
use super::error::ReplError;
use super::interpreter::{self, interpreter, touch_free_pools, without_gil};
use super::interrupt::{BlockEvents, Watchdog};
use super::metadata::{ContextMetadata, ExecutionResult, VariableInfo, VariableRow};
use super::natives::{LlmQuery, LlmQueryBatched, SubCallRoute, SubModelBridge};
use super::source::{ContextInput, LoadOptions};

/// How long `exec` waits beyond the cell's time limit for the interrupted cell to return.
const INTERRUPT_GRACE: Duration = Duration::from_secs(10);
/// How long non-exec jobs (variables, session start) may wait for an idle session thread.
const QUERY_WAIT: Duration = Duration::from_secs(30);

/// How long a variable's `__str__` may run when the loop reads it (well under `QUERY_WAIT`).
const STR_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a job's answer goes: called once, on the session thread without the GIL, before
/// it waits for its next job (see [`LocalSession::submit`]).
pub(crate) type Answer<T> = Box<dyn FnOnce(T) + Send>;

/// What the session thread does next, in the order the jobs were handed to it.
pub(crate) enum Job {
    /// Run a block (see [`LocalSession::exec_until_stopped`]).
    Exec {
        code: String,
        stop: Option<CancellationToken>,
        reply: Answer<Ran>,
    },
    Variables {
        reply: Answer<Result<Vec<VariableInfo>, ReplError>>,
    },
    VariableString {
        name: String,
        reply: Answer<Result<Option<String>, ReplError>>,
    },
    ResetAnswer {
        reply: Answer<Result<(), ReplError>>,
    },
    AnswerContent {
        reply: Answer<Result<Option<String>, ReplError>>,
    },
    /// Kernel code that needs the GIL but nothing of the session (a worker's support module
    /// loaded, a result of one read), in turn with the session's jobs.
    Call {
        call: Box<dyn FnOnce() -> Result<Option<String>, ReplError> + Send>,
        reply: Answer<Result<Option<String>, ReplError>>,
    },
    Shutdown,
}

/// What a block gave: its result (redacted), and whether the session may now hold processes
/// its blocks started (see [`LocalSession::holds_processes`]).
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) result: Result<ExecutionResult, ReplError>,
    pub(crate) processes: bool,
}

/// How a worker process embeds a [`LocalSession`]: its blocks' output goes to the parent as
/// it is written, and the parent learns when interrupted user code has returned.
#[derive(Debug, Clone, Default)]
pub(crate) struct Embedding {
    /// Where block output goes instead of the session's own bounded capture.
    pub(crate) output: Option<Arc<dyn OutputSink>>,
    /// Told about the running block's progress.
    pub(crate) events: Option<Arc<dyn BlockEvents>>,
    /// Loads the contexts instead of [`load_context`] (a worker maps some from memfds).
    pub(crate) loader: Option<Arc<dyn ContextLoader>>,
    /// Where the session thread waits for its next job instead of its queue alone (a
    /// worker's reads its link meanwhile).
    pub(crate) jobs: Option<Arc<dyn JobSource>>,
}

/// Where an idle session thread waits for its next job (see [`Embedding::jobs`]).
pub(crate) trait JobSource: Send + Sync + std::fmt::Debug {
    /// The next job: the first of `queued`, else one this source finds; `Err` once the
    /// session is closed (`queued`'s sender gone).
    fn next_job(&self, queued: &Receiver<Job>) -> Result<Job, RecvError>;
}

/// Loads context `index` of a session (see [`Embedding::loader`]).
pub(crate) trait ContextLoader: Send + Sync + std::fmt::Debug {
    fn load<'py>(
        &self,
        py: Python<'py>,
        index: usize,
        input: &ContextInput,
        options: &LoadOptions,
    ) -> Result<LoadedContext<'py>, ReplError>;
}

/// The in-process session (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct LocalSession {
    id: u64,
    config: SessionConfig,
    jobs: Sender<Job>,
    /// Serialises callers: one job in flight per session, so every wait is bounded by that job.
    busy: Mutex<()>,
    contexts: Vec<ContextMetadata>,
    cancel: CancellationToken,
    closed: CancellationToken,
    watchdog: Arc<Watchdog>,
    /// The support module's `Session`: what [`LocalSession::end_processes`] reaches without
    /// the session thread, which may be stuck in a block.
    py_session: Py<PyAny>,
    thread: Option<JoinHandle<()>>,
    thread_done: Mutex<Receiver<()>>,
    /// Who runs the session's `rlm_query` children (set by the loop that owns the session).
    children: Arc<ChildSlot>,
    /// Whether a block was sent to the session thread. Until one is, its answer is the empty
    /// dict it started with and no process was started from it (only blocks start them), so
    /// resetting the answer, reading it, and ending the processes ask the thread nothing (an
    /// `rlm_query` child that runs no block is a run's start and end without a round trip).
    ran: AtomicBool,
    /// Shared with the session thread's [`SessionState::processes`].
    processes: Arc<AtomicBool>,
}

static NEXT_SESSION_ID: AtomicU64 = AtomicU64::new(1);

/// A process-unique session number (1 for the first).
pub(crate) fn next_session_id() -> u64 {
    NEXT_SESSION_ID.fetch_add(1, Ordering::Relaxed)
}

impl LocalSession {
    /// Start a session: a new namespace with the natives, and every context loaded (or an
    /// error naming the context that failed, with nothing left behind). The context names
    /// are checked by the caller.
    pub(crate) fn start(
        config: SessionConfig,
        route: SubCallRoute,
        contexts: &[ContextInput],
        embedding: Embedding,
    ) -> Result<Self, ReplError> {
        Prepared::new()?.start(config, route, contexts, embedding)
    }

    /// Where the session's natives find who runs `rlm_query` children.
    pub(crate) fn children(&self) -> &Arc<ChildSlot> {
        &self.children
    }

    /// Run one code block. `Err` only if the kernel itself broke; a Python exception, a
    /// timeout or `sys.exit()` are reported in the [`ExecutionResult`].
    pub(crate) fn exec(&self, code: &str) -> Result<ExecutionResult, ReplError> {
        self.exec_job(code, None)
    }

    /// Like [`exec`](Self::exec), and the block is stopped (`CellCancelled`) once `stop` is
    /// cancelled — also when that happens before the block started running, so a stop that
    /// races with the start of a block is never lost. Whoever cancels `stop` while the block
    /// runs must then call [`interrupt`](Self::interrupt) to wake the watchdog.
    pub(crate) fn exec_until_stopped(
        &self,
        code: &str,
        stop: &CancellationToken,
    ) -> Result<ExecutionResult, ReplError> {
        self.exec_job(code, Some(stop.clone()))
    }

    fn exec_job(
        &self,
        code: &str,
        stop: Option<CancellationToken>,
    ) -> Result<ExecutionResult, ReplError> {
        let wait = self.config.cell_timeout + INTERRUPT_GRACE;
        self.ran.store(true, Ordering::Relaxed);
        let ran = self.request(wait, |reply| Job::Exec {
            code: code.to_owned(),
            stop,
            reply,
        })?;
        ran.result
    }

    /// Hands `job` to the session thread without waiting: it runs after the jobs handed
    /// before it, and the session thread itself gives its answer where the job says,
    /// without the GIL (a worker's session thread writes it to its link). For a caller with
    /// other work meanwhile, and its own bound on the wait (a worker's main thread reads its
    /// link while a block runs; its parent stops a block, or ends the worker, that outlives
    /// its time). Fails when the session thread has exited; the job is dropped unanswered.
    pub(crate) fn submit(&self, job: Job) -> Result<(), ReplError> {
        if matches!(job, Job::Exec { .. }) {
            self.ran.store(true, Ordering::Relaxed);
        }
        self.jobs.send(job).map_err(|_| ReplError::SessionClosed {
            reason: "its Python thread has exited".to_owned(),
        })
    }

    /// Metadata of the loaded contexts, in order.
    pub(crate) fn contexts(&self) -> &[ContextMetadata] {
        &self.contexts
    }

    /// Empties the `answer` dict (`content = ""`, `ready = False`), so that a new run on this
    /// session does not inherit the last run's finished answer. The loop calls it per run.
    pub(crate) fn reset_answer(&self) -> Result<(), ReplError> {
        if !self.ran.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.request(QUERY_WAIT, |reply| Job::ResetAnswer { reply })?
    }

    /// `str(answer["content"])` when it is not blank, whether or not `ready` was set: what a
    /// run stopped early keeps as its partial answer.
    pub(crate) fn answer_content(&self) -> Result<Option<String>, ReplError> {
        if !self.ran.load(Ordering::Relaxed) {
            return Ok(None);
        }
        self.request(QUERY_WAIT, |reply| Job::AnswerContent { reply })?
    }

    /// The user's variables (reserved names, `_private` names and modules hidden).
    pub(crate) fn variables(&self) -> Result<Vec<VariableInfo>, ReplError> {
        self.request(QUERY_WAIT, |reply| Job::Variables { reply })?
    }

    /// `str(value)` of a variable in the namespace, `None` if unset.
    pub(crate) fn variable_as_string(&self, name: &str) -> Result<Option<String>, ReplError> {
        self.request(QUERY_WAIT, |reply| Job::VariableString {
            name: name.to_owned(),
            reply,
        })?
    }

    /// The session's cancellation token: cancelling it aborts in-flight `llm_query` calls and
    /// interrupts the running block (`CellCancelled`). It cannot be reset: later sub-calls of
    /// this session fail with a cancellation error.
    pub(crate) fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Interrupts the block running now, if any, like a notebook's stop button: its in-flight
    /// sub-calls are cancelled and it ends with `CellCancelled`; the session keeps its state
    /// and takes the next block normally. Returns whether a block was running.
    pub(crate) fn interrupt(&self) -> bool {
        self.watchdog.interrupt_running()
    }

    /// Makes the watchdog look at the running block's stop token now: after cancelling the
    /// token given to [`exec_until_stopped`](Self::exec_until_stopped), this stops that block
    /// (and no other, unlike [`interrupt`](Self::interrupt), which stops whatever runs).
    pub(crate) fn check_stop(&self) {
        self.watchdog.notify();
    }

    /// Terminates the processes the session's blocks started that still run — pool workers,
    /// forked children, subprocesses and their descendants (see the [module docs](super)).
    /// The loop calls it when a run ends; dropping the session does too. It does not wait
    /// for the session thread, so it works while a block is stuck.
    pub(crate) fn end_processes(&self) -> Result<(), ReplError> {
        if !self.holds_processes() {
            return Ok(());
        }
        Python::attach(|py| {
            self.py_session
                .bind(py)
                .call_method0("terminate_processes")
                .map(drop)
                .map_err(|e| ReplError::internal("terminating the session's processes", e))
        })?;
        self.processes.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the session may hold processes its blocks started, for
    /// [`end_processes`](Self::end_processes) to end: what the last block's end found (see
    /// [`SessionState::processes`]). Read without the GIL: a thread of the model's code may
    /// hold it.
    pub(crate) fn holds_processes(&self) -> bool {
        self.ran.load(Ordering::Relaxed) && self.processes.load(Ordering::Relaxed)
    }

    /// A process-unique number of this session (1 for the first).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    fn request<T: Send + 'static>(
        &self,
        wait: Duration,
        job: impl FnOnce(Answer<T>) -> Job,
    ) -> Result<T, ReplError> {
        let _turn = match self.busy.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (reply, answer) = mpsc::channel();
        self.jobs
            .send(job(Box::new(move |value| {
                let _ = reply.send(value);
            })))
            .map_err(|_| ReplError::SessionClosed {
                reason: "its Python thread has exited".to_owned(),
            })?;
        match without_gil(move || answer.recv_timeout(wait)) {
            Ok(value) => Ok(value),
            Err(RecvTimeoutError::Timeout) => Err(ReplError::Unresponsive { waited: wait }),
            Err(RecvTimeoutError::Disconnected) => Err(ReplError::SessionClosed {
                reason: "its Python thread exited while running the request".to_owned(),
            }),
        }
    }
}

/// A session's threads started, and its namespace possibly built, ahead of its start (see
/// [`Prepared::new`], [`Prepared::build`]).
///
/// A worker confined ahead of need prepares its session while it waits, idle, for a session
/// to take it, so that its start frame only has the session's contexts to install. The
/// threads run no Python code until [`Prepared::build`] or [`Prepared::start`]: the session
/// thread waits for its settings before it takes the GIL, the watchdog for a block to watch.
/// What `build` runs is the kernel's own support code (the namespace, the natives, the
/// answer dict, `FINAL_VAR`, `SHOW_VARS`) and its own warm-up block
/// ([`SessionState::warm_up`]), never model code.
#[derive(Debug)]
pub(crate) struct Prepared {
    id: u64,
    cancel: CancellationToken,
    watchdog: Arc<Watchdog>,
    /// Who runs the session's `rlm_query` children (the natives built ahead hold it).
    children: Arc<ChildSlot>,
    /// Whether the session may hold processes (see [`SessionState::processes`]).
    processes: Arc<AtomicBool>,
    /// Hands the session thread its settings (dropping it ends the thread).
    init: Option<Sender<Setup>>,
    jobs: Sender<Job>,
    ready: Option<Receiver<Result<Started, ReplError>>>,
    /// Whether the namespace was sent to be built ahead and its answer not read yet.
    building: bool,
    thread: Option<JoinHandle<()>>,
    thread_done: Option<Receiver<()>>,
}

impl Prepared {
    /// Starts the interpreter (if needed) and a session's threads, its session thread and
    /// its watchdog, which wait for [`start`](Self::start).
    pub(crate) fn new() -> Result<Self, ReplError> {
        interpreter::start()?;
        let id = next_session_id();
        let cancel = CancellationToken::new();
        let watchdog = Arc::new(Watchdog::default());
        let (jobs, job_rx) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        let (done_tx, thread_done) = mpsc::channel();
        let (init, init_rx) = mpsc::channel::<Setup>();
        let thread = std::thread::Builder::new()
            .name(format!("rlm-repl-{id}"))
            .spawn(move || {
                // No GIL while waiting: a prepared session that is never started costs its
                // thread only.
                if let Ok(first) = init_rx.recv() {
                    session_thread(first, init_rx, job_rx, ready_tx);
                }
                let _ = done_tx.send(());
            })
            .map_err(|e| ReplError::Interpreter {
                message: format!("cannot start the session thread: {e}"),
            })?;
        let prepared = Self {
            id,
            cancel,
            watchdog: Arc::clone(&watchdog),
            children: Arc::default(),
            processes: Arc::default(),
            init: Some(init),
            jobs,
            ready: Some(ready),
            building: false,
            thread: Some(thread),
            thread_done: Some(thread_done),
        };
        std::thread::Builder::new()
            .name(format!("rlm-watchdog-{id}"))
            .spawn(move || watchdog.run())
            .map_err(|e| ReplError::Interpreter {
                message: format!("cannot start the watchdog thread: {e}"),
            })?;
        Ok(prepared)
    }

    /// Builds the session's namespace ahead of its start, for sessions of `config`: the
    /// support module's session, its natives (whose sub-calls take `route`), the answer
    /// dict, `FINAL_VAR` and `SHOW_VARS`; everything but the contexts. [`start`](Self::start)
    /// with the same settings then only loads the contexts; with others, it builds the
    /// session again (the `route` and output `embedding` given here are kept either way).
    /// Then, as a worker confined ahead of need is a fresh fork whose first block would pay
    /// for the memory it touches first (see [`SessionState::warm_up`]), a block that leaves
    /// nothing behind runs once. After an error the session thread has ended: drop this.
    pub(crate) fn build(
        &mut self,
        config: SessionConfig,
        route: SubCallRoute,
        embedding: Embedding,
    ) -> Result<(), ReplError> {
        self.send_ahead(config, route, embedding, true)?;
        self.building = false;
        let answer = match self.ready.take() {
            Some(ready) => {
                let (answer, ready) = without_gil(move || (ready.recv().ok(), ready));
                self.ready = Some(ready);
                answer.map(|answer| answer.map(drop))
            }
            None => None,
        };
        self.built(answer)
    }

    /// Has the session thread build the namespace as [`build`](Self::build) does, without
    /// waiting for it: [`start`](Self::start) reads how that went (and, should it have failed,
    /// fails with its error).
    /// (without its warm-up block: in-process, nothing was forked).
    pub(crate) fn build_ahead(
        &mut self,
        config: SessionConfig,
        route: SubCallRoute,
        embedding: Embedding,
    ) -> Result<(), ReplError> {
        self.send_ahead(config, route, embedding, false)
    }

    fn send_ahead(
        &mut self,
        config: SessionConfig,
        route: SubCallRoute,
        embedding: Embedding,
        warm_up: bool,
    ) -> Result<(), ReplError> {
        let load = config.load.resolved()?;
        let init = self.init(config, route, Vec::new(), load, embedding);
        let sent = self
            .init
            .as_ref()
            .is_some_and(|tx| tx.send(Setup::Ahead { init, warm_up }).is_ok());
        if !sent {
            return self.built(None);
        }
        self.building = true;
        Ok(())
    }

    /// What building the namespace ahead gave (`None`: the session thread stopped).
    fn built(&mut self, answer: Option<Result<(), ReplError>>) -> Result<(), ReplError> {
        match answer {
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => {
                self.join();
                Err(e)
            }
            None => {
                self.join();
                Err(ReplError::SessionClosed {
                    reason: "the session thread stopped while building its namespace".to_owned(),
                })
            }
        }
    }

    fn init(
        &self,
        config: SessionConfig,
        route: SubCallRoute,
        contexts: Vec<ContextInput>,
        load: LoadOptions,
        embedding: Embedding,
    ) -> SessionInit {
        SessionInit {
            id: self.id,
            config,
            children: Arc::clone(&self.children),
            processes: Arc::clone(&self.processes),
            route,
            contexts,
            load,
            cancel: self.cancel.clone(),
            watchdog: Arc::clone(&self.watchdog),
            embedding,
        }
    }

    /// Starts the session on the prepared threads (see [`LocalSession::start`]); on a
    /// namespace [built](Self::build) for the same settings, only the contexts are loaded
    /// (the `route` and `embedding`'s output given to `build` stay, its `loader` is this
    /// one's).
    pub(crate) fn start(
        mut self,
        config: SessionConfig,
        route: SubCallRoute,
        contexts: &[ContextInput],
        embedding: Embedding,
    ) -> Result<LocalSession, ReplError> {
        let load = config.load.resolved()?;
        let remote = matches!(route, SubCallRoute::Remote(_));
        let closed = CancellationToken::new();
        let children = Arc::clone(&self.children);
        let init = self.init(config.clone(), route, contexts.to_vec(), load, embedding);
        let sent = self
            .init
            .take()
            .is_some_and(|tx| tx.send(Setup::Start(init)).is_ok());
        let building = std::mem::take(&mut self.building);
        // The session thread always answers or exits (dropping the sender): first how the
        // namespace built ahead went, if it was not read, then the start.
        let answer = match self.ready.take() {
            Some(ready) if sent || building => without_gil(move || {
                if building {
                    match ready.recv() {
                        Ok(Ok(_)) => {}
                        failed @ Ok(Err(_)) => return failed.ok(),
                        Err(_) => return None,
                    }
                }
                ready.recv().ok()
            }),
            _ => None,
        };
        let (contexts, py_session) = match answer {
            Some(Ok(started)) => started,
            Some(Err(e)) => {
                self.join();
                return Err(e);
            }
            None => {
                self.join();
                return Err(ReplError::SessionClosed {
                    reason: "the session thread stopped while starting".to_owned(),
                });
            }
        };
        if !remote {
            // Cancelling the session token interrupts a running block. (A worker's session
            // is stopped through its parent's link instead, and runs no tokio runtime.)
            let (cancel, closed, wd) = (
                self.cancel.clone(),
                closed.clone(),
                Arc::clone(&self.watchdog),
            );
            crate::runtime::shared().spawn(async move {
                tokio::select! {
                    () = cancel.cancelled() => wd.notify(),
                    () = closed.cancelled() => {}
                }
            });
        }
        let (Some(thread), Some(thread_done)) = (self.thread.take(), self.thread_done.take())
        else {
            return Err(ReplError::internal(
                "starting a prepared session",
                "it was started before",
            ));
        };
        Ok(LocalSession {
            id: self.id,
            config,
            jobs: self.jobs.clone(),
            busy: Mutex::new(()),
            contexts,
            cancel: self.cancel.clone(),
            closed,
            watchdog: Arc::clone(&self.watchdog),
            py_session,
            thread: Some(thread),
            thread_done: Mutex::new(thread_done),
            children,
            ran: AtomicBool::new(false),
            processes: Arc::clone(&self.processes),
        })
    }

    /// Waits for the session thread after a failed start (it exits on its own).
    fn join(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = without_gil(move || thread.join());
        }
    }
}

impl Drop for Prepared {
    /// A prepared session not started (or whose start failed) ends its threads; a started
    /// one has handed them to its [`LocalSession`].
    fn drop(&mut self) {
        if self.thread.is_some() || self.thread_done.is_some() {
            self.init = None;
            self.watchdog.shutdown();
        }
    }
}

impl Drop for LocalSession {
    fn drop(&mut self) {
        if let Err(e) = self.end_processes() {
            tracing::warn!("could not end a closing session's processes: {e}");
        }
        self.closed.cancel();
        self.watchdog.shutdown();
        let _ = self.jobs.send(Job::Shutdown);
        if !self.ran.load(Ordering::Relaxed) {
            // No block ran: nothing can keep the thread, which closes the namespace and
            // ends on its own; the caller (a child run's end) does not wait for it.
            return;
        }
        // Join unless the thread is stuck in native code; then leave it to finish on its own.
        let thread_done = &self.thread_done;
        let done = without_gil(|| {
            let rx = match thread_done.lock() {
                Ok(rx) => rx,
                Err(poisoned) => poisoned.into_inner(),
            };
            rx.recv_timeout(Duration::from_secs(2)).is_ok()
        });
        if done && let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Loads a support module (`source`) as `name` into `sys.modules` unless it is there.
pub(crate) fn ensure_module(name: &str, source: &str) -> Result<(), ReplError> {
    const READY: &str = "_rlm_ready";
    let fail = |e: PyErr| ReplError::internal("loading a support module", e);
    Python::attach(|py| {
        let modules = py
            .import("sys")
            .and_then(|s| s.getattr("modules"))
            .map_err(fail)?;
        // A module is in `sys.modules` while its code still runs (which may let another
        // thread in: concurrent steps on sessions of one interpreter): wait until it is whole.
        // A load that failed took it out again, and this caller loads it.
        while let Ok(module) = modules.get_item(name) {
            if module.hasattr(READY).map_err(fail)? {
                return Ok(());
            }
            py.detach(|| std::thread::sleep(std::time::Duration::from_millis(1)));
        }
        let code = std::ffi::CString::new(source)
            .map_err(|e| ReplError::internal("loading a support module", e))?;
        let file = std::ffi::CString::new(name)
            .map_err(|e| ReplError::internal("loading a support module", e))?;
        // Named like the kernel's support module, so its frames are cut from user tracebacks.
        let module = PyModule::from_code(py, &code, c"<rlm-kernel>", &file).map_err(fail)?;
        modules.set_item(name, &module).map_err(fail)?;
        module.setattr(READY, true).map_err(fail)
    })
}

/// Pops `results[token]` of support module `module` (`None` when it left nothing).
pub(crate) fn pop_result(module: &str, token: u64) -> Result<Option<String>, ReplError> {
    Python::attach(|py| -> PyResult<Option<String>> {
        let Ok(module) = py.import("sys")?.getattr("modules")?.get_item(module) else {
            return Ok(None);
        };
        module
            .getattr("results")?
            .call_method1("pop", (token, py.None()))?
            .extract()
    })
    .map_err(|e| ReplError::internal("reading a support module's result", e))
}

/// What the session thread is handed before its first job.
enum Setup {
    /// Build the namespace without its contexts (then, with `warm_up`, run
    /// [`SessionState::warm_up`]), answer, then wait for [`Setup::Start`].
    Ahead { init: SessionInit, warm_up: bool },
    /// Start the session: finish the namespace built ahead when it has these settings, else
    /// build it; answer.
    Start(SessionInit),
}

struct SessionInit {
    id: u64,
    config: SessionConfig,
    children: Arc<ChildSlot>,
    processes: Arc<AtomicBool>,
    route: SubCallRoute,
    contexts: Vec<ContextInput>,
    load: LoadOptions,
    cancel: CancellationToken,
    watchdog: Arc<Watchdog>,
    embedding: Embedding,
}

/// What a started session thread hands back: the loaded contexts and its `Session` object.
type Started = (Vec<ContextMetadata>, Py<PyAny>);

/// How long a worker built ahead waits for its session before it writes its free pools
/// ([`touch_free_pools`]): a session that was waiting for the worker (a child whose sibling
/// ended before the pool had a worker ready, or a session that confines its own) sends its
/// start well within this, and gets it without that work before it.
const STARTED_AT_ONCE: Duration = Duration::from_millis(2);

/// The wait of a worker built ahead for its session's start (or the end of its setups), with
/// its free pools written once if the session does not come at once: the time of the faults
/// its first objects would take moves off a child that takes the worker later, out of the
/// way of one that takes it at once.
fn idle_until_started(py: Python<'_>, setups: Receiver<Setup>) -> Result<Setup, RecvError> {
    let (first, setups) = py.detach(move || (setups.recv_timeout(STARTED_AT_ONCE), setups));
    match first {
        Ok(setup) => Ok(setup),
        Err(RecvTimeoutError::Disconnected) => Err(RecvError),
        Err(RecvTimeoutError::Timeout) => {
            touch_free_pools(py);
            py.detach(move || setups.recv())
        }
    }
}

fn session_thread(
    first: Setup,
    setups: Receiver<Setup>,
    jobs: Receiver<Job>,
    ready: Sender<Result<Started, ReplError>>,
) {
    Python::attach(|py| {
        let created = match first {
            Setup::Start(init) => SessionState::create(py, init),
            Setup::Ahead { init, warm_up } => match SessionState::skeleton(py, init) {
                Ok(mut state) => {
                    if warm_up {
                        state.warm_up(py);
                    }
                    let _ = ready.send(Ok((Vec::new(), state.py_session.clone_ref(py))));
                    // Idle, without the GIL, until a session takes it (or never does).
                    let setup = if warm_up {
                        idle_until_started(py, setups)
                    } else {
                        py.detach(move || setups.recv())
                    };
                    match setup {
                        Ok(Setup::Start(init)) => state.finish(py, init),
                        Ok(Setup::Ahead { .. }) | Err(_) => {
                            state.close(py);
                            return;
                        }
                    }
                }
                Err(e) => Err(e),
            },
        };
        let mut state = match created {
            Ok((state, contexts)) => {
                let _ = ready.send(Ok((contexts, state.py_session.clone_ref(py))));
                state
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let mut jobs = jobs;
        let source = state.embedding.jobs.clone();
        // The last job's answer, given (and its text redacted) without the GIL, before the
        // wait for the next job; after a block's, the next block is prepared in between.
        let mut answer: Option<Box<dyn FnOnce() + Send>> = None;
        loop {
            if !state.prepared
                && let Some(answer) = answer.take()
            {
                py.detach(answer);
            }
            state.prepare_block(py);
            let source = source.as_deref();
            let (job, rx) = py.detach(move || {
                if let Some(answer) = answer {
                    answer();
                }
                let job = match source {
                    Some(source) => source.next_job(&jobs),
                    None => jobs.recv(),
                };
                (job, jobs)
            });
            jobs = rx;
            answer = match job {
                Ok(Job::Exec { code, stop, reply }) => {
                    let result = state.exec(py, &code, stop);
                    let processes = state.processes.load(Ordering::Relaxed);
                    Some(Box::new(move || {
                        let result = result.map(|mut result| {
                            result.redact(&bridge::secret::redactor());
                            result
                        });
                        reply(Ran { result, processes });
                    }))
                }
                Ok(Job::Variables { reply }) => {
                    let variables = state.variables(py);
                    Some(Box::new(move || {
                        let redactor = bridge::secret::redactor();
                        reply(variables.map(|mut variables| {
                            for variable in &mut variables {
                                variable.redact(&redactor);
                            }
                            variables
                        }));
                    }))
                }
                Ok(Job::VariableString { name, reply }) => {
                    let text = state.variable_as_string(py, &name);
                    Some(Box::new(move || reply(text.map(|text| text.map(redacted)))))
                }
                Ok(Job::ResetAnswer { reply }) => {
                    let done = state.reset_answer(py);
                    Some(Box::new(move || reply(done)))
                }
                Ok(Job::AnswerContent { reply }) => {
                    let text = state.answer_content(py);
                    Some(Box::new(move || reply(text.map(|text| text.map(redacted)))))
                }
                Ok(Job::Call { call, reply }) => {
                    let out = call();
                    Some(Box::new(move || reply(out)))
                }
                Ok(Job::Shutdown) | Err(_) => break,
            };
        }
        state.close(py);
    });
}

/// `text` with the secrets the run knows replaced.
fn redacted(mut text: String) -> String {
    bridge::secret::redactor().redact_in_place(&mut text);
    text
}

/// The session thread's side: the namespace and everything bound to it.
pub(crate) struct SessionState {
    pub(crate) id: u64,
    pub(crate) config: SessionConfig,
    pub(crate) globals: Py<PyDict>,
    /// The support module's `Session` object for this session.
    pub(crate) py_session: Py<PyAny>,
    /// The session's own `answer` dict (the slot after a reset; see `answer_slot`).
    pub(crate) answer: Py<PyAny>,
    pub(crate) reserved: Vec<(String, Py<PyAny>)>,
    pub(crate) reserved_set: Py<PyFrozenSet>,
    pub(crate) bridge: Arc<SubModelBridge>,
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) thread_id: std::os::raw::c_long,
    /// The process the session lives in: a block that finds itself elsewhere runs in a
    /// forked child (see `SessionState::exec`).
    pub(crate) pid: u32,
    pub(crate) blocks: u64,
    /// User code run outside blocks under the watchdog (see `SessionState::guarded`).
    pub(crate) guards: u64,
    /// Whether what the next block starts with is made (see `SessionState::prepare_block`).
    pub(crate) prepared: bool,
    /// How a worker process embeds the session (default: not at all).
    pub(crate) embedding: Embedding,
    /// Whether the session may hold processes its blocks started (what `end_processes`
    /// ends): `true` from a block's start, then what its end found (the session's list
    /// changes only there and when they are ended). Read by its [`LocalSession`].
    pub(crate) processes: Arc<AtomicBool>,
}

impl SessionState {
    /// A new session with its contexts loaded; nothing of it is left when one fails.
    fn create(
        py: Python<'_>,
        mut init: SessionInit,
    ) -> Result<(Self, Vec<ContextMetadata>), ReplError> {
        let contexts = std::mem::take(&mut init.contexts);
        let (loader, load) = (init.embedding.loader.clone(), init.load.clone());
        let mut state = Self::skeleton(py, init)?;
        match state.add_contexts(py, &contexts, loader.as_ref(), &load) {
            Ok(metadata) => Ok((state, metadata)),
            Err(e) => {
                state.close(py);
                Err(e)
            }
        }
    }

    /// Finishes a session built ahead by [`skeleton`](Self::skeleton) with `init`'s
    /// contexts, or, when `init` has other settings, closes it and creates one for `init`.
    fn finish(
        mut self,
        py: Python<'_>,
        init: SessionInit,
    ) -> Result<(Self, Vec<ContextMetadata>), ReplError> {
        if init.config != self.config {
            self.close(py);
            return Self::create(py, init);
        }
        let loader = init.embedding.loader.clone();
        self.embedding.loader.clone_from(&loader);
        match self.add_contexts(py, &init.contexts, loader.as_ref(), &init.load) {
            Ok(metadata) => Ok((self, metadata)),
            Err(e) => {
                self.close(py);
                Err(e)
            }
        }
    }

    /// The session without contexts (`init.contexts` is not read): the support module's
    /// `Session` and its namespace, bound to this thread, with the natives, the answer
    /// dict, `FINAL_VAR` and `SHOW_VARS`.
    fn skeleton(py: Python<'_>, init: SessionInit) -> Result<Self, ReplError> {
        let support = interpreter(py)?.support(py);
        let fail = |e: PyErr| ReplError::internal("creating a session", e);
        let py_session = support
            .getattr("Session")
            .and_then(|c| c.call1((init.id,)))
            .map_err(fail)?;
        let globals = py_session
            .getattr("globals")
            .and_then(|g| Ok(g.cast_into::<PyDict>()?))
            .map_err(fail)?;
        support
            .call_method1("bind_thread", (&py_session,))
            .map_err(fail)?;
        let thread_id: std::os::raw::c_long = py
            .import("threading")
            .and_then(|t| t.call_method0("get_ident"))
            .and_then(|i| i.extract::<u64>())
            .map_err(fail)? as std::os::raw::c_long;

        let error_class = support.getattr("LlmQueryError").map_err(fail)?;
        let bridge = Arc::new(SubModelBridge::new(
            init.route,
            init.id,
            init.config.sub_endpoint.clone(),
            init.config.batch_concurrency,
            init.config.sub_call_errors,
            init.config.sub_call_text_chars,
            init.cancel,
            error_class.clone().unbind(),
        ));
        let llm_query = Bound::new(
            py,
            LlmQuery {
                bridge: Arc::clone(&bridge),
            },
        )
        .map_err(fail)?;
        let llm_query_batched = Bound::new(
            py,
            LlmQueryBatched {
                bridge: Arc::clone(&bridge),
            },
        )
        .map_err(fail)?;
        let rlm_query = Bound::new(
            py,
            RlmQuery {
                bridge: Arc::clone(&bridge),
                slot: Arc::clone(&init.children),
            },
        )
        .map_err(fail)?;
        let rlm_query_batched = Bound::new(
            py,
            RlmQueryBatched {
                bridge: Arc::clone(&bridge),
                slot: Arc::clone(&init.children),
            },
        )
        .map_err(fail)?;
        let answer = support
            .getattr("AnswerDict")
            .and_then(|c| c.call1((&py_session,)))
            .map_err(fail)?;
        let reserved: Vec<(String, Py<PyAny>)> = vec![
            ("llm_query".to_owned(), llm_query.into_any().unbind()),
            (
                "llm_query_batched".to_owned(),
                llm_query_batched.into_any().unbind(),
            ),
            ("rlm_query".to_owned(), rlm_query.into_any().unbind()),
            (
                "rlm_query_batched".to_owned(),
                rlm_query_batched.into_any().unbind(),
            ),
            ("answer".to_owned(), answer.clone().unbind()),
            ("LlmQueryError".to_owned(), error_class.unbind()),
        ];
        let mut state = Self {
            id: init.id,
            config: init.config,
            globals: globals.unbind(),
            py_session: py_session.unbind(),
            answer: answer.unbind(),
            reserved,
            reserved_set: PyFrozenSet::empty(py).map_err(fail)?.unbind(),
            bridge,
            watchdog: init.watchdog,
            thread_id,
            pid: std::process::id(),
            blocks: 0,
            guards: 0,
            prepared: false,
            embedding: init.embedding,
            processes: init.processes,
        };
        if let Err(e) = state.seal_reserved(py) {
            state.close(py);
            return Err(e);
        }
        Ok(state)
    }

    /// Loads `contexts` and binds them (`context`, `context_N`, their names) as reserved
    /// names of the namespace.
    fn add_contexts(
        &mut self,
        py: Python<'_>,
        contexts: &[ContextInput],
        loader: Option<&Arc<dyn ContextLoader>>,
        load: &LoadOptions,
    ) -> Result<Vec<ContextMetadata>, ReplError> {
        if contexts.is_empty() {
            return Ok(Vec::new());
        }
        let mut bound: Vec<(String, Py<PyAny>)> = Vec::new();
        let mut metadata = Vec::with_capacity(contexts.len());
        for (index, input) in contexts.iter().enumerate() {
            let loaded = match loader {
                Some(loader) => loader.load(py, index, input, load)?,
                None => load_context(py, index, input, load)?,
            };
            if index == 0 {
                bound.push(("context".to_owned(), loaded.value.clone().unbind()));
            }
            if let Some(name) = &input.name {
                bound.push((name.clone(), loaded.value.clone().unbind()));
            }
            bound.push((format!("context_{index}"), loaded.value.unbind()));
            metadata.push(loaded.metadata);
        }
        self.reserved.splice(0..0, bound);
        self.seal_reserved(py)?;
        Ok(metadata)
    }

    /// Makes the reserved names what `FINAL_VAR` and `SHOW_VARS` hide and skip (both made
    /// again over the new set), and binds every reserved name in the namespace.
    fn seal_reserved(&mut self, py: Python<'_>) -> Result<(), ReplError> {
        const OWN: [&str; 2] = ["FINAL_VAR", "SHOW_VARS"];
        let fail = |e: PyErr| ReplError::internal("creating a session", e);
        let support = interpreter(py)?.support(py);
        self.reserved
            .retain(|(name, _)| !OWN.contains(&name.as_str()));
        let names: Vec<&str> = self
            .reserved
            .iter()
            .map(|(n, _)| n.as_str())
            .chain(OWN)
            .collect();
        let reserved_set = PyFrozenSet::new(py, &names).map_err(fail)?;
        let (py_session, globals) = (self.py_session.bind(py), self.globals.bind(py));
        let final_var = support
            .call_method1("make_final_var", (py_session, globals, &reserved_set))
            .map_err(fail)?;
        let show_vars = support
            .call_method1("make_show_vars", (globals, &reserved_set))
            .map_err(fail)?;
        self.reserved
            .push(("FINAL_VAR".to_owned(), final_var.unbind()));
        self.reserved
            .push(("SHOW_VARS".to_owned(), show_vars.unbind()));
        for (name, value) in &self.reserved {
            globals.set_item(name, value).map_err(fail)?;
        }
        self.reserved_set = reserved_set.unbind();
        Ok(())
    }

    pub(crate) fn variables(&self, py: Python<'_>) -> Result<Vec<VariableInfo>, ReplError> {
        let support = interpreter(py)?.support(py);
        let rows = support
            .call_method1(
                "list_variables",
                (self.globals.bind(py), self.reserved_set.bind(py)),
            )
            .and_then(|rows| rows.extract::<Vec<VariableRow>>())
            .map_err(|e| ReplError::internal("listing variables", e))?;
        Ok(rows.into_iter().map(VariableInfo::from_row).collect())
    }

    fn reset_answer(&mut self, py: Python<'_>) -> Result<(), ReplError> {
        let answer = self.answer.bind(py);
        answer
            .call_method0("reset")
            .and_then(|_| self.globals.bind(py).set_item("answer", answer))
            .map_err(|e| ReplError::internal("resetting the answer dict", e))?;
        self.set_answer_slot(answer.clone().unbind());
        Ok(())
    }

    fn answer_content(&self, py: Python<'_>) -> Result<Option<String>, ReplError> {
        let content = self
            .answer_slot(py)
            .get_item("content")
            .ok()
            .filter(|value| !value.is_none());
        let Some(content) = content else {
            return Ok(None);
        };
        let text = content
            .str()
            .and_then(|s| s.extract::<String>())
            .map_err(|e| ReplError::internal("reading `answer[\"content\"]`", e))?;
        Ok((!text.trim().is_empty()).then_some(text))
    }

    /// What `answer` is now: the session's own dict, or a mapping a block rebound it to.
    pub(crate) fn answer_slot<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.reserved
            .iter()
            .find(|(name, _)| name == "answer")
            .map_or_else(|| self.answer.bind(py).clone(), |(_, v)| v.bind(py).clone())
    }

    /// Makes `slot` the object that `answer` is restored to after each block.
    pub(crate) fn set_answer_slot(&mut self, slot: Py<PyAny>) {
        if let Some(entry) = self.reserved.iter_mut().find(|(name, _)| name == "answer") {
            entry.1 = slot;
        }
    }

    fn variable_as_string(
        &mut self,
        py: Python<'_>,
        name: &str,
    ) -> Result<Option<String>, ReplError> {
        let globals = self.globals.bind(py).clone();
        let Some(value) = globals
            .get_item(name)
            .map_err(|e| ReplError::internal("reading a variable", e))?
        else {
            return Ok(None);
        };
        // str() runs the user's __str__: bounded like a block, its failure described.
        let limit = self.config.cell_timeout.min(STR_TIMEOUT);
        let text = self.guarded(py, limit, || value.str())?;
        Ok(Some(match text {
            Ok(s) => s.to_string_lossy().into_owned(),
            Err(e) => format!("<str() of `{name}` failed: {e}>"),
        }))
    }

    /// Blocks are compiled as `<repl-block-N>` in the first session of the process and as
    /// `<repl-S-block-N>` in session S > 1, so the process-wide linecache keeps them apart.
    pub(crate) fn block_filename_prefix(&self) -> String {
        if self.id == 1 {
            "<repl-block-".to_owned()
        } else {
            format!("<repl-{}-block-", self.id)
        }
    }

    fn close(self, py: Python<'_>) {
        if let Err(e) = self.py_session.bind(py).call_method0("close") {
            tracing::warn!("could not close a session's module and processes: {e}");
            self.globals.bind(py).clear();
        }
        if let Ok(support) = interpreter(py).map(|i| i.support(py)) {
            let _ = support.call_method1("unbind_thread", (self.block_filename_prefix(),));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::source::ContextSource;
    use bridge::{Budget, Endpoints, Ledger};

    fn route() -> SubCallRoute {
        let ledger = Arc::new(Ledger::new(Budget::default()));
        SubCallRoute::Local(Arc::new(
            Endpoints::new(Vec::new(), ledger).expect("no endpoints"),
        ))
    }

    fn doc() -> Vec<ContextInput> {
        vec![ContextInput {
            name: Some("doc".to_owned()),
            source: ContextSource::Text("the handed text".to_owned()),
        }]
    }

    /// A session whose namespace was built ahead (as a worker of the pool builds it while
    /// idle), then started.
    fn built_then_started(ahead: SessionConfig, start: SessionConfig) -> LocalSession {
        let mut prepared = Prepared::new().expect("threads");
        prepared
            .build(ahead, route(), Embedding::default())
            .expect("built ahead");
        prepared
            .start(start, route(), &doc(), Embedding::default())
            .expect("started")
    }

    /// The names of the variables `session` lists.
    fn listed(session: &LocalSession) -> Vec<String> {
        session
            .variables()
            .expect("variables")
            .into_iter()
            .map(|v| v.name)
            .collect()
    }

    const LOOK: &str = "import sys\n\
        names = sorted(k for k in globals() if not k.startswith('_') and k != 'sys')\n\
        mine = [m for m in sys.modules if m.startswith('__rlm_session_')]\n\
        print(names, context == doc == context_0 == 'the handed text', len(mine))\n\
        SHOW_VARS()";

    #[test]
    fn a_session_built_ahead_gets_its_contexts_at_start_as_reserved_names() {
        let session = built_then_started(SessionConfig::default(), SessionConfig::default());
        let result = session.exec(LOOK).expect("ran");
        assert!(result.error.is_none(), "{result:?}");
        let mut lines = result.stdout.lines();
        assert_eq!(
            lines.next(),
            Some(
                "['FINAL_VAR', 'LlmQueryError', 'SHOW_VARS', 'answer', 'context', 'context_0', \
                 'doc', 'llm_query', 'llm_query_batched', 'rlm_query', 'rlm_query_batched'] \
                 True 1"
            ),
            "{result:?}"
        );
        // The contexts, added after the namespace was built, are hidden like every reserved
        // name: only the block's own variables are listed.
        let shown: Vec<&str> = lines
            .map(|l| l.split_whitespace().next().unwrap_or(""))
            .collect();
        assert_eq!(shown, ["names", "mine"], "{result:?}");
        assert_eq!(listed(&session), ["names", "mine"]);
        // A block cannot keep a context rebound: it is restored after the block.
        session.exec("context = 'mine now'").expect("ran");
        let after = session.exec("print(context)").expect("ran");
        assert_eq!(after.stdout.trim(), "the handed text");
    }

    #[test]
    fn a_session_built_ahead_ran_a_warm_up_block_that_left_nothing_behind() {
        let session = built_then_started(SessionConfig::default(), SessionConfig::default());
        // The first block is still the first (its file name), the line cache holds no entry
        // of the warm-up's source, and its name is gone from the namespace.
        let first = session
            .exec(
                "import linecache, sys\n\
                 me = sys._getframe().f_code.co_filename\n\
                 print(me, [k for k in linecache.cache if 'block-' in k and k != me])\n\
                 print('_rlm_warm_up' in globals())",
            )
            .expect("ran");
        assert!(first.error.is_none(), "{first:?}");
        let mut lines = first.stdout.lines();
        let (file, cached) = lines
            .next()
            .and_then(|l| l.split_once(' '))
            .expect("a line");
        assert!(file.ends_with("block-1>"), "{first:?}");
        assert_eq!(cached, "[]", "{first:?}");
        assert_eq!(lines.next(), Some("False"), "{first:?}");
        assert_eq!(first.new_variables, ["me"], "{first:?}");
        assert_eq!(listed(&session), ["me"]);
    }

    #[test]
    fn a_session_built_ahead_makes_its_first_small_objects_without_page_faults() {
        // Started 50 ms after it was built, as a worker of the pool waits for its child.
        let mut prepared = Prepared::new().expect("threads");
        prepared
            .build(SessionConfig::default(), route(), Embedding::default())
            .expect("built ahead");
        std::thread::sleep(Duration::from_millis(50));
        let session = prepared
            .start(
                SessionConfig::default(),
                route(),
                &doc(),
                Embedding::default(),
            )
            .expect("started");
        // ~340 KB of new small objects (6000 strings of 56 bytes): ~85 pages the session
        // thread's first write would fault in, had it not written its free pools while it
        // waited for its start.
        // The list that holds them is made before the count starts (it is not pymalloc's).
        let first = session
            .exec(
                "import resource\n\
                 kept = [None] * 6000\n\
                 before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt\n\
                 for i in range(6000):\n    kept[i] = f'{i:>6}' + 'ab'\n\
                 print(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)",
            )
            .expect("ran");
        assert!(first.error.is_none(), "{first:?}");
        let faults: u64 = first.stdout.trim().parse().expect("a count");
        assert!(faults < 30, "{faults} page faults: {first:?}");
    }

    #[test]
    fn a_session_built_ahead_for_other_settings_is_built_again_with_its_own() {
        let ahead = SessionConfig {
            cell_timeout: Duration::from_secs(60),
            ..SessionConfig::default()
        };
        let start = SessionConfig {
            cell_timeout: Duration::from_millis(300),
            ..SessionConfig::default()
        };
        let session = built_then_started(ahead, start);
        let result = session.exec(LOOK).expect("ran");
        assert!(result.stdout.contains("True 1"), "{result:?}");
        // The start's time limit, not the one the namespace was built ahead with.
        let slow = session.exec("import time\ntime.sleep(20)").expect("ran");
        assert!(slow.timed_out, "{slow:?}");
        assert!(slow.duration < Duration::from_secs(10), "{slow:?}");
    }

    /// Where an answer was given: its thread's name, and whether it held the GIL.
    fn answered_where() -> (String, bool) {
        let name = std::thread::current().name().unwrap_or("").to_owned();
        // SAFETY: only asks whether this thread holds the GIL.
        let gil = unsafe { pyo3::ffi::PyGILState_Check() } == 1;
        (name, gil)
    }

    #[test]
    fn submitted_jobs_run_in_turn_and_are_answered_on_the_session_thread_without_the_gil() {
        let session = LocalSession::start(
            SessionConfig::default(),
            route(),
            &doc(),
            Embedding::default(),
        )
        .expect("started");
        let (tx, answers) = mpsc::channel::<(&str, String, (String, bool))>();
        let exec_tx = tx.clone();
        // The block waits until its answer could have been read: `submit` must not wait.
        let (go, gate) = mpsc::channel::<()>();
        session
            .submit(Job::Call {
                call: Box::new(move || {
                    let _ = without_gil(move || gate.recv_timeout(Duration::from_secs(10)));
                    Ok(Some("waited".to_owned()))
                }),
                reply: Box::new(move |out| {
                    let text = out.ok().flatten().unwrap_or_default();
                    let _ = tx.send(("call", text, answered_where()));
                }),
            })
            .expect("submitted");
        session
            .submit(Job::Exec {
                code: "x = 41\nprint(x + 1)".to_owned(),
                stop: None,
                reply: Box::new(move |ran| {
                    let out = ran.result.map(|r| r.stdout).unwrap_or_default();
                    let _ = exec_tx.send(("exec", out, answered_where()));
                }),
            })
            .expect("submitted");
        let (vars_tx, vars) = mpsc::channel();
        session
            .submit(Job::Variables {
                reply: Box::new(move |listed| {
                    let names: Vec<String> = listed
                        .unwrap_or_default()
                        .into_iter()
                        .map(|v| v.name)
                        .collect();
                    let _ = vars_tx.send((names, answered_where()));
                }),
            })
            .expect("submitted");
        // All three were handed over while the first still waits: nothing answered yet.
        assert!(
            answers.try_recv().is_err(),
            "a job was answered before its turn"
        );
        go.send(()).expect("the first job waits");
        let wait = Duration::from_secs(10);
        let first = answers.recv_timeout(wait).expect("the first answer");
        let second = answers.recv_timeout(wait).expect("the second answer");
        let (names, listed_where) = vars.recv_timeout(wait).expect("the variables");
        let thread = format!("rlm-repl-{}", session.id());
        assert_eq!(
            first,
            ("call", "waited".to_owned(), (thread.clone(), false))
        );
        assert_eq!(second, ("exec", "42\n".to_owned(), (thread.clone(), false)));
        // The variables job ran after the block: it lists what the block bound.
        assert_eq!(names, ["x"]);
        assert_eq!(listed_where, (thread, false));
    }

    #[test]
    fn a_session_built_ahead_and_never_started_ends_its_threads() {
        let mut prepared = Prepared::new().expect("threads");
        prepared
            .build(SessionConfig::default(), route(), Embedding::default())
            .expect("built ahead");
        let done = prepared.thread_done.take().expect("its thread");
        drop(prepared);
        assert!(
            without_gil(move || done.recv_timeout(Duration::from_secs(10))).is_ok(),
            "the session thread of a namespace built ahead outlived it"
        );
    }
}
