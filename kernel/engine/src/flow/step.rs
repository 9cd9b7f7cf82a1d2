//! [`FnAgent`]: a deterministic step written as a Rust function of the context.

use async_trait::async_trait;

use super::agent::{Agent, Control};
use super::callbacks::Callbacks;
use super::context::InvocationContext;
use super::error::FlowError;

type StepFn = dyn Fn(&InvocationContext) -> Result<Control, FlowError> + Send + Sync;

/// An agent that runs a Rust function: it reads and writes state through the context and
/// says how control goes on (a formatter, a job step, a test double).
pub struct FnAgent {
    name: String,
    description: String,
    callbacks: Callbacks,
    step: Box<StepFn>,
}

impl std::fmt::Debug for FnAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FnAgent({})", self.name)
    }
}

impl FnAgent {
    /// The agent `name` running `step`.
    pub fn new(
        name: impl Into<String>,
        step: impl Fn(&InvocationContext) -> Result<Control, FlowError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            description: String::new(),
            callbacks: Callbacks::new(),
            step: Box::new(step),
        }
    }

    /// This agent with its own `callbacks`.
    pub fn with_callbacks(mut self, callbacks: Callbacks) -> Self {
        self.callbacks = callbacks;
        self
    }
}

#[async_trait]
impl Agent for FnAgent {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn class(&self) -> &str {
        "FnAgent"
    }

    fn callbacks(&self) -> &Callbacks {
        &self.callbacks
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        (self.step)(ctx)
    }
}
