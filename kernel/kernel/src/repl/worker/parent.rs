//! The parent's side of an isolated session: [`WorkerSession`] starts and talks to the
//! worker, answers its sub-calls, keeps its output, stops it, and puts it back after a crash.
//!
//! Threads: the caller's (a request waits there, GIL released), one reader per worker at a
//! time (first a thread of the shared runtime's blocking pool, kept from one worker to the
//! next: none is started on a child's path; from the start frame on, it reads the worker's
//! `Ready`, which the session takes from it when first needed, then every frame: output into
//! the block's capture, replies to their waiters, sub-calls to tasks on the shared tokio
//! runtime that call the endpoint and answer; when the link closes it reaps the worker and
//! wakes every waiter), and threads kept for the next call (`threads.rs`) for the worker
//! code's `rlm_query` children: the reader that reads a call for children, once a kept thread,
//! runs them itself and another kept thread reads on (the first reader hands both to kept
//! threads), so that the children start without a thread woken on their way. No
//! thread watches a block's stop token or the session's: their wait lists hold a waker that
//! tells the block's caller to stop the block ([`StopWatch`]), run by whoever cancels them.
//!
//! Stopping: the worker's own watchdog interrupts a block at its time limit or when told to
//! ([`ToWorker::Interrupt`]); the worker says when interrupted code has returned. A block
//! whose code has not returned [`KILL_GRACE`] after its limit (or after the stop) is stuck in
//! native code: its worker is killed, and the block ends as timed out or cancelled.
//!
//! Starting: the worker is confined first ([`ToWorker::Confine`], with the settings its
//! session's namespace is built with), then handed its session ([`ToWorker::Start`]: its
//! contexts, and its settings only if they are not those); a worker confined ahead of need
//! (`pool.rs`) gets only the second.
//! Closing: the worker is told to shut down and given [`EXIT_WAIT`] to exit before it is
//! killed; while a run keeps workers ready, on a closer thread once the run waits for a
//! model (`quiet.rs`), so that a child (and its parent) does not wait for its worker's exit
//! nor share the cores with it (unless that thread is behind: `closer.rs`), and the run's end
//! waits for them all.
//!
//! Crashes: a worker that ends during a block (a signal, `exit()`, the memory limit, our own
//! kill) ends only the block. A fresh worker loads the contexts, and the blocks that ran to
//! completion before are replayed with their sub-calls answered from their records
//! ([`super::journal`]), unless the session asks for a fresh start; the block's result says
//! what happened ([`WorkerRestart`]). When the run is stopping, the restore waits for the
//! session's next use. A worker the session killed ends as what it was killed for (stopped,
//! lost); any other end is read from its exit status, and a `SIGKILL` (the out-of-memory
//! killer's signal, and `kill -9`'s) is told as memory only when the kernel counted an
//! out-of-memory kill while the worker ran ([`WorkerEnd::OutOfMemory`]), as a kill otherwise;
//! a signal that only asks a process to end (`SIGTERM`, `SIGHUP`, ...: [`ASKED_TO_END`]) is
//! told as a stop from outside `rlm` ([`WorkerEnd::Killed`]), not as a crash. The block's
//! counts of its sub-calls ended with its worker (they are counted where the code makes the
//! calls and gets the answers, in the worker: see [`crate::repl::natives`]), but the parent saw
//! them all: every request arrives here, and every answer, to a sub-call or an `rlm_query`
//! child, goes out through [`Worker::answer`]. So the parent keeps what it saw of the running
//! block ([`SubCallsSeen`]: its `llm_query` and `llm_query_batched` calls as their requests
//! arrive, the answers it sent as errors, and what each call asked and got); the texts are
//! always the block's (they are kept here, where the secrets are known), the counts only when
//! its worker ended with it, so nothing counts twice. An answer that comes after the worker was
//! reaped (a call cancelled by its end) never reached the code and is not counted; an empty
//! `llm_query_batched([])` asks the parent nothing and is not seen.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufReader};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bridge::record::{AnswerRecord, RecordKey};
use bridge::{BatchPolicy, CallOptions, ChatRequest, Endpoints};
use tokio_util::sync::CancellationToken;

use super::closer;
use super::journal::{Entry, Journal};
use super::lock::lock;
use super::policy::{level_of, session_policy};
use super::pool::{self, Ready, Shape};
use super::protocol::{
    Confine, FrameError, FromWorker, NoSigPipe, Reply, Request, Start, ToWorker, read_frame,
    worker_settings, write_frame,
};
use super::scratch::Scratch;
use super::spawn::{
    Exit, OomCounter, REAP_WAIT, SpawnJob, Spawned, WorkerProgram, oom_counter, oom_kills, reap,
    send_fds, start_worker, worker_program,
};
use super::template;
use super::threads::Threads;
use super::transfer::{SharedContexts, described_ahead, share_contexts};
use crate::repl::capture::{OutputCapture, Stream};
use crate::repl::children::{ChildSlot, query_of};
use crate::repl::config::{OnCrash, SessionConfig};
use crate::repl::error::ReplError;
use crate::repl::interpreter::without_gil;
use crate::repl::metadata::{
    ContextMetadata, ExecError, ExecutionResult, Restore, SubCallText, VariableInfo, WorkerEnd,
    WorkerRestart, kept_text,
};
use crate::repl::natives::{SubAnswer, SubFailure, WireChild, WireContext, failed_answers};
use crate::repl::source::ContextInput;
use crate::repl::stop_watch::StopWatch;
use crate::runtime;

/// How long after its time limit, or after it was told to stop, a block whose code has not
/// returned is stopped by ending its worker.
pub(crate) const KILL_GRACE: Duration = Duration::from_millis(500);
/// How long a block whose interrupted code has returned may take to wind down (its
/// processes are ended, SIGKILL after 1 s).
const WIND_DOWN: Duration = Duration::from_secs(10);
/// How long other requests may wait for the worker.
const QUERY_WAIT: Duration = Duration::from_secs(30);
/// How long a worker told to exit may take before it is killed.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// Fresh workers tried when replaying ends the worker again.
const RESTORE_ATTEMPTS: usize = 3;

/// A worker's first frame after its start frame, as its link's reader read it.
type FirstFrame = Result<FromWorker, FrameError>;

/// A worker confined ahead of need (`pool.rs`): what is in force, and the settings its
/// session's namespace was built with.
type Confined = (sandbox::Report, Arc<SessionConfig>);

/// The parent's side of an isolated session (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct WorkerSession {
    /// The session's id ([`crate::repl::ReplSession::id`]), in the ledger record of each
    /// sub-call its code makes.
    id: u64,
    config: SessionConfig,
    endpoints: Arc<Endpoints>,
    program: WorkerProgram,
    shared: SharedContexts,
    policy: sandbox::Policy,
    level: sandbox::Level,
    /// The worker's memory limit.
    memory_bytes: u64,
    /// The scratch directory (removed with the session, once its worker ended).
    scratch: Option<Scratch>,
    scratch_path: PathBuf,
    worker: Mutex<Slot>,
    /// Signalled when a [`Slot::Readying`] worker became live or failed.
    settled: Condvar,
    /// One request at a time, as in-process.
    busy: Mutex<()>,
    journal: Mutex<Journal>,
    cancel: CancellationToken,
    contexts: Vec<ContextMetadata>,
    confinement: sandbox::Report,
    /// A restart outside any block, reported with the next block.
    pending: Mutex<Option<WorkerRestart>>,
    /// Who runs the `rlm_query` children of the worker's code (here, in the parent).
    children: Arc<ChildSlot>,
    /// Whether a block was sent to the worker (else its answer is empty: nothing to ask it
    /// at a run's start).
    ran: std::sync::atomic::AtomicBool,
    /// Whether the session may hold processes its blocks started: set when a block is sent,
    /// then to what the worker said at the block's end (only blocks start them). If not,
    /// ending them at a run's end asks the worker nothing.
    processes: std::sync::atomic::AtomicBool,
}

/// The session's worker: running; handed its session and not taken yet (its `Ready`, read
/// by its link's reader as it comes, is taken when the session is first needed); ended and
/// not yet replaced; or never started.
#[derive(Debug)]
enum Slot {
    Live(Arc<Worker>),
    Starting(Box<Handed>),
    /// Its `Ready` being taken (waited for, if it has not come) by one request, outside the
    /// slot's lock (so that `interrupt` does not wait for it); other requests wait for the
    /// outcome
    /// ([`WorkerSession::settled`]).
    Readying,
    Ended(WorkerEnd),
    /// Its worker could not start its session: why (later requests get it as the reason).
    Failed(String),
}

/// A worker sent its session's start frame, whose `Ready` its link's reader reads as it
/// comes; the session takes it from there when first needed.
#[derive(Debug)]
struct Handed {
    worker: Arc<Worker>,
    /// The worker's answer to its start frame, as its link's reader read it.
    answer: Receiver<FirstFrame>,
    /// Whether the start frame (and the memfds) went out.
    sent: io::Result<()>,
    confinement: sandbox::Report,
    /// A worker of the pool, a fork of the template or the spare: one ended meanwhile is
    /// replaced.
    spare: bool,
    /// A worker of the pool.
    pooled: bool,
}

impl WorkerSession {
    /// Where the worker code's `rlm_query` children find their runner.
    pub(crate) fn children(&self) -> &Arc<ChildSlot> {
        &self.children
    }

    /// Starts a worker for session `id` over `inputs` (files as paths, the rest in shared
    /// memory) and waits until its session is ready.
    pub(crate) fn start(
        id: u64,
        config: SessionConfig,
        endpoints: Arc<Endpoints>,
        inputs: &[ContextInput],
    ) -> Result<Self, ReplError> {
        Self::begin(id, config, endpoints, inputs, false, None)
    }

    /// Like [`WorkerSession::start`], for a session whose caller has other work before its
    /// first block (an `rlm_query` child's first model call): the worker is taken and sent
    /// its start frame, and its `Ready` (read by its link's reader as it comes) is taken only
    /// when the session is first needed (a block, or any request), so the worker starts its
    /// session while the caller works. A
    /// worker that fails to start its session makes that first request fail with the error
    /// [`WorkerSession::start`] would have returned. The contexts' metadata, which the
    /// caller needs at once (its first prompt describes them), is rlm's own description of
    /// what it hands over, made before the worker (or any code in it) runs; a context that
    /// must be loaded to be described (a file, a child's frame, JSON only Python can judge:
    /// [`described_ahead`]) makes the start wait for `Ready`, as `start`. `run_shape`: the
    /// shape of the workers the caller's run keeps ready ([`super::ReadyWorkers::shape`]),
    /// which a session without file contexts takes its worker by rather than work its own
    /// out again.
    pub(crate) fn start_ready_later(
        id: u64,
        config: SessionConfig,
        endpoints: Arc<Endpoints>,
        inputs: &[ContextInput],
        run_shape: Option<&Shape>,
    ) -> Result<Self, ReplError> {
        Self::begin(id, config, endpoints, inputs, true, run_shape)
    }

    fn begin(
        id: u64,
        config: SessionConfig,
        endpoints: Arc<Endpoints>,
        inputs: &[ContextInput],
        ready_later: bool,
        run_shape: Option<&Shape>,
    ) -> Result<Self, ReplError> {
        let program = worker_program().ok_or(ReplError::NoWorkerProgram)?;
        let shared = share_contexts(inputs)?;
        let described = if ready_later {
            described_ahead(inputs)
        } else {
            None
        };
        // A worker confined ahead of need for sessions like this one (no files to read): a
        // run's child takes its run's (the policy built, `/proc/meminfo` and the environment
        // read once for the whole run, not on each child's path).
        let own_shape;
        let shape = if !shared.read_paths.is_empty() {
            None
        } else if run_shape.is_some() {
            run_shape
        } else {
            own_shape = Shape::of(&config, &program);
            own_shape.as_ref()
        };
        let ready = shape.and_then(pool::take);
        let (scratch, policy) = match &ready {
            Some(_) => (None, None),
            None => {
                let scratch = Scratch::create().map_err(|e| ReplError::Worker {
                    problem: format!(
                        "has no scratch directory: {e}; check that `$TMPDIR` is writable"
                    ),
                })?;
                let policy = session_policy(&config, scratch.path(), &program, &shared.read_paths);
                (Some(scratch), Some(policy))
            }
        };
        let (scratch, policy, ready) = match (ready, scratch, policy) {
            (Some(ready), _, _) => {
                let Ready {
                    spawned,
                    scratch,
                    policy,
                    confinement,
                    settings,
                    ..
                } = ready;
                (scratch, policy, Some((spawned, (confinement, settings))))
            }
            (None, Some(scratch), Some(policy)) => (scratch, policy, None),
            (None, _, _) => {
                return Err(ReplError::internal(
                    "starting a worker",
                    "no scratch directory",
                ));
            }
        };
        let mut session = Self::unstarted(id, config, endpoints, program, shared, policy, scratch);
        if let Some(contexts) = described {
            let handed = session.hand_over_any(ready)?;
            session.contexts = contexts;
            session.confinement = handed.confinement.clone();
            *lock(&session.worker) = Slot::Starting(Box::new(handed));
        } else {
            let (worker, contexts, confinement) = session.spawn(ready)?;
            session.contexts = contexts;
            session.confinement = confinement;
            *lock(&session.worker) = Slot::Live(worker);
        }
        // The next session like this one finds a worker confined while this one runs.
        if let Some(shape) = shape {
            pool::order_refill(shape);
        }
        Ok(session)
    }

