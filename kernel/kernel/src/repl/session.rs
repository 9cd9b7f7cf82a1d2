//! [`ReplSession`]: the one session handle the RLM loop, agents, tools and workflow steps
//! use — whether its Python runs in this process (`isolation = none`) or in a worker process
//! of its own (`process`, `strict`; see [`super::worker`]). Callers cannot tell the two
//! apart except by what survives: in a worker, a crash or a block stuck in native code ends
//! the worker, not the caller, and [`ExecutionResult::restart`] says how the session was put
//! back.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::children::ChildRunner;
use super::config::SessionConfig;
use super::error::ReplError;
use super::interpreter::{self, without_gil};
use super::local::{Embedding, LocalSession, Prepared, ensure_module, next_session_id, pop_result};
use super::metadata::{ContextMetadata, ExecutionResult, VariableInfo};
use super::natives::SubCallRoute;
use super::source::{ContextInput, ContextSource, check_names};
use super::worker::parent::WorkerSession;
use super::worker::{ReadyWorkers, Shape};
use bridge::Endpoints;

/// An embedded Python REPL session (see the [module docs](super)).
#[derive(Debug)]
pub struct ReplSession {
    id: u64,
    config: SessionConfig,
    backend: Backend,
}

/// Where the session's Python runs.
#[derive(Debug)]
enum Backend {
    Local(Box<LocalSession>),
    Worker(Box<WorkerSession>),
}

const _: () = {
    const fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<ReplSession>();
};

/// How long a session's start waits for the session made ahead for it (a spare thread of
/// the shared runtime makes it; it is done long before in practice).
const AHEAD_WAIT: Duration = Duration::from_secs(30);

/// An in-process session's threads and namespace, made ahead of its start off the caller's
/// thread ([`ReplSession::ahead`]); dropped unused, its threads end.
#[derive(Debug)]
pub(crate) struct AheadSession {
    made: Receiver<Result<Prepared, ReplError>>,
}

impl ReplSession {
    /// Start a session: a new namespace with the natives, and every context loaded (or an
    /// error naming the context that failed, with nothing left behind).
    pub fn new(
        config: SessionConfig,
        endpoints: Arc<Endpoints>,
        contexts: &[ContextSource],
    ) -> Result<Self, ReplError> {
        let inputs: Vec<ContextInput> = contexts.iter().cloned().map(Into::into).collect();
        Self::with_inputs(config, endpoints, &inputs)
    }

    /// While the returned guard lives, sessions of `config` (without file contexts: a run's
    /// `rlm_query` children) find a worker already confined for them, and sessions closed
    /// end their workers off the closing thread; dropping the last guard ends the workers
    /// still idle and waits for the closed ones. `None` in-process.
    pub(crate) fn keep_workers_ready(config: &SessionConfig) -> Option<ReadyWorkers> {
        super::worker::keep_ready(config)
    }

    /// Has the next session of `config` over `endpoints` (a run's next `rlm_query` child)
    /// ready ahead of its start, while the caller goes on. In-process, its threads started
    /// and its namespace built (everything but its contexts) on a spare thread of the shared
    /// runtime, returned for [`ReplSession::start_ahead`]. With isolation on, `None`: a run
    /// that keeps workers ready ([`ReplSession::keep_workers_ready`]) has the next worker
    /// confined with all of that (its pool orders it each time a session takes one); else
    /// the worker template is kept running (or a spare worker started). The session that
    /// takes a worker is still the only one that ever runs in it.
    pub(crate) fn ahead(
        config: &SessionConfig,
        endpoints: &Arc<Endpoints>,
    ) -> Option<AheadSession> {
        if config.isolation.in_worker() {
            super::worker::prepare_worker();
            return None;
        }
        let (made_tx, made) = mpsc::sync_channel(1);
        let (config, route) = (config.clone(), SubCallRoute::Local(Arc::clone(endpoints)));
        crate::runtime::shared().spawn_blocking(move || {
            let prepared = Prepared::new().and_then(|mut prepared| {
                prepared.build_ahead(config, route, Embedding::default())?;
                Ok(prepared)
            });
            // A session started meanwhile without it (or a run that ended) dropped the
            // receiver: the prepared session is dropped here and its threads end.
            let _ = made_tx.send(prepared);
        });
        Some(AheadSession { made })
    }

