//! [`FlowKernel`]: what the kernel's agents of one workflow run share — the model endpoints
//! and one REPL session holding the contexts — and [`off_runtime`], how they wait for it.

use std::sync::{Arc, Mutex, PoisonError};

use bridge::Endpoints;
use engine::flow::{FlowError, InvocationContext};

use crate::repl::{ContextInput, ReplError, ReplSession, SessionConfig};

/// The endpoints and the REPL session of one workflow run.
///
/// The session is started on first use with the run's contexts; a context loader may start
/// it again with more ([`FlowKernel::load_contexts`]). Every RLM agent, Python step and
/// Python callback of the run works in it, so a variable one step makes is there for the
/// next, and the contexts are loaded once.
#[derive(Debug)]
pub struct FlowKernel {
    endpoints: Arc<Endpoints>,
    config: SessionConfig,
    contexts: Vec<ContextInput>,
    /// Folders of the workflow's Python functions, readable by an isolated session.
    read_paths: Mutex<Vec<std::path::PathBuf>>,
    session: Mutex<Option<Arc<ReplSession>>>,
}

impl FlowKernel {
    /// Services over `endpoints`; the session (started on first use) loads `contexts`.
    pub fn new(
        endpoints: Arc<Endpoints>,
        config: SessionConfig,
        contexts: Vec<ContextInput>,
    ) -> Self {
        Self {
            endpoints,
            config,
            contexts,
            read_paths: Mutex::new(Vec::new()),
            session: Mutex::new(None),
        }
    }

    /// Lets the session read `folder` (a Python step's or tool's code): a worker process is
    /// confined to its contexts and Python's own files otherwise. Call it before the session
    /// starts (while the workflow is built).
    pub fn allow_read(&self, folder: &std::path::Path) {
        let mut paths = self
            .read_paths
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !paths.iter().any(|p| p == folder) {
            paths.push(folder.to_owned());
        }
    }

    /// The session's configuration with the folders of the workflow's code readable.
    fn session_config(&self) -> SessionConfig {
        let mut config = self.config.clone();
        config.read_paths.extend(
            self.read_paths
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .cloned(),
        );
        config
    }

    /// The model endpoints.
    pub fn endpoints(&self) -> &Arc<Endpoints> {
        &self.endpoints
    }

    /// The contexts the run was given.
    pub fn contexts(&self) -> &[ContextInput] {
        &self.contexts
    }

    /// The session, started with the run's contexts if it is not running yet. Blocks.
    pub fn session(&self) -> Result<Arc<ReplSession>, ReplError> {
        let mut slot = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(session) = slot.as_ref() {
            return Ok(Arc::clone(session));
        }
        let session = Arc::new(ReplSession::with_inputs(
            self.session_config(),
            Arc::clone(&self.endpoints),
            &self.contexts,
        )?);
        *slot = Some(Arc::clone(&session));
        Ok(session)
    }

    /// Interrupts the block the session runs now, if any (a cancelled step).
    pub fn interrupt(&self) {
        let slot = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(session) = slot.as_ref() {
            session.interrupt();
        }
    }

    /// Starts the session afresh with the run's contexts followed by `more` (variables of
    /// the session it replaces are gone). Blocks.
    pub fn load_contexts(&self, more: &[ContextInput]) -> Result<Arc<ReplSession>, ReplError> {
        let mut slot = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        let mut inputs = self.contexts.clone();
        inputs.extend(more.iter().cloned());
        let session = Arc::new(ReplSession::with_inputs(
            self.session_config(),
            Arc::clone(&self.endpoints),
            &inputs,
        )?);
        *slot = Some(Arc::clone(&session));
        Ok(session)
    }
}

/// Runs blocking `work` on a thread of its own and waits for it without blocking the
/// runtime. Not `spawn_blocking`: the RLM loop refuses to run where a runtime handle is set.
///
/// `stop`, if given, makes `work` end soon. When the step is cancelled it is called and the
/// wait goes on, holding a [`WindingDown`](engine::flow::WindingDown) guard, so that the
/// step ends after what `work` reports on its way out (see `engine::flow::run_agent`). If
/// the wait is dropped first (the step was abandoned), it is called then.
pub(crate) async fn off_runtime<T: Send + 'static>(
    ctx: &InvocationContext,
    agent: &str,
    work: impl FnOnce() -> T + Send + 'static,
    stop: Option<&(dyn Fn() + Sync)>,
) -> Result<T, FlowError> {
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("rlm-flow-{agent}"))
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| FlowError::Agent {
            agent: agent.to_owned(),
            message: format!("Cannot start a thread for the step: {e}"),
        })?;
    let result = match stop {
        None => rx.await,
        Some(stop) => {
            let _winding = ctx.winding_down();
            let mut guard = Abandon(Some(stop));
            let early = tokio::select! {
                biased;
                result = &mut rx => Some(result),
                () = ctx.cancel_token().cancelled() => None,
            };
            let result = match early {
                Some(result) => result,
                None => {
                    if let Some(stop) = guard.0.take() {
                        stop();
                    }
                    rx.await
                }
            };
            guard.0 = None;
            result
        }
    };
    result.map_err(|_| FlowError::Agent {
        agent: agent.to_owned(),
        message: "The step's thread ended without a result (it panicked)".to_owned(),
    })
}

/// Calls its function when dropped, unless it was taken out.
struct Abandon<'a>(Option<&'a (dyn Fn() + Sync)>);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(stop) = self.0.take() {
            stop();
        }
    }
}

/// A kernel failure of `agent` as a flow error.
pub(crate) fn kernel_error(agent: &str, error: &ReplError) -> FlowError {
    FlowError::Agent {
        agent: agent.to_owned(),
        message: format!("The Python session failed: {error}"),
    }
}