    /// The session with no worker yet (nor contexts described).
    fn unstarted(
        id: u64,
        config: SessionConfig,
        endpoints: Arc<Endpoints>,
        program: WorkerProgram,
        shared: SharedContexts,
        policy: sandbox::Policy,
        scratch: Scratch,
    ) -> Self {
        let memory_bytes = policy
            .limits
            .memory_bytes
            .unwrap_or_else(sandbox::default_memory_limit);
        Self {
            id,
            level: level_of(&config),
            config,
            endpoints,
            program,
            shared,
            policy,
            memory_bytes,
            scratch_path: scratch.path().to_owned(),
            scratch: Some(scratch),
            worker: Mutex::new(Slot::Ended(WorkerEnd::Lost {
                detail: "has not started".to_owned(),
            })),
            settled: Condvar::new(),
            busy: Mutex::new(()),
            journal: Mutex::new(Journal::default()),
            cancel: CancellationToken::new(),
            contexts: Vec::new(),
            confinement: sandbox::Report { layers: Vec::new() },
            pending: Mutex::new(None),
            children: Arc::default(),
            ran: std::sync::atomic::AtomicBool::new(false),
            processes: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn contexts(&self) -> &[ContextMetadata] {
        &self.contexts
    }

    pub(crate) fn confinement(&self) -> &sandbox::Report {
        &self.confinement
    }

    pub(crate) fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// A worker process with its session ready: `ready` (confined ahead of need), else one
    /// forked from the template, or the spare, confined now (a new worker if the one taken
    /// had died meanwhile).
    fn spawn(
        &self,
        ready: Option<(Spawned, Confined)>,
    ) -> Result<(Arc<Worker>, Vec<ContextMetadata>, sandbox::Report), ReplError> {
        let handed = self.hand_over_any(ready)?;
        self.ready(handed)
    }

    /// A worker sent its session's start frame: `ready` (confined ahead of need), else a
    /// new one ([`WorkerSession::hand_over_new`]). Its `Ready` is taken by
    /// [`WorkerSession::ready`].
    fn hand_over_any(&self, ready: Option<(Spawned, Confined)>) -> Result<Handed, ReplError> {
        match ready {
            // Sending to a worker that ended meanwhile fails: that shows when `Ready` is taken.
            Some((spawned, confinement)) => self
                .hand_over(spawned, Some(confinement))
                .map_err(Failure::into_error),
            None => self.hand_over_new(),
        }
    }

    /// One forked from the template, or the spare, confined now and sent its start frame (a
    /// new worker if the one taken had died meanwhile).
    fn hand_over_new(&self) -> Result<Handed, ReplError> {
        let spawned = template::take(&self.program).map_err(|e| spawn_error(&e))?;
        match self.hand_over(spawned, None) {
            Err(Failure::Spare) => {
                let fresh = start_worker(&self.program).map_err(|e| spawn_error(&e))?;
                self.hand_over(fresh, None)
            }
            other => other,
        }
        .map_err(Failure::into_error)
    }

    /// `handed`'s `Ready`, taken now: a worker of the pool that had ended is replaced by one
    /// forked from the template, a fork of the template or the spare that had by a new
    /// process.
    fn ready(
        &self,
        handed: Handed,
    ) -> Result<(Arc<Worker>, Vec<ContextMetadata>, sandbox::Report), ReplError> {
        let pid = handed.worker.pid;
        let pooled = handed.pooled;
        match self.await_ready(handed) {
            Ok(started) => {
                if pooled {
                    tracing::debug!("the session took the worker {pid}, confined ahead of need");
                }
                Ok(started)
            }
            Err(Failure::Spare) if pooled => {
                tracing::debug!(
                    "the worker {pid} confined ahead of need had ended; the session starts another"
                );
                let handed = self.hand_over_new()?;
                self.ready(handed)
            }
            Err(Failure::Spare) => {
                let fresh = start_worker(&self.program).map_err(|e| spawn_error(&e))?;
                self.hand_over(fresh, None)
                    .and_then(|handed| self.await_ready(handed))
                    .map_err(Failure::into_error)
            }
            Err(Failure::Error(error)) => Err(error),
        }
    }

    /// Confines `spawned` (unless it is: `confined`) and sends it its session (memfds, start
    /// frame: its settings only if they are not those its namespace was built with), without
    /// waiting for its answer.
    fn hand_over(
        &self,
        mut spawned: Spawned,
        confined: Option<Confined>,
    ) -> Result<Handed, Failure> {
        let last_words = spawned.read_output();
        let Spawned {
            pid,
            link,
            spare,
            oom_kills,
            ..
        } = spawned;
        // A worker of the pool was taken from it: ended meanwhile, it is replaced.
        let pooled = confined.is_some();
        let spare = spare || pooled;
        let writer = link
            .try_clone()
            .map_err(|e| Failure::Error(spawn_error(&e)))?;
        let worker = Arc::new(Worker {
            pid,
            writer: Mutex::new(writer),
            waiters: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            block: Mutex::new(None),
            end: Mutex::new(None),
            ended: Condvar::new(),
            ended_by: Mutex::new(None),
            oom_kills,
            last_words,
            text_chars: self.config.sub_call_text_chars,
        });
        let mut reader = BufReader::new(link);
        let mut buffer = Vec::new();
        let (confinement, settings) = match confined {
            Some((confinement, built_for)) => {
                let settings = (*built_for != self.config).then(|| worker_settings(&self.config));
                (confinement, settings)
            }
            None => {
                let confine = Confine {
                    cwd: std::env::current_dir().unwrap_or_else(|_| self.scratch_path.clone()),
                    policy: self.policy.clone(),
                    level: self.level,
                    session: worker_settings(&self.config),
                };
                let answer = worker
                    .send(&ToWorker::Confine(Box::new(confine)))
                    .map_err(FrameError::Io)
                    .and_then(|()| {
                        without_gil(|| read_frame::<FromWorker>(&mut reader, &mut buffer))
                    });
                match answer {
                    Ok(FromWorker::Confined(confinement)) => (confinement, None),
                    answer => return Err(self.not_started(&worker, answer, spare)),
                }
            }
        };
        let start = Start {
            settings,
            contexts: self.shared.contexts.clone(),
        };
        // The memfds and the start frame in one `sendmsg`: one wake-up of the worker.
        let mut frame = Vec::new();
        let sent = write_frame(&mut frame, &ToWorker::Start(Box::new(start)))
            .and_then(|()| send_fds(&lock(&worker.writer), &self.shared.memfds, &frame));
        let answer = self.start_reader(&worker, reader);
        Ok(Handed {
            worker,
            answer,
            sent,
            confinement,
            spare,
            pooled,
        })
    }

    /// The `Ready` of a worker handed its session, as its link's reader read it (waited for,
    /// if it has not come yet).
    fn await_ready(
        &self,
        handed: Handed,
    ) -> Result<(Arc<Worker>, Vec<ContextMetadata>, sandbox::Report), Failure> {
        let Handed {
            worker,
            answer,
            sent,
            confinement,
            spare,
            ..
        } = handed;
        let ready = sent
            .map_err(FrameError::Io)
            .and_then(|()| without_gil(move || answer.recv().unwrap_or(Err(FrameError::Closed))));
        match ready {
            Ok(FromWorker::Ready { contexts }) => Ok((worker, contexts, confinement)),
            answer => Err(self.not_started(&worker, answer, spare)),
        }
    }

    /// Why `worker` did not start its session (`answer`: what it said instead of going on);
    /// it is ended and reaped.
    fn not_started(
        &self,
        worker: &Worker,
        answer: Result<FromWorker, FrameError>,
        spare: bool,
    ) -> Failure {
        match answer {
            Ok(FromWorker::Failed(error)) => {
                worker.kill();
                worker.reap();
                Failure::Error(error)
            }
            Ok(other) => {
                worker.kill();
                worker.reap();
                Failure::Error(ReplError::Worker {
                    problem: format!("answered its start with {other:?}"),
                })
            }
            Err(_) if spare => {
                worker.kill();
                worker.reap();
                Failure::Spare
            }
            Err(e) => {
                let exit = worker.reap();
                let end = classify(&exit, None, self.memory_bytes);
                let words = worker.last_words();
                Failure::Error(ReplError::Worker {
                    problem: format!(
                        "ended while starting ({}; {e}){}",
                        end_summary(&end),
                        if words.trim().is_empty() {
                            String::new()
                        } else {
                            format!("; it said: {}", words.trim())
                        }
                    ),
                })
            }
        }
    }

    /// Has `worker`'s link read from now on, by a thread of the shared runtime's blocking pool
    /// (one idle since an earlier worker's end, not one started on a child's path): its
    /// answer to the start frame just sent, handed back through the returned channel, then,
    /// once that was `Ready`, every frame until the link closes ([`read_worker`]). A worker
    /// that answered anything else is left to the session (`not_started` ends and reaps it).
    fn start_reader(
        &self,
        worker: &Arc<Worker>,
        mut reader: BufReader<UnixStream>,
    ) -> Receiver<FirstFrame> {
        let services = Services {
            endpoints: Arc::clone(&self.endpoints),
            sub_endpoint: self.config.sub_endpoint.clone(),
            batch: BatchPolicy {
                concurrency: self.config.batch_concurrency,
            },
            cancel: self.cancel.clone(),
            text_chars: self.config.sub_call_text_chars,
            session: self.id,
            children: Arc::clone(&self.children),
            child_threads: Threads::new("rlm-children"),
        };
        let services = Arc::new(services);
        let worker = Arc::clone(worker);
        let (answered, answer) = mpsc::channel();
        // Dropped unrun (the runtime is shutting down), the channel closes: the session sees
        // the worker as not started, and ends it. Not awaited: it runs as long as the link.
        drop(runtime::shared().spawn_blocking(move || {
            let first = read_frame::<FromWorker>(&mut reader, &mut Vec::new());
            let ready = matches!(first, Ok(FromWorker::Ready { .. }));
            let _ = answered.send(first);
            if ready {
                read_worker(&worker, reader, &services, false);
            }
        }));
        answer
    }

    /// The running worker; one that ended since is replaced first (restored).
    fn live(&self, stop: Option<&CancellationToken>) -> Result<Arc<Worker>, ReplError> {
        let ended = {
            let mut slot = lock(&self.worker);
            // Another request takes the worker's `Ready`: its outcome is this one's too.
            while matches!(*slot, Slot::Readying) {
                slot = self
                    .settled
                    .wait(slot)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            match &*slot {
                Slot::Live(worker) => match worker.ended(self.memory_bytes) {
                    None => return Ok(Arc::clone(worker)),
                    Some(end) => end,
                },
                Slot::Starting(_) => {
                    let starting = std::mem::replace(&mut *slot, Slot::Readying);
                    drop(slot);
                    let Slot::Starting(handed) = starting else {
                        return Err(ReplError::internal("starting a worker", "no worker"));
                    };
                    // Not under the slot's lock: `interrupt` must not wait for the start.
                    let started = self.ready(*handed);
                    *lock(&self.worker) = match &started {
                        Ok((worker, _, _)) => Slot::Live(Arc::clone(worker)),
                        Err(error) => Slot::Failed(error.to_string()),
                    };
                    self.settled.notify_all();
                    return started.map(|(worker, contexts, _)| {
                        self.check_described(&contexts);
                        worker
                    });
                }
                Slot::Ended(end) => end.clone(),
                Slot::Failed(reason) => {
                    return Err(ReplError::SessionClosed {
                        reason: reason.clone(),
                    });
                }
                Slot::Readying => {
                    return Err(ReplError::internal("starting a worker", "still starting"));
                }
            }
        };
        let restart = self.restart(ended, stop);
        let failed = match &restart.restore {
            Restore::Failed { message } => Some(message.clone()),
            _ => None,
        };
        *lock(&self.pending) = Some(restart);
        if let Some(message) = failed {
            return Err(ReplError::SessionClosed { reason: message });
        }
        match &*lock(&self.worker) {
            Slot::Live(worker) => Ok(Arc::clone(worker)),
            Slot::Starting(_) | Slot::Readying | Slot::Ended(_) | Slot::Failed(_) => {
                Err(ReplError::SessionClosed {
                    reason: "its worker process could not be restored".to_owned(),
                })
            }
        }
    }

    /// Compares what a worker said of its contexts in its `Ready` with what the session
    /// reports (rlm's own description, made before the worker ran: see
    /// [`WorkerSession::start_ready_later`]). They differ only by a bug, which is logged;
    /// the session keeps rlm's, which its first prompt carried.
    fn check_described(&self, said: &[ContextMetadata]) {
        let same = said.len() == self.contexts.len()
            && said.iter().zip(&self.contexts).all(|(said, ours)| {
                // The load's time is the one field that differs by nature.
                let said = ContextMetadata {
                    load_ms: ours.load_ms,
                    ..said.clone()
                };
                said == *ours
            });
        if !same {
            tracing::warn!(
                worker = ?said,
                rlm = ?self.contexts,
                "a worker described its contexts differently from rlm; the session keeps rlm's description"
            );
        }
    }

    /// Runs one block (see [`crate::repl::ReplSession::exec_until_stopped`]).
    pub(crate) fn exec(
        &self,
        code: &str,
        stop: Option<&CancellationToken>,
    ) -> Result<ExecutionResult, ReplError> {
        let _turn = lock(&self.busy);
        self.ran.store(true, Ordering::Relaxed);
        let worker = self.live(stop)?;
        let ledger = self.endpoints.ledger();
        let ledger_start = ledger.next_call_index();
        let started = Instant::now();
        let outcome = self.run_block(&worker, code, Answers::Live(AnswerRecord::default()), stop);
        let earlier = lock(&self.pending).take();
        let mut result = match outcome {
            BlockOutcome::Done {
                result,
                stdout,
                stderr,
                answers,
            } => {
                let mut result = *result;
                fill_output(&mut result, &stdout, &stderr);
                if completed(&result)
                    && let Answers::Live(answers) = answers
                {
                    lock(&self.journal).push(Entry::Block {
                        code: code.to_owned(),
                        answers,
                        skipped: false,
                    });
                }
                self.explain_memory_error(&mut result);
                result.restart = earlier;
                result
            }
            BlockOutcome::Failed(error) => return Err(error),
            BlockOutcome::Ended {
                end,
                stdout,
                stderr,
                seen,
            } => {
                // The block ended with its worker; the restore that follows is not its time.
                let duration = started.elapsed();
                let words = worker.last_words();
                let restart = self.restart(end, stop);
                let variables = match restart.restore {
                    Restore::Failed { .. } | Restore::Deferred => Vec::new(),
                    _ => self.variables_unlocked().unwrap_or_default(),
                };
                ended_result(EndedBlock {
                    restart,
                    stdout,
                    stderr,
                    duration,
                    limit: self.config.cell_timeout,
                    limit_setting: &self.config.cell_timeout_setting,
                    variables,
                    last_words: words,
                    memory_limit: self.memory_bytes,
                    seen,
                })
            }
        };
        result.sub_calls = ledger.records_of(self.id, ledger_start);
        result.redact(&bridge::secret::redactor());
        Ok(result)
    }

    /// One block on `worker`, until it replies, ends, or is stopped (see the module docs).
    fn run_block(
        &self,
        worker: &Arc<Worker>,
        code: &str,
        answers: Answers,
        stop: Option<&CancellationToken>,
    ) -> BlockOutcome {
        let id = worker.next_id();
        let (events, mut inbox) = mpsc::channel();
        lock(&worker.waiters).insert(id, events.clone());
        let calls = self.cancel.child_token();
        *lock(&worker.block) = Some(Block {
            id,
            stdout: new_capture(self.config.max_output_chars),
            stderr: new_capture(self.config.max_output_chars),
            calls: calls.clone(),
            answers,
            seen: SubCallsSeen::default(),
        });
        // Already cancelled when the block starts: not a reason to stop it (as in-process).
        let session = (!self.cancel.is_cancelled()).then(|| self.cancel.clone());
        let watch = StopWatch::arm(stop.cloned().into_iter().chain(session), move || {
            let _ = events.send(Event::Stop);
        });
        let stopped = stop.is_some_and(CancellationToken::is_cancelled);
        self.processes.store(true, Ordering::Relaxed);
        let sent = worker.send(&ToWorker::Request {
            id,
            request: Request::Exec {
                code: code.to_owned(),
                stopped,
            },
        });
        let started = Instant::now();
        let mut kill_at = started.checked_add(self.config.cell_timeout + KILL_GRACE);
        let mut told_to_stop = stopped;
        let mut returned = false;
        let outcome = loop {
            if sent.is_err() {
                break Wait::Ended;
            }
            let wait = kill_at.map_or(Duration::from_secs(86_400), |at| {
                at.saturating_duration_since(Instant::now())
            });
            let (event, back) = receive(inbox, wait);
            inbox = back;
            match event {
                Ok(Event::Reply(Reply::Exec { result, processes })) => {
                    self.processes.store(processes, Ordering::Relaxed);
                    break Wait::Replied(result);
                }
                Ok(Event::Reply(other)) => {
                    worker.lose(format!("answered a block with {other:?}"));
                    break Wait::Ended;
                }
                Ok(Event::Returned) => {
                    returned = true;
                    kill_at = Instant::now().checked_add(WIND_DOWN);
                }
                Ok(Event::Stop) => {
                    if !told_to_stop {
                        told_to_stop = true;
                        let _ = worker.send(&ToWorker::Interrupt { id });
                    }
                    if !returned {
                        let soon = Instant::now() + KILL_GRACE;
                        kill_at = Some(kill_at.map_or(soon, |at| at.min(soon)));
                    }
                }
                Ok(Event::Dead) | Err(RecvTimeoutError::Disconnected) => break Wait::Ended,
                Err(RecvTimeoutError::Timeout) => {
                    let timed_out = started.elapsed() >= self.config.cell_timeout;
                    worker.stop_by_killing(started.elapsed(), timed_out);
                    break Wait::Ended;
                }
            }
        };
        drop(watch);
        calls.cancel();
        lock(&worker.waiters).remove(&id);
        let Some(block) = lock(&worker.block).take() else {
            return BlockOutcome::Failed(ReplError::internal(
                "ending a block",
                "the block's state is gone",
            ));
        };
        match outcome {
            Wait::Replied(Ok(mut result)) => {
                result.sub_call_texts = block.seen.texts;
                BlockOutcome::Done {
                    result,
                    stdout: block.stdout,
                    stderr: block.stderr,
                    answers: block.answers,
                }
            }
            Wait::Replied(Err(error)) => BlockOutcome::Failed(error),
            Wait::Ended => {
                if !worker.wait_end(REAP_WAIT + EXIT_WAIT) {
                    worker.lose("stopped answering without ending".to_owned());
                    worker.wait_end(REAP_WAIT);
                }
                let end = worker.ended(self.memory_bytes).unwrap_or(WorkerEnd::Lost {
                    detail: "stopped answering".to_owned(),
                });
                BlockOutcome::Ended {
                    end,
                    stdout: block.stdout,
                    stderr: block.stderr,
                    seen: block.seen,
                }
            }
        }
    }

    /// Replaces an ended worker: a fresh one with the contexts, and the journal replayed
    /// unless the session asks for a fresh start (or the run is stopping: then later).
    fn restart(&self, end: WorkerEnd, stop: Option<&CancellationToken>) -> WorkerRestart {
        let started = Instant::now();
        let stopping =
            stop.is_some_and(CancellationToken::is_cancelled) || self.cancel.is_cancelled();
        let restore = if stopping {
            *lock(&self.worker) = Slot::Ended(end.clone());
            Restore::Deferred
        } else {
            match self.restore(stop) {
                Ok(restore) => restore,
                Err(error) => {
                    *lock(&self.worker) = Slot::Ended(end.clone());
                    Restore::Failed {
                        message: error.to_string(),
                    }
                }
            }
        };
        let restart = WorkerRestart {
            cause: end,
            restore,
            restore_ms: started.elapsed().as_secs_f64() * 1000.0,
        };
        tracing::info!(?restart, "the REPL's worker process was replaced");
        // A session that crashed once may crash again: its next restore starts warm.
        template::prepare_next(&self.program);
        restart
    }

    fn restore(&self, stop: Option<&CancellationToken>) -> Result<Restore, ReplError> {
        self.empty_scratch();
        for _ in 0..RESTORE_ATTEMPTS {
            let (worker, _, _) = self.spawn(None)?;
            *lock(&self.worker) = Slot::Live(Arc::clone(&worker));
            if self.config.on_crash == OnCrash::Fresh {
                return Ok(Restore::Fresh);
            }
            match self.replay(&worker, stop) {
                Replayed::Done(restore) => return Ok(restore),
                Replayed::Stopped => return Ok(Restore::Deferred),
                Replayed::Crashed(index) => {
                    lock(&self.journal).skip(index);
                    self.empty_scratch();
                }
            }
        }
        Err(ReplError::Worker {
            problem: format!(
                "ended again each of the {RESTORE_ATTEMPTS} times the session's blocks were replayed"
            ),
        })
    }

    /// Runs the journal again on a fresh `worker`.
    fn replay(&self, worker: &Arc<Worker>, stop: Option<&CancellationToken>) -> Replayed {
        let entries = lock(&self.journal).snapshot();
        let (mut blocks, mut raised, mut unanswered) = (0, 0, 0);
        for (index, entry) in entries.into_iter().enumerate() {
            match entry {
                Entry::Block { skipped: true, .. } => {}
                Entry::Block { code, answers, .. } => {
                    let outcome = self.run_block(
                        worker,
                        &code,
                        Answers::Replay {
                            answers,
                            unanswered: 0,
                        },
                        stop,
                    );
                    match outcome {
                        BlockOutcome::Done {
                            result, answers, ..
                        } => {
                            blocks += 1;
                            raised += usize::from(result.error.is_some());
                            if let Answers::Replay { unanswered: n, .. } = answers {
                                unanswered += n;
                            }
                        }
                        BlockOutcome::Failed(_) => blocks += 1,
                        BlockOutcome::Ended { .. } => {
                            if stop.is_some_and(CancellationToken::is_cancelled) {
                                return Replayed::Stopped;
                            }
                            return Replayed::Crashed(index);
                        }
                    }
                }
                Entry::ResetAnswer => {
                    let _ = worker.request(Request::ResetAnswer, QUERY_WAIT);
                }
                Entry::Module { name, source } => {
                    let _ = worker.request(Request::EnsureModule { name, source }, QUERY_WAIT);
                }
            }
        }
        Replayed::Done(Restore::Replayed {
            blocks,
            raised,
            skipped: lock(&self.journal).skipped(),
            unanswered,
        })
    }

    /// Files an ended worker left in the scratch directory go: the replay writes them again.
    fn empty_scratch(&self) {
        let Ok(entries) = std::fs::read_dir(&self.scratch_path) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if let Err(e) = removed {
                tracing::warn!(
                    "could not empty the scratch directory ({}): {e}",
                    path.display()
                );
            }
        }
    }

    /// A request that is not a block: the worker is restored first if it ended, and once
    /// more if it ends while answering.
    fn query(&self, request: impl Fn() -> Request, wait: Duration) -> Result<Reply, ReplError> {
        let _turn = lock(&self.busy);
        self.query_unlocked(&request, wait)
    }

    fn query_unlocked(
        &self,
        request: &dyn Fn() -> Request,
        wait: Duration,
    ) -> Result<Reply, ReplError> {
        for _ in 0..2 {
            let worker = self.live(None)?;
            match worker.request(request(), wait) {
                Ok(reply) => return Ok(reply),
                Err(Unanswered::Dead) => {}
                Err(Unanswered::Timeout) => {
                    worker.stop_by_killing(wait, true);
                    return Err(ReplError::Unresponsive { waited: wait });
                }
            }
        }
        Err(ReplError::SessionClosed {
            reason: "its worker process ended twice while answering".to_owned(),
        })
    }

    pub(crate) fn variables(&self) -> Result<Vec<VariableInfo>, ReplError> {
        let _turn = lock(&self.busy);
        self.variables_unlocked()
    }

    fn variables_unlocked(&self) -> Result<Vec<VariableInfo>, ReplError> {
        let mut variables = match self.query_unlocked(&|| Request::Variables, QUERY_WAIT)? {
            Reply::Variables(variables) => variables?,
            other => return Err(unexpected(&other)),
        };
        let redactor = bridge::secret::redactor();
        for variable in &mut variables {
            variable.redact(&redactor);
        }
        Ok(variables)
    }

    pub(crate) fn variable_as_string(&self, name: &str) -> Result<Option<String>, ReplError> {
        let name = name.to_owned();
        let text = self.text(move || Request::VariableString { name: name.clone() })?;
        Ok(text.map(|mut v| {
            bridge::secret::redactor().redact_in_place(&mut v);
            v
        }))
    }

    pub(crate) fn reset_answer(&self) -> Result<(), ReplError> {
        if !self.ran.load(Ordering::Relaxed) {
            // No code ran: the answer is as the session started, empty (a child's run).
            return Ok(());
        }
        self.text(|| Request::ResetAnswer)?;
        lock(&self.journal).push(Entry::ResetAnswer);
        Ok(())
    }

    pub(crate) fn answer_content(&self) -> Result<Option<String>, ReplError> {
        if !self.ran.load(Ordering::Relaxed) {
            // No code ran: the answer is as the session started, empty.
            return Ok(None);
        }
        let content = self.text(|| Request::AnswerContent)?;
        Ok(content.map(|mut c| {
            bridge::secret::redactor().redact_in_place(&mut c);
            c
        }))
    }

    pub(crate) fn ensure_module(&self, name: &str, source: &str) -> Result<(), ReplError> {
        let (n, s) = (name.to_owned(), source.to_owned());
        self.text(move || Request::EnsureModule {
            name: n.clone(),
            source: s.clone(),
        })?;
        lock(&self.journal).push(Entry::Module {
            name: name.to_owned(),
            source: source.to_owned(),
        });
        Ok(())
    }

    pub(crate) fn pop_result(&self, module: &str, token: u64) -> Result<Option<String>, ReplError> {
        let module = module.to_owned();
        self.text(move || Request::PopResult {
            module: module.clone(),
            token,
        })
    }

    fn text(&self, request: impl Fn() -> Request) -> Result<Option<String>, ReplError> {
        match self.query(request, QUERY_WAIT)? {
            Reply::Text(text) => text,
            other => Err(unexpected(&other)),
        }
    }

    /// Stops the block running now, if any; returns whether one was.
    pub(crate) fn interrupt(&self) -> bool {
        let Slot::Live(worker) = &*lock(&self.worker) else {
            return false;
        };
        let Some(id) = lock(&worker.block).as_ref().map(|b| b.id) else {
            return false;
        };
        if let Some(waiter) = lock(&worker.waiters).get(&id) {
            let _ = waiter.send(Event::Stop);
        }
        true
    }

    /// Ends the processes the session's blocks started (without waiting for a running block).
    pub(crate) fn end_processes(&self) -> Result<(), ReplError> {
        if !self.processes.load(Ordering::Relaxed) {
            // No code ran, or the worker said after the last block that none was left.
            return Ok(());
        }
        let worker = match &*lock(&self.worker) {
            Slot::Live(worker) => Arc::clone(worker),
            // Not started: no code ran in it.
            Slot::Starting(_) | Slot::Readying | Slot::Ended(_) | Slot::Failed(_) => return Ok(()),
        };
        match worker.request(Request::EndProcesses, QUERY_WAIT) {
            Ok(Reply::Text(done)) => {
                done?;
                self.processes.store(false, Ordering::Relaxed);
                Ok(())
            }
            Ok(other) => Err(unexpected(&other)),
            // A worker gone has no processes left: they die with it.
            Err(_) => Ok(()),
        }
    }

    /// A `MemoryError` in a worker is the memory limit: say so.
    fn explain_memory_error(&self, result: &mut ExecutionResult) {
        if let Some(error) = &mut result.error
            && error.type_name == "MemoryError"
        {
            let note = format!(
                " (the worker's memory limit is {}; raise it with `--memory-limit`)",
                gigabytes(self.memory_bytes)
            );
            error.message.push_str(&note);
        }
    }
}

impl Drop for WorkerSession {
    fn drop(&mut self) {
        self.cancel.cancel();
        let slot = std::mem::replace(
            &mut *lock(&self.worker),
            Slot::Ended(WorkerEnd::Lost {
                detail: "was closed".to_owned(),
            }),
        );
        let end: Box<dyn FnOnce() + Send> = match slot {
            // Told to shut down by `close` (off this thread while a run keeps workers ready).
            Slot::Live(worker) => Box::new(move || {
                let _ = worker.send(&ToWorker::Shutdown);
                if !worker.wait_end(EXIT_WAIT) {
                    worker.kill();
                    worker.wait_end(EXIT_WAIT);
                }
            }),
            // Handed its session and never needed: once it said `Ready`, its link's reader reads
            // on and reaps it as a running one's does; one that did not (it failed, or is
            // killed for not answering within `REAP_WAIT`) is reaped here.
            Slot::Starting(handed) => Box::new(move || {
                let Handed { worker, answer, .. } = *handed;
                let _ = worker.send(&ToWorker::Shutdown);
                let mut first = answer.recv_timeout(REAP_WAIT);
                if first.is_err() {
                    worker.kill();
                    first = answer.recv_timeout(REAP_WAIT);
                }
                if let Ok(Ok(FromWorker::Ready { .. })) = first {
                    if !worker.wait_end(EXIT_WAIT) {
                        worker.kill();
                        worker.wait_end(EXIT_WAIT);
                    }
                } else {
                    worker.kill();
                    worker.reap();
                }
            }),
            Slot::Readying | Slot::Ended(_) | Slot::Failed(_) => Box::new(|| {}),
        };
        close(end, self.scratch.take(), self.program.clone());
    }
}

/// Ends a closed session's worker (told to shut down), then removes its scratch directory and
/// has the next session of this process (an eval's next task, a notebook's next completion)
/// start warm: on this thread, or, while a run keeps workers ready (`pool.rs`: one with
/// `rlm_query` children, whose every child closes a session), on the closer thread, so that
/// neither the child nor its parent waits for the worker's exit, and once the run waits for a
/// model (`quiet.rs`), so that the exit does not take the cores from the next child's hops
/// (on this thread again while that thread is behind: `closer.rs`). Either way the worker is
/// told to shut down, given [`EXIT_WAIT`] to exit, then killed, and reaped by its link's
/// reader (`end` does that; a worker never heard from since its start frame is reaped by `end`
/// itself).
fn close(end: Box<dyn FnOnce() + Send>, scratch: Option<Scratch>, program: WorkerProgram) {
    let finish = move || {
        end();
        drop(scratch);
        template::prepare_next(&program);
    };
    if !pool::in_use() {
        finish();
    } else if let Err(job) = closer::hand_over(Box::new(finish)) {
        job();
    }
}

fn spawn_error(e: &io::Error) -> ReplError {
    ReplError::Worker {
        problem: format!("could not be started: {e}"),
    }
}

fn unexpected(reply: &Reply) -> ReplError {
    ReplError::Worker {
        problem: format!("answered with {reply:?}, which does not fit the request"),
    }
}

fn new_capture(max: usize) -> OutputCapture {
    OutputCapture::new(max, bridge::secret::redactor())
}

/// The block ran to its end (with or without an exception), so replaying it makes sense.
fn completed(result: &ExecutionResult) -> bool {
    !result.timed_out
        && !result
            .error
            .as_ref()
            .is_some_and(|e| e.type_name == "CellTimeout" || e.type_name == "CellCancelled")
}

fn fill_output(result: &mut ExecutionResult, stdout: &OutputCapture, stderr: &OutputCapture) {
    let out = stdout.take();
    let err = stderr.take();
    result.stdout = out.text;
    result.stderr = err.text;
    result.stdout_omitted_chars = out.omitted_chars;
    result.stderr_omitted_chars = err.omitted_chars;
}

fn gigabytes(bytes: u64) -> String {
    if bytes < 100_000_000 {
        return format!("{:.0} MB", bytes as f64 / 1e6);
    }
    format!("{:.1} GB", bytes as f64 / 1e9)
}

/// What one block on the worker came to.
enum BlockOutcome {
    Done {
        result: Box<ExecutionResult>,
        stdout: OutputCapture,
        stderr: OutputCapture,
        answers: Answers,
    },
    Failed(ReplError),
    Ended {
        end: WorkerEnd,
        stdout: OutputCapture,
        stderr: OutputCapture,
        /// What the parent saw of the block's sub-calls ([`Block::seen`]).
        seen: SubCallsSeen,
    },
}

enum Wait {
    Replied(Result<Box<ExecutionResult>, ReplError>),
    Ended,
}

/// Why a worker did not get its session started.
enum Failure {
    /// A spare (or a worker of the pool) that had died meanwhile: try a new worker.
    Spare,
    Error(ReplError),
}

impl Failure {
    fn into_error(self) -> ReplError {
        match self {
            Self::Error(error) => error,
            Self::Spare => ReplError::Worker {
                problem: "ended before its session started".to_owned(),
            },
        }
    }
}

enum Replayed {
    Done(Restore),
    Stopped,
    /// Journal entry `index` ended the worker.
    Crashed(usize),
}

/// A block that ended its worker, for [`ended_result`].
struct EndedBlock<'a> {
    restart: WorkerRestart,
    stdout: OutputCapture,
    stderr: OutputCapture,
    duration: Duration,
    limit: Duration,
    /// What sets `limit`, as the front end's users write it (`` `--cell-timeout` ``).
    limit_setting: &'a str,
    variables: Vec<VariableInfo>,
    last_words: String,
    memory_limit: u64,
    /// Its sub-calls as its parent saw them: its counts and texts.
    seen: SubCallsSeen,
}

/// The result of a block whose worker ended: the output it wrote, an error that says what
/// happened (in its stderr too, like a traceback), and what the fresh worker holds.
fn ended_result(ended: EndedBlock<'_>) -> ExecutionResult {
    let (type_name, message) = describe_end(
        &ended.restart.cause,
        (ended.limit, ended.limit_setting),
        ended.memory_limit,
    );
    let mut traceback = format!("{type_name}: {message}\n");
    if !ended.last_words.trim().is_empty() {
        traceback.push_str(&format!(
            "The worker's last words on its stderr:\n{}\n",
            ended.last_words.trim_end()
        ));
    }
    traceback.push_str(&describe_restore(&ended.restart));
    traceback.push('\n');
    ended.stderr.push(&traceback);
    let timed_out = matches!(
        ended.restart.cause,
        WorkerEnd::Stopped {
            timed_out: true,
            ..
        }
    );
    let mut result = ExecutionResult {
        stdout: String::new(),
        stderr: String::new(),
        stdout_omitted_chars: 0,
        stderr_omitted_chars: 0,
        error: Some(ExecError {
            type_name: type_name.to_owned(),
            message,
            traceback,
            line: None,
        }),
        timed_out,
        duration: ended.duration,
        sub_calls: Vec::new(),
        sub_call_texts: ended.seen.texts,
        llm_query_calls: ended.seen.llm_query_calls,
        llm_query_batched_calls: ended.seen.llm_query_batched_calls,
        sub_call_errors: ended.seen.sub_call_errors,
        final_answers: Vec::new(),
        variables: ended.variables,
        new_variables: Vec::new(),
        restart: Some(ended.restart),
    };
    fill_output(&mut result, &ended.stdout, &ended.stderr);
    result
}

/// The error type and sentence for a worker's end; `limit` is the cell's time limit and what
/// sets it.
fn describe_end(
    end: &WorkerEnd,
    (limit, setting): (Duration, &str),
    memory_limit: u64,
) -> (&'static str, String) {
    match end {
        WorkerEnd::Crashed { name, .. } => (
            "WorkerCrashed",
            format!("The block crashed the Python worker process: {name}"),
        ),
        WorkerEnd::OutOfMemory {
            peak_bytes,
            signal,
            oom_kills: Some(kills),
            ..
        } => (
            "WorkerOutOfMemory",
            format!(
                "The worker process was killed ({}) holding {}, while the system's out-of-memory killer was ending processes (the kernel counted {kills} such kill(s) {} while the worker ran), so most likely for its memory; use less memory per block",
                signal_name(*signal),
                gigabytes(*peak_bytes),
                oom_scope()
            ),
        ),
        WorkerEnd::OutOfMemory {
            limit_bytes,
            signal,
            ..
        } => (
            "WorkerOutOfMemory",
            format!(
                "The block ran out of memory at {} (the worker's memory limit; raise it with `--memory-limit`) and the worker process ended ({})",
                gigabytes(limit_bytes.unwrap_or(memory_limit)),
                signal_name(*signal)
            ),
        ),
        WorkerEnd::Killed { signal, .. } if *signal != libc::SIGKILL => (
            "WorkerKilled",
            format!(
                "The Python worker process was stopped by {} from outside rlm, not by the session: a `kill` from a user, another program (a service manager, a job scheduler's time limit) or the block's own code. Do not send signals to the worker from a block; if nobody meant to stop it, find what sends {} to processes on this machine",
                signal_name(*signal),
                signal_name(*signal)
            ),
        ),
        WorkerEnd::Killed {
            signal,
            peak_bytes,
            oom_kills,
        } => {
            let memory = match oom_kills {
                Some(_) => format!(
                    "not for memory: the kernel counted no out-of-memory kill {} while it ran",
                    oom_scope()
                ),
                None => format!(
                    "whether for memory cannot be told here (it held {}; this kernel does not count out-of-memory kills)",
                    gigabytes(*peak_bytes)
                ),
            };
            (
                "WorkerKilled",
                format!(
                    "The Python worker process was killed ({}), not by the session and {memory}. A `kill -9` ends a worker this way (from a user, another program, or the block's own code)",
                    signal_name(*signal)
                ),
            )
        }
        WorkerEnd::Exited { code } => (
            "WorkerExited",
            format!(
                "The block ended the Python worker process with exit status {code} (a C-level `exit()` or similar)"
            ),
        ),
        WorkerEnd::Stopped {
            after_ms,
            timed_out: true,
        } => (
            "CellTimeout",
            format!(
                "The block exceeded its time limit of {:.3}s and did not respond to the interrupt (it was stuck in native code), so it was stopped after {:.1}s by ending its worker process. Do less per block, or raise {setting}",
                limit.as_secs_f64(),
                after_ms / 1000.0
            ),
        ),
        WorkerEnd::Stopped { after_ms, .. } => (
            "CellCancelled",
            format!(
                "The block was stopped because the session's run was cancelled (a run time limit, a budget stop or Ctrl-C) and did not respond, so its worker process was ended after {:.1}s",
                after_ms / 1000.0
            ),
        ),
        WorkerEnd::Lost { detail } => (
            "WorkerLost",
            format!("The Python worker process {detail} and was ended"),
        ),
    }
}

/// What the session holds now, for the model.
fn describe_restore(restart: &WorkerRestart) -> String {
    match &restart.restore {
        Restore::Replayed {
            blocks,
            skipped,
            unanswered,
            ..
        } => {
            let mut text = format!(
                "A fresh worker took over: the contexts were loaded again and the session's variables restored by running its {blocks} earlier block(s) again in {:.2}s, every sub-call answered from this run's record (no model was called again). Variables this block set are gone.",
                restart.restore_ms / 1000.0
            );
            if *skipped > 0 {
                text.push_str(&format!(
                    " {skipped} earlier block(s) were left out because running them again ended the worker too; what they set is gone."
                ));
            }
            if *unanswered > 0 {
                text.push_str(&format!(
                    " {unanswered} sub-call(s) of the replay asked something not asked the first time and got an error instead of an answer; variables built from them may differ."
                ));
            }
            text
        }
        Restore::Fresh => "A fresh worker took over with the contexts loaded again; the session's earlier variables are gone (the session starts fresh after a crash).".to_owned(),
        Restore::Deferred => "The session will be restored in a fresh worker when it is used again.".to_owned(),
        Restore::Failed { message } => format!(
            "A fresh worker could not be started ({message}); the session cannot run more blocks."
        ),
    }
}

fn end_summary(end: &WorkerEnd) -> String {
    match end {
        WorkerEnd::Crashed { name, .. } => format!("crashed: {name}"),
        WorkerEnd::OutOfMemory { peak_bytes, .. } => {
            format!("ran out of memory at {}", gigabytes(*peak_bytes))
        }
        WorkerEnd::Killed { signal, .. } if *signal != libc::SIGKILL => {
            format!("stopped by {} from outside rlm", signal_name(*signal))
        }
        WorkerEnd::Killed { signal, .. } => format!("killed ({})", signal_name(*signal)),
        WorkerEnd::Exited { code } => format!("exit status {code}"),
        WorkerEnd::Stopped { after_ms, .. } => format!("stopped after {:.1}s", after_ms / 1000.0),
        WorkerEnd::Lost { detail } => detail.clone(),
    }
}

fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGSEGV => "SIGSEGV (segmentation fault)",
        libc::SIGBUS => "SIGBUS (bus error)",
        libc::SIGFPE => "SIGFPE (arithmetic fault)",
        libc::SIGILL => "SIGILL (illegal instruction)",
        libc::SIGABRT => "SIGABRT (abort)",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGSYS => "SIGSYS (a system call the sandbox forbids)",
        libc::SIGXCPU => "SIGXCPU (the CPU time limit)",
        libc::SIGXFSZ => "SIGXFSZ (the file size limit)",
        libc::SIGPIPE => "SIGPIPE (a broken pipe)",
        libc::SIGTRAP => "SIGTRAP (a trap)",
        other => return format!("signal {other}"),
    };
    name.to_owned()
}