    /// [`ReplSession::new`] on a session made ahead by [`ReplSession::ahead`] with the same
    /// `config` and `endpoints`: only the contexts are loaded now. One that could not be made
    /// ahead (or not start) is made now, as `new` makes it.
    pub(crate) fn start_ahead(
        ahead: AheadSession,
        config: SessionConfig,
        endpoints: Arc<Endpoints>,
        contexts: Vec<ContextSource>,
    ) -> Result<Self, ReplError> {
        let inputs: Vec<ContextInput> = contexts.into_iter().map(Into::into).collect();
        check_names(&inputs)?;
        let made = ahead.made;
        let started = match without_gil(move || made.recv_timeout(AHEAD_WAIT)) {
            Ok(Ok(prepared)) => prepared.start(
                config.clone(),
                SubCallRoute::Local(Arc::clone(&endpoints)),
                &inputs,
                Embedding::default(),
            ),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ReplError::SessionClosed {
                reason: "the session made ahead did not come".to_owned(),
            }),
        };
        match started {
            Ok(local) => Ok(Self {
                id: local.id(),
                config,
                backend: Backend::Local(Box::new(local)),
            }),
            Err(e) => {
                tracing::debug!("the session made ahead could not start ({e}); starting one now");
                Self::with_inputs(config, endpoints, &inputs)
            }
        }
    }

    /// Like [`ReplSession::new`], with contexts that may carry their own variable names
    /// (checked before anything loads).
    pub fn with_inputs(
        config: SessionConfig,
        endpoints: Arc<Endpoints>,
        contexts: &[ContextInput],
    ) -> Result<Self, ReplError> {
        Self::begin(config, endpoints, contexts, None)
    }

    /// Like [`ReplSession::new`] for an `rlm_query` child, whose loop asks its model before
    /// its first block: with isolation on, the session returns once its worker was sent its
    /// start frame, and waits for the worker's `Ready` when it is first used (a block, or
    /// anything else that needs the worker), so the worker starts the session while the
    /// child's first model call is out. A worker that fails to start fails that first use
    /// with the error `new` would have returned. The first prompt describes the context:
    /// a text, or the JSON of a `dict` or `list`, is described by rlm from what it hands
    /// over, exactly as the worker describes it; a frame (or JSON only Python can judge) is
    /// described by the worker that loads it, so such a child waits for `Ready` at its start.
    /// `run_shape`: the shape of the workers its run keeps ready ([`ReadyWorkers::shape`]),
    /// by which it takes one. In-process, as `new`.
    pub(crate) fn for_child(
        config: SessionConfig,
        endpoints: Arc<Endpoints>,
        contexts: Vec<ContextSource>,
        run_shape: Option<&Shape>,
    ) -> Result<Self, ReplError> {
        let inputs: Vec<ContextInput> = contexts.into_iter().map(Into::into).collect();
        Self::begin(config, endpoints, &inputs, Some(run_shape))
    }

    /// `child`: for an `rlm_query` child, the shape of the workers its run keeps ready.
    fn begin(
        config: SessionConfig,
        endpoints: Arc<Endpoints>,
        contexts: &[ContextInput],
        child: Option<Option<&Shape>>,
    ) -> Result<Self, ReplError> {
        let backend = if config.isolation.in_worker() {
            // The worker checks the names and loads the contexts itself.
            let (id, config) = (next_session_id(), config.clone());
            Backend::Worker(Box::new(match child {
                Some(run_shape) => {
                    WorkerSession::start_ready_later(id, config, endpoints, contexts, run_shape)
                }
                None => WorkerSession::start(id, config, endpoints, contexts),
            }?))
        } else {
            interpreter::start()?;
            check_names(contexts)?;
            Backend::Local(Box::new(LocalSession::start(
                config.clone(),
                SubCallRoute::Local(endpoints),
                contexts,
                Embedding::default(),
            )?))
        };
        let id = match &backend {
            Backend::Local(local) => local.id(),
            Backend::Worker(worker) => worker.id(),
        };
        Ok(Self {
            id,
            config,
            backend,
        })
    }

    /// Run one code block. `Err` only if the kernel itself broke; a Python exception, a
    /// timeout or `sys.exit()` are reported in the [`ExecutionResult`] — and in a worker, so
    /// are a crash and a block that had to be stopped by ending the worker.
    pub fn exec(&self, code: &str) -> Result<ExecutionResult, ReplError> {
        match &self.backend {
            Backend::Local(local) => local.exec(code),
            Backend::Worker(worker) => worker.exec(code, None),
        }
    }

    /// Like [`exec`](Self::exec), and the block is stopped (`CellCancelled`) once `stop` is
    /// cancelled — also when that happens before the block started running, so a stop that
    /// races with the start of a block is never lost. Whoever cancels `stop` while the block
    /// runs must then call [`check_stop`](Self::check_stop) to wake the watchdog.
    pub fn exec_until_stopped(
        &self,
        code: &str,
        stop: &CancellationToken,
    ) -> Result<ExecutionResult, ReplError> {
        match &self.backend {
            Backend::Local(local) => local.exec_until_stopped(code, stop),
            Backend::Worker(worker) => worker.exec(code, Some(stop)),
        }
    }

    /// Metadata of the loaded contexts, in order.
    pub fn contexts(&self) -> &[ContextMetadata] {
        match &self.backend {
            Backend::Local(local) => local.contexts(),
            Backend::Worker(worker) => worker.contexts(),
        }
    }

    /// What confines the session's code: `None` in this process, the layers in force (and
    /// those missing, with why) in a worker.
    pub fn confinement(&self) -> Option<&sandbox::Report> {
        match &self.backend {
            Backend::Local(_) => None,
            Backend::Worker(worker) => Some(worker.confinement()),
        }
    }

    /// Empties the `answer` dict (`content = ""`, `ready = False`), so that a new run on this
    /// session does not inherit the last run's finished answer. The loop calls it per run.
    pub fn reset_answer(&self) -> Result<(), ReplError> {
        match &self.backend {
            Backend::Local(local) => local.reset_answer(),
            Backend::Worker(worker) => worker.reset_answer(),
        }
    }

    /// `str(answer["content"])` when it is not blank, whether or not `ready` was set: what a
    /// run stopped early keeps as its partial answer.
    pub fn answer_content(&self) -> Result<Option<String>, ReplError> {
        match &self.backend {
            Backend::Local(local) => local.answer_content(),
            Backend::Worker(worker) => worker.answer_content(),
        }
    }

    /// The user's variables (reserved names, `_private` names and modules hidden).
    pub fn variables(&self) -> Result<Vec<VariableInfo>, ReplError> {
        match &self.backend {
            Backend::Local(local) => local.variables(),
            Backend::Worker(worker) => worker.variables(),
        }
    }

    /// `str(value)` of a variable in the namespace, `None` if unset.
    pub fn variable_as_string(&self, name: &str) -> Result<Option<String>, ReplError> {
        match &self.backend {
            Backend::Local(local) => local.variable_as_string(name),
            Backend::Worker(worker) => worker.variable_as_string(name),
        }
    }

    /// The session's cancellation token: cancelling it aborts in-flight `llm_query` calls and
    /// interrupts the running block (`CellCancelled`). It cannot be reset: later sub-calls of
    /// this session fail with a cancellation error.
    pub fn cancel_token(&self) -> CancellationToken {
        match &self.backend {
            Backend::Local(local) => local.cancel_token(),
            Backend::Worker(worker) => worker.cancel_token(),
        }
    }

    /// Interrupts the block running now, if any, like a notebook's stop button: its in-flight
    /// sub-calls are cancelled and it ends with `CellCancelled` (in a worker, if it does not
    /// stop within half a second, by ending the worker); the session keeps its state and
    /// takes the next block normally. Returns whether a block was running.
    pub fn interrupt(&self) -> bool {
        match &self.backend {
            Backend::Local(local) => local.interrupt(),
            Backend::Worker(worker) => worker.interrupt(),
        }
    }

    /// Makes the session look at the running block's stop token now: after cancelling the
    /// token given to [`exec_until_stopped`](Self::exec_until_stopped), this stops that block
    /// (and no other, unlike [`interrupt`](Self::interrupt), which stops whatever runs).
    pub fn check_stop(&self) {
        match &self.backend {
            Backend::Local(local) => local.check_stop(),
            // The parent watches the stop token itself.
            Backend::Worker(_) => {}
        }
    }

    /// Terminates the processes the session's blocks started that still run — pool workers,
    /// forked children, subprocesses and their descendants (see the [module docs](super)).
    /// The loop calls it when a run ends; dropping the session does too. It does not wait
    /// for a running block, so it works while a block is stuck.
    pub fn end_processes(&self) -> Result<(), ReplError> {
        match &self.backend {
            Backend::Local(local) => local.end_processes(),
            Backend::Worker(worker) => worker.end_processes(),
        }
    }

    /// Loads a support module (`source`) as `name` into the session's interpreter unless it
    /// is there (kept across a worker's restart).
    pub(crate) fn ensure_module(&self, name: &str, source: &str) -> Result<(), ReplError> {
        match &self.backend {
            Backend::Local(_) => ensure_module(name, source),
            Backend::Worker(worker) => worker.ensure_module(name, source),
        }
    }

    /// Pops `results[token]` of support module `module` in the session's interpreter.
    pub(crate) fn pop_result(&self, module: &str, token: u64) -> Result<Option<String>, ReplError> {
        match &self.backend {
            Backend::Local(_) => pop_result(module, token),
            Backend::Worker(worker) => worker.pop_result(module, token),
        }
    }

    /// The session's configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Sets who runs the `rlm_query` children of this session's code (`None`: `rlm_query`
    /// runs as `llm_query`, see [`super::children`]). The RLM loop sets its runner for a run
    /// and takes it away after. In a worker, the children are still run here, by the parent.
    pub(crate) fn set_children(&self, runner: Option<Arc<dyn ChildRunner>>) {
        match &self.backend {
            Backend::Local(local) => local.children().set(runner),
            Backend::Worker(worker) => worker.children().set(runner),
        }
    }

    /// A process-unique number of this session (1 for the first).
    pub fn id(&self) -> u64 {
        self.id
    }
}
