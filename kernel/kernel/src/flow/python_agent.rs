//! [`PythonAgent`]: a deterministic step written as a Python function, run in the
//! workflow's REPL session.

use std::sync::Arc;

use async_trait::async_trait;
use engine::flow::{Agent, Callbacks, Control, Event, EventKind, FlowError, InvocationContext};
use serde_json::{Map, Value};

use super::python::{FunctionKind, PyFunction};
use super::services::{FlowKernel, kernel_error, off_runtime};

/// A step that calls a Python function in the run's session, in Google ADK's convention: a
/// parameter named `ctx` gets the step's context — `ctx.state` (reads; writes, deletes and
/// in-place changes are the step's writes) and `ctx.actions` (`exit_loop`, `end_turn`,
/// `escalate`) — and a returned str is the step's message. A function without a `ctx`
/// parameter (the form documented first) gets a copy of the state as a dict and returns a
/// dict of updates (`None`: no updates), in which `"__actions__"` lists actions and
/// `"__message__"` is its message. `args` of the file are keyword arguments.
pub struct PythonAgent {
    name: String,
    description: String,
    function: PyFunction,
    kwargs: Map<String, Value>,
    kernel: Arc<FlowKernel>,
    callbacks: Callbacks,
}

impl std::fmt::Debug for PythonAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PythonAgent({}: {})", self.name, self.function.display())
    }
}

impl PythonAgent {
    /// The step `name` calling `function` with keyword arguments `kwargs`, in `kernel`'s
    /// session.
    pub fn new(
        name: impl Into<String>,
        function: PyFunction,
        kwargs: Map<String, Value>,
        kernel: Arc<FlowKernel>,
    ) -> Self {
        Self {
            name: name.into(),
            description: String::new(),
            function,
            kwargs,
            kernel,
            callbacks: Callbacks::new(),
        }
    }

    /// This step described as `description`.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// This step with its own `callbacks`.
    pub fn with_callbacks(mut self, callbacks: Callbacks) -> Self {
        self.callbacks = callbacks;
        self
    }

    fn fail(&self, message: impl Into<String>) -> FlowError {
        FlowError::Agent {
            agent: self.name.clone(),
            message: message.into(),
        }
    }
}

#[async_trait]
impl Agent for PythonAgent {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn class(&self) -> &str {
        engine::flow::class::PYTHON
    }

    fn callbacks(&self) -> &Callbacks {
        &self.callbacks
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        let state = ctx.state().clone();
        let kernel = Arc::clone(&self.kernel);
        let function = self.function.clone();
        let kwargs = self.kwargs.clone();
        let stop = ctx.cancel_token().clone();
        let name = self.name.clone();
        let called = off_runtime(
            ctx,
            &self.name,
            move || {
                let session = kernel.session().map_err(|e| kernel_error(&name, &e))?;
                Ok(function.call(
                    &session,
                    FunctionKind::Step,
                    &Value::Null,
                    Some(&state),
                    &kwargs,
                    &stop,
                ))
            },
            Some(&|| self.kernel.interrupt()),
        )
        .await??;
        ctx.check()?;
        let called = called.map_err(|e| {
            self.fail(format!(
                "Python step `{}` failed: {e}",
                self.function.display()
            ))
        })?;
        ctx.apply(&called.effects.writes);
        let actions = called.effects.actions;
        let event = match called.value {
            Value::String(text) => Event::message(text),
            _ => Event::new(EventKind::StateUpdate),
        };
        ctx.emit(event.with_actions(actions))?;
        Ok(Control::from_actions(actions))
    }
}