/// Signals that ask a process to end, sent by a `kill` and never by a fault or a limit: a
/// worker they end was stopped from outside the session ([`WorkerEnd::Killed`]), not crashed.
/// The session itself ends a worker only with `SIGKILL`, and records why.
const ASKED_TO_END: [i32; 6] = [
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Where the out-of-memory kills a worker's end is told with were counted.
fn oom_scope() -> &'static str {
    oom_counter().map_or("on this machine", OomCounter::scope)
}

/// Why a worker ended: what the session ended it for (`ended_by`), else its exit status and
/// the evidence of memory (see [`WorkerEnd::OutOfMemory`]).
fn classify(exit: &Exit, ended_by: Option<&WorkerEnd>, memory_limit: u64) -> WorkerEnd {
    if let Some(end) = ended_by {
        return end.clone();
    }
    let Some(status) = exit.status else {
        return WorkerEnd::Lost {
            detail: "could not be waited for".to_owned(),
        };
    };
    if exit.killed {
        return WorkerEnd::Lost {
            detail: format!(
                "closed its link but did not exit within {:.0}s, so it was killed",
                REAP_WAIT.as_secs_f64()
            ),
        };
    }
    if libc::WIFEXITED(status) {
        return WorkerEnd::Exited {
            code: libc::WEXITSTATUS(status),
        };
    }
    let signal = libc::WTERMSIG(status);
    if signal == libc::SIGKILL {
        // The out-of-memory killer's `SIGKILL` is a `kill -9`'s: only the kernel's count tells.
        return match exit.oom_kills {
            Some(kills) if kills > 0 => WorkerEnd::OutOfMemory {
                limit_bytes: Some(memory_limit),
                peak_bytes: exit.peak_bytes,
                signal,
                oom_kills: Some(kills),
            },
            oom_kills => WorkerEnd::Killed {
                signal,
                peak_bytes: exit.peak_bytes,
                oom_kills,
            },
        };
    }
    if ASKED_TO_END.contains(&signal) {
        return WorkerEnd::Killed {
            signal,
            peak_bytes: exit.peak_bytes,
            oom_kills: None,
        };
    }
    let near_limit = exit.peak_bytes >= memory_limit / 10 * 8;
    if near_limit && matches!(signal, libc::SIGSEGV | libc::SIGABRT | libc::SIGBUS) {
        return WorkerEnd::OutOfMemory {
            limit_bytes: Some(memory_limit),
            peak_bytes: exit.peak_bytes,
            signal,
            oom_kills: None,
        };
    }
    WorkerEnd::Crashed {
        signal,
        name: signal_name(signal),
    }
}

