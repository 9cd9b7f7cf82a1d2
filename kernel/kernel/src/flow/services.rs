//! [`FlowKernel`]: what the kernel's agents of one workflow run share — the model endpoints
//! and one REPL session holding the contexts — and [`off_runtime`], how they wait for it.

use std::sync::{Arc, Mutex, PoisonError};

use bridge::Endpoints;
use engine::flow::FlowError;

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
            session: Mutex::new(None),
        }
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
            self.config.clone(),
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
            self.config.clone(),
            Arc::clone(&self.endpoints),
            &inputs,
        )?);
        *slot = Some(Arc::clone(&session));
        Ok(session)
    }
}

/// Runs blocking `work` on a thread of its own and waits for it without blocking the
/// runtime. Not `spawn_blocking`: the RLM loop refuses to run where a runtime handle is set.
/// If the wait is dropped before `work` ends (the run was cancelled), `on_abandon` runs, to
/// make `work` end soon.
pub(crate) async fn off_runtime<T: Send + 'static>(
    agent: &str,
    work: impl FnOnce() -> T + Send + 'static,
    on_abandon: impl FnOnce(),
) -> Result<T, FlowError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("rlm-flow-{agent}"))
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| FlowError::Agent {
            agent: agent.to_owned(),
            message: format!("Cannot start a thread for the step: {e}"),
        })?;
    let mut guard = Abandon(Some(on_abandon));
    let result = rx.await;
    guard.0 = None;
    result.map_err(|_| FlowError::Agent {
        agent: agent.to_owned(),
        message: "The step's thread ended without a result (it panicked)".to_owned(),
    })
}

/// Runs its function when dropped, unless it was taken out.
struct Abandon<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for Abandon<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
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
