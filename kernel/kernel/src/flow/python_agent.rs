//! [`PythonAgent`]: a deterministic step written as a Python function
//! `(state) -> dict of updates`, run in the workflow's REPL session.

use std::sync::Arc;

use async_trait::async_trait;
use engine::flow::{Agent, Callbacks, Control, Event, EventKind, FlowError, InvocationContext};
use serde_json::{Map, Value};

use super::python::PyFunction;
use super::services::{FlowKernel, kernel_error, off_runtime};

/// A step that calls a Python function with a copy of the state (a dict) and applies the
/// dict it returns as state updates (`None`: no updates). Two keys of the returned dict are
/// not state: `"__actions__"` lists actions (`exit_loop`, `end_turn`, `escalate`) and
/// `"__message__"` is a str the step says (its message, as an LLM agent's answer).
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

/// The key of a step's returned dict that lists actions instead of naming a state key.
pub const ACTIONS_KEY: &str = "__actions__";

/// The key of a step's returned dict that holds its message instead of naming a state key.
pub const MESSAGE_KEY: &str = "__message__";

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
        let state = Value::Object(ctx.state().with(|s| s.values().clone()));
        let kernel = Arc::clone(&self.kernel);
        let function = self.function.clone();
        let kwargs = self.kwargs.clone();
        let stop = ctx.cancel_token().clone();
        let name = self.name.clone();
        let called = off_runtime(
            &self.name,
            move || {
                let session = kernel.session().map_err(|e| kernel_error(&name, &e))?;
                Ok(function.call(&session, &state, &kwargs, &stop))
            },
            || self.kernel.interrupt(),
        )
        .await??;
        ctx.check()?;
        let (out, _) = called.map_err(|e| {
            self.fail(format!(
                "Python step `{}` failed: {e}",
                self.function.display()
            ))
        })?;
        let updates = match out {
            Value::Null => Map::new(),
            Value::Object(updates) => updates,
            other => {
                return Err(self.fail(format!(
                    "Python step `{}` returned {}, not a dict of state updates (or `None`)",
                    self.function.display(),
                    kind_of(&other)
                )));
            }
        };
        let mut actions = engine::Actions::default();
        let mut message = None;
        for (key, value) in updates {
            if key == ACTIONS_KEY {
                actions = parse_actions(&value).map_err(|m| self.fail(m))?;
            } else if key == MESSAGE_KEY {
                match value {
                    Value::String(text) => message = Some(text),
                    other => {
                        return Err(self.fail(format!(
                            "`{MESSAGE_KEY}` must be a str, not {}",
                            kind_of(&other)
                        )));
                    }
                }
            } else {
                ctx.set_state(key, value);
            }
        }
        let event = match message {
            Some(text) => Event::message(text),
            None => Event::new(EventKind::StateUpdate),
        };
        ctx.emit(event.with_actions(actions))?;
        Ok(Control::from_actions(actions))
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "None",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a str",
        Value::Array(_) => "a list",
        Value::Object(_) => "a dict",
    }
}

/// The actions a list of names asks for.
pub(crate) fn parse_actions(value: &Value) -> Result<engine::Actions, String> {
    let mut actions = engine::Actions::default();
    let names = match value {
        Value::Array(items) => items.iter().collect::<Vec<_>>(),
        Value::String(_) => vec![value],
        _ => {
            return Err(format!(
                "`{ACTIONS_KEY}` must list actions (`exit_loop`, `end_turn`, `escalate`), not {}",
                kind_of(value)
            ));
        }
    };
    for name in names {
        match name.as_str() {
            Some("exit_loop") => actions.exit_loop = true,
            Some("end_turn") => actions.end_turn = true,
            Some("escalate") => actions.escalate = true,
            _ => {
                return Err(format!(
                    "`{name}` in `{ACTIONS_KEY}` is not an action; expected `exit_loop`, \
                     `end_turn` or `escalate`"
                ));
            }
        }
    }
    Ok(actions)
}