/// What a block's sub-calls are answered from.
enum Answers {
    /// The endpoints; the answers are recorded.
    Live(AnswerRecord<SubAnswer>),
    /// A replay: the record of the block's first run.
    Replay {
        answers: AnswerRecord<SubAnswer>,
        /// Calls with no recorded answer.
        unanswered: usize,
    },
}

/// The block a worker runs now.
struct Block {
    id: u64,
    stdout: OutputCapture,
    stderr: OutputCapture,
    /// Cancels the block's sub-calls in flight when it ends.
    calls: CancellationToken,
    answers: Answers,
    /// What the parent saw of its sub-calls.
    seen: SubCallsSeen,
}

/// What the parent saw of a block's sub-calls (see the module docs): the texts are the
/// block's, the counts only if its worker ends with it (the worker's count stands otherwise).
#[derive(Debug, Default)]
struct SubCallsSeen {
    /// `llm_query` calls, counted as their requests arrive (as the worker counts them: before
    /// anything can fail, a model name with no endpoint included).
    llm_query_calls: u32,
    /// `llm_query_batched` calls, counted likewise.
    llm_query_batched_calls: u32,
    /// Answers sent to its code as errors ([`Worker::answer`]).
    sub_call_errors: u32,
    /// What its sub-calls asked and got ([`Worker::record`]), kept here where the secrets are
    /// known.
    texts: Vec<SubCallText>,
}

impl SubCallsSeen {
    /// Keeps what a sub-call asked (`prompt`, already kept; `None` when the session keeps no
    /// texts) and got, the reply kept to `chars` characters.
    fn keep_text(&mut self, prompt: Option<String>, answer: &SubAnswer, chars: usize) {
        if let Some(prompt) = prompt {
            let reply = match answer {
                Ok(text) => text.clone(),
                Err(failure) => format!("Error: {}", failure.message),
            };
            self.texts.push(SubCallText {
                prompt,
                reply: kept_text(&reply, chars),
            });
        }
    }
}

/// What the code is sent for one of its sub-calls ([`Worker::answer`]).
enum Answered {
    /// `llm_query`'s.
    One(SubAnswer),
    /// `llm_query_batched`'s: the answers in input order, or one failure for all its
    /// `prompts` (an endpoint that does not exist).
    Many {
        answers: Result<Vec<SubAnswer>, SubFailure>,
        prompts: usize,
    },
    /// `rlm_query`'s and `rlm_query_batched`'s: the children's answers in input order, or
    /// `None` when nobody runs children (the code then asks as `llm_query`).
    Children(Option<Vec<SubAnswer>>),
}

impl Answered {
    /// A batch's answers, one for each prompt.
    fn all(answers: Vec<SubAnswer>) -> Self {
        Self::Many {
            prompts: answers.len(),
            answers: Ok(answers),
        }
    }
}

/// What a waiting request is told.
#[derive(Debug)]
enum Event {
    Reply(Reply),
    /// The interrupted block's code has returned.
    Returned,
    /// Stop the block.
    Stop,
    /// The worker ended.
    Dead,
}

/// Why a request got no answer.
enum Unanswered {
    Dead,
    Timeout,
}

/// One worker process.
struct Worker {
    pid: i32,
    writer: Mutex<UnixStream>,
    waiters: Mutex<HashMap<u64, Sender<Event>>>,
    next_id: AtomicU64,
    block: Mutex<Option<Block>>,
    /// Set by the reader once the worker is reaped.
    end: Mutex<Option<Exit>>,
    ended: Condvar,
    /// The session ended it, and why: its end, whatever its exit status says (`SIGKILL`).
    ended_by: Mutex<Option<WorkerEnd>>,
    /// The count of out-of-memory kills its own would be among, when it was started.
    oom_kills: Option<u64>,
    /// The tail of its own stdout/stderr.
    last_words: Arc<Mutex<Vec<u8>>>,
    /// Characters kept of each sub-call's prompt and reply (`0`: none).
    text_chars: usize,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl Worker {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn send(&self, message: &ToWorker) -> io::Result<()> {
        let stream = lock(&self.writer);
        write_frame(&mut NoSigPipe(&stream), message)
    }

    fn request(&self, request: Request, wait: Duration) -> Result<Reply, Unanswered> {
        let id = self.next_id();
        let (events, mut inbox) = mpsc::channel();
        lock(&self.waiters).insert(id, events);
        if self.send(&ToWorker::Request { id, request }).is_err() {
            lock(&self.waiters).remove(&id);
            return Err(Unanswered::Dead);
        }
        let deadline = Instant::now() + wait;
        let answer = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (event, back) = receive(inbox, left);
            inbox = back;
            match event {
                Ok(Event::Reply(reply)) => break Ok(reply),
                Ok(Event::Returned | Event::Stop) => {}
                Ok(Event::Dead) | Err(RecvTimeoutError::Disconnected) => {
                    break Err(Unanswered::Dead);
                }
                Err(RecvTimeoutError::Timeout) => break Err(Unanswered::Timeout),
            }
        };
        lock(&self.waiters).remove(&id);
        answer
    }

    /// Ends the worker (and the processes of its group) now.
    fn kill(&self) {
        // SAFETY: kill sends a signal; the pid is our unreaped child (or its group), so it
        // cannot have been reused.
        unsafe {
            libc::kill(-self.pid, libc::SIGKILL);
            libc::kill(self.pid, libc::SIGKILL);
        }
    }

    /// Ends a worker whose block did not stop: the block ends as stopped after `after`.
    fn stop_by_killing(&self, after: Duration, timed_out: bool) {
        self.kill_as(WorkerEnd::Stopped {
            after_ms: after.as_secs_f64() * 1000.0,
            timed_out,
        });
    }

    /// Ends a worker that broke the protocol.
    fn lose(&self, detail: String) {
        tracing::warn!("a REPL worker {detail}; it is ended");
        self.kill_as(WorkerEnd::Lost { detail });
    }

    /// Ends the worker, whose end is then `end` (the first reason the session had).
    fn kill_as(&self, end: WorkerEnd) {
        lock(&self.ended_by).get_or_insert(end);
        self.kill();
    }

    /// Waits for the worker to be reaped (by its reader); whether it was within `wait`.
    fn wait_end(&self, wait: Duration) -> bool {
        let end = lock(&self.end);
        let (end, _) = self
            .ended
            .wait_timeout_while(end, wait, |end| end.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        end.is_some()
    }

    /// Why the worker ended, once it has.
    fn ended(&self, memory_limit: u64) -> Option<WorkerEnd> {
        let exit = (*lock(&self.end))?;
        let end = classify(&exit, lock(&self.ended_by).as_ref(), memory_limit);
        // An allocator that aborts says so on stderr (Rust: "memory allocation of N bytes
        // failed"; C libraries: "Cannot allocate memory", "std::bad_alloc").
        let words = self.last_words();
        let out_of_memory = [
            "memory allocation of",
            "Cannot allocate memory",
            "bad_alloc",
        ]
        .iter()
        .any(|w| words.contains(w));
        Some(match end {
            WorkerEnd::Crashed { signal, .. } if out_of_memory => WorkerEnd::OutOfMemory {
                limit_bytes: Some(memory_limit),
                peak_bytes: exit.peak_bytes.max(memory_limit),
                signal,
                oom_kills: None,
            },
            end => end,
        })
    }

    /// Waits for the worker to exit (killing it after [`REAP_WAIT`]) and records how it did.
    fn reap(&self) -> Exit {
        let mut exit = reap(self.pid);
        if exit.signal() == Some(libc::SIGKILL) {
            exit.oom_kills = self
                .oom_kills
                .zip(oom_kills())
                .map(|(then, now)| now.saturating_sub(then));
        }
        *lock(&self.end) = Some(exit);
        self.ended.notify_all();
        exit
    }

    fn last_words(&self) -> String {
        String::from_utf8_lossy(&lock(&self.last_words)).into_owned()
    }

    /// Whether the worker has been reaped: nothing sent to it since reaches its code.
    fn reaped(&self) -> bool {
        lock(&self.end).is_some()
    }

    /// Counts a sub-call of the running block's code as its request arrives: `calls` picks
    /// which count ([`SubCallsSeen::llm_query_calls`] or `llm_query_batched_calls`).
    fn asked(&self, calls: fn(&mut SubCallsSeen) -> &mut u32) {
        if let Some(running) = lock(&self.block).as_mut() {
            let count = calls(&mut running.seen);
            *count = count.saturating_add(1);
        }
    }

    /// Sends the code the answer(s) to its sub-call `call`, first counting those that are
    /// errors in the block they are for, if it still runs on a live worker: `block` (`None`:
    /// the one running now). Every answer to `llm_query`, `llm_query_batched` and the
    /// `rlm_query` children is sent here.
    fn answer(&self, block: Option<u64>, call: u64, answers: Answered) {
        let failed = match &answers {
            Answered::One(answer) => usize::from(answer.is_err()),
            Answered::Many { answers, prompts } => failed_answers(answers.as_deref(), *prompts),
            Answered::Children(answers) => answers
                .as_deref()
                .map_or(0, |answers| failed_answers(Ok(answers), answers.len())),
        };
        if !self.reaped()
            && let Some(running) = lock(&self.block).as_mut()
            && block.is_none_or(|id| id == running.id)
        {
            let failed = u32::try_from(failed).unwrap_or(u32::MAX);
            running.seen.sub_call_errors = running.seen.sub_call_errors.saturating_add(failed);
        }
        let _ = self.send(&match answers {
            Answered::One(answer) => ToWorker::Answer { call, answer },
            Answered::Many { answers, .. } => ToWorker::Answers { call, answers },
            Answered::Children(answers) => ToWorker::ChildAnswers { call, answers },
        });
    }

    /// Keeps `answer` in the record of block `id`, and what was asked and answered (`prompt`:
    /// already kept, see [`Services::kept`]) in its texts, if that block is still running live
    /// on a live worker.
    fn record(&self, id: u64, key: RecordKey, prompt: Option<String>, answer: &SubAnswer) {
        if self.reaped() {
            return;
        }
        if let Some(Block {
            id: running,
            answers: Answers::Live(record),
            seen,
            ..
        }) = lock(&self.block).as_mut()
            && *running == id
        {
            record.push(key, answer.clone());
            seen.keep_text(prompt, answer, self.text_chars);
        }
    }

    /// Keeps in the texts of the block running live now what `prompts` (already kept) asked
    /// and that each got `failure`: calls to a model name with no endpoint, which no record
    /// holds, so the texts say what the code got for every call, as in-process.
    fn record_unsent(&self, prompts: Vec<Option<String>>, failure: &SubFailure) {
        if self.reaped() {
            return;
        }
        if let Some(Block {
            answers: Answers::Live(_),
            seen,
            ..
        }) = lock(&self.block).as_mut()
        {
            let answer = Err(failure.clone());
            for prompt in prompts {
                seen.keep_text(prompt, &answer, self.text_chars);
            }
        }
    }
}

/// Waits up to `wait` for an event with the GIL released (if this thread holds it); the
/// receiver goes into the wait and comes back.
fn receive(
    inbox: Receiver<Event>,
    wait: Duration,
) -> (Result<Event, RecvTimeoutError>, Receiver<Event>) {
    without_gil(move || {
        let event = inbox.recv_timeout(wait);
        (event, inbox)
    })
}

/// What the reader needs to answer sub-calls.
struct Services {
    endpoints: Arc<Endpoints>,
    sub_endpoint: String,
    batch: BatchPolicy,
    cancel: CancellationToken,
    /// Characters kept of each sub-call's prompt and reply (`0`: none).
    text_chars: usize,
    /// The session's id, in the ledger record of each call.
    session: u64,
    /// Who runs the worker code's `rlm_query` children.
    children: Arc<ChildSlot>,
    /// The threads they run on, and the link's reader while they do (ended with the reader).
    child_threads: Threads,
}

impl Services {
    /// The options of a sub-call of the session's code: through the run's record of sub-call
    /// answers (the cache, the context-window check).
    fn options(&self, cancel: CancellationToken) -> CallOptions {
        CallOptions {
            cancel,
            session: Some(self.session),
            sub_call: true,
            ..CallOptions::default()
        }
    }

    /// A prompt as a block's record keeps it, `None` when the session keeps none.
    fn kept(&self, prompt: &str) -> Option<String> {
        (self.text_chars > 0).then(|| kept_text(prompt, self.text_chars))
    }
}

/// The reader: every frame of the worker, until its link closes (then the worker is reaped
/// and every waiter told), or until one asks for `rlm_query` children. On a kept thread of the
/// session's [`Threads`] (`kept`), those run on this thread, at once, and another kept thread
/// reads on: the thread woken for them is the next reader, which takes over the link while
/// they start, not their own on their way. The link's first reader, a thread of the shared
/// runtime's blocking pool (where a child's loop may not run: [`crate::rlm::Rlm::run`]), hands
/// both to kept threads. Where no thread can be had, the children are answered as failed and
/// this thread reads on.
fn read_worker(
    worker: &Arc<Worker>,
    mut reader: BufReader<UnixStream>,
    services: &Arc<Services>,
    kept: bool,
) {
    let mut buffer = Vec::new();
    loop {
        let Some(children) = read_until_children(worker, &mut reader, &mut buffer, services) else {
            return;
        };
        let here = if kept {
            Some(children)
        } else {
            children.run_on(&services.child_threads, worker);
            None
        };
        // Taken back if no thread could be had for it.
        let link = Arc::new(Mutex::new(Some(reader)));
        let handed = Arc::clone(&link);
        let (next_worker, next_services) = (Arc::clone(worker), Arc::clone(services));
        let read_on = services.child_threads.run(Box::new(move || {
            if let Some(reader) = lock(&handed).take() {
                read_worker(&next_worker, reader, &next_services, true);
            }
        }));
        match read_on {
            Ok(()) => {
                if let Some(children) = here {
                    (children.run)();
                }
                return;
            }
            Err(e) => {
                if let Some(children) = here {
                    fail_children(worker, children.call, children.count, &e);
                }
                // Dropped unrun, the job left the reader here.
                match lock(&link).take() {
                    Some(back) => reader = back,
                    None => return,
                }
            }
        }
    }
}

/// Every frame of the worker until one asks for `rlm_query` children (returned, to run), or
/// the link closes (`None`: the worker reaped and every waiter told).
fn read_until_children(
    worker: &Arc<Worker>,
    reader: &mut BufReader<UnixStream>,
    buffer: &mut Vec<u8>,
    services: &Services,
) -> Option<ChildrenRun> {
    loop {
        match read_frame::<FromWorker>(reader, buffer) {
            Ok(FromWorker::Output { stream, text }) => {
                if let Some(block) = lock(&worker.block).as_ref() {
                    match stream {
                        Stream::Stdout => block.stdout.push(&text),
                        Stream::Stderr => block.stderr.push(&text),
                    }
                }
            }
            Ok(FromWorker::Call {
                call,
                endpoint,
                prompt,
            }) => answer_call(worker, services, call, endpoint, prompt),
            Ok(FromWorker::Batch {
                call,
                endpoint,
                prompts,
            }) => answer_batch(worker, services, call, endpoint, prompts),
            Ok(FromWorker::Children { call, children }) => {
                if let Some(run) = answer_children(worker, services, call, children) {
                    return Some(run);
                }
            }
            Ok(FromWorker::Returned { id }) => {
                if let Some(waiter) = lock(&worker.waiters).get(&id) {
                    let _ = waiter.send(Event::Returned);
                }
            }
            Ok(FromWorker::Reply { id, reply }) => {
                if let Some(waiter) = lock(&worker.waiters).remove(&id) {
                    let _ = waiter.send(Event::Reply(reply));
                }
            }
            Ok(
                other
                @ (FromWorker::Confined(_) | FromWorker::Ready { .. } | FromWorker::Failed(_)),
            ) => {
                worker.lose(format!("sent {other:?} after its start"));
                break;
            }
            Err(FrameError::Closed | FrameError::Io(_)) => break,
            Err(e @ FrameError::Malformed(_)) => {
                worker.lose(e.to_string());
                break;
            }
        }
    }
    worker.reap();
    if let Some(block) = lock(&worker.block).as_ref() {
        block.calls.cancel();
    }
    for (_, waiter) in lock(&worker.waiters).drain() {
        let _ = waiter.send(Event::Dead);
    }
    None
}

/// The failure a replayed block's sub-call gets when its record has no answer for it.
fn unanswered() -> SubFailure {
    SubFailure {
        kind: "replay_miss".to_owned(),
        message: "This sub-call was not asked when the block first ran, so replaying the block after a worker crash has no answer for it (a prompt built from the time or random numbers differs); no model was called".to_owned(),
    }
}

/// How a sub-call of the running block is answered: from the replay's record, or live with
/// the block's cancellation (a call of a thread left running between blocks: the session's).
enum Route {
    Replayed(Vec<SubAnswer>),
    Live {
        block: u64,
        cancel: CancellationToken,
    },
}

fn route(worker: &Worker, services: &Services, keys: &[RecordKey]) -> Route {
    match lock(&worker.block).as_mut() {
        Some(Block {
            answers:
                Answers::Replay {
                    answers,
                    unanswered: missed,
                },
            ..
        }) => Route::Replayed(
            keys.iter()
                .map(|key| {
                    answers.take(key).unwrap_or_else(|| {
                        *missed += 1;
                        Err(unanswered())
                    })
                })
                .collect(),
        ),
        Some(block) => Route::Live {
            block: block.id,
            cancel: block.calls.clone(),
        },
        None => Route::Live {
            block: 0,
            cancel: services.cancel.child_token(),
        },
    }
}

fn answer_call(
    worker: &Arc<Worker>,
    services: &Services,
    call: u64,
    endpoint: Option<String>,
    prompt: String,
) {
    worker.asked(|seen| &mut seen.llm_query_calls);
    let name = endpoint.unwrap_or_else(|| services.sub_endpoint.clone());
    let endpoint = match services.endpoints.get(&name) {
        Ok(endpoint) => endpoint,
        Err(e) => {
            let failure = SubFailure::from(&e);
            worker.record_unsent(vec![services.kept(&prompt)], &failure);
            worker.answer(None, call, Answered::One(Err(failure)));
            return;
        }
    };
    let kept = services.kept(&prompt);
    let request = ChatRequest::from_prompt(prompt);
    let key = RecordKey::for_call(endpoint.config(), &request);
    let (block, cancel) = match route(worker, services, &[key]) {
        Route::Replayed(mut answers) => {
            let answer = answers.pop().unwrap_or_else(|| Err(unanswered()));
            worker.answer(None, call, Answered::One(answer));
            return;
        }
        Route::Live { block, cancel } => (block, cancel),
    };
    let worker = Arc::clone(worker);
    let options = services.options(cancel);
    runtime::shared().spawn(async move {
        let answer = endpoint
            .call(request, &options)
            .await
            .map(|response| response.content)
            .map_err(|e| SubFailure::from(&e));
        worker.record(block, key, kept, &answer);
        worker.answer(Some(block), call, Answered::One(answer));
    });
}

fn answer_batch(
    worker: &Arc<Worker>,
    services: &Services,
    call: u64,
    endpoint: Option<String>,
    prompts: Vec<String>,
) {
    worker.asked(|seen| &mut seen.llm_query_batched_calls);
    let name = endpoint.unwrap_or_else(|| services.sub_endpoint.clone());
    let endpoint = match services.endpoints.get(&name) {
        Ok(endpoint) => endpoint,
        Err(e) => {
            let failure = SubFailure::from(&e);
            worker.record_unsent(prompts.iter().map(|p| services.kept(p)).collect(), &failure);
            let answers = Err(failure);
            let prompts = prompts.len();
            worker.answer(None, call, Answered::Many { answers, prompts });
            return;
        }
    };
    let kept: Vec<Option<String>> = prompts.iter().map(|p| services.kept(p)).collect();
    let requests: Vec<ChatRequest> = prompts.into_iter().map(ChatRequest::from_prompt).collect();
    let keys: Vec<RecordKey> = requests
        .iter()
        .map(|r| RecordKey::for_call(endpoint.config(), r))
        .collect();
    let (block, cancel) = match route(worker, services, &keys) {
        Route::Replayed(answers) => {
            worker.answer(None, call, Answered::all(answers));
            return;
        }
        Route::Live { block, cancel } => (block, cancel),
    };
    let worker = Arc::clone(worker);
    let policy = services.batch;
    let options = services.options(cancel);
    runtime::shared().spawn(async move {
        let outcomes = endpoint.batch_recorded(requests, policy, &options).await;
        let answers: Vec<SubAnswer> = outcomes
            .into_iter()
            .map(|o| {
                o.result
                    .map(|r| r.content)
                    .map_err(|e| SubFailure::from(&e))
            })
            .collect();
        for ((key, prompt), answer) in keys.iter().zip(kept).zip(&answers) {
            worker.record(block, *key, prompt, answer);
        }
        worker.answer(Some(block), call, Answered::all(answers));
    });
}

/// The worker code's `rlm_query` children, to run here, in the parent (each with a session,
/// and so a worker, of its own), or `None` when they are answered already (no runner: the
/// worker asks as `llm_query`; a replay: from its record). A child's loop blocks its thread,
/// and the link must be read meanwhile ([`read_worker`]). Their answers go on the block's
/// record like sub-calls', so a replayed block gets them again without running the children
/// again, and to the worker as soon as they are all in, while the runner records the last
/// child's node and closes its session.
fn answer_children(
    worker: &Arc<Worker>,
    services: &Services,
    call: u64,
    children: Vec<WireChild>,
) -> Option<ChildrenRun> {
    let Some(runner) = services.children.get() else {
        worker.answer(None, call, Answered::Children(None));
        return None;
    };
    let config = services
        .endpoints
        .get(&services.sub_endpoint)
        .map(|e| e.config().clone())
        .unwrap_or_default();
    let keys: Vec<RecordKey> = children.iter().map(|c| child_key(&config, c)).collect();
    let (block, cancel) = match route(worker, services, &keys) {
        Route::Replayed(answers) => {
            worker.answer(None, call, Answered::Children(Some(answers)));
            return None;
        }
        Route::Live { block, cancel } => (block, cancel),
    };
    let mut kept: Vec<Option<String>> = children.iter().map(|c| services.kept(&c.prompt)).collect();
    let n = children.len();
    let queries: Vec<_> = children.into_iter().map(query_of).collect();
    let runs_on = Arc::clone(worker);
    Some(ChildrenRun {
        run: Box::new(move || {
            runner.run(queries, &cancel, &mut |answers| {
                for ((key, prompt), answer) in keys.iter().zip(kept.drain(..)).zip(&answers) {
                    runs_on.record(block, *key, prompt, answer);
                }
                runs_on.answer(Some(block), call, Answered::Children(Some(answers)));
            });
        }),
        call,
        count: n,
    })
}

/// A call's `rlm_query` children, to run ([`answer_children`]).
struct ChildrenRun {
    run: SpawnJob,
    call: u64,
    count: usize,
}

impl ChildrenRun {
    /// Runs them on a kept thread of `threads`; where none can be had, each fails.
    fn run_on(self, threads: &Threads, worker: &Worker) {
        let Self { run, call, count } = self;
        if let Err(e) = threads.run(run) {
            fail_children(worker, call, count, &e);
        }
    }
}

/// No thread could be had for a call's `count` children (or the link's reader while they
/// run): each fails.
fn fail_children(worker: &Worker, call: u64, count: usize, e: &io::Error) {
    tracing::warn!("could not start a thread for rlm_query children: {e}");
    let failure = SubFailure {
        kind: "child_error".to_owned(),
        message: format!(
            "the rlm_query child run could not run: no thread could be started for it ({e})"
        ),
    };
    worker.answer(
        None,
        call,
        Answered::Children(Some(vec![Err(failure); count])),
    );
}

/// The key a child's answer is recorded under for a replay: its query, its context (by
/// content, [`context_digest`]: a replayed block names the same context with another number)
/// and model.
fn child_key(sub: &bridge::EndpointConfig, child: &WireChild) -> RecordKey {
    let context = child
        .context
        .as_ref()
        .map_or_else(String::new, context_digest);
    let request = ChatRequest {
        model: child.model.clone(),
        messages: vec![
            bridge::Message::system(format!(
                "rlm_query child (max_iterations {:?})",
                child.max_iterations
            )),
            bridge::Message::user(child.prompt.clone()),
            bridge::Message::user(context),
        ],
        ..ChatRequest::default()
    };
    RecordKey::for_call(sub, &request)
}

/// A child's context as its record key has it: what it is (text, or the format it was
/// serialised in), its length and a 128-bit digest of its bytes (two foldhash passes with
/// different seeds). The context itself, copied, JSON-escaped and hashed twice with SipHash
/// in the key's request, took ~0.13 ms a 100 KB; this ~0.01 ms.
fn context_digest(context: &WireContext) -> String {
    let (kind, bytes) = match context {
        WireContext::Text(text) => ("text", text.as_bytes()),
        WireContext::Encoded(encoded) => (encoded.format.extension(), encoded.bytes.as_slice()),
    };
    let digest = |seed: u64| {
        let mut hasher = foldhash::quality::FixedState::with_seed(seed).build_hasher();
        hasher.write(bytes);
        hasher.finish()
    };
    format!(
        "{kind} of {} bytes, digest {:016x}{:016x}",
        bytes.len(),
        digest(0x5eed_0001),
        digest(0x5eed_0002)
    )
}

#[cfg(test)]
mod tests {
    //! A session's worker slot under concurrent requests and a failed start, with the worker
    //! played by the test over a real socket pair (its pid a `sleep` process, so that the
    //! session can kill and reap it as a worker's).

    use std::os::unix::net::UnixStream;
    use std::process::Command;

    use bridge::{Budget, Ledger};

    use super::*;
    use crate::repl::config::Isolation;
    use crate::repl::source::ContextSource;
    use crate::repl::worker::spawn::{Output, receive_fds};

    /// What stands in for a worker: the link's other end, and the process to end.
    struct FakeWorker {
        link: UnixStream,
        pid: i32,
    }

    impl FakeWorker {
        /// Says `frame`, as the worker would after reading its start frame.
        fn say(&mut self, frame: &FromWorker) {
            write_frame(&mut self.link, frame).expect("the session reads its link");
        }
    }

    impl Drop for FakeWorker {
        fn drop(&mut self) {
            // Killed unless the session reaped it already (then its pid is no longer ours);
            // the session's reader reaps it once the link closes, after this.
            // SAFETY: waitid fills a zeroed siginfo; WNOWAIT leaves the child to be reaped.
            let ours = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                let options = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
                libc::waitid(libc::P_PID, self.pid.unsigned_abs(), &mut info, options) == 0
            };
            if ours {
                // SAFETY: our own unreaped child: its pid cannot have been reused.
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
            }
        }
    }

    /// A session over `inputs` in the state `start_ready_later` leaves it: its worker handed
    /// its start frame, its `Ready` not taken yet, the contexts described by rlm. Its worker
    /// program does not exist: a session that tried to start another worker fails.
    fn handed_session(inputs: &[ContextInput]) -> (Arc<WorkerSession>, FakeWorker) {
        handed_session_built_for(inputs, &session_config())
    }

    /// The settings of [`handed_session`]'s session.
    fn session_config() -> SessionConfig {
        SessionConfig {
            isolation: Isolation::Process,
            ..SessionConfig::default()
        }
    }

    /// [`handed_session`], its worker's namespace built (as a worker of the pool's is) with
    /// `built_for`.
    #[allow(clippy::zombie_processes)] // The session reaps `sleep` as its worker.
    fn handed_session_built_for(
        inputs: &[ContextInput],
        built_for: &SessionConfig,
    ) -> (Arc<WorkerSession>, FakeWorker) {
        let (ours, theirs) = UnixStream::pair().expect("a socket pair");
        let sleeper = Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("`sleep` starts");
        let pid = i32::try_from(sleeper.id()).expect("a pid");
        let (output, _) = io::pipe().expect("a pipe");
        let program = WorkerProgram {
            program: PathBuf::from("/nonexistent/rlm-test-worker"),
            args: Vec::new(),
            env: Vec::new(),
        };
        let scratch = Scratch::create().expect("a scratch directory");
        let endpoints = Endpoints::new(Vec::new(), Arc::new(Ledger::new(Budget::default())))
            .expect("no endpoints");
        let mut session = WorkerSession::unstarted(
            1,
            session_config(),
            Arc::new(endpoints),
            program.clone(),
            share_contexts(inputs).expect("contexts shared"),
            sandbox::Policy::new(scratch.path()),
            scratch,
        );
        session.contexts = described_ahead(inputs).expect("described by rlm");
        let spawned = Spawned {
            pid,
            link: ours,
            output: Output::Pipe(output),
            spare: false,
            program,
            oom_kills: None,
        };
        let confined = (
            sandbox::Report { layers: Vec::new() },
            Arc::new(built_for.clone()),
        );
        let Ok(handed) = session.hand_over(spawned, Some(confined)) else {
            panic!("the start frame was not sent");
        };
        *lock(&session.worker) = Slot::Starting(Box::new(handed));
        (Arc::new(session), FakeWorker { link: theirs, pid })
    }

    /// How long the test lets the requests reach the slot before the worker answers.
    const SETTLE: Duration = Duration::from_millis(200);

    /// Runs each call's children by waiting for the test's word: it says which call started
    /// (its first child's prompt), and answers every child `done` once released.
    #[derive(Debug)]
    struct HeldChildren {
        started: Mutex<Sender<String>>,
        release: Mutex<Receiver<()>>,
    }

    impl crate::repl::children::ChildRunner for HeldChildren {
        fn run(
            &self,
            queries: Vec<crate::repl::children::ChildQuery>,
            _cancel: &CancellationToken,
            answered: &mut (dyn FnMut(Vec<SubAnswer>) + Send),
        ) {
            let first = queries
                .first()
                .map(|q| q.prompt.clone())
                .unwrap_or_default();
            let _ = lock(&self.started).send(first);
            let _ = lock(&self.release).recv_timeout(Duration::from_secs(10));
            answered(vec![Ok("done".to_owned()); queries.len()]);
        }
    }

    /// The worker asks sub-call `call` (of an endpoint there is not) and gets its answer, an
    /// error, while `what` goes on.
    fn answered_meanwhile(worker: &mut FakeWorker, call: u64, what: &str) {
        worker.say(&FromWorker::Call {
            call,
            endpoint: Some("nowhere".to_owned()),
            prompt: "hello".to_owned(),
        });
        let answer = read_frame::<ToWorker>(&mut &worker.link, &mut Vec::new());
        assert!(
            matches!(
                answer,
                Ok(ToWorker::Answer {
                    call: answered,
                    answer: Err(_)
                }) if answered == call
            ),
            "the worker's call was not answered while {what}: {answer:?}"
        );
    }

    fn child(prompt: &str) -> WireChild {
        WireChild {
            prompt: prompt.to_owned(),
            context: None,
            model: None,
            max_iterations: None,
        }
    }

    #[test]
    fn a_workers_link_is_read_on_while_its_rlm_query_children_run() {
        // A call's children run on a kept thread (the first call's handed there by the
        // link's first reader, the second's on the kept thread that read it), and a kept
        // thread reads on: while they run (held here), the worker's sub-calls are answered,
        // and its second call for children runs at once, beside the first.
        const WAIT: Duration = Duration::from_secs(10);
        let (session, mut worker) = handed_session(&[]);
        let (started_tx, started) = mpsc::channel();
        let (release, release_rx) = mpsc::channel();
        session.children().set(Some(Arc::new(HeldChildren {
            started: Mutex::new(started_tx),
            release: Mutex::new(release_rx),
        })));
        worker.say(&FromWorker::Ready {
            contexts: Vec::new(),
        });
        let link = worker.link.try_clone().expect("the link");
        link.set_read_timeout(Some(WAIT)).expect("a read timeout");
        let read = || read_frame::<ToWorker>(&mut &link, &mut Vec::new());
        receive_fds(&link).expect("the contexts' memfds");
        assert!(matches!(read(), Ok(ToWorker::Start(_))));
        worker.say(&FromWorker::Children {
            call: 1,
            children: vec![child("first")],
        });
        assert_eq!(started.recv_timeout(WAIT).as_deref(), Ok("first"));
        answered_meanwhile(&mut worker, 2, "its children ran");
        worker.say(&FromWorker::Children {
            call: 3,
            children: vec![child("second")],
        });
        assert_eq!(started.recv_timeout(WAIT).as_deref(), Ok("second"));
        // Read on while both run, the second on the thread that read its call.
        answered_meanwhile(&mut worker, 4, "its second children ran");
        release.send(()).expect("the children wait");
        release.send(()).expect("the children wait");
        let mut calls = Vec::new();
        for _ in 0..2 {
            match read() {
                Ok(ToWorker::ChildAnswers {
                    call,
                    answers: Some(answers),
                }) => {
                    assert_eq!(answers, vec![Ok("done".to_owned())]);
                    calls.push(call);
                }
                other => panic!("not the children's answers: {other:?}"),
            }
        }
        calls.sort_unstable();
        assert_eq!(calls, [1, 3]);
    }

    #[test]
    fn a_worker_of_the_pool_is_sent_its_sessions_settings_only_if_its_namespace_has_others() {
        let other = SessionConfig {
            cell_timeout: Duration::from_secs(7),
            ..session_config()
        };
        // Built for the session's own settings: the start frame carries none. Built for
        // others: the session's, as the worker gets them.
        for (built_for, expected) in [
            (session_config(), None),
            (other, Some(worker_settings(&session_config()))),
        ] {
            let (_session, worker) = handed_session_built_for(&[], &built_for);
            let link = &worker.link;
            link.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("a read timeout");
            receive_fds(link).expect("the contexts' memfds");
            match read_frame::<ToWorker>(&mut &*link, &mut Vec::new()) {
                Ok(ToWorker::Start(start)) => {
                    assert_eq!(start.settings, expected, "built for {built_for:?}")
                }
                other => panic!("not a start frame: {other:?}"),
            }
        }
    }

    #[test]
    fn a_handed_workers_link_is_read_from_its_start_frame_on_not_from_the_sessions_first_use() {
        // Its `Ready` is read by its link's reader as it comes, and every frame after it: a
        // sub-call the worker asks before the session was ever used is answered (here: no
        // such endpoint), and the session's first use then finds the worker ready.
        let (session, mut worker) = handed_session(&[]);
        worker.say(&FromWorker::Ready {
            contexts: Vec::new(),
        });
        worker.say(&FromWorker::Call {
            call: 7,
            endpoint: Some("nowhere".to_owned()),
            prompt: "hello".to_owned(),
        });
        let link = &worker.link;
        link.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        let memfds = receive_fds(link).expect("the contexts' memfds");
        assert!(memfds.is_empty());
        let start = read_frame::<ToWorker>(&mut &*link, &mut Vec::new());
        assert!(matches!(start, Ok(ToWorker::Start(_))), "{start:?}");
        let answer = read_frame::<ToWorker>(&mut &*link, &mut Vec::new());
        assert!(
            matches!(
                answer,
                Ok(ToWorker::Answer {
                    call: 7,
                    answer: Err(_)
                })
            ),
            "the worker's call was not answered before the session's first use: {answer:?}"
        );
        assert!(
            matches!(*lock(&session.worker), Slot::Starting(_)),
            "the session was used"
        );
        assert_eq!(
            session.live(None).map(|w| w.pid).map_err(|e| e.to_string()),
            Ok(worker.pid)
        );
    }

    #[test]
    fn cancelling_a_blocks_stop_token_or_the_sessions_tells_the_worker_to_interrupt_it() {
        // No task watches the tokens: cancelling either, on this thread, must make the
        // session send the running block's interrupt, and the block ends with the worker's
        // reply.
        for session_token in [false, true] {
            let (session, mut worker) = handed_session(&[]);
            worker.say(&FromWorker::Ready {
                contexts: Vec::new(),
            });
            let link = worker.link.try_clone().expect("the link");
            link.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("a read timeout");
            let read = || read_frame::<ToWorker>(&mut &link, &mut Vec::new());
            receive_fds(&link).expect("the contexts' memfds");
            assert!(matches!(read(), Ok(ToWorker::Start(_))));
            let stop = CancellationToken::new();
            let block = {
                let (session, stop) = (Arc::clone(&session), stop.clone());
                std::thread::spawn(move || {
                    session
                        .exec("while True: pass", Some(&stop))
                        .map(|result| result.error.map(|e| e.type_name))
                })
            };
            let id = match read() {
                Ok(ToWorker::Request {
                    id,
                    request: Request::Exec { stopped: false, .. },
                }) => id,
                other => panic!("the block was not sent as it should be: {other:?}"),
            };
            if session_token {
                session.cancel_token().cancel();
            } else {
                stop.cancel();
            }
            let told = read();
            assert!(
                matches!(told, Ok(ToWorker::Interrupt { id: told }) if told == id),
                "the worker was not told to interrupt the block (session token: {session_token}): {told:?}"
            );
            let result = ExecutionResult {
                error: Some(ExecError {
                    type_name: "CellCancelled".to_owned(),
                    message: "stopped".to_owned(),
                    traceback: String::new(),
                    line: None,
                }),
                ..crate::rlm::test_support::empty_result()
            };
            worker.say(&FromWorker::Returned { id });
            worker.say(&FromWorker::Reply {
                id,
                reply: Reply::Exec {
                    result: Ok(Box::new(result)),
                    processes: false,
                },
            });
            let ended = block.join().expect("the block ends");
            assert_eq!(
                ended.map_err(|e| e.to_string()),
                Ok(Some("CellCancelled".to_owned()))
            );
        }
    }

    #[test]
    fn two_requests_at_a_starting_worker_both_get_it_once_it_is_ready() {
        // One request takes the worker's `Ready`; the other, at the same time, must wait for
        // it, not find the slot empty and start a worker of its own (which, here, fails).
        let (session, mut worker) = handed_session(&[]);
        let requests: Vec<_> = (0..2)
            .map(|_| {
                let session = Arc::clone(&session);
                std::thread::spawn(move || session.live(None).map(|w| w.pid))
            })
            .collect();
        std::thread::sleep(SETTLE);
        worker.say(&FromWorker::Ready {
            contexts: Vec::new(),
        });
        for request in requests {
            let got = request.join().expect("the request ends");
            assert_eq!(got.map_err(|e| e.to_string()), Ok(worker.pid));
        }
        assert!(matches!(*lock(&session.worker), Slot::Live(_)));
    }

    #[test]
    fn a_worker_that_fails_to_load_a_childs_context_fails_the_first_block_with_its_error() {
        // A child's context described by rlm (its first prompt went out), and the worker
        // fails to load it: the first block gets the worker's error as it said it, a request
        // at the same time and every later one get it as the reason the session is closed,
        // and the description stays rlm's.
        let inputs = [ContextInput::from(ContextSource::Text(
            "a piece".to_owned(),
        ))];
        let (session, mut worker) = handed_session(&inputs);
        let described = session.contexts().to_vec();
        let error = || ReplError::internal("mapping a context's shared memory", "out of memory");
        let first = {
            let session = Arc::clone(&session);
            std::thread::spawn(move || session.exec("x = 1", None).map(|_| ()))
        };
        // The block took the worker to take its `Ready` before the other request comes.
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(*lock(&session.worker), Slot::Starting(_)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let beside = {
            let session = Arc::clone(&session);
            std::thread::spawn(move || session.live(None).map(|_| ()))
        };
        std::thread::sleep(SETTLE);
        worker.say(&FromWorker::Failed(error()));
        let first = first.join().expect("the block ends");
        assert_eq!(
            first.map_err(|e| e.to_string()),
            Err(error().to_string()),
            "the first block"
        );
        let closed = format!(
            "{}",
            ReplError::SessionClosed {
                reason: error().to_string()
            }
        );
        let beside = beside.join().expect("the request ends");
        assert_eq!(beside.map_err(|e| e.to_string()), Err(closed.clone()));
        let later = session.variables().map(|_| ());
        assert_eq!(later.map_err(|e| e.to_string()), Err(closed));
        assert_eq!(session.contexts(), described.as_slice());
        assert_eq!(described[0].chars, Some(7));
    }

    #[test]
    fn a_childs_record_key_follows_its_query_model_and_context_by_content_and_kind() {
        let sub = bridge::EndpointConfig::openai("sub", "http://127.0.0.1:9/v1", "m");
        let key = |prompt: &str, context: Option<WireContext>| {
            child_key(
                &sub,
                &WireChild {
                    prompt: prompt.to_owned(),
                    context,
                    model: None,
                    max_iterations: None,
                },
            )
        };
        let json = |source: &str, bytes: &[u8]| {
            Some(WireContext::Encoded(crate::repl::source::EncodedContext {
                source: source.to_owned(),
                format: crate::repl::source::EncodedFormat::Json,
                bytes: Arc::new(bytes.to_vec()),
            }))
        };
        let text = |text: &str| Some(WireContext::Text(text.to_owned()));
        // A replayed block names the same value with another number: the same key.
        assert_eq!(
            key("q", json("/s/rlm-child-context-9-0.json", b"[1, 2]")),
            key("q", json("/s/rlm-child-context-9-4.json", b"[1, 2]"))
        );
        assert_ne!(
            key("q", json("a.json", b"[1, 2]")),
            key("q", json("a.json", b"[1, 3]"))
        );
        // A str and a list whose JSON is that str are different children.
        assert_ne!(
            key("q", text("[1, 2]")),
            key("q", json("a.json", b"[1, 2]"))
        );
        assert_ne!(key("q", None), key("q", text("")));
        assert_ne!(key("q", text("x")), key("p", text("x")));
        // The whole of a long text counts, to its last byte.
        let long = "lorem ipsum ".repeat(20_000);
        assert_eq!(key("q", text(&long)), key("q", text(&long.clone())));
        assert_ne!(key("q", text(&long)), key("q", text(&format!("{long}."))));
        assert_ne!(
            key("q", text(&format!("{long}a"))),
            key("q", text(&format!("{long}b")))
        );
    }

    /// A wait status: killed by `signal`.
    fn killed_by(signal: i32, peak_bytes: u64, oom_kills: Option<u64>) -> Exit {
        Exit {
            status: Some(signal),
            peak_bytes,
            killed: false,
            oom_kills,
        }
    }

    #[test]
    fn a_sigkill_is_out_of_memory_only_when_the_kernel_counted_an_oom_kill_meanwhile() {
        let limit = 1 << 30;
        let told = |end: &WorkerEnd| describe_end(end, (Duration::from_secs(1), "x"), limit);
        // Counted: the killer was at work while the worker ran.
        let end = classify(&killed_by(libc::SIGKILL, 900 << 20, Some(2)), None, limit);
        assert!(
            matches!(
                end,
                WorkerEnd::OutOfMemory {
                    oom_kills: Some(2),
                    signal: libc::SIGKILL,
                    ..
                }
            ),
            "{end:?}"
        );
        let (kind, message) = told(&end);
        assert_eq!(kind, "WorkerOutOfMemory");
        assert!(message.contains("counted 2 such kill(s)"), "{message}");
        // Counted none: a `kill -9`, whatever it held (here: its whole limit).
        for peak in [40 << 20, limit] {
            let end = classify(&killed_by(libc::SIGKILL, peak, Some(0)), None, limit);
            assert_eq!(
                end,
                WorkerEnd::Killed {
                    signal: libc::SIGKILL,
                    peak_bytes: peak,
                    oom_kills: Some(0)
                }
            );
            let (kind, message) = told(&end);
            assert_eq!(kind, "WorkerKilled");
            assert!(
                message.contains("killed (SIGKILL), not by the session and not for memory"),
                "{message}"
            );
        }
        // Not counted by this kernel: a kill, and the message says memory cannot be ruled out.
        let end = classify(&killed_by(libc::SIGKILL, 40 << 20, None), None, limit);
        let (kind, message) = told(&end);
        assert_eq!(kind, "WorkerKilled", "{end:?}");
        assert!(
            message.contains("whether for memory cannot be told here (it held 42 MB"),
            "{message}"
        );
        // An allocator's abort at the limit is still memory, and other signals crashes.
        let end = classify(&killed_by(libc::SIGABRT, limit, None), None, limit);
        assert!(
            matches!(
                end,
                WorkerEnd::OutOfMemory {
                    oom_kills: None,
                    ..
                }
            ),
            "{end:?}"
        );
        assert!(
            told(&end).1.contains("ran out of memory at 1.1 GB"),
            "{end:?}"
        );
        let end = classify(&killed_by(libc::SIGSEGV, 40 << 20, None), None, limit);
        assert!(
            matches!(
                end,
                WorkerEnd::Crashed {
                    signal: libc::SIGSEGV,
                    ..
                }
            ),
            "{end:?}"
        );
    }

    #[test]
    fn a_signal_that_asks_the_worker_to_end_is_a_stop_from_outside_not_a_crash() {
        let limit = 1 << 30;
        let told = |end: &WorkerEnd| describe_end(end, (Duration::from_secs(1), "x"), limit);
        // Never a crash nor memory, whatever the worker held and the kernel counted.
        for signal in [libc::SIGTERM, libc::SIGHUP] {
            let end = classify(&killed_by(signal, limit, Some(3)), None, limit);
            assert_eq!(
                end,
                WorkerEnd::Killed {
                    signal,
                    peak_bytes: limit,
                    oom_kills: None
                }
            );
            let (kind, message) = told(&end);
            assert_eq!(kind, "WorkerKilled");
            assert!(
                message.contains(&format!(
                    "was stopped by {} from outside rlm, not by the session",
                    signal_name(signal)
                )),
                "{message}"
            );
            assert!(!message.contains("memory"), "{message}");
        }
        // The session's own ends stay what it ended the worker for.
        let stopped = WorkerEnd::Stopped {
            after_ms: 1.0,
            timed_out: false,
        };
        let exit = killed_by(libc::SIGTERM, 0, None);
        assert_eq!(classify(&exit, Some(&stopped), limit), stopped);
    }

    #[test]
    fn the_sessions_own_sigkill_is_told_as_what_the_session_ended_the_worker_for() {
        let limit = 1 << 30;
        let lost = WorkerEnd::Lost {
            detail: "stopped answering without ending".to_owned(),
        };
        let exit = killed_by(libc::SIGKILL, 40 << 20, Some(1));
        assert_eq!(classify(&exit, Some(&lost), limit), lost);
        // Killed by the reaper: the worker closed its link and did not exit.
        let reaped = Exit {
            killed: true,
            ..exit
        };
        let end = classify(&reaped, None, limit);
        assert!(
            matches!(&end, WorkerEnd::Lost { detail } if detail.contains("did not exit within 1s")),
            "{end:?}"
        );
    }
}
